package openb

import (
	"fmt"
	"slices"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// CeilingResult is Ceiling's answer: the replay's figures for the best
// prefix, and the partly free GPUs it leaves.
//
// Ceiling is a clairvoyant reference for the replay, not a policy: how much
// a packer could allocate if it knew the whole arrival sequence in advance
// and the cluster were one pool of GPUs (no nodes, so no CPU, memory or
// node boundaries, and no GPU model constraints). For a prefix of k
// arrivals it packs their GPU pods best-fit decreasing, then places the
// later arrivals best-fit as they come, a pod that fits nowhere being
// dropped as in the replay; it returns the best k from the point where the
// prefix asks for 90 % of the cluster (or from the empty prefix, when that
// one does not pack whole) up to the last prefix that packs whole. It is a
// heuristic, not a proven optimum; what it shows is how little room the
// trace's mix of sizes leaves above a good online policy
// (cmd/tessera-sim/README.md, "Target not reached").
type CeilingResult struct {
	Result
	// Prefix is the best k.
	Prefix int
	// Slivers counts, per free share (milli), the GPUs left partly free.
	Slivers map[int]int
}

// pool is the relaxed cluster: how many GPUs have each free share.
type pool [packing.MilliPerGPU + 1]int

// place puts one pod (n whole GPUs, or a fraction of milli) best-fit.
func (p *pool) place(n, milli int) bool {
	if n > 0 {
		if p[packing.MilliPerGPU] < n {
			return false
		}
		p[packing.MilliPerGPU] -= n
		p[0] += n
		return true
	}
	for f := milli; f <= packing.MilliPerGPU; f++ {
		if p[f] > 0 {
			p[f]--
			p[f-milli]++
			return true
		}
	}
	return false
}

func (p *pool) free() int64 {
	var s int64
	for f, n := range p {
		s += int64(f) * int64(n)
	}
	return s
}

// Ceiling computes the reference for one seed; step > 0 is the stride of
// the prefixes tried (1 tries every one).
func Ceiling(nodes []Node, pods []Pod, tune float64, seed uint64, step int) (CeilingResult, error) {
	if step < 1 {
		return CeilingResult{}, fmt.Errorf("openb: ceiling step %d must be at least 1", step)
	}
	if len(nodes) == 0 || len(pods) == 0 {
		return CeilingResult{}, fmt.Errorf("openb: need nodes and pods (got %d nodes, %d pods)", len(nodes), len(pods))
	}
	if err := CheckTune(tune); err != nil {
		return CeilingResult{}, err
	}
	sorted := SortByName(pods)
	var gpus int
	for _, n := range nodes {
		gpus += n.GPUs
	}
	capMilli := int64(gpus) * packing.MilliPerGPU
	if capMilli == 0 {
		return CeilingResult{}, fmt.Errorf("openb: the cluster has no GPUs")
	}
	seq := Arrivals(sorted, tune, capMilli, NewRand(seed))
	c := newCeilingRun(sorted, seq, gpus, step)
	c.best.Result = Result{Seed: seed, Tune: tune, PodsArrived: len(seq), GPUCapacity: int64(gpus)}

	// The first prefix worth trying: 90 % of the cluster asked for.
	c.try(c.firstAsking(capMilli * 9 / 10))
	if c.bestFree < 0 {
		// Even that prefix does not pack whole (a small cluster, large
		// pods, or fractions that pair badly): find the longest prefix
		// that packs and try from the one asking 90 % of what it asks.
		// Trying every prefix from the empty one took minutes on traces
		// with many fractions.
		c.try(c.firstAsking(c.asked[c.longestPacking()] * 9 / 10))
	}
	best := c.best
	best.AllocatedMilli = capMilli - c.bestFree
	best.GPUAllocated = float64(best.AllocatedMilli) / packing.MilliPerGPU
	best.GPUAllocationRate = float64(best.AllocatedMilli) / float64(capMilli)
	return best, nil
}

// gpuPod is what a pod asks of the pool: n whole GPUs, or milli of one.
type gpuPod struct{ n, milli int }

func shapeOf(p *Pod) gpuPod {
	if p.NumGPU == 1 && p.GPUMilli < packing.MilliPerGPU {
		return gpuPod{0, p.GPUMilli}
	}
	return gpuPod{p.NumGPU, 0}
}

func (g gpuPod) size() int {
	if g.n > 0 {
		return g.n * packing.MilliPerGPU
	}
	return g.milli
}

// ceilingRun is one seed's search for the best prefix.
type ceilingRun struct {
	sorted []Pod
	seq    []int // arrivals, indices into sorted
	gpus   int
	step   int
	// asked[k] is the GPU the first k arrivals ask for.
	asked []int64
	// prefix is pack's buffer.
	prefix   []gpuPod
	best     CeilingResult
	bestFree int64 // -1 until a prefix packs
}

func newCeilingRun(sorted []Pod, seq []int, gpus, step int) *ceilingRun {
	c := &ceilingRun{sorted: sorted, seq: seq, gpus: gpus, step: step, bestFree: -1}
	c.asked = make([]int64, len(seq)+1)
	for k, pi := range seq {
		c.asked[k+1] = c.asked[k] + sorted[pi].GPUMilliTotal()
	}
	return c
}

// firstAsking is the first prefix that asks for at least m.
func (c *ceilingRun) firstAsking(m int64) int {
	k, _ := slices.BinarySearch(c.asked, m)
	return min(k, len(c.seq))
}

// pack packs the GPU pods of the first k arrivals best-fit decreasing.
func (c *ceilingRun) pack(k int) (pool, bool) {
	c.prefix = c.prefix[:0]
	for _, pi := range c.seq[:k] {
		if c.sorted[pi].NumGPU > 0 {
			c.prefix = append(c.prefix, shapeOf(&c.sorted[pi]))
		}
	}
	slices.SortStableFunc(c.prefix, func(a, b gpuPod) int { return b.size() - a.size() })
	var p pool
	p[packing.MilliPerGPU] = c.gpus
	for _, g := range c.prefix {
		if !p.place(g.n, g.milli) {
			return p, false
		}
	}
	return p, true
}

// try tries every step-th prefix from from on, until one does not pack
// whole: each packed, then the later arrivals placed best-fit as they
// come; the one leaving the least free is the best so far.
func (c *ceilingRun) try(from int) {
	for k := from; k <= len(c.seq); k += c.step {
		p, fits := c.pack(k)
		if !fits {
			// Prefixes only grow from here; best-fit decreasing on a
			// superset is taken not to pack whole either (a heuristic).
			return
		}
		placed, failed := k, 0
		for _, pi := range c.seq[k:] {
			if c.sorted[pi].NumGPU == 0 {
				placed++ // CPU-only: no CPU limits in this relaxation
				continue
			}
			g := shapeOf(&c.sorted[pi])
			if p.place(g.n, g.milli) {
				placed++
			} else {
				failed++
			}
		}
		if free := p.free(); c.bestFree < 0 || free < c.bestFree {
			c.bestFree = free
			c.best.Prefix, c.best.PodsPlaced, c.best.PodsFailed = k, placed, failed
			c.best.Slivers = map[int]int{}
			for f := 1; f < packing.MilliPerGPU; f++ {
				if p[f] > 0 {
					c.best.Slivers[f] = p[f]
				}
			}
		}
	}
}

// longestPacking finds the longest prefix that packs whole, by bisection
// under try's heuristic (packing is taken to fail for every longer prefix
// once it fails).
func (c *ceilingRun) longestPacking() int {
	lo, hi := 0, len(c.seq) // pack(lo) holds (the empty prefix always packs)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if _, ok := c.pack(mid); ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
