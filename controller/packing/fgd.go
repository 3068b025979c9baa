package packing

import (
	"fmt"
	"math"
	"strings"
)

// Workload is the pod mix a scheduler expects: FGD measures fragmentation
// as the free GPU capacity this mix could not use. Build it from the pods
// the scheduler knows (pending and placed), not from a fixed table, so it
// follows whatever trace or cluster it runs on.
type Workload struct {
	index   map[string]int // type key -> index in types
	types   []wtype
	classes []wclass
	total   float64 // weight of the GPU types
	version uint64  // bumped on every change; keys FGD's per-node cache
	sorted  bool

	gpuPerCPU, gpuPerMem float64
	ratioVersion         uint64

	fill        map[string][]float64 // per GPU model: fillValues
	fillVersion uint64
}

// wtype is one pod shape: its CPU and memory, and its GPU class.
type wtype struct {
	cpu, mem int64
	class    int
	weight   float64
}

// wclass groups the shapes that ask the same of the GPUs: k GPUs each with
// milli free (MilliPerGPU for whole GPUs), in one sharing mode, of the
// allowed models. Fragmentation depends on the CPU and memory of a shape
// only through whether it fits, so scoring walks classes, not shapes.
type wclass struct {
	req    Request // GPUs, GPUMilli, Sharing and Models set
	weight float64
	lo, hi int // its shapes are types[lo:hi] once sorted
}

// NewWorkload returns an empty workload.
func NewWorkload() *Workload { return &Workload{index: map[string]int{}} }

// Add counts weight more pods shaped like req (usually weight 1 per pod).
// CPU-only pods are ignored: they use no GPU, so they change every node's
// fragmentation by the same amount and never change FGD's choice; their
// CPU use is already felt through the GPU shapes' CPU fit.
func (w *Workload) Add(req Request, weight float64) {
	r := req.norm()
	if !r.WantsGPU() || weight <= 0 {
		return
	}
	if w.index == nil {
		w.index = map[string]int{}
	}
	models := strings.Join(r.Models, "|")
	ckey := fmt.Sprintf("%d/%d/%d/%s", r.GPUs, r.GPUMilli, r.Sharing, models)
	tkey := fmt.Sprintf("%d/%d/%s", r.CPUMilli, r.Memory, ckey)
	w.total += weight
	w.version++
	if i, ok := w.index[tkey]; ok {
		w.types[i].weight += weight
		w.classes[w.types[i].class].weight += weight
		return
	}
	c, ok := w.index["class:"+ckey]
	if !ok {
		c = len(w.classes)
		w.index["class:"+ckey] = c
		cr := Request{GPUs: r.GPUs, GPUMilli: r.GPUMilli, Sharing: r.Sharing}
		if len(r.Models) > 0 {
			cr.Models = append([]string(nil), r.Models...)
		}
		w.classes = append(w.classes, wclass{req: cr})
	}
	w.classes[c].weight += weight
	w.index[tkey] = len(w.types)
	w.types = append(w.types, wtype{cpu: r.CPUMilli, mem: r.Memory, class: c, weight: weight})
	w.sorted = false
}

// Len is the number of distinct GPU pod shapes.
func (w *Workload) Len() int { return len(w.types) }

// prepare groups the shapes by class (stable order, so results are
// deterministic) and rebuilds the index.
func (w *Workload) prepare() {
	if w.sorted {
		return
	}
	byClass := make([][]wtype, len(w.classes))
	for _, t := range w.types {
		byClass[t.class] = append(byClass[t.class], t)
	}
	w.types = w.types[:0]
	for c := range byClass {
		w.classes[c].lo = len(w.types)
		w.types = append(w.types, byClass[c]...)
		w.classes[c].hi = len(w.types)
	}
	for k, i := range w.index {
		if !strings.HasPrefix(k, "class:") {
			delete(w.index, k)
		}
		_ = i
	}
	for i, t := range w.types {
		c := w.classes[t.class].req
		models := strings.Join(c.Models, "|")
		w.index[fmt.Sprintf("%d/%d/%d/%d/%d/%s", t.cpu, t.mem, c.GPUs, c.GPUMilli, c.Sharing, models)] = i
	}
	w.sorted = true
}

// fgdState holds FGD's scratch space and per-node cache.
type fgdState struct {
	gpus    []GPU
	cache   []fragEntry
	version uint64
	w       *Workload
	// memo maps a node state to its fragmentation: many nodes share a
	// shape and a state (e.g. every empty node of one type), so most
	// evaluations are lookups.
	memo map[memoKey]float64
}

type memoKey struct {
	cpu, mem int64
	key      [3]uint64
	model    string
}

// memoLimit bounds the memo; it is cleared when full.
const memoLimit = 1 << 18

type fragEntry struct {
	valid    bool
	cpu, mem int64
	key      [3]uint64
	frag     float64
}

// CacheByIndex, when set, lets Place remember each node's fragmentation by
// its index in the nodes slice: the caller promises that index i names the
// same node (same GPU models) on every call. The cache checks the node's
// free CPU, memory and per-GPU shares, so allocations need no invalidation.
func (p *Placer) CacheByIndex(on bool) {
	p.fgd.cache = p.fgd.cache[:0]
	if on {
		p.fgd.cache = make([]fragEntry, 0, 1024)
	} else {
		p.fgd.cache = nil
	}
}

// fragKey packs the per-GPU free share and sharing mode; ok is false when
// the node has too many GPUs to pack.
func fragKey(gpus []GPU) (k [3]uint64, ok bool) {
	if len(gpus) > 15 {
		return k, false
	}
	for i := range gpus {
		v := uint64(gpus[i].FreeMilli)&0x3ff | uint64(gpus[i].Sharing&3)<<10
		k[i/5] |= v << (12 * (i % 5))
	}
	k[2] |= uint64(len(gpus)) << 60
	return k, true
}

// fragmentation is FGD's measure of a node: the expected amount of its free
// GPU capacity (milli-GPU) that a pod drawn from the workload could not use.
// For a shape that cannot run on the node at all (CPU, memory, too few
// usable GPUs, wrong model) every free share is lost; for one that can, the
// free shares of the GPUs it could not use (too little free, wrong model or
// sharing mode) are lost.
func fragmentation(w *Workload, cpu, mem int64, gpus []GPU) float64 {
	var total int64
	for i := range gpus {
		total += int64(gpus[i].FreeMilli)
	}
	if total == 0 {
		return 0
	}
	var f float64
	for ci := range w.classes {
		c := &w.classes[ci]
		var wfit float64
		for _, t := range w.types[c.lo:c.hi] {
			if t.cpu <= cpu && t.mem <= mem {
				wfit += t.weight
			}
		}
		if wfit < c.weight {
			f += (c.weight - wfit) * float64(total)
		}
		if wfit == 0 {
			continue
		}
		f += wfit * float64(lostFor(&c.req, gpus, total))
	}
	return f / w.total
}

// lostFor is the free share of the GPUs that a pod of class c could not
// use on a node whose CPU and memory it fits: all of it when too few GPUs
// are usable, else the free share of the unusable ones.
func lostFor(c *Request, gpus []GPU, total int64) int64 {
	need, d := c.GPUs, c.GPUMilli
	if need > 0 {
		d = MilliPerGPU
	} else {
		need = 1
	}
	usable := 0
	var lost int64
	if len(c.Models) == 0 {
		// The common case, without the model check.
		for i := range gpus {
			g := &gpus[i]
			if g.FreeMilli >= d && (g.Sharing == SharingNone || g.Sharing == c.Sharing) {
				usable++
			} else {
				lost += int64(g.FreeMilli)
			}
		}
	} else {
		for i := range gpus {
			if gpuUsable(&gpus[i], c) {
				usable++
			} else {
				lost += int64(gpus[i].FreeMilli)
			}
		}
	}
	if usable < need {
		return total
	}
	return lost
}

// frag is fragmentation through the memo. Nodes whose GPUs are of mixed
// models, or too many to pack, are computed directly.
func (p *Placer) frag(cpu, mem int64, gpus []GPU) float64 {
	w := p.Workload
	p.syncWorkload()
	k, ok := fragKey(gpus)
	if !ok || len(gpus) == 0 {
		return fragmentation(w, cpu, mem, gpus)
	}
	model := gpus[0].Model
	for i := 1; i < len(gpus); i++ {
		if gpus[i].Model != model {
			return fragmentation(w, cpu, mem, gpus)
		}
	}
	mk := memoKey{cpu: cpu, mem: mem, key: k, model: model}
	if f, hit := p.fgd.memo[mk]; hit {
		return f
	}
	f := fragmentation(w, cpu, mem, gpus)
	if p.fgd.memo == nil || len(p.fgd.memo) >= memoLimit {
		p.fgd.memo = make(map[memoKey]float64, 1024)
	}
	p.fgd.memo[mk] = f
	return f
}

// syncWorkload drops what was computed for an older workload.
func (p *Placer) syncWorkload() {
	w := p.Workload
	if p.fgd.w != w || p.fgd.version != w.version {
		p.fgd.w, p.fgd.version = w, w.version
		clear(p.fgd.cache)
		clear(p.fgd.memo)
	}
}

// nodeFrag is fragmentation with the per-node cache.
func (p *Placer) nodeFrag(idx int, n *NodeState) float64 {
	p.syncWorkload()
	if p.fgd.cache == nil || idx < 0 {
		return p.frag(n.FreeCPUMilli, n.FreeMemory, n.GPUs)
	}
	for len(p.fgd.cache) <= idx {
		p.fgd.cache = append(p.fgd.cache, fragEntry{})
	}
	k, ok := fragKey(n.GPUs)
	e := &p.fgd.cache[idx]
	if ok && e.valid && e.cpu == n.FreeCPUMilli && e.mem == n.FreeMemory && e.key == k {
		return e.frag
	}
	f := p.frag(n.FreeCPUMilli, n.FreeMemory, n.GPUs)
	*e = fragEntry{valid: ok, cpu: n.FreeCPUMilli, mem: n.FreeMemory, key: k, frag: f}
	return f
}

// fgdScore is −(fragmentation after − fragmentation before): the placement
// that grows the node's fragmentation least scores highest. For a fraction
// every distinct usable GPU state is tried. With tessera set it adds
// Tessera's two refinements (tessera.go) on the exact Δ; without, it is
// FGD as published (paperScore).
func (p *Placer) fgdScore(idx int, n *NodeState, r *Request, tessera bool) (float64, []int) {
	w := p.Workload
	w.prepare()
	var fv []float64 // Tessera: the leftover's expected final waste, by GPU model
	var fvModel string
	before := p.nodeFrag(idx, n)
	cpu, mem := n.FreeCPUMilli-r.CPUMilli, n.FreeMemory-r.Memory
	p.fgd.gpus = append(p.fgd.gpus[:0], n.GPUs...)
	gs := p.fgd.gpus
	g := p.cand[:0]
	var after float64
	switch {
	case r.GPUs > 0:
		g = p.firstGPUs(n, r, g)
		for _, i := range g {
			gs[i].FreeMilli -= MilliPerGPU
		}
		after = p.frag(cpu, mem, gs)
	case r.GPUMilli > 0:
		bestGPU, bestAfter := -1, 0.0
		for i := range n.GPUs {
			gi := &n.GPUs[i]
			if !gpuUsable(gi, r) || seenState(n.GPUs[:i], gi, r) {
				continue
			}
			old := gs[i]
			gs[i].FreeMilli -= r.GPUMilli
			gs[i].Sharing = r.Sharing
			a := p.frag(cpu, mem, gs)
			if tessera {
				if fv == nil || gi.Model != fvModel {
					fv, fvModel = w.fillValues(gi.Model), gi.Model
				}
				a += fillWeight * (fv[gi.FreeMilli-r.GPUMilli] - fv[gi.FreeMilli])
			}
			gs[i] = old
			if bestGPU < 0 || a < bestAfter ||
				(a == bestAfter && gi.FreeMilli < n.GPUs[bestGPU].FreeMilli) {
				bestGPU, bestAfter = i, a
			}
		}
		g = append(g, bestGPU)
		after = bestAfter
	default:
		after = p.frag(cpu, mem, gs)
	}
	p.cand = g
	score := before - after
	if !tessera {
		return paperScore(score), g
	}
	// Tessera's refinement: FGD sees CPU and memory only through whether
	// a whole pod shape still fits, so it happily spends a node's CPU where
	// its free GPUs will need it. Add the change in the GPU share that the
	// node's free CPU or memory could no longer feed at the workload's
	// average CPU and memory per GPU, in the same milli-GPU unit.
	w.ratios()
	freeGPU := freeGPUMilli(n)
	score += stranded(n.FreeCPUMilli, n.FreeMemory, freeGPU, w) -
		stranded(cpu, mem, freeGPU-r.GPUMilliTotal(), w)
	return score, g
}

// paperScore is how the FGD paper's scheduler plugin turns a change of
// fragmentation (milli-GPU) into a node score: a whole number from 0 to 100,
// 100·sigmoid(Δ/1000), truncated. The coarseness is part of FGD as published:
// nodes whose fragmentation grows by about the same amount (within roughly
// 40 milli-GPU near zero) tie, and ties go to the lowest node index, so FGD
// keeps filling the same nodes. Scoring by the exact Δ instead lets small
// differences from rare pod shapes spread pods over the cluster, and costs
// 0.8 points of allocation on the openb trace (cmd/tessera-sim/README.md).
func paperScore(delta float64) float64 {
	return math.Trunc(100 / (1 + math.Exp(-delta/MilliPerGPU)))
}

// stranded is the free GPU share that the node's free CPU and memory could
// not feed at the workload's average CPU and memory per GPU.
func stranded(cpu, mem, gpu int64, w *Workload) float64 {
	s := float64(gpu) - float64(cpu)*w.gpuPerCPU
	if m := float64(gpu) - float64(mem)*w.gpuPerMem; m > s {
		s = m
	}
	if s < 0 {
		return 0
	}
	return s
}

// ratios computes the workload's GPU per CPU and per memory (weighted by
// pod count), once per workload version.
func (w *Workload) ratios() {
	if w.ratioVersion == w.version+1 {
		return
	}
	var g, c, m float64
	for _, t := range w.types {
		cl := w.classes[t.class].req
		g += t.weight * float64(cl.GPUMilliTotal())
		c += t.weight * float64(t.cpu)
		m += t.weight * float64(t.mem)
	}
	w.gpuPerCPU, w.gpuPerMem = 0, 0
	if c > 0 {
		w.gpuPerCPU = g / c
	}
	if m > 0 {
		w.gpuPerMem = g / m
	}
	w.ratioVersion = w.version + 1
}

// seenState reports whether an earlier usable GPU has the same state as g,
// so scoring it again would give the same result.
func seenState(prev []GPU, g *GPU, r *Request) bool {
	for i := range prev {
		q := &prev[i]
		if q.FreeMilli == g.FreeMilli && q.Sharing == g.Sharing && q.Model == g.Model && gpuUsable(q, r) {
			return true
		}
	}
	return false
}
