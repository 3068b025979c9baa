package core

import (
	"fmt"
	"slices"
	"strings"
)

// plan is a placement of one pod on one node.
type plan struct {
	node    *nodeState
	gpus    []int // positions in node.gpus, ascending
	milli   []int64
	mem     []int64
	sharing Sharing
	// alt is the pod's request the plan is for (podState.alt when it was
	// made): attach switches the pod to it.
	alt int
	// brokeWhole is set when a fraction starts a GPU nobody used.
	brokeWhole bool
	// frag is the refiner's tie-breaking score, once refined is set.
	refined bool
	frag    float64
}

// scorer gives the primary key of placing a pod on a node; higher is
// better. used is the milli-GPU the pod takes there; brokeWhole is set when
// a fraction starts a GPU nobody used. It must be cheap: the whole-GPU scan
// calls it for every node.
type scorer interface {
	score(p *podState, n *nodeState, used int64, brokeWhole bool) int64
}

// binPackScorer fills the fullest node first for whole GPUs, so whole nodes
// stay free for big gangs. FGD (the refiner) only breaks ties between nodes
// equally full: scoring every node with FGD first would trade the
// bin-packing rule of DESIGN.md (fill used nodes first, which the whole-GPU
// scenarios pin) for FGD's expected-workload view, and would cost an FGD
// evaluation per node and pod instead of per tie. For a fraction the key is
// only "packs onto a partly used GPU" (DESIGN.md: pack onto partly used
// GPUs); among those, FGD chooses the node and the GPU, which is what it is
// best at.
type binPackScorer struct{}

func (binPackScorer) score(p *podState, n *nodeState, used int64, broke bool) int64 {
	if p.req.IsFraction() {
		return -fragPenalty(broke)
	}
	return -(n.freeMilli - used)
}

// spreadScorer places on the emptiest node first.
type spreadScorer struct{}

func (spreadScorer) score(p *podState, n *nodeState, used int64, broke bool) int64 {
	return n.freeMilli - used - fragPenalty(broke)
}

// fragPenalty charges a fraction for turning a free GPU into a shared one.
func fragPenalty(broke bool) int64 {
	if broke {
		return 500
	}
	return 0
}

func (s *session) scorePlan(p *podState, pl *plan) int64 {
	var used int64
	for _, m := range pl.milli {
		used += m
	}
	k := s.key(p, pl.node, used, pl.brokeWhole)
	if len(pl.gpus) > 1 && oneDomain(pl) {
		// DESIGN.md: a multi-GPU pod prefers GPUs of one NVLink domain —
		// across nodes too, ahead of packing (a node's packing score is
		// far below this).
		k += nvlinkBonus
	}
	return k
}

// nvlinkBonus lifts a plan whose GPUs share one NVLink domain above any
// packing score (a count of milli-GPU on one node).
const nvlinkBonus = 1 << 24

// oneDomain says whether the plan's GPUs are all in one NVLink domain.
func oneDomain(pl *plan) bool {
	d := pl.node.gpus[pl.gpus[0]].domain
	for _, g := range pl.gpus[1:] {
		if pl.node.gpus[g].domain != d {
			return false
		}
	}
	return true
}

// key is the primary key of placing p on n: the pod's preferences
// (Pod.Prefers, Pod.NodeScore) first, then the placement policy's score.
// Both fit in one int64: the policy's score is a count of milli-GPU on one
// node (far below 2³¹) and the preference is clamped to ±2³⁰.
func (s *session) key(p *podState, n *nodeState, used int64, broke bool) int64 {
	sc := s.scorer.score(p, n, used, broke)
	if !s.hasPreferences(p) {
		return sc
	}
	return min(max(preference(p, n), -1<<30), 1<<30)<<32 + sc
}

// hasPreferences: p has soft terms of its own, or a placed pod attracts
// (or repels) pods of a term that selects p.
func (s *session) hasPreferences(p *podState) bool {
	if p.nodeScore != nil || len(p.prefers) > 0 {
		return true
	}
	for _, k := range p.matches {
		if s.terms.attractors[k] > 0 {
			return true
		}
	}
	return false
}

// preference is p's soft score on n: Pod.Prefers, Pod.NodeScore, and the
// pull of the placed pods around n (Pod.Attracts) through the terms that
// select p.
func preference(p *podState, n *nodeState) int64 {
	var v int64
	if p.nodeScore != nil {
		v = p.nodeScore(n.name)
	}
	for _, t := range p.prefers {
		if d := n.apart[t.term]; d != nil {
			v += t.weight * int64(d.matching)
		}
	}
	for _, k := range p.matches {
		if d := n.apart[k]; d != nil {
			v += d.attract
		}
	}
	return v
}

// better says whether plan a (primary key ka) beats plan b (kb): the
// primary key first, then the refiner's score, computed only for ties and
// at most once per plan. Equal plans keep b, the earlier node by name.
func (s *session) better(p *podState, a *plan, ka int64, b *plan, kb int64) bool {
	if ka != kb {
		return ka > kb
	}
	if s.refiner == nil {
		return false
	}
	return s.refined(p, a) > s.refined(p, b)
}

// sameState reports whether two nodes look alike to every scorer (same
// capacity, usage and GPUs): then the earlier by name wins a tie without
// asking the refiner. Most ties are between such nodes (empty ones), so
// this keeps FGD off the hot path.
func sameState(a, b *nodeState) bool {
	if a.shape != b.shape {
		return false
	}
	if a.empty() && b.empty() {
		return true // the common case, without the per-GPU walk
	}
	if a.cpu != b.cpu || a.mem != b.mem || a.usedCPU != b.usedCPU || a.usedMem != b.usedMem || len(a.gpus) != len(b.gpus) ||
		!slices.Equal(a.usedOther, b.usedOther) {
		return false
	}
	for i := range a.gpus {
		x, y := &a.gpus[i], &b.gpus[i]
		if x.usedMilli != y.usedMilli || x.usedMem != y.usedMem || x.sharing != y.sharing || x.pods != y.pods ||
			x.memory != y.memory || x.model != y.model || x.domain != y.domain {
			return false
		}
	}
	return true
}

func (n *nodeState) empty() bool {
	return n.freeWhole == len(n.gpus) && n.usedCPU == 0 && n.usedMem == 0 && !slices.ContainsFunc(n.usedOther, func(v int64) bool { return v != 0 })
}

func (s *session) refined(p *podState, pl *plan) float64 {
	if !pl.refined {
		pl.frag, pl.refined = s.refiner.refine(p, pl), true
	}
	return pl.frag
}

// failKind says why a pod does not fit a node, most fundamental first.
type failKind int

const (
	fitOK failKind = iota
	failUnschedulable
	failTopology // outside the domain a topology-constrained try keeps it to
	failSelector
	failModel
	failFeasible
	failApart  // required pod anti-affinity
	failNear   // required pod affinity
	failSpread // topology spread
	failGPUCount
	failNVLink
	failFraction
	failQueueRoom // a memory fraction's share where it fits passes its queue's limit or quota
	failCPU
	failMemory
	failOther
)

// staticFit checks what does not depend on usage.
func staticFit(p *podState, n *nodeState) failKind {
	if n.unschedulable {
		return failUnschedulable
	}
	if p.mask != nil && !p.mask[n.idx] {
		return failTopology
	}
	for k, v := range p.selector {
		if lv, ok := n.labels[k]; !ok || lv != v {
			return failSelector
		}
	}
	if p.feasible != nil && !p.feasible(n.name, -1) {
		return failFeasible
	}
	if (len(p.models) > 0 || p.feasible != nil) && (p.req.GPUs > 0 || p.req.IsFraction()) {
		model, usable := false, false
		for i := range n.gpus {
			g := &n.gpus[i]
			if len(p.models) == 0 || slices.Contains(p.models, g.model) {
				model = true
				if p.feasible == nil || p.feasible(n.name, g.index) {
					usable = true
					break
				}
			}
		}
		if !model {
			return failModel
		}
		if !usable {
			return failFeasible
		}
	}
	for i, v := range p.other {
		if v > n.other[i] {
			return failOther // more than the node holds: no eviction helps
		}
	}
	return fitOK
}

// gpuOK says whether p may use GPU g of node n at all (model, and the
// adapter's feasibility hook).
func gpuOK(p *podState, n *nodeState, g *gpuState) bool {
	if len(p.models) > 0 && !slices.Contains(p.models, g.model) {
		return false
	}
	return p.feasible == nil || p.feasible(n.name, g.index)
}

// fitOnNode finds the best GPUs for p on n given live usage. nvBest reports,
// for NVLink failures, the largest set of free connected GPUs found.
func fitOnNode(p *podState, n *nodeState) (pl *plan, why failKind, nvBest int) {
	if k := staticFit(p, n); k != fitOK {
		return nil, k, 0
	}
	if (p.matches != nil || p.avoids != nil) && !apartOK(p, n) {
		return nil, failApart, 0
	}
	if p.needs != nil && !nearOK(p, n) {
		return nil, failNear, 0
	}
	if p.spread != nil && !spreadOK(p, n) {
		return nil, failSpread, 0
	}
	r := &p.req
	if n.usedCPU+r.CPU > n.cpu {
		return nil, failCPU, 0
	}
	if n.usedMem+r.Memory > n.mem {
		return nil, failMemory, 0
	}
	if !otherFits(p, n) {
		return nil, failOther, 0
	}
	switch {
	case r.GPUs > 0:
		if n.freeWhole < r.GPUs {
			return nil, failGPUCount, 0
		}
		return wholeFit(p, n)
	case r.IsFraction():
		return fractionFit(p, n)
	}
	return &plan{node: n, alt: p.alt}, fitOK, 0
}

// wholeFit picks k free GPUs, keeping NVLink domains whole: the smallest
// domain that holds all k, else (when only preferred) the largest domains
// first so the pod spans as few as possible.
func wholeFit(p *podState, n *nodeState) (*plan, failKind, int) {
	k := p.req.GPUs
	type dom struct {
		name string
		free []int
	}
	var doms []dom
	total := 0
	for i := range n.gpus {
		g := &n.gpus[i]
		if g.pods != 0 || !gpuOK(p, n, g) {
			continue
		}
		total++
		j := slices.IndexFunc(doms, func(d dom) bool { return d.name == g.domain })
		if j < 0 {
			doms = append(doms, dom{name: g.domain})
			j = len(doms) - 1
		}
		doms[j].free = append(doms[j].free, i)
	}
	if total < k {
		return nil, failGPUCount, 0
	}
	best, largest := -1, 0
	for i, d := range doms {
		largest = max(largest, len(d.free))
		if len(d.free) >= k && (best < 0 || len(d.free) < len(doms[best].free)) {
			best = i
		}
	}
	pl := &plan{node: n, alt: p.alt}
	switch {
	case best >= 0:
		pl.gpus = slices.Clone(doms[best].free[:k])
	case k > 1 && p.req.NVLink == NVLinkRequired:
		return nil, failNVLink, largest
	default:
		slices.SortStableFunc(doms, func(a, b dom) int { return len(b.free) - len(a.free) })
		for _, d := range doms {
			for _, g := range d.free {
				if len(pl.gpus) < k {
					pl.gpus = append(pl.gpus, g)
				}
			}
		}
		slices.Sort(pl.gpus)
	}
	for _, gi := range pl.gpus {
		pl.milli = append(pl.milli, 1000)
		pl.mem = append(pl.mem, n.gpus[gi].memory)
	}
	return pl, fitOK, 0
}

// fractionFit packs a fraction onto the partly used GPU of the same mode
// that it fills most tightly; else onto a free GPU of the smallest NVLink
// domain (big domains stay whole for multi-GPU pods).
func fractionFit(p *podState, n *nodeState) (*plan, failKind, int) {
	r := &p.req
	bestShared, bestFree := -1, -1
	var bestLeft int64
	domFree := func(d string) int {
		c := 0
		for i := range n.gpus {
			if n.gpus[i].domain == d && n.gpus[i].pods == 0 {
				c++
			}
		}
		return c
	}
	bestFreeDom := 0
	// A memory fraction's milli depends on the GPU's size, and the gates
	// checked the queue's limits and quotas with the largest GPU's (the
	// least): here the real share must fit what the queues have left.
	room, capped := int64(-1), false
	if r.GPUMemory > 0 {
		room = milliRoom(p)
	}
	for i := range n.gpus {
		g := &n.gpus[i]
		if !gpuOK(p, n, g) {
			continue
		}
		milli, mem := fractionOn(r, g)
		if mem > g.memory {
			continue
		}
		if room >= 0 && milli > room {
			capped = true
			continue
		}
		if g.pods == 0 {
			if bestFree < 0 {
				bestFree, bestFreeDom = i, domFree(g.domain)
			} else if d := domFree(g.domain); d < bestFreeDom {
				bestFree, bestFreeDom = i, d
			}
			continue
		}
		if g.sharing != r.Sharing || !g.fitsFraction(r, milli, mem) {
			continue
		}
		left := 1000 - g.usedMilli - milli
		if bestShared < 0 || left < bestLeft {
			bestShared, bestLeft = i, left
		}
	}
	pick, broke := bestShared, false
	if pick < 0 {
		pick, broke = bestFree, true
	}
	if pick < 0 && capped {
		return nil, failQueueRoom, 0
	}
	if pick < 0 {
		return nil, failFraction, 0
	}
	milli, mem := fractionOn(r, &n.gpus[pick])
	return &plan{node: n, gpus: []int{pick}, milli: []int64{milli}, mem: []int64{mem}, sharing: r.Sharing, alt: p.alt, brokeWhole: broke}, fitOK, 0
}

// modeBlocks says whether some GPU p may use would hold it but for the
// other sharing mode of the fractions already there (for the reason).
func (s *session) modeBlocks(p *podState) bool {
	r := &p.req
	for _, n := range s.nodes {
		if n.unschedulable {
			continue
		}
		for i := range n.gpus {
			g := &n.gpus[i]
			if g.pods == 0 || g.sharing == r.Sharing || !gpuOK(p, n, g) {
				continue
			}
			if milli, mem := fractionOn(r, g); g.fitsFraction(r, milli, mem) {
				return true
			}
		}
	}
	return false
}

// milliRoom is how much more GPU, in milli, p's queues let it take: their
// limits, and for a non-preemptible job their quotas, and p.milliCap; -1
// when nothing caps it.
func milliRoom(p *podState) int64 {
	room := int64(-1)
	take := func(left int64) {
		if room < 0 || left < room {
			room = max(0, left)
		}
	}
	if p.milliCap > 0 {
		take(p.milliCap)
	}
	j := p.job
	for q := j.queue; q != nil && q.parent != nil; q = q.parent {
		if l := q.limit[ResGPU]; l != Unlimited {
			take(l - q.allocated[ResGPU] - q.heldLimit[ResGPU])
		}
		if qu := q.quota[ResGPU]; !j.preemptible && qu != Unlimited {
			take(qu - q.allocNP[ResGPU])
		}
	}
	return room
}

// fractionOn is what a fractional request takes of GPU g.
func fractionOn(r *Request, g *gpuState) (milli, mem int64) {
	if r.GPUMilli > 0 {
		return r.GPUMilli, mulDiv(r.GPUMilli, g.memory, 1000)
	}
	return memMilliOn(g, r.GPUMemory), r.GPUMemory
}

// memMilliOn is the milli-GPU a memory fraction of mem bytes counts for on
// g: what it adds to the GPU's memory fractions rounded as a whole, so that
// the fractions on one GPU add up to their exact share rounded once (three
// 8Gi pods on a 24Gi GPU count 333 + 334 + 333 = 1000, not 999).
func memMilliOn(g *gpuState, mem int64) int64 {
	before, after := memMilli(g.fracMem, g.memory), memMilli(g.fracMem+mem, g.memory)
	if g.fracMem == 0 {
		before = 0
	}
	return max(1, after-before)
}

// bestNode returns the best plan for p over all nodes, or nil. For whole
// GPUs the score depends on the node alone, so only the winner's GPUs are
// chosen; the scan itself allocates nothing.
func (s *session) bestNode(p *podState) *plan {
	r := &p.req
	if r.IsFraction() || r.GPUs > 1 || len(p.models) > 0 || p.feasible != nil || p.matches != nil || p.avoids != nil || p.needs != nil || p.spread != nil || s.hasPreferences(p) {
		return s.bestNodeSlow(p)
	}
	used := int64(r.GPUs) * 1000
	var best *nodeState
	var bestPlan *plan // made only for ties, for the refiner
	var bestScore int64
	for _, n := range s.nodes {
		if n.freeWhole < r.GPUs || n.usedCPU+r.CPU > n.cpu || n.usedMem+r.Memory > n.mem {
			continue
		}
		if p.other != nil && !otherFits(p, n) {
			continue
		}
		if n.unschedulable || (p.mask != nil && !p.mask[n.idx]) || (len(p.selector) > 0 && staticFit(p, n) != fitOK) {
			continue
		}
		sc := s.scorer.score(p, n, used, false)
		switch {
		case best == nil || sc > bestScore:
			best, bestScore, bestPlan = n, sc, nil
		case sc == bestScore && s.refiner != nil && !sameState(n, best):
			if bestPlan == nil {
				bestPlan = &plan{node: best}
			}
			if cand := (&plan{node: n}); s.better(p, cand, sc, bestPlan, bestScore) {
				best, bestPlan = n, cand
			}
		}
	}
	if best == nil {
		return nil
	}
	pl, _, _ := fitOnNode(p, best)
	return pl
}

func (s *session) bestNodeSlow(p *podState) *plan {
	var best *plan
	var bestScore int64
	prefs := s.hasPreferences(p)
	for _, n := range s.nodes {
		if p.req.GPUs > 0 && n.freeWhole < p.req.GPUs {
			continue // the common rejection, before any work
		}
		pl, why, _ := fitOnNode(p, n)
		if why != fitOK {
			continue
		}
		sc := s.scorePlan(p, pl)
		// Alike nodes tie, and the earlier wins, unless the pod's
		// preferences tell them apart (by name or by domain).
		if best == nil || (prefs || !sameState(n, best.node)) && s.better(p, pl, sc, best, bestScore) {
			best, bestScore = pl, sc
		}
	}
	return best
}

// whyNot explains in a person's words why p fits no node right now.
func (s *session) whyNot(p *podState) string {
	why, counts := s.whyNotCounted(p)
	if n := counts[failApart] + counts[failNear]; n > 0 && !strings.Contains(why, "pod affinity") && !strings.Contains(why, "pod anti-affinity") {
		why += fmt.Sprintf("; %s ruled out by required pod (anti-)affinity", plural(n, "node"))
	}
	if n := counts[failSpread]; n > 0 && !strings.Contains(why, "topology spread") {
		why += fmt.Sprintf("; %s ruled out by topology spread", plural(n, "node"))
	}
	return why
}

// whyNotCounted is whyNot's main reason, and how many nodes failed how.
func (s *session) whyNotCounted(p *podState) (string, map[failKind]int) {
	f := s.surveyNodes(p)
	if f.fits {
		return "fits a node now", f.counts // not reached by callers
	}
	return s.whyNotReason(p, f), f.counts
}

// nodeSurvey is how the nodes fail a pod: how many fail how and, on the
// nodes that fail it only for its resources, the most they have free.
type nodeSurvey struct {
	counts           map[failKind]int
	fits             bool // some node fits it (the survey stopped there)
	nvBest, maxWhole int
	maxFreeCPU       int64
	maxFreeMem       int64
	gpuCPU, gpuMem   int64   // on the nodes that have its GPUs free
	maxFreeOther     []int64 // indexed like p.other
}

func (s *session) surveyNodes(p *podState) *nodeSurvey {
	f := &nodeSurvey{counts: map[failKind]int{}}
	if p.other != nil {
		f.maxFreeOther = make([]int64, len(p.other))
	}
	for _, n := range s.nodes {
		_, why, nv := fitOnNode(p, n)
		f.counts[why]++
		if why == fitOK {
			f.fits = true
			return f
		}
		if why >= failGPUCount {
			f.nvBest = max(f.nvBest, nv)
			free := 0
			for i := range n.gpus {
				if n.gpus[i].pods == 0 && gpuOK(p, n, &n.gpus[i]) {
					free++
				}
			}
			f.maxWhole = max(f.maxWhole, free)
			f.maxFreeCPU = max(f.maxFreeCPU, n.cpu-n.usedCPU)
			f.maxFreeMem = max(f.maxFreeMem, n.mem-n.usedMem)
			// On the nodes that have its GPUs free, what they lack.
			if why == failCPU {
				f.gpuCPU = max(f.gpuCPU, n.cpu-n.usedCPU)
			}
			if why == failMemory {
				f.gpuMem = max(f.gpuMem, n.mem-n.usedMem)
			}
			for i := range f.maxFreeOther {
				f.maxFreeOther[i] = max(f.maxFreeOther[i], n.other[i]-n.usedOther[i])
			}
		}
	}
	return f
}

// whyNotReason says, from the survey, why p fits no node.
func (s *session) whyNotReason(p *podState, f *nodeSurvey) string {
	counts := f.counts
	r := &p.req
	switch {
	case len(s.nodes) == 0:
		return "the cluster has no nodes"
	case counts[failUnschedulable]+counts[failTopology]+counts[failSelector]+counts[failModel]+counts[failFeasible]+counts[failApart]+counts[failNear]+counts[failSpread] == len(s.nodes):
		return constraintReason(p, counts)
	case counts[failNVLink] > 0:
		return fmt.Sprintf("needs %s; the best node has %d", plural(r.GPUs, "NVLink-connected GPU"), f.nvBest)
	case counts[failGPUCount] > 0 && (f.maxWhole < r.GPUs || counts[failCPU]+counts[failMemory] == 0):
		// (When some node has the GPUs free, what it lacks is CPU or memory:
		// said below.)
		return fmt.Sprintf("needs %s on one node; the most free on any node is %d", plural(r.GPUs, "free GPU"), f.maxWhole)
	case counts[failQueueRoom] > 0:
		return fmt.Sprintf("needs %s of GPU memory; on every GPU with room that share would take its queue past its GPU limit (or, non-preemptible, its quota)", formatBytes(r.GPUMemory))
	case counts[failFraction] > 0:
		what := fmt.Sprintf("%s of a GPU", formatMilli(r.GPUMilli))
		if r.GPUMemory > 0 {
			what = formatBytes(r.GPUMemory) + " of GPU memory"
		}
		if s.modeBlocks(p) {
			return fmt.Sprintf("needs %s (%s); no GPU has that much free without mixing sharing modes", what, r.Sharing)
		}
		return fmt.Sprintf("needs %s (%s); no GPU it may use has that much free", what, r.Sharing)
	case counts[failCPU] > 0 && counts[failGPUCount] > 0 && r.GPUs > 0:
		return fmt.Sprintf("needs %s on a node with %s; the most free on such a node is %s", formatAmount(ResCPU, r.CPU), plural(r.GPUs, "free GPU"), formatAmount(ResCPU, f.gpuCPU))
	case counts[failCPU] > 0:
		return fmt.Sprintf("needs %s; the most free on any node is %s", formatAmount(ResCPU, r.CPU), formatAmount(ResCPU, f.maxFreeCPU))
	case counts[failMemory] > 0 && counts[failGPUCount] > 0 && r.GPUs > 0:
		return fmt.Sprintf("needs %s on a node with %s; the most free on such a node is %s", formatAmount(ResMemory, r.Memory), plural(r.GPUs, "free GPU"), formatAmount(ResMemory, f.gpuMem))
	case counts[failMemory] > 0:
		return fmt.Sprintf("needs %s; the most free on any node is %s", formatAmount(ResMemory, r.Memory), formatAmount(ResMemory, f.maxFreeMem))
	default:
		return s.otherResourceReason(p, f)
	}
}

// constraintReason says which constraint rules out every node, when no
// node passes p's constraints.
func constraintReason(p *podState, counts map[failKind]int) string {
	switch {
	case counts[failSpread] > 0:
		return "every node it could use would break its topology spread (maxSkew)"
	case counts[failNear] > 0:
		return "no node it could use is in a domain with the pods it must run near (required pod affinity)"
	case counts[failApart] > 0:
		return "every node it could use runs a pod it must be kept apart from (required pod anti-affinity)"
	case counts[failFeasible] > 0:
		return "no schedulable node passes its constraints (taints, device selectors, healthy GPUs)"
	case counts[failModel] > 0:
		return fmt.Sprintf("no schedulable node has a GPU of model %s", strings.Join(p.models, " or "))
	case counts[failSelector] > 0:
		return "no schedulable node matches its node selector"
	case counts[failTopology] > 0:
		return "no schedulable node of its gang's topology domain matches it"
	}
	return "every node is unschedulable"
}

// otherResourceReason names the extended resource p asks for more of than
// any node has free, or, when each fits somewhere, all it asks.
func (s *session) otherResourceReason(p *podState, f *nodeSurvey) string {
	var asks []string
	for i, v := range p.other {
		if v == 0 {
			continue
		}
		name := s.otherNames[i]
		if v > f.maxFreeOther[i] {
			return fmt.Sprintf("needs %d %s; the most free on any node is %d", v, name, f.maxFreeOther[i])
		}
		asks = append(asks, fmt.Sprintf("%d %s", v, name))
	}
	return fmt.Sprintf("needs %s; no node has all of it free", strings.Join(asks, " and "))
}
