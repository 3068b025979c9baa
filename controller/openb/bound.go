package openb

import (
	"errors"
	"fmt"
	"math"
	"slices"

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
// The cutting-plane search (a small simplex on the dual restricted to the
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
//	s.t. μ − Σ_k a_pk·y_k ≥ −ε_p  (each pattern p)
//	     y_k + β_k ≥ value_k      (each size k)
//	     μ + γ ≥ 1,  μ ≤ boundCap,  all ≥ 0
//
// with one slack per row, written so that the slacks of the pattern rows,
// β, γ and the cap's slack are a feasible starting basis (μ = y = 0). ε_p
// is a distinct tiny margin per pattern: without it the problem is highly
// degenerate (every pattern row is tight at y = 0). It and an inexact
// optimum cost nothing in validity: the figure is certified from y alone.
func (b *boundLP) restricted(c boundCase) ([]float64, float64, error) {
	K, P := len(b.sizes), len(b.patterns)
	mu, gamma := K, 2*K+1
	slack := 2*K + 2 // then one per row
	rows, cols := P+K+2, 2*K+2+P+K+2
	t := newTableau(rows, cols)
	for k := range K {
		t.cost[k] = -float64(c.lo[k])
		t.cost[K+1+k] = float64(b.total[k] - c.lo[k])
	}
	t.cost[mu] = float64(b.gpus - c.wmin)
	t.cost[gamma] = float64(c.wmax - c.wmin)
	r := 0
	for _, p := range b.patterns { // Σ a·y − μ + s = ε
		for k, n := range p {
			t.set(r, k, float64(n))
		}
		t.set(r, mu, -1)
		t.set(r, slack+r, 1)
		t.rhs(r, 1e-7*float64(r+1)/float64(P))
		t.basis[r] = slack + r
		r++
	}
	for k := range K { // y + β − s = value
		t.set(r, k, 1)
		t.set(r, K+1+k, 1)
		t.set(r, slack+r, -1)
		t.rhs(r, b.value[k])
		t.basis[r] = K + 1 + k
		r++
	}
	t.set(r, mu, 1) // μ + γ − s = 1
	t.set(r, gamma, 1)
	t.set(r, slack+r, -1)
	t.rhs(r, 1)
	t.basis[r] = gamma
	r++
	t.set(r, mu, 1) // μ + s = cap
	t.set(r, slack+r, 1)
	t.rhs(r, boundCap)
	t.basis[r] = slack + r
	if err := t.minimise(50 * (rows + cols)); err != nil {
		return nil, 0, err
	}
	x := t.solution()
	y := make([]float64, K)
	for k := range K {
		y[k] = max(x[k], 0)
	}
	return y, x[mu], nil
}

// tableau is a dense simplex tableau for min cost·x, A·x = b, x ≥ 0,
// started from a feasible basis whose columns are the identity. It is
// written here rather than taken from gonum (optimize/convex/lp), whose
// Simplex has no iteration limit and did not return on a degenerate
// instance of this problem; here Bland's rule and a limit bound the work.
type tableau struct {
	m, n  int
	a     []float64 // m rows of n coefficients and the right-hand side
	cost  []float64
	basis []int
}

func newTableau(m, n int) *tableau {
	return &tableau{m: m, n: n, a: make([]float64, m*(n+1)), cost: make([]float64, n), basis: make([]int, m)}
}

func (t *tableau) set(i, j int, v float64) { t.a[i*(t.n+1)+j] = v }
func (t *tableau) at(i, j int) float64     { return t.a[i*(t.n+1)+j] }
func (t *tableau) rhs(i int, v float64)    { t.set(i, t.n, v) }

// minimise pivots until no reduced cost is negative, or limit pivots.
// Stopping at the limit is not an error: the point is feasible, only
// perhaps not optimal.
func (t *tableau) minimise(limit int) error {
	const tol = 1e-9
	reduced := make([]float64, t.n)
	for range limit {
		// Reduced costs: cost − c_B·(column), the basis being the identity
		// of the current tableau.
		copy(reduced, t.cost)
		for i, bj := range t.basis {
			if cb := t.cost[bj]; cb != 0 {
				for j := range t.n {
					reduced[j] -= cb * t.at(i, j)
				}
			}
		}
		enter := -1
		for j := range t.n { // Bland: the first improving column
			if reduced[j] < -tol {
				enter = j
				break
			}
		}
		if enter < 0 {
			return nil
		}
		leave, best := -1, math.Inf(1)
		for i := range t.m {
			if v := t.at(i, enter); v > tol {
				ratio := t.at(i, t.n) / v
				if ratio < best-tol || ratio <= best+tol && leave >= 0 && t.basis[i] < t.basis[leave] {
					leave, best = i, ratio
				}
			}
		}
		if leave < 0 {
			return errors.New("openb: bound: the restricted problem is unbounded")
		}
		t.pivot(leave, enter)
	}
	return nil
}

func (t *tableau) pivot(r, c int) {
	w := t.n + 1
	row := t.a[r*w : (r+1)*w]
	p := row[c]
	for j := range row {
		row[j] /= p
	}
	for i := range t.m {
		if i == r {
			continue
		}
		other := t.a[i*w : (i+1)*w]
		if f := other[c]; f != 0 {
			for j := range other {
				other[j] -= f * row[j]
			}
		}
	}
	t.basis[r] = c
}

func (t *tableau) solution() []float64 {
	x := make([]float64, t.n)
	for i, bj := range t.basis {
		x[bj] = t.at(i, t.n)
	}
	return x
}
