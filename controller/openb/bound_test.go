package openb

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/controller/packing"
)

func frac(m int) Pod  { return Pod{NumGPU: 1, GPUMilli: m} }
func whole(n int) Pod { return Pod{NumGPU: n, GPUMilli: packing.MilliPerGPU} }

func TestBoundKnapsack(t *testing.T) {
	b, _ := newBoundLP(1, []Pod{frac(190), frac(320), frac(470), frac(810)})
	if b.unit != 10 {
		t.Fatalf("unit %d, want 10", b.unit)
	}
	tests := []struct {
		y       []float64 // per size: 190, 320, 470, 810
		want    float64
		pattern []int
	}{
		{[]float64{0.19, 0.32, 0.47, 0.81}, 1.0, []int{1, 0, 0, 1}}, // 810 + 190 fills the GPU
		{[]float64{0.3, 0.32, 0.47, 0.81}, 1.5, []int{5, 0, 0, 0}},  // five 190s
		{[]float64{0, 0, 0.6, 0.5}, 1.2, []int{0, 0, 2, 0}},         // two 470s
		{[]float64{0, 0.4, 0.5, 0}, 1.2, []int{0, 3, 0, 0}},         // three 320s beat two 470s
		{[]float64{0, 0, 0, 0}, 0, []int{0, 0, 0, 0}},               // worth nothing: empty
	}
	for _, tt := range tests {
		got, pattern := b.knapsack(tt.y)
		if math.Abs(got-tt.want) > 1e-12 || !slices.Equal(pattern, tt.pattern) {
			t.Errorf("knapsack(%v) = %v %v, want %v %v", tt.y, got, pattern, tt.want, tt.pattern)
		}
	}
}

// TestPoolBoundByHand: sequences small enough to work out by hand the best
// online outcome (best) and the bound (want).
func TestPoolBoundByHand(t *testing.T) {
	tests := []struct {
		name       string
		gpus       int64
		arr        []Pod
		want, best float64
	}{
		{"810s then a whole pod that finds no GPU, small pods fill the holes", 2,
			[]Pod{frac(810), frac(810), whole(1), frac(190), frac(190)}, 2, 2},
		{"an 810 forced before the last whole pod, the second 810 finds no room", 2,
			[]Pod{frac(810), whole(1), frac(810), whole(1)}, 1.81, 1.81},
		{"whole pods only", 3, []Pod{whole(1), whole(2), whole(1)}, 3, 3},
		// The relaxation counts a multi-GPU pod's GPUs without asking that
		// they be free together: it lets the 2-GPU pod take the GPU left.
		{"a 2-GPU pod cannot follow", 2, []Pod{whole(1), whole(2), frac(500)}, 2, 1.5},
		{"fractions only: 600s one per GPU", 2, []Pod{frac(600), frac(600), frac(600)}, 1.2, 1.2},
		{"nothing arrives that asks for a GPU", 2, []Pod{{NumGPU: 0}}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := poolBound(tt.gpus, tt.arr)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("bound %v GPUs, want %v", got, tt.want)
			}
			if best := bestOnline(tt.gpus, tt.arr); math.Abs(best-tt.best) > 1e-9 {
				t.Errorf("exhaustive search: %v GPUs, want %v (the case is mis-stated)", best, tt.best)
			}
		})
	}
}

// TestPoolBoundAboveEveryOnlinePolicy: on random small sequences the bound
// is never below the best that any policy placing every pod that fits
// reaches on the pool, found by trying every placement.
func TestPoolBoundAboveEveryOnlinePolicy(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	sizes := []int{190, 250, 320, 470, 500, 650, 810}
	var tight int
	const runs = 300
	for run := range runs {
		gpus := int64(1 + rng.IntN(3))
		arr := make([]Pod, 3+rng.IntN(6))
		for i := range arr {
			switch r := rng.IntN(10); {
			case r < 4:
				arr[i] = frac(sizes[rng.IntN(len(sizes))])
			case r < 8:
				arr[i] = whole(1)
			default:
				arr[i] = whole(2)
			}
		}
		got, _, err := poolBound(gpus, arr)
		if err != nil {
			t.Fatal(err)
		}
		best := bestOnline(gpus, arr)
		if got < best-1e-9 {
			t.Fatalf("run %d, %d GPUs, %s: bound %v below a reachable %v", run, gpus, describe(arr), got, best)
		}
		if got < best+1e-9 {
			tight++
		}
	}
	// Not a requirement of a bound, but a sign that it is not vacuous.
	if tight < runs/2 {
		t.Errorf("the bound is tight on only %d of %d runs", tight, runs)
	}
	t.Logf("tight on %d of %d runs", tight, runs)
}

// bestOnline tries every placement of every arrival on a pool (a pod that
// fits must be placed; which GPUs it takes is the choice) and returns the
// most GPU allocated at the end.
func bestOnline(gpus int64, arr []Pod) float64 {
	free := make([]int, gpus)
	for i := range free {
		free[i] = packing.MilliPerGPU
	}
	var walk func(i int, free []int) int
	walk = func(i int, free []int) int {
		if i == len(arr) {
			var used int
			for _, f := range free {
				used += packing.MilliPerGPU - f
			}
			return used
		}
		p := arr[i]
		if p.NumGPU == 0 {
			return walk(i+1, free)
		}
		if p.GPUMilli == packing.MilliPerGPU {
			n := 0
			next := slices.Clone(free)
			for g := range next {
				if n < p.NumGPU && next[g] == packing.MilliPerGPU {
					next[g] = 0
					n++
				}
			}
			if n < p.NumGPU {
				return walk(i+1, free) // does not fit: not placed
			}
			return walk(i+1, next)
		}
		best, fits := 0, false
		for g, f := range free {
			if f < p.GPUMilli || slices.Index(free, f) != g {
				continue // too full, or the same free share as a GPU already tried
			}
			fits = true
			next := slices.Clone(free)
			next[g] -= p.GPUMilli
			best = max(best, walk(i+1, next))
		}
		if !fits {
			return walk(i+1, free)
		}
		return best
	}
	return float64(walk(0, free)) / packing.MilliPerGPU
}

func describe(arr []Pod) string {
	s := ""
	for _, p := range arr {
		if p.GPUMilli < packing.MilliPerGPU {
			s += fmt.Sprintf(" %dm", p.GPUMilli)
		} else {
			s += fmt.Sprintf(" %dG", p.NumGPU)
		}
	}
	return s
}
