package openb

import (
	"testing"

	"github.com/tessera-gpu/tessera/controller/packing"
)

func TestPoolPlaceBestFit(t *testing.T) {
	var p pool
	p[packing.MilliPerGPU] = 3
	steps := []struct {
		n, milli int
		ok       bool
		wantFree int64
	}{
		{0, 810, true, 2190}, // a fresh GPU: 190 left on it
		{0, 160, true, 2030}, // the tightest hole that fits: the 190 one
		{0, 500, true, 1530}, // no partial GPU has 500: a fresh one
		{2, 0, false, 1530},  // only one GPU is wholly free
		{0, 500, true, 1030}, // fills the 500 hole, not the fresh GPU
		{1, 0, true, 30},     // the last whole GPU
		{0, 40, false, 30},   // nothing has 40 free
		{0, 30, true, 0},     // the 30 hole
	}
	for i, s := range steps {
		if ok := p.place(s.n, s.milli); ok != s.ok {
			t.Fatalf("step %d (%d GPUs, %d milli): placed %v, want %v", i, s.n, s.milli, ok, s.ok)
		}
		if got := p.free(); got != s.wantFree {
			t.Fatalf("step %d: free %d, want %d", i, got, s.wantFree)
		}
	}
}

// TestCeilingAboveReplays checks that the ceiling is one on the default
// trace: no policy, under the real node constraints and without knowing
// the future, may beat it on the same arrivals; and that the pool bound is
// above them all and below issue 3's target of 96.5 %. If any of this
// failed, the argument in cmd/tessera-sim/README.md ("Target not reached")
// would not hold.
func TestCeilingAboveReplays(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the default openb trace: seconds of CPU")
	}
	nodes, pods := loadTrace(t)
	const seed, tune = 42, 1.3
	c, err := Ceiling(nodes, pods, tune, seed, 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.PodsPlaced+c.PodsFailed != c.PodsArrived {
		t.Errorf("ceiling: placed %d + failed %d != arrived %d", c.PodsPlaced, c.PodsFailed, c.PodsArrived)
	}
	var free int64
	for f, n := range c.Slivers {
		free += int64(f * n)
	}
	if capMilli := c.GPUCapacity * packing.MilliPerGPU; c.AllocatedMilli+free != capMilli {
		t.Errorf("ceiling: allocated %d + partly free %d != capacity %d (a wholly free GPU is left, so a prefix was too short)", c.AllocatedMilli, free, capMilli)
	}
	t.Logf("ceiling %.4f (best prefix %d of %d arrivals); partly free GPUs by free milli: %v", c.GPUAllocationRate, c.Prefix, c.PodsArrived, c.Slivers)
	b, err := Bound(nodes, pods, tune, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bound %.4f (%.2f GPUs; the last single-GPU whole pod placed is arrival %d)", b.GPUAllocationRate, b.GPUAllocated, b.Last)
	if b.PodsArrived != c.PodsArrived || b.GPUAllocated < c.GPUAllocated || b.GPUAllocationRate >= 0.965 {
		t.Errorf("bound %.2f GPUs (rate %.4f, %d arrivals): want at least the ceiling's %.2f and a rate below 0.965 (%d arrivals)",
			b.GPUAllocated, b.GPUAllocationRate, b.PodsArrived, c.GPUAllocated, c.PodsArrived)
	}
	for _, pol := range []packing.Policy{packing.Tessera, packing.FGD, packing.BestFit} {
		r, err := Replay(nodes, pods, Config{Tune: tune, Seed: seed, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		if r.AllocatedMilli > c.AllocatedMilli || r.AllocatedMilli > b.AllocatedMilli {
			t.Errorf("%s allocates %d milli-GPU, above the ceiling's %d or the bound's %d", pol, r.AllocatedMilli, c.AllocatedMilli, b.AllocatedMilli)
		}
		t.Logf("%s %.4f", pol, r.GPUAllocationRate)
	}
	if _, err := Ceiling(nodes, pods, tune, seed, 0); err == nil {
		t.Error("step 0 accepted")
	}
}

// TestCeilingSmallCluster: when even the prefix that asks for 90 % of the
// cluster does not pack whole (large pods on a small cluster), the ceiling
// searches from the longest prefix that packs (found by bisection) instead
// of failing.
func TestCeilingSmallCluster(t *testing.T) {
	nodes := []Node{{Name: "n0", CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: 2, Model: "T4"}}
	// Three 700-milli pods: the 90 % prefix is all three, which two GPUs
	// cannot hold.
	pods := []Pod{
		{Name: "a", NumGPU: 1, GPUMilli: 700},
		{Name: "b", NumGPU: 1, GPUMilli: 700},
		{Name: "c", NumGPU: 1, GPUMilli: 700},
	}
	c, err := Ceiling(nodes, pods, 1.3, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Replay(nodes, pods, Config{Tune: 1.3, Seed: 1, Policy: packing.BestFit})
	if err != nil {
		t.Fatal(err)
	}
	if c.AllocatedMilli != 1400 || c.AllocatedMilli < r.AllocatedMilli {
		t.Errorf("ceiling %d milli, bestfit %d, capacity 2000", c.AllocatedMilli, r.AllocatedMilli)
	}
}

func TestCheckTuneAndUnknownModels(t *testing.T) {
	for _, tune := range []float64{0, -1, 101, 1e9} {
		if CheckTune(tune) == nil {
			t.Errorf("tune %v accepted", tune)
		}
	}
	if err := CheckTune(1.3); err != nil {
		t.Error(err)
	}
	nodes := []Node{{Name: "n0", GPUs: 1, Model: "T4"}, {Name: "cpu", Model: "H100"}}
	pods := []Pod{
		{Name: "ok", NumGPU: 1, GPUMilli: 1000, Models: []string{"T4", "A100"}},
		// H100 is only on a node without GPUs: it cannot serve.
		{Name: "typo", NumGPU: 1, GPUMilli: 1000, Models: []string{"T-4", "H100"}},
		{Name: "any", NumGPU: 1, GPUMilli: 1000},
		// A CPU-only pod's gpu_spec constrains nothing.
		{Name: "cpuOnly", Models: []string{"V100"}},
	}
	models, n := UnknownModels(nodes, pods)
	if n != 1 || len(models) != 2 || models[0] != "H100" || models[1] != "T-4" {
		t.Errorf("UnknownModels = %v, %d; want [H100 T-4], 1", models, n)
	}
}
