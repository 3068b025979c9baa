package scenario

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseQuantities(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{{"80Gi", 80 << 30}, {"1Ti", 1 << 40}, {"1.5Gi", 3 << 29}, {"1000", 1000}, {"2G", 2e9}} {
		got, err := parseBytes(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in    string
		allow bool
		want  int64
	}{{"0.25", false, 250}, {"2", false, 2000}, {"500m", true, 500}, {"-1", false, -1000}} {
		got, err := parseMilli(c.in, c.allow)
		if err != nil || got != c.want {
			t.Errorf("parseMilli(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	// Refused before big.Rat reads them: a fraction, a hex float, and a
	// long exponent, which big.Rat expands (1e1000000: a quarter second).
	for _, c := range []struct{ in, want string }{
		{"1/4", `"1/4" is not a number`},
		{"0x1p-2", `"0x1p-2" is not a number`},
		{"1e1000000", `"1e1000000" has an exponent of more than two digits`},
		{"1e-100", `"1e-100" has an exponent of more than two digits`},
		{strings.Repeat("1", 65), `"11111111111111111111"... is longer than 64 characters`},
	} {
		if _, err := parseMilli(c.in, false); err == nil || err.Error() != c.want {
			t.Errorf("parseMilli(%q): %v; want %s", c.in, err, c.want)
		}
		if _, err := parseBytes(c.in); err == nil || err.Error() != c.want {
			t.Errorf("parseBytes(%q): %v; want %s", c.in, err, c.want)
		}
	}
	for _, bad := range []string{"0.0001", "x", "500m"} {
		if _, err := parseMilli(bad, false); err == nil {
			t.Errorf("parseMilli(%q) should fail", bad)
		}
	}
	if got := formatMilli(2667); got != "2.667" {
		t.Errorf("formatMilli(2667) = %s", got)
	}
	if got := formatMilli(500); got != "0.5" {
		t.Errorf("formatMilli(500) = %s", got)
	}
	if got := formatBytes(160 << 30); got != "160Gi" {
		t.Errorf("formatBytes = %s", got)
	}
}

// Defaults exactly as SCENARIOS.md lists them.
func TestDefaults(t *testing.T) {
	specs, err := Parse("t.yaml", []byte(`
name: d
nodes:
- {name: dgx, count: 2, gpus: 8}
jobs:
- name: train
  pods:
  - {count: 2, gpu: 0.5}
  - {gpu: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := specs[0]
	if s.Cycles != 3 || !s.Consolidation || s.Placement != "binpack" {
		t.Errorf("config defaults: %+v", s)
	}
	n := s.Nodes[1]
	if n.Name != "dgx-1" || n.GPUMemory != 80<<30 || n.NVLink != "all" || n.CPUMilli != 64000 || n.Memory != 512<<30 {
		t.Errorf("node defaults: %+v", n)
	}
	// The implicit default queue is the only queue: no quota to keep (-1).
	q := s.Queues[0]
	if len(s.Queues) != 1 || q.Name != "default" || q.Priority != 100 || q.GPU != (Resource{-1, -1, 1}) || q.CPU != (Resource{-1, -1, 1}) || q.Memory != (Resource{-1, -1, 1}) {
		t.Errorf("queue defaults: %+v", s.Queues)
	}
	j := s.Jobs[0]
	if j.Queue != "default" || j.Priority != 100 || j.Preemptible || j.MinMember != 3 || j.CreatedAt != 0 {
		t.Errorf("job defaults: %+v", j)
	}
	if len(j.Pods) != 3 || j.Pods[2].Name != "train-2" || j.Pods[0].Sharing != "mps" || j.Pods[2].WholeGPUs() != 2 {
		t.Errorf("pods: %+v", j.Pods)
	}
}

// Alternatives are read as a pod's own GPU fields are, with the same
// defaults; Pod.As puts one in place of the pod's GPU fields and keeps the
// rest.
func TestAlternativesLoaded(t *testing.T) {
	specs, err := Parse("t.yaml", []byte(`
name: a
nodes:
- {name: box, gpus: 4}
jobs:
- name: j
  pods:
  - count: 2
    gpu: 2
    cpu: 4
    alternatives:
    - {gpu: 1, gpuMemory: 40Gi}
    - {gpuMemory: 20Gi}
    - {gpu: 0.5, sharing: timeslice, nvlink: required}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := specs[0].Jobs[0].Pods[1]
	want := []Pod{{GPUMilli: 1000, MinGPUMemory: 40 << 30}, {GPUMemory: 20 << 30, Sharing: "mps"}, {GPUMilli: 500, Sharing: "timeslice", NVLinkReq: true}}
	if len(p.Alternatives) != len(want) {
		t.Fatalf("alternatives: %+v", p.Alternatives)
	}
	for i, w := range want {
		a := p.Alternatives[i]
		if a.GPUMilli != w.GPUMilli || a.GPUMemory != w.GPUMemory || a.MinGPUMemory != w.MinGPUMemory || a.Sharing != w.Sharing || a.NVLinkReq != w.NVLinkReq {
			t.Errorf("alternative %d: %+v, want %+v", i, a, w)
		}
	}
	if q, ok := p.As(2); !ok || q.Name != "j-1" || q.CPUMilli != 4000 || q.GPUMemory != 20<<30 || q.WholeGPUs() != 0 || !q.Fractional() || q.Alternatives != nil {
		t.Errorf("As(2) = %+v, %v", q, ok)
	}
	if q, ok := p.As(0); !ok || q.WholeGPUs() != 2 {
		t.Errorf("As(0) = %+v, %v", q, ok)
	}
	if _, ok := p.As(4); ok {
		t.Error("As(4) should say there is no alternative 4")
	}
}

// The work limit (Spec.Work): a scenario at MaxWork loads, one unit of
// nodes more does not, and the error names the numbers and the limit.
func TestWorkLimit(t *testing.T) {
	file := func(nodes int) []byte {
		return []byte(fmt.Sprintf("name: w\ncycles: 10\nnodes: [{name: dgx, count: %d, gpus: 8}]\njobs: [{name: j, pods: [{count: 50000, gpu: 1}]}]\n", nodes))
	}
	specs, err := Parse("w.yaml", file(1000))
	if err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if w := specs[0].Work(); w != MaxWork {
		t.Errorf("work %d, want %d (10 × 50000 × (1000 + 1000))", w, int64(MaxWork))
	}
	_, err = Parse("w.yaml", file(1001))
	want := `w.yaml: scenario "w": cycles: 10 cycles of 50000 pods on 1001 nodes is too much work: 1000500000 units (pod-cycles × (nodes + 1000)), at most 1000000000; use fewer cycles, pods or nodes`
	if err == nil || err.Error() != want {
		t.Errorf("above the limit: %v; want %s", err, want)
	}
}

// RunContext stops between cycles once its context ends, naming the cycle.
func TestRunContextStops(t *testing.T) {
	specs, err := Parse("c.yaml", []byte("name: c\ncycles: 5\nnodes: [{name: dgx, gpus: 8}]\njobs: [{name: j, pods: [{gpu: 1}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cycles := 0
	rep, err := RunContext(ctx, specs[0], Options{OnCycle: func(c int) {
		if cycles++; c == 2 {
			cancel()
		}
	}})
	var ce *CycleError
	if rep != nil || !errors.As(err, &ce) || ce.Cycle != 3 || ce.Cycles != 5 || !errors.Is(err, context.Canceled) || cycles != 2 {
		t.Fatalf("report %v, error %v after %d cycles; want none and a CycleError before cycle 3 of 5", rep, err, cycles)
	}
}
