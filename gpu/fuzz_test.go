package gpu

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzParseProfile feeds ParseProfile what tessera-node --fake-gpus reads
// from a custom profile file. A profile is refused with an error that
// names the field (or says the YAML does not decode), or it builds fake
// GPUs: as many as it lists, at most maxFakeGPUs, each with at most
// nvlinksPerGPU NVLinks; and written back as YAML it parses to itself.
func FuzzParseProfile(f *testing.F) {
	b, err := os.ReadFile("testdata/example-profile.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	for _, name := range Profiles() {
		y, err := yaml.Marshal(builtinProfiles[name])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(y)
	}
	for _, s := range []string{"gpus: []", "gpus: [{model: l4-24gb, cout: 2}]", "gpus: [{model: nope}]",
		"gpus: [{productName: X, architecture: Hopper, computeCapability: '9.0', memory: 80Gi, multiprocessors: 132}]",
		"gpus: [{model: l4-24gb, count: 3}]\nnvlink: {bridges: [{gpus: [0, 1], links: 9}, {gpus: [0, 2], links: 9}]}",
		"gpus: [{model: l4-24gb, count: 2, pciBusIDs: ['0000:18:00.0', '0000:18:00.0']}]", "cudaDriverVersion: '99999999999999999999.1'\ngpus: [{model: l4-24gb}]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProfile(data)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "decoding: ") && !strings.HasPrefix(msg, "unknown field ") &&
				!strings.HasPrefix(msg, "gpus") && !strings.HasPrefix(msg, "nvlink") && !strings.HasPrefix(msg, "cudaDriverVersion: ") {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		want := 0
		for _, g := range p.GPUs {
			want += max(g.Count, 1)
		}
		fake, err := NewFakeFromSpec(p, "node-1")
		if err != nil {
			t.Fatalf("accepted profile does not build: %v", err)
		}
		if n := len(fake.profile.gpus); n != want || n > maxFakeGPUs {
			t.Fatalf("%d fake GPUs, want %d (at most %d)", n, want, maxFakeGPUs)
		}
		for i := range fake.profile.gpus {
			if l := len(fake.linksOf(i)); l > nvlinksPerGPU {
				t.Fatalf("GPU %d has %d NVLinks, more than %d", i, l, nvlinksPerGPU)
			}
		}
		y, err := yaml.Marshal(p)
		if err != nil {
			t.Fatalf("writing back: %v", err)
		}
		// Compared as YAML: an empty list and none are one (omitempty).
		back, err := ParseProfile(y)
		if err != nil {
			t.Fatalf("written back as\n%s\ndoes not parse: %v", y, err)
		}
		if y2, err := yaml.Marshal(back); err != nil || !bytes.Equal(y, y2) {
			t.Fatalf("written back as\n%s\nparses to\n%s", y, y2)
		}
	})
}
