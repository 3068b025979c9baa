package openb

import (
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// BoundResult is Bound's answer for one seed.
//
// Bound is an upper bound on the GPU allocation rate that any policy which
// places every pod that fits can reach on a replay, with the cluster seen as
// one pool of GPUs: a fraction fits when some GPU has that much free, a pod
// of n whole GPUs when n GPUs are wholly free (no nodes, so no CPU, memory,
// node or GPU-model limits). Unlike Ceiling, which is a good packing, this
// is a limit: no policy on the pool can do better.
//
// Why it holds. Let t1 be the arrival of the last single-GPU whole pod that
// is placed. When it arrived some GPU was wholly free, and so it was for
// every earlier arrival (nothing leaves): every fraction that arrived before
// t1 fitted, so it was placed. The next single-GPU whole pod (if any) fails,
// so from then on no GPU is wholly free, and the whole GPUs placed are those
// of pods arriving before it. Fractions arriving after t1 may or may not be
// placed. So for each possible t1 the allocation is at most the optimum of:
// place W whole GPUs (at least the single-GPU pods before t1, at most the
// whole GPUs that arrived before the next single-GPU pod) and n_k fractions
// of each size k (at least those before t1, at most all that arrive), the
// fractions packed into the GPUs the whole pods leave. The linear relaxation
// of that program (GPUs filled by patterns of sizes, counts fractional) is
// bounded above by its dual, and the bound is the largest over t1.
//
// The figure is certified, not just solved for: any dual point y ≥ 0 (a
// value per fraction size) gives the upper bound UB(y) below, whatever y is.
// The cutting-plane search (gonum's simplex on the dual restricted to the
// patterns found so far, the most violated pattern found by an exact
// knapsack) only chooses y; the bound reported is UB(y) evaluated again with
// the exact knapsack, so an inexact solve can loosen it but not make it
// wrong. cmd/tessera-sim/README.md ("Target not reached") reads it.
type BoundResult struct {
	Result
	// Last is the t1 at which the bound is largest: the index (0-based) of
	// the arrival after which no single-GPU whole pod is placed in the
	// bounding program; -1 when it is the case where none is.
	Last int
}

// Bound computes the pool bound for one seed.
func Bound(nodes []Node, pods []Pod, tune float64, seed uint64) (BoundResult, error) {
	if len(nodes) == 0 || len(pods) == 0 {
		return BoundResult{}, fmt.Errorf("openb: need nodes and pods (got %d nodes, %d pods)", len(nodes), len(pods))
	}
	if err := CheckTune(tune); err != nil {
		return BoundResult{}, err
	}
	var gpus int64
	for _, n := range nodes {
		gpus += int64(n.GPUs)
	}
	if gpus == 0 {
		return BoundResult{}, fmt.Errorf("openb: the cluster has no GPUs")
	}
	sorted := SortByName(pods)
	seq := Arrivals(sorted, tune, gpus*packing.MilliPerGPU, NewRand(seed))
	arr := make([]Pod, len(seq))
	for i, pi := range seq {
		arr[i] = sorted[pi]
	}
	best, last, err := poolBound(gpus, arr)
	if err != nil {
		return BoundResult{}, err
	}
	res := BoundResult{Result: Result{Seed: seed, Tune: tune, PodsArrived: len(seq), GPUCapacity: gpus}, Last: last}
	res.GPUAllocated = best
	res.AllocatedMilli = int64(math.Ceil(best * packing.MilliPerGPU))
	res.GPUAllocationRate = best / float64(gpus)
	return res, nil
}

// poolBound is Bound on an arrival sequence: the bound in GPUs, and the t1
// where it is reached.
func poolBound(gpus int64, arr []Pod) (float64, int, error) {
	b, cases := newBoundLP(gpus, arr)
	best, bestAt := math.Inf(-1), -1
	// The bound peaks where saturation comes latest, so the cases are taken
	// from there outwards. Every dual point found is a certificate for every
	// case, so a case that one of them already holds to the best figure is
	// not solved; the cases past saturation (what they must place does not
	// fit) fall to the certificates of the first ones solved.
	peak, err := b.latestFeasible(cases)
	if err != nil {
		return 0, 0, err
	}
	visit := func(c boundCase) error {
		if slices.ContainsFunc(b.duals, func(d dual) bool { return b.upper(c, d) <= best }) {
			return nil
		}
		v, err := b.solve(c)
		if err != nil {
			return err
		}
		if v > best {
			best, bestAt = v, c.at
		}
		return nil
	}
	for i := peak; i >= 0; i-- {
		if err := visit(cases[i]); err != nil {
			return 0, 0, err
		}
	}
	for i := peak + 1; i < len(cases); i++ {
		if err := visit(cases[i]); err != nil {
			return 0, 0, err
		}
	}
	// An allocation: never below nothing or above the pool itself.
	return min(max(best, 0), float64(gpus)), bestAt, nil
}

// boundCase is one candidate t1: what the program must and may place.
type boundCase struct {
	at         int     // t1, the arrival's index; -1: no single-GPU whole pod placed
	lo         []int64 // fractions per size that must be placed
	wmin, wmax int64   // whole GPUs placed: at least, at most
}

// boundLP holds what does not change between candidates: the pool, the
// fraction sizes, how many of each arrive, and the patterns found so far
// (a pattern is valid for every candidate, so they are kept).
type boundLP struct {
	gpus     int64
	sizes    []int     // fraction sizes in milli, ascending
	value    []float64 // sizes[k] / 1000: what one placed fraction adds
	total    []int64   // fractions per size over the whole replay
	unit     int       // gcd of the sizes and 1000: the knapsack's step
	patterns [][]int   // per pattern, how many of each size one GPU holds
	duals    []dual    // every dual point found: each certifies every case
}

// dual is a dual point: a value per fraction size, and ks, the most a
// GPU's worth of fractions is worth at those values (the exact knapsack).
type dual struct {
	y  []float64
	ks float64
	// overflow: the restricted problem's value of a GPU reached boundCap,
	// i.e. its primal needs more GPUs than the pool has.
	overflow bool
}

// boundCap bounds the dual's value of a GPU in the restricted problem
// (the primal may overflow the pool at this cost per GPU), so that the
// restricted problem is bounded even when a case cannot fit at all. It
// shapes the search only: the certified figure does not use it.
const boundCap = 100

// boundMaxCuts bounds the cutting planes per case.
const boundMaxCuts = 400

func newBoundLP(gpus int64, arr []Pod) (*boundLP, []boundCase) {
	b := &boundLP{gpus: gpus, unit: packing.MilliPerGPU}
	isFraction := func(p *Pod) bool { return p.NumGPU == 1 && p.GPUMilli < packing.MilliPerGPU }
	for i := range arr {
		if isFraction(&arr[i]) && !slices.Contains(b.sizes, arr[i].GPUMilli) {
			b.sizes = append(b.sizes, arr[i].GPUMilli)
		}
	}
	slices.Sort(b.sizes)
	index := make(map[int]int, len(b.sizes))
	for k, s := range b.sizes {
		index[s] = k
		b.value = append(b.value, float64(s)/packing.MilliPerGPU)
		b.unit = gcd(b.unit, s)
		one := make([]int, len(b.sizes))
		b.patterns = append(b.patterns, one)
	}
	for k, s := range b.sizes {
		b.patterns[k][k] = packing.MilliPerGPU / s // one size alone: keeps the search bounded
	}
	b.total = make([]int64, len(b.sizes))

	// One pass: fractions before each arrival, whole GPUs before it, and
	// the single-GPU whole pods where a case starts.
	lo := make([]int64, len(b.sizes))
	units := make([]int64, len(arr)+1) // whole GPUs among arrivals [0, i)
	var singles int64
	cases := []boundCase{{at: -1, lo: make([]int64, len(b.sizes))}}
	for i := range arr {
		p := &arr[i]
		units[i+1] = units[i]
		switch {
		case isFraction(p):
			k := index[p.GPUMilli]
			b.total[k]++
			lo[k]++
		case p.NumGPU > 0:
			units[i+1] += int64(p.NumGPU)
			if p.NumGPU == 1 {
				// This pod is t1: the fractions before it are forced (lo
				// does not count p, which is whole), and so is every
				// single-GPU whole pod up to it.
				singles++
				cases = append(cases, boundCase{at: i, lo: slices.Clone(lo), wmin: singles})
			}
		}
	}
	// wmax: whole GPUs among arrivals before the next single-GPU whole pod,
	// the one that fails (or all of them when none does).
	next := len(arr)
	for c := len(cases) - 1; c >= 0; c-- {
		cases[c].wmax = units[next]
		next = cases[c].at
		if next < 0 {
			next = 0
		}
	}
	return b, cases
}

// latestFeasible finds, by bisection, the last case whose forced pods
// fit the pool in the relaxation (forced sets only grow from case to
// case, so feasibility is monotone). It only orders the search: every case
// is still solved or ruled out by a certificate.
func (b *boundLP) latestFeasible(cases []boundCase) (int, error) {
	lo, hi := 0, len(cases)-1 // cases[0] forces nothing: always feasible
	for lo < hi {
		mid := (lo + hi + 1) / 2
		ok := b.demand(cases[mid]) <= float64(b.gpus)
		if ok {
			if _, err := b.solve(cases[mid]); err != nil {
				return 0, err
			}
			ok = !b.duals[len(b.duals)-1].overflow
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, nil
}

// demand is what the case must place, in GPUs.
func (b *boundLP) demand(c boundCase) float64 {
	d := float64(c.wmin)
	for k, n := range c.lo {
		d += float64(n) * b.value[k]
	}
	return d
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// knapsack returns the most that one GPU of fractions is worth at values y,
// and a pattern that reaches it (unbounded knapsack, exact: sizes are whole
// multiples of unit).
func (b *boundLP) knapsack(y []float64) (float64, []int) {
	capacity := packing.MilliPerGPU / b.unit
	best := make([]float64, capacity+1)
	take := make([]int, capacity+1) // size index taken last at this capacity, -1: none
	for c := 0; c <= capacity; c++ {
		take[c] = -1
		if c > 0 && best[c-1] > best[c] {
			best[c], take[c] = best[c-1], -2 // a unit left empty
		}
		for k, s := range b.sizes {
			w := s / b.unit
			if w <= c && best[c-w]+y[k] > best[c] {
				best[c], take[c] = best[c-w]+y[k], k
			}
		}
	}
	pattern := make([]int, len(b.sizes))
	for c := capacity; c > 0 && take[c] != -1; {
		if take[c] == -2 {
			c--
			continue
		}
		pattern[take[c]]++
		c -= b.sizes[take[c]] / b.unit
	}
	return best[capacity], pattern
}

// upper is UB(y): for any y ≥ 0 and μ ≥ knapsack(y), Lagrangian duality
// bounds the case's program by
//
//	μ·gpus + max_{W∈[wmin,wmax]} W·(1−μ) + Σ_k max_{n∈[lo_k,total_k]} n·(value_k − y_k)
//
// which is piecewise linear in μ; its least value is at μ = ks or at μ = 1.
func (b *boundLP) upper(c boundCase, d dual) float64 {
	var frac float64
	for k, v := range b.value {
		if diff := v - d.y[k]; diff > 0 {
			frac += float64(b.total[k]) * diff
		} else {
			frac += float64(c.lo[k]) * diff
		}
	}
	at := func(mu float64) float64 {
		w := c.wmin
		if mu < 1 {
			w = c.wmax
		}
		return mu*float64(b.gpus) + float64(w)*(1-mu) + frac
	}
	v := at(d.ks)
	if d.ks < 1 {
		v = min(v, at(1))
	}
	return v
}

// solve finds a dual point for the case by cutting planes, keeps it, and
// returns the certified bound at it. When the cuts stop short of
// convergence (the solver's tolerance, or boundMaxCuts) the figure is
// still a bound, only perhaps looser than the program's optimum.
func (b *boundLP) solve(c boundCase) (float64, error) {
	var last dual
	for range boundMaxCuts {
		y, mu, err := b.restricted(c)
		if err != nil {
			if last.y == nil {
				return 0, fmt.Errorf("openb: bound: restricted dual: %w", err)
			}
			break
		}
		ks, pattern := b.knapsack(y)
		last = dual{y: y, ks: ks, overflow: mu >= boundCap*(1-1e-9)}
		if ks <= mu+1e-9 {
			break
		}
		if slices.ContainsFunc(b.patterns, func(p []int) bool { return slices.Equal(p, pattern) }) {
			break // within the solver's tolerance: no further cut to add
		}
		b.patterns = append(b.patterns, pattern)
	}
	b.duals = append(b.duals, last)
	return b.upper(c, last), nil
}

// restricted solves the case's dual over the patterns found so far:
//
//	min  Σ_k −lo_k·y_k + (gpus − wmin)·μ + Σ_k (total_k − lo_k)·β_k + (wmax − wmin)·γ
//	s.t. μ − Σ_k a_pk·y_k ≥ 0   (each pattern p)
//	     y_k + β_k ≥ value_k    (each size k)
//	     μ + γ ≥ 1,  μ ≤ boundCap,  all ≥ 0
//
// in gonum's standard form (equalities with one slack per row).
func (b *boundLP) restricted(c boundCase) ([]float64, float64, error) {
	K, P := len(b.sizes), len(b.patterns)
	mu, gamma := K, 2*K+1
	slack := 2*K + 2
	rows, cols := P+K+2, 2*K+2+P+K+2
	A := mat.NewDense(rows, cols, nil)
	rhs := make([]float64, rows)
	cost := make([]float64, cols)
	for k := range K {
		cost[k] = -float64(c.lo[k])
		cost[K+1+k] = float64(b.total[k] - c.lo[k])
	}
	cost[mu] = float64(b.gpus - c.wmin)
	cost[gamma] = float64(c.wmax - c.wmin)
	r := 0
	for _, p := range b.patterns {
		A.Set(r, mu, 1)
		for k, n := range p {
			if n > 0 {
				A.Set(r, k, -float64(n))
			}
		}
		A.Set(r, slack+r, -1)
		r++
	}
	for k := range K {
		A.Set(r, k, 1)
		A.Set(r, K+1+k, 1)
		A.Set(r, slack+r, -1)
		rhs[r] = b.value[k]
		r++
	}
	A.Set(r, mu, 1)
	A.Set(r, gamma, 1)
	A.Set(r, slack+r, -1)
	rhs[r] = 1
	r++
	A.Set(r, mu, 1)
	A.Set(r, slack+r, 1)
	rhs[r] = boundCap
	_, x, err := lp.Simplex(cost, A, rhs, 1e-10, nil)
	if err != nil {
		return nil, 0, err
	}
	y := make([]float64, K)
	for k := range K {
		y[k] = max(x[k], 0)
	}
	return y, x[mu], nil
}
