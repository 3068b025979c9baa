package packing

import "math"

// Placer chooses placements under one policy. Its scratch buffers and
// per-node caches make Place and Score allocation-free once warm; the GPU
// index slices it returns stay valid only until its next call. Not safe for
// concurrent use.
type Placer struct {
	Policy Policy
	// Workload is the expected pod mix FGD scores against. When it is nil or
	// empty FGD falls back to BestFit.
	Workload *Workload

	best    []int // GPUs of the best placement so far
	cand    []int // GPUs of the candidate being scored
	out     []int // GPUs returned to the caller
	maxCPU  int64 // BestFit normalisation: the largest node's CPU and GPU
	maxGPU  int64
	fgd     fgdState
	scratch [2][]int
}

// NewPlacer returns a Placer for the policy; w may be nil for BestFit and
// FirstFit.
func NewPlacer(policy Policy, w *Workload) *Placer {
	return &Placer{Policy: policy, Workload: w}
}

// Place picks a node and GPUs for req among nodes. It returns the node's
// index, the GPU indices on it (nil for a CPU-only request) and false when
// the request fits nowhere. Ties go to the lowest node index, so the result
// is deterministic.
func (p *Placer) Place(nodes []NodeState, req Request) (node int, gpus []int, ok bool) {
	r := req.norm()
	p.prepare(nodes)
	bestNode, bestScore := -1, math.Inf(-1)
	for i := range nodes {
		n := &nodes[i]
		if !fits(n, &r) {
			continue
		}
		if p.Policy == FirstFit {
			p.best = p.firstGPUs(n, &r, p.best[:0])
			bestNode = i
			break
		}
		s, g := p.score(i, n, &r)
		if s > bestScore {
			bestScore, bestNode = s, i
			p.best = append(p.best[:0], g...)
		}
	}
	if bestNode < 0 {
		return -1, nil, false
	}
	return bestNode, p.result(&r, p.best), true
}

// Score rates placing req on one node: higher is better, comparable across
// nodes for the same request and the same Placer. It also returns the GPUs
// it would use. ok is false when the request does not fit the node. The
// scheduling core calls it when it filters nodes itself (NVLink, taints).
// BestFit normalises by the largest node seen by Place or SetClusterMax.
func (p *Placer) Score(node *NodeState, req Request) (score float64, gpus []int, ok bool) {
	r := req.norm()
	if !fits(node, &r) {
		return 0, nil, false
	}
	if p.maxCPU == 0 && p.maxGPU == 0 {
		p.observe(node)
	}
	if p.Policy == FirstFit {
		p.best = p.firstGPUs(node, &r, p.best[:0])
		return 0, p.result(&r, p.best), true
	}
	s, g := p.score(-1, node, &r)
	p.best = append(p.best[:0], g...)
	return s, p.result(&r, p.best), true
}

// SetClusterMax sets the per-node CPU (milli) and GPU (count) that BestFit
// divides by; Place sets it from the nodes it is given.
func (p *Placer) SetClusterMax(cpuMilli int64, gpus int) {
	p.maxCPU, p.maxGPU = cpuMilli, int64(gpus)*MilliPerGPU
}

func (p *Placer) result(r *Request, g []int) []int {
	if !r.WantsGPU() {
		return nil
	}
	p.out = append(p.out[:0], g...)
	return p.out
}

func (p *Placer) prepare(nodes []NodeState) {
	p.maxCPU, p.maxGPU = 0, 0
	for i := range nodes {
		p.observe(&nodes[i])
	}
}

func (p *Placer) observe(n *NodeState) {
	if n.CPUMilli > p.maxCPU {
		p.maxCPU = n.CPUMilli
	}
	if g := int64(len(n.GPUs)) * MilliPerGPU; g > p.maxGPU {
		p.maxGPU = g
	}
}

// score dispatches to the policy; idx is the node's index for FGD's cache
// (-1: uncached).
func (p *Placer) score(idx int, n *NodeState, r *Request) (float64, []int) {
	if (p.Policy == FGD || p.Policy == Tessera) && p.Workload != nil && p.Workload.total > 0 {
		return p.fgdScore(idx, n, r, p.Policy == Tessera)
	}
	return p.bestFitScore(n, r)
}

// firstGPUs takes the lowest-index usable GPUs.
func (p *Placer) firstGPUs(n *NodeState, r *Request, dst []int) []int {
	want := r.GPUs
	if want == 0 && r.GPUMilli > 0 {
		want = 1
	}
	for i := range n.GPUs {
		if len(dst) == want {
			break
		}
		if gpuUsable(&n.GPUs[i], r) {
			dst = append(dst, i)
		}
	}
	return dst
}

// tightestGPU returns the usable GPU with the least free share (lowest
// index on ties), so fractions fill partly used GPUs first.
func tightestGPU(n *NodeState, r *Request) int {
	best := -1
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if gpuUsable(g, r) && (best < 0 || g.FreeMilli < n.GPUs[best].FreeMilli) {
			best = i
		}
	}
	return best
}

func freeGPUMilli(n *NodeState) int64 {
	var s int64
	for i := range n.GPUs {
		s += int64(n.GPUs[i].FreeMilli)
	}
	return s
}
