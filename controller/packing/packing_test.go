package packing

import (
	"math"
	"testing"
)

func node(cpu int64, frees ...int) NodeState {
	n := NodeState{FreeCPUMilli: cpu, FreeMemory: 1 << 20, CPUMilli: cpu, Memory: 1 << 20}
	for _, f := range frees {
		n.GPUs = append(n.GPUs, GPU{FreeMilli: f, Model: "A"})
	}
	return n
}

func TestParsePolicy(t *testing.T) {
	for s, want := range map[string]Policy{"": Tessera, "tessera": Tessera, "fgd": FGD, "default": Default, "bestfit": BestFit, "FirstFit": FirstFit} {
		got, err := ParsePolicy(s)
		if err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy(random): want error")
	}
}

func TestFirstFitTakesFirstFeasible(t *testing.T) {
	nodes := []NodeState{node(1000, 0, 0), node(8000, 1000, 1000), node(8000, 1000)}
	i, g, ok := NewPlacer(FirstFit, nil).Place(nodes, Request{CPUMilli: 2000, GPUs: 1})
	if !ok || i != 1 || len(g) != 1 || g[0] != 0 {
		t.Fatalf("got %d %v %v", i, g, ok)
	}
}

func TestBestFitTightestNodeAndGPU(t *testing.T) {
	nodes := []NodeState{node(8000, 1000, 1000), node(8000, 1000, 300), node(8000, 1000, 600)}
	p := NewPlacer(BestFit, nil)
	i, g, ok := p.Place(nodes, Request{GPUMilli: 250})
	if !ok || i != 1 || g[0] != 1 {
		t.Fatalf("fraction: got %d %v %v; want node 1 gpu 1", i, g, ok)
	}
	i, g, ok = p.Place(nodes, Request{GPUMilli: 500})
	if !ok || i != 1 || g[0] != 0 { // node 1 is left tighter overall
		t.Fatalf("fraction 500: got %d %v %v; want node 1 gpu 0", i, g, ok)
	}
	if _, _, ok := p.Place(nodes, Request{GPUs: 3}); ok {
		t.Fatal("3 GPUs placed on 2-GPU nodes")
	}
}

func TestModelsAndSharing(t *testing.T) {
	nodes := []NodeState{node(8000, 1000), node(8000, 1000)}
	nodes[1].GPUs[0].Model = "B"
	i, _, ok := NewPlacer(BestFit, nil).Place(nodes, Request{GPUs: 1, Models: []string{"B", "C"}})
	if !ok || i != 1 {
		t.Fatalf("models: got %d %v", i, ok)
	}
	nodes[0].GPUs[0] = GPU{FreeMilli: 500, Model: "A", Sharing: SharingTimeSlice}
	nodes[1].GPUs[0].FreeMilli = 0
	if _, _, ok := NewPlacer(BestFit, nil).Place(nodes, Request{GPUMilli: 200, Sharing: SharingMPS}); ok {
		t.Fatal("MPS fraction placed on a time-sliced GPU")
	}
}

func TestApplyRelease(t *testing.T) {
	n := node(8000, 1000, 1000)
	r := Request{CPUMilli: 100, GPUMilli: 300}
	Apply(&n, r, []int{1})
	if n.GPUs[1].FreeMilli != 700 || n.GPUs[1].Sharing != SharingMPS || n.FreeCPUMilli != 7900 {
		t.Fatalf("apply: %+v", n)
	}
	Release(&n, r, []int{1})
	if n.GPUs[1].FreeMilli != 1000 || n.GPUs[1].Sharing != SharingNone || n.FreeCPUMilli != 8000 {
		t.Fatalf("release: %+v", n)
	}
}

// FGD keeps a whole GPU free for the whole-GPU pods the workload expects:
// a small fraction goes onto the partly used GPU, not onto a fresh one.
func TestFGDAvoidsBreakingWholeGPUs(t *testing.T) {
	w := NewWorkload()
	w.Add(Request{GPUs: 1}, 5)
	w.Add(Request{GPUMilli: 500}, 5)
	nodes := []NodeState{node(8000, 1000, 1000), node(8000, 1000, 500)}
	p := NewPlacer(FGD, w)
	i, g, ok := p.Place(nodes, Request{GPUMilli: 500})
	if !ok || i != 1 || g[0] != 1 {
		t.Fatalf("got %d %v %v; want node 1 gpu 1", i, g, ok)
	}
}

func TestFGDPlaceDoesNotAllocate(t *testing.T) {
	for _, pol := range []Policy{FGD, Tessera} {
		w := NewWorkload()
		w.Add(Request{GPUs: 1, CPUMilli: 1000}, 3)
		w.Add(Request{GPUMilli: 250, CPUMilli: 500}, 2)
		nodes := []NodeState{node(8000, 1000, 1000, 250, 0), node(16000, 1000, 700, 1000, 1000)}
		p := NewPlacer(pol, w)
		p.CacheByIndex(true)
		req := Request{GPUMilli: 250, CPUMilli: 500}
		p.Place(nodes, req)
		if a := testing.AllocsPerRun(100, func() { p.Place(nodes, req) }); a != 0 {
			t.Fatalf("%v: Place allocates %v times per call", pol, a)
		}
	}
}

// Fill values: a leftover no pod fits is wasted whole; one that a common
// size fills exactly is mostly used; model constraints shape each model's V.
func TestFillValues(t *testing.T) {
	w := NewWorkload()
	w.Add(Request{GPUs: 1}, 3)
	w.Add(Request{GPUMilli: 500}, 3)
	w.Add(Request{GPUMilli: 100, Models: []string{"A"}}, 2)
	vb := w.fillValues("B")
	if vb[0] != 0 || math.Abs(vb[499]-499) > 1e-6 || vb[500] > 50 || vb[1000] > 50 || vb[999] >= vb[499]+500 {
		t.Fatalf("model B: V[0]=%v V[499]=%v V[500]=%v V[999]=%v V[1000]=%v", vb[0], vb[499], vb[500], vb[999], vb[1000])
	}
	for f, v := range vb {
		if v < 0 || v > float64(f)+1e-9 {
			t.Fatalf("model B: V[%d] = %v outside [0, %d]", f, v, f)
		}
	}
	va := w.fillValues("A")
	if va[150] >= vb[150] || math.Abs(va[99]-99) > 1e-6 {
		t.Fatalf("model A's 100-milli pods should make a 150 leftover less wasted: A %v, B %v", va[150], vb[150])
	}
	w.Add(Request{GPUMilli: 50}, 1)
	if w.fillValues("B")[99] >= 99 {
		t.Fatal("fill values not recomputed after the workload changed")
	}
}

// TestPaperScore pins FGD's node score to the paper's plugin: an integer
// 0..100 from 100·sigmoid(Δ/1000), so nearby fragmentation changes tie.
func TestPaperScore(t *testing.T) {
	for _, c := range []struct{ delta, want float64 }{
		{0, 50},
		{-1, 49},  // any growth of fragmentation drops below 50
		{-39, 49}, // ... and about 40 milli-GPU share one score
		{-41, 48},
		{250, 56},
		{-4600, 0}, // beyond about 4.6 GPUs every node scores 0
		{-20000, 0},
		{20000, 99},
	} {
		if got := paperScore(c.delta); got != c.want {
			t.Errorf("paperScore(%v) = %v, want %v", c.delta, got, c.want)
		}
	}
}
