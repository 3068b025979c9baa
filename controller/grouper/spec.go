package grouper

import (
	"fmt"
	"math"
	"strings"
)

// maxMembers bounds a derived minimum: a PodGroup's minMember is an int32,
// and no gang of more pods than this is a real workload (a spec that sums
// to more is refused with its fields named, never wrapped).
const maxMembers = 1 << 20

// field reads obj at path; ok is false when a step is missing or null.
// A step that is not an object is an error naming the path.
func field(obj map[string]any, path ...string) (any, bool, error) {
	var cur any = obj
	for i, p := range path {
		m, isMap := cur.(map[string]any)
		if !isMap {
			return nil, false, fmt.Errorf("%s is not an object", strings.Join(path[:i], "."))
		}
		v, has := m[p]
		if !has || v == nil {
			return nil, false, nil
		}
		cur = v
	}
	return cur, true, nil
}

// intField reads a whole number at path (JSON numbers come as int64 from
// the API's decoder, float64 from encoding/json); def when absent. It must
// be between 0 and maxMembers.
func intField(obj map[string]any, def int64, path ...string) (int64, error) {
	v, ok, err := field(obj, path...)
	if err != nil || !ok {
		return def, err
	}
	name := strings.Join(path, ".")
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int32:
		n = int64(x)
	case int:
		n = int64(x)
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) || math.IsNaN(x) || x < -maxMembers-1 || x > maxMembers+1 {
			return 0, fmt.Errorf("%s: %v is not a whole number of pods up to %d", name, x, maxMembers)
		}
		n = int64(x)
	default:
		return 0, fmt.Errorf("%s: %v is not a number", name, v)
	}
	if n < 0 || n > maxMembers {
		return 0, fmt.Errorf("%s: %d is not between 0 and %d", name, n, maxMembers)
	}
	return n, nil
}

// stringField reads a string at path; "" when absent.
func stringField(obj map[string]any, path ...string) (string, error) {
	v, ok, err := field(obj, path...)
	if err != nil || !ok {
		return "", err
	}
	s, isString := v.(string)
	if !isString {
		return "", fmt.Errorf("%s: %v is not a string", strings.Join(path, "."), v)
	}
	return s, nil
}

// listField reads a list of objects at path; nil when absent.
func listField(obj map[string]any, path ...string) ([]map[string]any, error) {
	v, ok, err := field(obj, path...)
	if err != nil || !ok {
		return nil, err
	}
	l, isList := v.([]any)
	if !isList {
		return nil, fmt.Errorf("%s is not a list", strings.Join(path, "."))
	}
	out := make([]map[string]any, 0, len(l))
	for i, e := range l {
		m, isMap := e.(map[string]any)
		if !isMap {
			return nil, fmt.Errorf("%s[%d] is not an object", strings.Join(path, "."), i)
		}
		out = append(out, m)
	}
	return out, nil
}

// mapField reads an object at path; nil when absent.
func mapField(obj map[string]any, path ...string) (map[string]any, error) {
	v, ok, err := field(obj, path...)
	if err != nil || !ok {
		return nil, err
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		return nil, fmt.Errorf("%s is not an object", strings.Join(path, "."))
	}
	return m, nil
}

// sum adds pod counts, refusing a total above maxMembers.
func sum(what string, ns ...int64) (int64, error) {
	var t int64
	for _, n := range ns {
		t += n
		if t > maxMembers {
			return 0, fmt.Errorf("%s: more than %d pods", what, maxMembers)
		}
	}
	return t, nil
}
