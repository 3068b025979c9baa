package v1alpha1

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// gpuConfigSeeds returns every GpuConfig object in the repository's
// DeviceClasses and demo examples (the opaque parameters as users write
// them), as JSON.
func gpuConfigSeeds(f *testing.F) [][]byte {
	var files []string
	for _, glob := range []string{"../../../driver/deviceclasses/*.yaml", "../../../demo/examples/*.yaml"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			f.Fatal(err)
		}
		files = append(files, m...)
	}
	var out [][]byte
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["kind"] == Kind {
				b, err := json.Marshal(x)
				if err != nil {
					f.Fatal(err)
				}
				out = append(out, b)
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var v any
			if yaml.Unmarshal([]byte(doc), &v) == nil {
				walk(v)
			}
		}
	}
	if len(out) == 0 {
		f.Fatal("no GpuConfig in the DeviceClasses or demo examples")
	}
	return out
}

// FuzzParse feeds Parse what a ResourceClaim's or DeviceClass's opaque
// parameters may hold. A config is refused with an error that says it is
// the GpuConfig and names the field, or it validates, encodes and parses
// back to itself, and merged over the default class config (as Prepare
// does) keeps its strategy and settings, or, when partial, is refused by
// field.
func FuzzParse(f *testing.F) {
	for _, s := range gpuConfigSeeds(f) {
		f.Add(s)
	}
	for _, s := range []string{`{` + head + `}`, `{` + head + `,"sharing":{"strategy":"MPS","mps":{"computePercent":30}}}`,
		`{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`, `{` + head + `,"sharing":{"mps":{"computePercentage":30}}}`,
		`{` + head + `,"Sharing":{}}`, `{` + head + `,"sharing":{},"sharing":{}}`, `{` + head + `,"sharing":{"strategy":"Exclusive","mps":{}}}`,
		`{` + head + `,"sharing":{"mps":{"computePercent":101}}}`, `null`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := Parse(raw)
		if err != nil {
			var fe *FieldError
			if !strings.HasPrefix(err.Error(), "decoding GpuConfig: ") && !errors.As(err, &fe) {
				t.Fatalf("error says neither GpuConfig nor a field: %v", err)
			}
			if errors.As(err, &fe) && fe.Path == "" {
				t.Fatalf("field error without a path: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted a config that does not validate: %v", err)
		}
		enc, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("encoding: %v", err)
		}
		back, err := Parse(enc)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%s encoded as %s parses back to %+v, %v", raw, enc, back, err)
		}
		// A partial config (no strategy) may not fit the class it is merged
		// over (an mps section over Exclusive); a complete one always does.
		m := Merge(DefaultGpuConfig(), c)
		if err := m.Validate(); err != nil {
			var fe *FieldError
			if c.Strategy() != Exclusive || c.Sharing == nil || c.Sharing.Strategy != "" || !errors.As(err, &fe) {
				t.Fatalf("merged over the default: %v", err)
			}
			return
		}
		if c.Sharing != nil && c.Sharing.Strategy != "" && m.Strategy() != c.Sharing.Strategy {
			t.Fatalf("merged strategy %s, want %s", m.Strategy(), c.Sharing.Strategy)
		}
		if c.ComputePercent() != 0 && m.ComputePercent() != c.ComputePercent() {
			t.Fatalf("merged computePercent %d, want %d", m.ComputePercent(), c.ComputePercent())
		}
	})
}
