package scenario

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// Error is an invalid scenario file: it names the file, the scenario (or the
// document when the scenario has no usable name), the field and why.
type Error struct {
	File     string
	Scenario string // "" when unknown
	Document int    // 1-based YAML document
	Line     int    // first line of the document
	Field    string // "" for the whole document
	Why      string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Scenario != "" {
		fmt.Fprintf(&b, "scenario %q", e.Scenario)
	} else if e.Document > 0 {
		fmt.Fprintf(&b, "document %d (line %d)", e.Document, e.Line)
	}
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	if e.Scenario != "" || e.Document > 0 || e.Field != "" {
		b.WriteString(": ")
	}
	b.WriteString(e.Why)
	return b.String()
}

// LoadFile reads every scenario of one file.
func LoadFile(path string) ([]*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Why: fmt.Sprintf("cannot read: %v", unwrapPathError(err))}
	}
	return Parse(path, data)
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

type document struct {
	text []byte
	line int
}

// splitDocuments splits a YAML stream on "---" lines, remembering where each
// document starts so errors can point at it.
func splitDocuments(data []byte) []document {
	var docs []document
	lines := bytes.SplitAfter(data, []byte("\n"))
	cur := document{line: 1}
	for i, l := range lines {
		t := bytes.TrimRight(l, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- #")) {
			docs = append(docs, cur)
			cur = document{line: i + 2}
			continue
		}
		cur.text = append(cur.text, l...)
	}
	return append(docs, cur)
}

// Parse reads every scenario of a file's contents; path is used in errors.
func Parse(path string, data []byte) ([]*Spec, error) {
	var specs []*Spec
	seen := map[string]int{}
	n := 0
	for _, d := range splitDocuments(data) {
		js, err := toJSON(d.text)
		if err != nil {
			return nil, &Error{File: path, Document: n + 1, Line: d.line, Why: "not valid YAML: " + cleanYAMLError(err, d.line)}
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue // empty document (comments only)
		}
		n++
		fail := func(field, why string) error {
			return &Error{File: path, Document: n, Line: d.line, Field: field, Why: why}
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		var raw any
		if err := dec.Decode(&raw); err != nil {
			return nil, fail("", "not valid YAML: "+err.Error())
		}
		m, ok := raw.(map[string]any)
		if !ok {
			return nil, fail("", "a scenario must be a mapping (name:, nodes:, ...)")
		}
		name, _ := m["name"].(string)
		failNamed := func(field, why string) error {
			return &Error{File: path, Scenario: name, Document: n, Line: d.line, Field: field, Why: why}
		}
		if field, why := checkShape(raw, reflect.TypeFor[fileScenario](), ""); why != "" {
			return nil, failNamed(field, why)
		}
		var fs fileScenario
		strict := json.NewDecoder(bytes.NewReader(js))
		strict.DisallowUnknownFields()
		if err := strict.Decode(&fs); err != nil {
			return nil, failNamed("", err.Error())
		}
		if fs.Name == "" {
			return nil, failNamed("name", "required")
		}
		if prev, dup := seen[fs.Name]; dup {
			return nil, failNamed("name", fmt.Sprintf("duplicate: document %d has the same name (names are unique in a file)", prev))
		}
		seen[fs.Name] = n
		spec, err := normalize(&fs)
		if err != nil {
			fe := err.(*fieldError)
			return nil, failNamed(fe.field, fe.why)
		}
		spec.File = path
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return nil, &Error{File: path, Why: "holds no scenario"}
	}
	return specs, nil
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// cleanYAMLError makes the YAML parser's message one line, with line numbers
// counted from the top of the file rather than of the document.
// toJSON converts one YAML document, refusing duplicate keys. yaml.v2's
// strict mode (sigs.k8s.io/yaml) also calls a key that overrides one merged
// in with "<<" a duplicate, which YAML allows (it is how an anchored node
// is reused with changes); such documents are checked for real duplicates
// on yaml.v3's node tree, which keeps merges apart, and converted without
// strictness.
func toJSON(text []byte) ([]byte, error) {
	js, err := yaml.YAMLToJSONStrict(text)
	if err == nil || !bytes.Contains(text, []byte("<<")) {
		return js, err
	}
	var root yamlv3.Node
	if yamlv3.Unmarshal(text, &root) != nil {
		return nil, err // not YAML at all: the first error says why
	}
	if dup := duplicateKey(&root); dup != nil {
		return nil, dup
	}
	return yaml.YAMLToJSON(text)
}

// duplicateKey finds a key given twice in one mapping, merges aside.
func duplicateKey(n *yamlv3.Node) error {
	if n.Kind == yamlv3.MappingNode {
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yamlv3.ScalarNode || k.Tag == "!!merge" {
				continue
			}
			if seen[k.Value] {
				return fmt.Errorf("yaml: line %d: key %q already set in map", k.Line, k.Value)
			}
			seen[k.Value] = true
		}
	}
	for _, c := range n.Content {
		if err := duplicateKey(c); err != nil {
			return err
		}
	}
	return nil
}

func cleanYAMLError(err error, docLine int) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "error converting YAML to JSON: ")
	s = strings.TrimPrefix(s, "yaml: ")
	s = strings.TrimPrefix(s, "unmarshal errors:\n")
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
	if strings.HasPrefix(s, "json: unsupported value: ") {
		// .nan and .inf are YAML floats that no field can hold.
		return "a value is " + strings.TrimPrefix(s, "json: unsupported value: ") + " (.nan or .inf); every number must be finite"
	}
	return yamlLine.ReplaceAllStringFunc(s, func(m string) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(m, "line "))
		return "line " + strconv.Itoa(n+docLine-1)
	})
}

var quantityType = reflect.TypeFor[Quantity]()

// checkShape walks the decoded document against the file types, so an unknown
// field or a value of the wrong kind is reported with its full path
// (jobs[train].pods[0].gpu) rather than encoding/json's index-less one.
func checkShape(v any, t reflect.Type, path string) (string, string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return "", "" // "key:" with no value is the same as leaving it out
	}
	if t == quantityType {
		switch v.(type) {
		case json.Number, string:
			return "", ""
		}
		return path, fmt.Sprintf("want a number or a quantity string, got %s", kindOf(v))
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return path, fmt.Sprintf("want a mapping, got %s", kindOf(v))
		}
		fields := map[string]reflect.Type{}
		var known []string
		shapeFields(t, fields, &known)
		keys := sortedKeys(m)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return join(path, k), fmt.Sprintf("unknown field (known here: %s)", strings.Join(known, ", "))
			}
			if f, why := checkShape(m[k], ft, join(path, k)); why != "" {
				return f, why
			}
		}
		return "", ""
	case reflect.Slice:
		a, ok := v.([]any)
		if !ok {
			return path, fmt.Sprintf("want a list, got %s", kindOf(v))
		}
		for i, e := range a {
			if f, why := checkShape(e, t.Elem(), path+"["+elemName(e, i)+"]"); why != "" {
				return f, why
			}
		}
		return "", ""
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return path, fmt.Sprintf("want a mapping, got %s", kindOf(v))
		}
		for _, k := range sortedKeys(m) {
			if f, why := checkShape(m[k], t.Elem(), join(path, k)); why != "" {
				return f, why
			}
		}
		return "", ""
	case reflect.String:
		if _, ok := v.(string); !ok {
			if _, isBool := v.(bool); isBool {
				// YAML 1.1, which the loader reads, turns unquoted y, n, yes,
				// no, on and off into booleans: say so, or "got false" for a
				// node named n is a riddle.
				return path, fmt.Sprintf("want a string, got %s (YAML reads unquoted y, n, yes, no, on, off, true and false as booleans: quote it)", kindOf(v))
			}
			return path, fmt.Sprintf("want a string, got %s", kindOf(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return path, fmt.Sprintf("want true or false, got %s", kindOf(v))
		}
	case reflect.Int, reflect.Int64:
		num, ok := v.(json.Number)
		if !ok {
			return path, fmt.Sprintf("want a whole number, got %s", kindOf(v))
		}
		if _, err := strconv.ParseInt(num.String(), 10, 64); err != nil {
			return path, fmt.Sprintf("want a whole number, got %s", num)
		}
	}
	return "", ""
}

// shapeFields lists a struct's JSON fields in order, with those of an
// embedded struct (filePod's fileGPU) in its place, as encoding/json reads
// them.
func shapeFields(t reflect.Type, fields map[string]reflect.Type, known *[]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("json"), ",")[0]
		if tag == "" && f.Anonymous && f.Type.Kind() == reflect.Struct {
			shapeFields(f.Type, fields, known)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		fields[tag] = f.Type
		*known = append(*known, tag)
	}
}

func kindOf(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("the string %q", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case json.Number:
		return "the number " + x.String()
	}
	return fmt.Sprintf("%T", v)
}

// elemName names a list element by its name: field when it has one.
func elemName(e any, i int) string {
	if m, ok := e.(map[string]any); ok {
		if n, ok := m["name"].(string); ok && n != "" {
			return n
		}
	}
	return strconv.Itoa(i)
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
