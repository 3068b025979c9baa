package core

import (
	"fmt"
	"slices"
	"strings"
)

// buildVictimOrder ranks every placed pod in DESIGN.md's victim order:
// lowest job priority first, then newest job first; within a job the last
// pod by name first. Each node keeps its own pods in the same order.
func (s *session) buildVictimOrder() {
	for _, p := range s.pods {
		if p.node != nil && p.phase != PodReleasing {
			s.victims = append(s.victims, p)
		}
	}
	slices.SortFunc(s.victims, func(a, b *podState) int {
		ja, jb := a.job, b.job
		if ja.priority != jb.priority {
			if ja.priority < jb.priority {
				return -1
			}
			return 1
		}
		if c := jb.created.Compare(ja.created); c != 0 {
			return c
		}
		// Jobs of one age: the one job order takes as newer (later by name)
		// is the victim first, so the two orders never disagree.
		if c := strings.Compare(jb.name, ja.name); c != 0 {
			return c
		}
		return strings.Compare(b.name, a.name)
	})
	for i, p := range s.victims {
		p.rank = i
		p.node.victims = append(p.node.victims, p)
	}
}

// evictPolicy is what one evicting action allows.
type evictPolicy struct {
	action Action
	// eligible says whether v may be evicted at all for job j.
	eligible func(v *podState) bool
	// rules checks a unit of victims against the action's rules (reclaim's
	// fair-share and quota tests); nil allows all.
	rules func(unit []*podState) bool
	// wholeGang evicts a victim's whole gang when its job says so
	// (jobState.evictsWhole; not for moves: a moved pod is re-placed).
	wholeGang bool
	reason    func(v *podState) string
}

// unitOf is what evicting v takes: v alone, or its whole gang when v's job
// would otherwise drop below minMember (or its disruption is all).
func (s *session) unitOf(v *podState, pol *evictPolicy) []*podState {
	j := v.job
	if !pol.wholeGang || !j.evictsWhole(v) {
		return []*podState{v}
	}
	var unit []*podState
	for _, p := range j.pods {
		if p.node != nil && p.phase != PodReleasing {
			unit = append(unit, p)
		}
	}
	return unit
}

// tryNode evicts victims on n in victim order, skipping those the policy
// forbids, until p fits. It leaves its evictions applied (the caller rolls
// back) and returns the plan, the highest victim rank it took and how many.
func (s *session) tryNode(p *podState, n *nodeState, pol *evictPolicy) (*plan, int, int) {
	pl, maxRank, count, _ := s.tryNodeUnits(p, n, pol, false)
	return pl, maxRank, count
}

// evictUnit is one unit tryNode evicted: whole when it is v's whole gang.
type evictUnit struct {
	pods  []*podState
	whole bool
}

// tryNodeUnits is tryNode, also returning the units it evicted, in order,
// when record is set (only for the plan kept: the search allocates less).
func (s *session) tryNodeUnits(p *podState, n *nodeState, pol *evictPolicy, record bool) (*plan, int, int, []evictUnit) {
	if staticFit(p, n) != fitOK {
		return nil, 0, 0, nil
	}
	maxRank, count := -1, 0
	var units []evictUnit
	for _, v := range n.victims {
		if !v.atOrig || v.node != n || !pol.eligible(v) {
			continue
		}
		unit := s.unitOf(v, pol)
		if slices.ContainsFunc(unit, func(u *podState) bool { return !u.atOrig || !pol.eligible(u) }) {
			continue
		}
		if pol.rules != nil && !pol.rules(unit) {
			continue
		}
		whole := pol.wholeGang && v.job.evictsWhole(v)
		for _, u := range unit {
			maxRank = max(maxRank, u.rank)
			count++
			s.detach(u, pol.action, pol.reason(u))
		}
		if record {
			units = append(units, evictUnit{pods: unit, whole: whole})
		}
		if pl, why, _ := fitOnNode(p, n); why == fitOK && s.withinLimitsWith(p) {
			return pl, maxRank, count, units
		}
	}
	return nil, 0, 0, nil
}

// reprieve gives back the victims of a plan on n that p turns out not to
// need, most important first, as kube-scheduler does: victims are taken in
// victim order, and a later one can make an earlier one unnecessary (a
// victim under p's limited queue makes room under the limit, after one
// outside it was taken for capacity). Giving one back raises its queue's
// allocation, and that queue may sit on p's side of another victim's
// check (a sibling of p's queue: the R' of a victim in another branch), so
// the kept units are checked against the action's rules again, in order.
// The last unit taken is always needed (without it p did not fit). A unit
// of a job whose whole gang the plan still takes is kept: giving it back
// would leave the gang below minMember. It leaves the kept evictions
// applied after cp and returns p's plan.
func (s *session) reprieve(p *podState, n *nodeState, pol *evictPolicy, cp int, units []evictUnit, pl *plan) *plan {
	if len(units) < 2 {
		return pl
	}
	keep := make([]bool, len(units))
	for i := range keep {
		keep[i] = true
	}
	// ganged: whether a unit of j's whole gang is still taken.
	ganged := func(j *jobState) bool {
		for k, u := range units {
			if keep[k] && u.whole && u.pods[0].job == j {
				return true
			}
		}
		return false
	}
	replay := func() (*plan, bool) {
		s.rollback(cp)
		ruled := true
		for k, u := range units {
			if keep[k] {
				ruled = ruled && (pol.rules == nil || pol.rules(u.pods))
				for _, v := range u.pods {
					s.detach(v, pol.action, pol.reason(v))
				}
			}
		}
		got, why, _ := fitOnNode(p, n)
		return got, ruled && why == fitOK && s.withinLimitsWith(p)
	}
	tried := false
	for i := len(units) - 2; i >= 0; i-- {
		if !units[i].whole && ganged(units[i].pods[0].job) {
			continue
		}
		tried = true
		keep[i] = false
		if _, ok := replay(); !ok {
			keep[i] = true
		}
	}
	if !tried {
		return pl
	}
	got, ok := replay()
	if !ok { // cannot happen (the kept set was just seen to fit); keep them all
		for i := range keep {
			keep[i] = true
		}
		got, _ = replay()
	}
	return got
}

// placeEvicting places p, on free capacity if it fits, else on the node
// whose needed victims come earliest in victim order (then fewest, then
// best scored). It searches nodes in the order of their first eligible
// victim and stops when no unseen node can beat the best found.
func (s *session) placeEvicting(p *podState, pol *evictPolicy) bool {
	if pl, _ := s.findPlace(p); pl != nil && s.withinLimitsWith(p) {
		s.attach(p, pl, pol.action, "")
		return true
	}
	s.seenGen++
	var best *nodeState
	var bestPlan *plan
	bestRank, bestCount := 0, 0
	var bestScore int64
	for i, v := range s.victims {
		if best != nil && i >= bestRank {
			break
		}
		n := v.node
		if n == nil || !v.atOrig || n.seen == s.seenGen || !pol.eligible(v) {
			continue
		}
		n.seen = s.seenGen
		cp := s.checkpoint()
		pl, rank, count := s.tryNode(p, n, pol)
		if pl != nil {
			sc := s.scorePlan(p, pl)
			if best == nil || rank < bestRank || rank == bestRank && (count < bestCount || count == bestCount && sc > bestScore) {
				best, bestRank, bestCount, bestScore, bestPlan = n, rank, count, sc, pl
			} else if rank == bestRank && count == bestCount && sc == bestScore && s.refiner != nil {
				// A tie: the refiner scores each node with its own
				// victims gone, so the best so far is replayed (rarely:
				// only on ties) to refine it.
				pl.frag, pl.refined = s.refiner.refine(p, pl), true
				s.rollback(cp)
				if !bestPlan.refined {
					bp, _, _ := s.tryNode(p, best, pol)
					bestPlan.frag, bestPlan.refined = s.refiner.refine(p, bp), true
					s.rollback(cp)
				}
				if pl.frag > bestPlan.frag {
					best, bestPlan = n, pl
				}
			}
		}
		s.rollback(cp)
	}
	if best == nil {
		return false
	}
	cp := s.checkpoint()
	pl, _, _, units := s.tryNodeUnits(p, best, pol, true)
	pl = s.reprieve(p, best, pol, cp, units, pl)
	if s.refiner != nil && p.req.IsFraction() {
		s.refiner.refine(p, pl) // lets it pick the GPU, as on free capacity
	}
	s.attach(p, pl, pol.action, "")
	return true
}

// commitPlan ends the evicting plan that began at cp: its decisions share a
// plan number (Bind.Plan, Eviction.Plan), and what its victims freed and it
// did not use is held to the end of the cycle.
func (s *session) commitPlan(cp int) {
	s.planStarts = append(s.planStarts, cp)
	s.holdFreed(cp)
}

// planOf is the number of the plan that logged operation i: 1, 2, … in
// commit order, 0 outside any plan (stale gangs, allocate).
func (s *session) planOf(i int) int {
	n, _ := slices.BinarySearch(s.planStarts, i+1)
	return n
}

// holdFreed keeps what the plan logged since cp evicted or moved away and
// did not use taken until the end of the cycle: SCENARIOS.md frees an
// evicted pod's resources at the end of the cycle, and only the plan that
// evicted it places onto them. Without it the rest of a gang evicted whole
// for one pod, or the rest of a GPU a small preemptor took from a bigger
// victim, would go in the same cycle to whichever job came next in reclaim
// or preempt, ahead of the job order allocate applies next cycle. Per GPU
// and per node, what the victims held less what the plan placed there is
// taken by a stand-in of no queue (in the GPU's sharing mode; a whole GPU
// when whole-GPU victims left it untouched).
func (s *session) holdFreed(cp int) {
	type gpuKey struct {
		n  *nodeState
		gi int
	}
	type left struct {
		milli, mem int64
		sharing    Sharing // the victims'
	}
	end := len(s.log)
	if !slices.ContainsFunc(s.log[cp:end], func(o op) bool { return !o.attach && o.node != nil }) {
		return // the plan evicted nothing: nothing to hold
	}
	s.holdLimits(cp, end)
	gpus := map[gpuKey]*left{}
	host := map[*nodeState]*[2]int64{}
	for i := cp; i < end; i++ {
		o := &s.log[i]
		if o.node == nil {
			continue
		}
		sign := int64(1)
		if o.attach {
			sign = -1
		}
		h := host[o.node]
		if h == nil {
			h = &[2]int64{}
			host[o.node] = h
		}
		h[0] += sign * o.pod.req.CPU
		h[1] += sign * o.pod.req.Memory
		for k, gi := range o.gpus {
			key := gpuKey{o.node, gi}
			l := gpus[key]
			if l == nil {
				l = &left{}
				gpus[key] = l
			}
			l.milli += sign * o.gpuMilli[k]
			l.mem += sign * o.gpuMem[k]
			if !o.attach {
				l.sharing = o.sharing
			}
		}
	}
	// In log order, so that the stand-ins are the same on every run.
	for i := cp; i < end; i++ {
		o := s.log[i]
		if o.attach || o.node == nil {
			continue
		}
		n := o.node
		r := Request{}
		if h := host[n]; h != nil {
			r.CPU = max(0, min(h[0], n.cpu-n.usedCPU))
			r.Memory = max(0, min(h[1], n.mem-n.usedMem))
			delete(host, n)
		}
		if r.CPU > 0 || r.Memory > 0 {
			s.hold(r, &plan{node: n}, o)
		}
		for _, gi := range o.gpus {
			key := gpuKey{n, gi}
			l := gpus[key]
			if l == nil {
				continue
			}
			delete(gpus, key)
			g := &n.gpus[gi]
			milli := max(0, min(l.milli, 1000-g.usedMilli))
			mem := max(0, min(l.mem, g.memory-g.usedMem))
			if milli == 0 {
				continue
			}
			sh := l.sharing
			if g.pods > 0 {
				sh = g.sharing
			}
			fr := Request{} // a whole GPU, when whole-GPU victims left it untouched
			if sh != "" {
				fr.GPUMilli, fr.Sharing = milli, sh
			}
			s.hold(fr, &plan{node: n, gpus: []int{gi}, milli: []int64{milli}, mem: []int64{mem}, sharing: sh}, o)
		}
	}
}

// holdLimits keeps the limit room that the plan logged in [cp, end) freed
// and did not use until the end of the cycle, as holdFreed does capacity:
// per queue, what its victims (its own and its descendants') held less what
// the plan placed under it. Without it a pod of a later plan, with no
// victims of its own and so no rule checked, could take room a reclaim
// made under a common limited ancestor, past what the reclaim's rules
// allowed its side (property seed 83499).
func (s *session) holdLimits(cp, end int) {
	var freed map[*queueState]*Resources
	for i := cp; i < end; i++ {
		o := &s.log[i]
		if o.node == nil || o.pod.job.queue == nil {
			continue
		}
		sign := int64(-1)
		if !o.attach {
			sign = 1
		}
		for q := o.pod.job.queue; q != s.root; q = q.parent {
			if !q.limited {
				continue
			}
			if freed == nil {
				freed = map[*queueState]*Resources{}
			}
			f := freed[q]
			if f == nil {
				f = &Resources{}
				freed[q] = f
			}
			addRes(f, o.res, sign)
		}
	}
	// In queue order, so that the holds are the same on every run.
	for _, q := range s.queues {
		f := freed[q]
		if f == nil {
			continue
		}
		var h Resources
		for r := range h {
			if q.limit[r] != Unlimited && f[r] > 0 {
				h[r] = f[r]
			}
		}
		if h != (Resources{}) {
			addRes(&q.heldLimit, h, 1)
			s.limitHolds = append(s.limitHolds, limitHold{at: end, q: q, res: h})
		}
	}
}

// hold places a stand-in taking r and pl until the end of the cycle, for
// the victim of o.
func (s *session) hold(r Request, pl *plan, o op) {
	h := &podState{name: o.pod.name, job: s.heldJob, req: r, held: true, rank: -1, lastOp: -1, lastDetach: -1}
	s.attach(h, pl, o.action, "")
}

// placeSetEvicting places set (all or nothing) with evictions under pol;
// after, when set, must accept the final plan.
func (s *session) placeSetEvicting(set []*podState, pol *evictPolicy, after func(cp int) bool) bool {
	cp := s.checkpoint()
	for _, p := range set {
		if !s.placeEvicting(p, pol) {
			s.rollback(cp)
			return false
		}
	}
	if after != nil && !after(cp) {
		s.rollback(cp)
		return false
	}
	s.commitPlan(cp)
	return true
}

// evictSets is podSets for the evicting actions, with pendingNeed's test:
// none when the job may not evict or cannot reach its minMember (an
// earlier plan in the action may have changed what it needs).
func (s *session) evictSets(j *jobState, tried map[*jobState]bool) podSetList {
	if !s.mayEvict(j, tried) {
		return podSetList{}
	}
	l := s.podSets(j)
	if !canReach(j, l.all) {
		return podSetList{}
	}
	return l
}

// pendingNeed gives the evicting actions the next request of each job still
// waiting that may evict to run (not Job.NeverEvicts).
func (s *session) pendingNeed(tried map[*jobState]bool) func(j *jobState) (Resources, bool) {
	return func(j *jobState) (Resources, bool) {
		if !s.mayEvict(j, tried) {
			return Resources{}, false
		}
		c := s.candidates(j)
		set := pickSet(j, c, needed(j))
		if set == nil || !canReach(j, c) {
			return Resources{}, false
		}
		return sumRes(set), true
	}
}

// mayEvict says whether j may still evict to run in this action: not
// Job.NeverEvicts, and its queue's preemption delay has passed since it was
// created.
func (s *session) mayEvict(j *jobState, tried map[*jobState]bool) bool {
	return !tried[j] && !j.neverEvicts && !s.now.Before(j.evictFrom)
}

// protected says whether v may not yet be a victim of action a taken for
// job by: its queue's minimum runtime for a has not passed since it started
// (DESIGN.md, "Time protections"). A consolidation move counts as preempt
// when by is of v's leaf queue, else as reclaim. A placed pod that has not
// started has run 0.
func (s *session) protected(v *podState, a Action, by *jobState) bool {
	q := v.job.queue
	if q == nil {
		return false
	}
	least := q.reclaimMin
	if a == ActionPreempt || a == ActionConsolidate && q == by.queue {
		least = q.preemptMin
	}
	return least > 0 && (v.started.IsZero() || s.now.Sub(v.started) < least)
}

// canReach says whether j, with pending pods c, can reach its minMember,
// and each subgroup its own.
func canReach(j *jobState, c []*podState) bool {
	return j.placed+len(c) >= j.minMember && (j.subs == nil || subReach(j, c) == "")
}

// reclaim lets jobs of queues below their fair share (or within quota) take
// resources back from other queues, under DESIGN.md's lowest-common-ancestor
// rules.
func (s *session) reclaim() {
	tried := map[*jobState]bool{}
	need := s.pendingNeed(tried)
	s.runOrdered(func(*jobState) bool { return true }, need, func(j *jobState) bool {
		l := s.evictSets(j, tried)
		if l.n == 0 {
			// An earlier plan in this action evicted the job's running gang
			// whole: what it needs has changed; it waits for the next cycle.
			tried[j] = true
			return false
		}
		for i, set := range l.list() {
			if s.inTopology(j, set, true, func(first bool) bool { return s.reclaimSet(j, set, i == 0 && first) }) {
				return true // next pod of the job, if any
			}
		}
		tried[j] = true
		return false
	})
}

// reclaimSet places set (all or nothing) by reclaim, or changes nothing;
// explain adds to the pods' reasons why reclaim cannot help.
//
// A memory fraction's share depends on the GPU it lands on, and reclaim's
// rules bound its queue's share: so, on a cluster of several GPU sizes, it
// is priced at each size in turn, largest GPU (least share) first, and kept
// to GPUs where it takes no more than that price.
func (s *session) reclaimSet(j *jobState, set []*podState, explain bool) bool {
	return s.atPrices(set, func(first bool) bool { return s.reclaimSetAt(j, set, explain && first) })
}

// atPrices runs try on set at its prices: once, or, when its share depends
// on the GPU it lands on (pricedBySize), at each GPU size in turn with its
// memory fractions kept to GPUs where they take no more (byGPUSize). So the
// gates an evicting action checks at the set's price hold where it lands: a
// 20Gi pod priced at an 80Gi GPU's quarter cannot take half of a 40Gi GPU
// past a non-preemptible quota or a limit.
func (s *session) atPrices(set []*podState, try func(first bool) bool) bool {
	if !s.pricedBySize(set) {
		return try(true)
	}
	return s.byGPUSize(set, try)
}

// pricedBySize says whether set's share depends on the GPU it lands on: a
// memory fraction on a cluster of several GPU sizes.
func (s *session) pricedBySize(set []*podState) bool {
	return len(s.gpuSizes) > 1 && slices.ContainsFunc(set, func(p *podState) bool { return p.req.GPUMemory > 0 })
}

// byGPUSize runs try with set's memory fractions priced at each GPU size in
// turn, largest GPU (least share) first, each kept to GPUs where it takes
// no more than that price, until try succeeds.
func (s *session) byGPUSize(set []*podState, try func(first bool) bool) bool {
	saved := make([]Resources, len(set))
	for i, p := range set {
		saved[i] = p.res
	}
	defer func() {
		for i, p := range set {
			p.milliCap = 0
			if p.node == nil {
				p.res = saved[i]
			}
		}
	}()
	for k, size := range s.gpuSizes {
		for _, p := range set {
			if p.req.GPUMemory > 0 {
				p.milliCap = memMilli(p.req.GPUMemory, size)
				p.res[ResGPU] = p.milliCap
			}
		}
		if try(k == 0) {
			return true
		}
	}
	return false
}

// reclaimSetAt is reclaimSet at the set's current prices.
func (s *session) reclaimSetAt(j *jobState, set []*podState, explain bool) bool {
	req := sumRes(set)
	// Limits are not checked up front: victims under the same limited
	// queue make room under it (placeEvicting checks as it goes).
	if s.gates(j, req, false) != "" {
		return false
	}
	if !s.limitsRelievable(j, req, false) {
		if explain {
			s.explainHeld(j, req)
		}
		return false
	}
	R := j.queue
	contested := contestedResources(req)
	// R itself must end within its fair share or its quota.
	if !fitsShare(R, req, contested) && !fitsQuota(R, req, contested) {
		if explain {
			for _, p := range s.candidates(j) {
				// Worth saying only when another queue holds something.
				if p.reason != "" && !strings.Contains(p.reason, "cannot reclaim") && s.othersHold(R, contested) {
					p.reason += fmt.Sprintf("; cannot reclaim: queue %s would exceed its fair share of %s", R.name, formatAmount(contested[0], R.fairShare[contested[0]]))
				}
			}
		}
		return false
	}
	remaining := req
	pol := &evictPolicy{
		action:    ActionReclaim,
		wholeGang: true,
		eligible: func(v *podState) bool {
			return v.job.preemptible && v.job.queue != R && !s.protected(v, ActionReclaim, j)
		},
		rules: func(unit []*podState) bool {
			rs, vs := unitContested(contested, req, unit)
			return s.reclaimAllowed(R, remaining, unit, rs, vs)
		},
		reason: func(v *podState) string {
			return fmt.Sprintf("reclaimed by queue %s for job %s", R.name, j.name)
		},
	}
	// remaining shrinks as the job's pods are placed: R's allocation
	// already holds those.
	cp := s.checkpoint()
	for _, p := range set {
		if !s.placeEvicting(p, pol) {
			s.rollback(cp)
			return false
		}
		addRes(&remaining, p.res, -1)
	}
	s.commitPlan(cp)
	return true
}

// othersHold says whether any queue but R has some of the resources
// allocated: only then could reclaim take any.
func (s *session) othersHold(R *queueState, rs []Resource) bool {
	for _, r := range rs {
		// The root's children together hold everything allocated.
		var total int64
		for _, q := range s.root.children {
			total += q.allocated[r]
		}
		if total > R.allocated[r] {
			return true
		}
	}
	return false
}

// unitContested is what the rules check for one unit of victims, on R's
// side (rs) and on the victims' (vs): the job's contested resources, except
//   - victims holding no GPU, taken for a GPU job, are taken for the CPU and
//     memory they free, and are checked on those on both sides (else a
//     CPU-only pod could be reclaimed past its queue's CPU quota or share,
//     and reclaim the CPU back in the next cycle: a flap);
//   - victims holding GPUs, taken for a job that asks none, are checked on
//     their GPUs too on their side: their queue must keep its GPU fair share
//     or quota (a quota is a guarantee), else the GPU pod's queue reclaims
//     its GPU back in the next cycle. R gains no GPU, so its side is not
//     checked on GPUs.
func unitContested(contested []Resource, req Resources, unit []*podState) (rs, vs []Resource) {
	freed := sumRes(unit)
	if req[ResGPU] == 0 {
		if freed[ResGPU] > 0 && !slices.Contains(contested, ResGPU) {
			return contested, append(slices.Clone(contested), ResGPU)
		}
		return contested, contested
	}
	if freed[ResGPU] > 0 {
		return contested, contested
	}
	var out []Resource
	for _, r := range [...]Resource{ResCPU, ResMemory} {
		if req[r] > 0 && freed[r] > 0 {
			out = append(out, r)
		}
	}
	if out == nil {
		return contested, contested
	}
	return out, out
}

func contestedResources(req Resources) []Resource {
	// GPUs are what teams contend for; CPU and memory follow them. A job
	// without GPUs contends for what it asks.
	if req[ResGPU] > 0 {
		return []Resource{ResGPU}
	}
	var out []Resource
	for r := Resource(0); r < NumResources; r++ {
		if req[r] > 0 {
			out = append(out, r)
		}
	}
	return out
}

func fitsShare(q *queueState, add Resources, rs []Resource) bool {
	for _, r := range rs {
		if q.allocated[r]+add[r] > q.fairShare[r] {
			return false
		}
	}
	return true
}

func fitsQuota(q *queueState, add Resources, rs []Resource) bool {
	for _, r := range rs {
		if q.quota[r] != Unlimited && q.allocated[r]+add[r] > q.quota[r] {
			return false
		}
	}
	return true
}

// reclaimAllowed applies DESIGN.md's rule to evicting unit (one queue V)
// for queue R whose job still needs rem: with A the lowest common ancestor
// and R', V' A's children towards R and V, after the plan either R and R'
// are within their fair shares and V' at or above its own, or R and R' are
// within their quotas and V' at or above its quota.
func (s *session) reclaimAllowed(R *queueState, rem Resources, unit []*podState, rs, vs []Resource) bool {
	V := unit[0].job.queue
	if V == R {
		return false
	}
	Rp, Vp := R, V
	for Rp.depth > Vp.depth {
		Rp = Rp.parent
	}
	for Vp.depth > Rp.depth {
		Vp = Vp.parent
	}
	for Rp.parent != Vp.parent {
		Rp, Vp = Rp.parent, Vp.parent
	}
	freed := sumRes(unit)
	shareOK := fitsShare(R, rem, rs) && fitsShare(Rp, rem, rs)
	quotaOK := fitsQuota(R, rem, rs) && fitsQuota(Rp, rem, rs)
	for _, r := range vs {
		after := Vp.allocated[r] - freed[r]
		shareOK = shareOK && after >= Vp.fairShare[r]
		quotaOK = quotaOK && Vp.quota[r] != Unlimited && after >= Vp.quota[r]
	}
	return shareOK || quotaOK
}

// preempt lets a job evict lower-priority preemptible pods of its own leaf
// queue.
func (s *session) preempt() {
	tried := map[*jobState]bool{}
	need := s.pendingNeed(tried)
	s.runOrdered(func(*jobState) bool { return true }, need, func(j *jobState) (again bool) {
		l := s.evictSets(j, tried)
		tried[j] = true
		if l.n == 0 {
			return false
		}
		defer func() { again = !tried[j] }()
		pol := &evictPolicy{
			action:    ActionPreempt,
			wholeGang: true,
			eligible: func(v *podState) bool {
				return v.job.queue == j.queue && v.job.preemptible && v.job.priority < j.priority && !s.protected(v, ActionPreempt, j)
			},
			reason: func(v *podState) string {
				return fmt.Sprintf("preempted by job %s (priority %d) in queue %s", j.name, j.priority, j.queue.name)
			},
		}
		for i, set := range l.list() {
			if s.inTopology(j, set, true, func(inFirst bool) bool {
				return s.atPrices(set, func(first bool) bool { return s.preemptSetAt(j, set, pol, i == 0 && inFirst && first) })
			}) {
				tried[j] = false
				return
			}
		}
		return
	})
}

// preemptSetAt places set (all or nothing) by preemption at its current
// prices, or changes nothing; explain adds to the pods' reasons why it
// waits.
func (s *session) preemptSetAt(j *jobState, set []*podState, pol *evictPolicy, explain bool) bool {
	req := sumRes(set)
	if s.gates(j, req, false) != "" {
		return false
	}
	if !s.limitsRelievable(j, req, true) {
		if explain {
			s.explainHeld(j, req)
		}
		return false
	}
	return s.placeSetEvicting(set, pol, func(int) bool {
		// Evictions in the same queue may bring it back under its limits.
		return withinLimits(s, j.queue, req)
	})
}

// limitsRelievable says whether evictions could bring j's queues within
// their limits with req added: under each queue that req would take past its
// limit, the victims the action may take (j's own leaf queue for preempt,
// the others for reclaim) must hold at least the excess. It spares the
// eviction search when they cannot.
func (s *session) limitsRelievable(j *jobState, req Resources, ownQueue bool) bool {
	if s.heldBlocks(j, req) != nil {
		return false
	}
	R := j.queue
	for q := R; q != s.root; q = q.parent {
		for r := range req {
			if req[r] == 0 || q.limit[r] == Unlimited {
				continue
			}
			over := q.allocated[r] + req[r] - q.limit[r]
			if over <= 0 {
				continue
			}
			avail := q.allocated[r] - R.allocated[r]
			if ownQueue {
				avail = R.allocated[r]
			}
			if avail < over {
				return false
			}
		}
	}
	return true
}

// heldBlocks returns the queue on j's path whose limit room held for this
// cycle (holdLimits) req would need, or nil. Such a set waits for the next
// cycle: the room is not free yet, and evicting more to make up for it would
// take pods that waiting a cycle spares. Every set an evicting action
// places passes here first (limitsRelievable), so the placements after it
// need not count held room.
func (s *session) heldBlocks(j *jobState, req Resources) *queueState {
	for q := j.queue; q != s.root; q = q.parent {
		for r := range req {
			if req[r] > 0 && q.heldLimit[r] > 0 && q.limit[r] != Unlimited && q.allocated[r]+q.heldLimit[r]+req[r] > q.limit[r] {
				return q
			}
		}
	}
	return nil
}

// explainHeld adds to the pods' reasons that j waits for limit room held
// for this cycle, when it does.
func (s *session) explainHeld(j *jobState, req Resources) {
	q := s.heldBlocks(j, req)
	if q == nil {
		return
	}
	for _, p := range s.candidates(j) {
		if p.reason != "" && !strings.Contains(p.reason, "free in the next cycle") {
			p.reason += fmt.Sprintf("; the room under queue %s's limit that this cycle's evictions freed is free in the next cycle", q.name)
		}
	}
}

// withinLimitsWith says whether p's queues stay within their limits with p
// added: free capacity does not help a queue at its limit, evicting its own
// pods does. (Room held for this cycle needs no check here: a set that
// would need it is not tried, see heldBlocks.)
func (s *session) withinLimitsWith(p *podState) bool {
	for q := p.job.queue; q != s.root; q = q.parent {
		for r := range p.res {
			if p.res[r] > 0 && q.limit[r] != Unlimited && q.allocated[r]+p.res[r] > q.limit[r] {
				return false
			}
		}
	}
	return true
}

func withinLimits(s *session, q *queueState, req Resources) bool {
	for ; q != s.root; q = q.parent {
		for r := range req {
			if req[r] > 0 && q.limit[r] != Unlimited && q.allocated[r] > q.limit[r] {
				return false
			}
		}
	}
	return true
}

// consolidate moves running preemptible pods to make room for a pending job
// that fits in the cluster's free capacity but on no node, only when every
// moved pod is re-placed in the same plan.
func (s *session) consolidate() {
	tried := map[*jobState]bool{}
	need := s.pendingNeed(tried)
	s.runOrdered(func(j *jobState) bool { return !j.gated }, need, func(j *jobState) (again bool) {
		l := s.evictSets(j, tried)
		tried[j] = true
		if l.n == 0 {
			return false
		}
		defer func() { again = !tried[j] }()
		// unmovable: pods a failed plan could not re-place; the next try
		// moves others (the first in victim order is not always movable).
		unmovable := map[*podState]bool{}
		pol := &evictPolicy{
			action: ActionConsolidate,
			// A topology-constrained gang's pods are not moved: a move
			// re-places pods one by one, anywhere.
			eligible: func(v *podState) bool {
				return v.job.preemptible && v.job != j && !v.pinned && !unmovable[v] && !v.job.hasTopology() && !s.protected(v, ActionConsolidate, j)
			},
			// A pod that fits nowhere now, not even beside itself, cannot be
			// re-placed later either (the plan only takes capacity).
			rules: func(unit []*podState) bool {
				for _, u := range unit {
					if pl, _ := s.findPlace(u); pl == nil {
						return false
					}
				}
				return true
			},
			reason: func(v *podState) string {
				return fmt.Sprintf("moved to make room for job %s", j.name)
			},
		}
		for _, set := range l.list() {
			if s.inTopology(j, set, true, func(bool) bool {
				return s.atPrices(set, func(bool) bool {
					req := sumRes(set)
					return s.gates(j, req, true) == "" && s.fitsFree(req, s.memSlack) && s.consolidateSet(j, set, pol, unmovable)
				})
			}) {
				tried[j] = false
				return
			}
		}
		return
	})
}

// consolidateSet tries plans that move pods to make room for set, each
// after marking unmovable a pod the last could not re-place.
func (s *session) consolidateSet(j *jobState, set []*podState, pol *evictPolicy, unmovable map[*podState]bool) bool {
	for try := 0; try < consolidateTries; try++ {
		var stuck *podState
		if s.placeSetEvicting(set, pol, func(cp int) bool {
			// Re-place every pod this plan moved, biggest first.
			var moved []*podState
			for _, o := range s.log[cp:] {
				if !o.attach {
					moved = append(moved, o.pod)
				}
			}
			slices.SortStableFunc(moved, biggestGPUFirst)
			for _, v := range moved {
				pl := s.bestNode(v)
				if pl == nil {
					stuck = v
					return false
				}
				s.attach(v, pl, ActionConsolidate, fmt.Sprintf("moved to make room for job %s", j.name))
			}
			// A move can change a memory fraction's share, and the job was
			// placed while the moved pods were out: the queues' limits must
			// hold with everyone back.
			all := Resources{1, 1, 1}
			if !withinLimits(s, j.queue, all) {
				return false
			}
			for _, v := range moved {
				if !withinLimits(s, v.job.queue, all) {
					return false
				}
			}
			return true
		}) {
			return true
		}
		if stuck == nil {
			break // no plan at all, not one that could not re-place a pod
		}
		unmovable[stuck] = true
	}
	return false
}

// consolidateTries bounds the plans tried for one job in one cycle, each
// after marking a pod the last could not re-place.
const consolidateTries = 4

// fitsFree says whether req fits the cluster's total free capacity, with
// gpuSlack more GPU milli that moves could free.
func (s *session) fitsFree(req Resources, gpuSlack int64) bool {
	for r := range req {
		free := s.free[r]
		if Resource(r) == ResGPU {
			free += gpuSlack
		}
		if req[r] > free {
			return false
		}
	}
	return true
}
