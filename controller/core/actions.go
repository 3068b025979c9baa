package core

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// candidates are the job's pods still waiting, biggest GPU request first
// (a gang fits more often when its big pods go first), then by name.
func (s *session) candidates(j *jobState) []*podState {
	var out []*podState
	for _, p := range j.pods {
		if p.phase == PodPending && p.node == nil {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, biggestGPUFirst)
	return out
}

// biggestGPUFirst orders pods by GPU request, biggest first, then those
// that require NVLink (the scarcer GPUs, before a pod that only prefers
// them takes them), then by name: the order in which pods are placed when
// several must fit together.
func biggestGPUFirst(a, b *podState) int {
	if c := cmp.Compare(b.res[ResGPU], a.res[ResGPU]); c != 0 {
		return c
	}
	if ra, rb := a.req.NVLink == NVLinkRequired, b.req.NVLink == NVLinkRequired; ra != rb {
		if ra {
			return -1
		}
		return 1
	}
	return strings.Compare(a.name, b.name)
}

// needed is how many pods the job must place now: the rest of its gang
// while short of minMember (or a subgroup of its minimum: at least what
// the subgroups lack), else one more.
func needed(j *jobState) int {
	n := j.minMember - j.placed
	if j.subs != nil {
		n = max(n, j.subDeficit())
	}
	return max(n, 1)
}

func sumRes(ps []*podState) Resources {
	var r Resources
	for _, p := range ps {
		addRes(&r, p.res, 1)
	}
	return r
}

// gates checks the policy that no eviction can change: queue limits (leaf
// and ancestors) and, for non-preemptible jobs, quotas. "" when it passes.
func (s *session) gates(j *jobState, req Resources, checkLimit bool) string {
	if checkLimit {
		for q := j.queue; q != s.root; q = q.parent {
			for r := Resource(0); r < NumResources; r++ {
				// Room this cycle's evictions freed is free only in the
				// next (holdLimits).
				used := q.allocated[r] + q.heldLimit[r]
				if req[r] == 0 || q.limit[r] == Unlimited || used+req[r] <= q.limit[r] {
					continue
				}
				if q.heldLimit[r] > 0 {
					return fmt.Sprintf("queue %s would exceed its limit of %s (%s in use and %s freed by this cycle's evictions, free in the next cycle; job %s needs %s)",
						q.name, formatAmount(r, q.limit[r]), formatAmount(r, q.allocated[r]), formatAmount(r, q.heldLimit[r]), j.name, formatAmount(r, req[r]))
				}
				if q.allocated[r] >= q.limit[r] {
					return fmt.Sprintf("queue %s at its limit of %s", q.name, formatAmount(r, q.limit[r]))
				}
				return fmt.Sprintf("queue %s would exceed its limit of %s (%s in use, job %s needs %s)",
					q.name, formatAmount(r, q.limit[r]), formatAmount(r, q.allocated[r]), j.name, formatAmount(r, req[r]))
			}
		}
	}
	if j.preemptible {
		return ""
	}
	// Name the quota that binds hardest: the queue with the least room left
	// (an ancestor on ties, as it constrains more), so the person is sent to
	// the queue whose quota must change, not to a leaf that would still be
	// blocked above.
	var worst *queueState
	var worstR Resource
	var worstLeft int64
	for q := j.queue; q != s.root; q = q.parent {
		for r := Resource(0); r < NumResources; r++ {
			if req[r] == 0 || q.quota[r] == Unlimited || q.allocNP[r]+req[r] <= q.quota[r] {
				continue
			}
			left := max(0, q.quota[r]-q.allocNP[r])
			if worst == nil || left <= worstLeft {
				worst, worstR, worstLeft = q, r, left
			}
		}
	}
	if worst == nil {
		return ""
	}
	where := "queue " + worst.name
	if worst != j.queue {
		where = fmt.Sprintf("queue %s (an ancestor of %s)", worst.name, j.queue.name)
	}
	return fmt.Sprintf("non-preemptible job %s needs %s within quota; %s has %s of its quota of %s left",
		j.name, formatAmount(worstR, req[worstR]), where, formatAmount(worstR, worstLeft), formatAmount(worstR, worst.quota[worstR]))
}

// findPlace is bestNode with a memo of shapes known not to fit.
func (s *session) findPlace(p *podState) (*plan, string) {
	if p.mask != nil {
		// Kept to a domain: what fits elsewhere is not this pod's answer.
		if pl := s.bestNode(p); pl != nil {
			return pl, ""
		}
		return nil, s.whyNot(p)
	}
	if e, ok := s.failCache[p.shape]; ok && e.epoch == s.freeEpoch {
		return nil, e.reason
	}
	if pl := s.bestNode(p); pl != nil {
		return pl, ""
	}
	why := s.whyNot(p)
	s.failCache[p.shape] = failEntry{epoch: s.freeEpoch, reason: why}
	return nil, why
}

// alternatives places p, for allocate, with the first of its alternatives
// (Pod.Alternatives) that passes the job's gates and fits a node, each
// tried on every node before the next; why is why its own request did
// not. The plan says which alternative it is for; the pod is left at its
// own request. Without a plan, the reason is each request's, in order.
func (s *session) alternatives(j *jobState, p *podState, why string) (*plan, string) {
	if p.alts == nil {
		return nil, why
	}
	// The pod's own request may be priced by GPU size (byGPUSize): its
	// price is not its alternatives'.
	res, capped := p.res, p.milliCap
	p.milliCap = 0
	defer func() { p.res, p.milliCap = res, capped }()
	for k := 1; k < len(p.alts); k++ {
		s.setAlt(p, k)
		pl, w := (*plan)(nil), s.gates(j, p.res, true)
		if w == "" {
			pl, w = s.findPlace(p)
		}
		s.setAlt(p, 0)
		if pl != nil {
			return pl, ""
		}
		why += fmt.Sprintf("; else (alternative %d) %s", k, w)
	}
	return nil, why
}

func setReason(ps []*podState, why string) {
	for _, p := range ps {
		p.reason = why
	}
}

// staleGangs evicts every gang that has stayed below minMember too long.
func (s *session) staleGangs() {
	if s.cfg.StaleGangTimeout < 0 {
		return
	}
	cp := s.checkpoint()
	for _, j := range s.jobs {
		if j.disruption == DisruptionSingle || !j.belowMin() || j.belowSince.IsZero() || s.now.Sub(j.belowSince) < s.cfg.StaleGangTimeout {
			continue
		}
		why := fmt.Sprintf("gang %s below its minMember of %d for %s", j.name, j.gangMin(), s.now.Sub(j.belowSince).Round(1e9))
		if j.placed >= j.gangMin() {
			why = fmt.Sprintf("gang %s below its minimum for %s (%s)", j.name, s.now.Sub(j.belowSince).Round(1e9), j.subsBelow())
		}
		for _, p := range j.pods {
			if p.node != nil && p.phase != PodReleasing {
				s.detach(p, ActionStaleGang, why)
			}
		}
	}
	// An evicted pod frees its resources at the end of the cycle
	// (SCENARIOS.md), and no plan placed anything onto these: they are
	// held, capacity and limit room, so allocate gets them in the next
	// cycle, in its job order, rather than in this one as binds that wait.
	s.holdFreed(cp)
}

// allocate places pending jobs on free capacity; it never evicts. Gangs
// short of minMember go first, all-or-nothing; then pods beyond minMember,
// one at a time.
func (s *session) allocate() {
	tried := map[*jobState]bool{}
	gangNeed := func(j *jobState) (Resources, bool) {
		if tried[j] || !j.short() {
			return Resources{}, false
		}
		c := s.candidates(j)
		set := pickSet(j, c, needed(j))
		if set == nil {
			return Resources{}, false
		}
		return sumRes(set), true
	}
	s.runOrdered(func(j *jobState) bool { return j.short() }, gangNeed, func(j *jobState) bool {
		tried[j] = true
		s.allocateTopo(j)
		return false
	})
	// Pods beyond minMember.
	done := map[*jobState]bool{}
	extraNeed := func(j *jobState) (Resources, bool) {
		if done[j] || j.short() {
			return Resources{}, false
		}
		c := s.candidates(j)
		if len(c) == 0 {
			return Resources{}, false
		}
		return c[0].res, true
	}
	s.runOrdered(func(j *jobState) bool { return true }, extraNeed, func(j *jobState) bool {
		// The biggest first; when it does not fit, a smaller one may.
		c := s.candidates(j)
		if j.hasTopology() {
			s.maskExtra(j, c)
			defer setMask(c, nil)
		}
		firstWhy, gated := "", false
		for _, p := range c {
			if why := s.gates(j, p.res, true); why != "" {
				if pl, why := s.alternatives(j, p, why); pl != nil {
					s.attach(p, pl, ActionAllocate, "")
					return true
				} else if firstWhy == "" {
					firstWhy, gated = why, true
				}
				continue
			}
			pl, why := s.findPlace(p)
			if pl == nil {
				pl, why = s.alternatives(j, p, why)
			}
			if pl == nil {
				if firstWhy == "" {
					firstWhy = why
				}
				continue
			}
			s.attach(p, pl, ActionAllocate, "")
			return true
		}
		setReason(c, firstWhy)
		j.gated = j.gated || gated
		done[j] = true
		return false
	})
	// Jobs that cannot reach minMember (or a subgroup its own) with the
	// pods they have.
	for _, j := range s.jobs {
		c := s.candidates(j)
		if len(c) == 0 {
			continue
		}
		if j.placed+len(c) < j.minMember {
			setReason(c, fmt.Sprintf("gang %s needs %s; only %d exist", j.name, plural(j.minMember, "pod"), j.placed+len(c)))
		} else if j.subs != nil {
			if why := subReach(j, c); why != "" {
				setReason(c, why)
			}
		}
	}
}

// podSets are the sets of pending pods a job may place now, in the order
// tried: the n it needs, biggest first; then, when it has more pods than
// that, the n smallest (biggest of them placed first), since a set with the
// big pods may not fit, or may pass a queue's share or limit, where one of
// small pods does (two halves share a GPU a whole pod would take; a job of
// minMember 1 runs its 1-GPU pod where its 2-GPU pod does not fit).
func (s *session) podSets(j *jobState) podSetList {
	c := s.candidates(j)
	n := needed(j)
	l := podSetList{all: c}
	first := pickSet(j, c, n)
	if first == nil {
		return l
	}
	l.sets[0], l.n = first, 1
	if len(c) == n {
		return l
	}
	if n == 1 {
		// Only pods of a subgroup short of its minimum count.
		c = lacking(j, c)
		// The smallest pod, found by a scan (no sort: pods beyond minMember
		// come here one at a time). On a tie of its shape with the first
		// set's (a memory fraction and a share of one price at the largest
		// GPU), the smallest pod that places differently.
		best, other := 0, -1
		for i := 1; i < len(c); i++ {
			if smallerPod(c[i], c[best]) < 0 {
				best = i
			}
			if c[i].shape != c[0].shape && (other < 0 || smallerPod(c[i], c[other]) < 0) {
				other = i
			}
		}
		if c[best].shape == c[0].shape {
			best = other
		}
		if best > 0 {
			l.sets[1], l.n = c[best:best+1], 2
		}
		return l
	}
	small := slices.Clone(c)
	slices.SortStableFunc(small, smallerPod)
	small = slices.Clone(pickSet(j, small, n))
	slices.SortStableFunc(small, biggestGPUFirst)
	if !slices.Equal(small, first) {
		l.sets[1], l.n = small, 2
	}
	return l
}

// smallerPod orders pods smallest first, by GPU, then CPU, then memory
// (pods of one GPU size may differ in what else they ask), then name.
func smallerPod(x, y *podState) int {
	for _, r := range [...]Resource{ResGPU, ResCPU, ResMemory} {
		if c := cmp.Compare(x.res[r], y.res[r]); c != 0 {
			return c
		}
	}
	return strings.Compare(x.name, y.name)
}

// podSetList is podSets' answer, by value: the job's pending pods (all,
// biggest first) and the sets to try.
type podSetList struct {
	all  []*podState
	sets [2][]*podState
	n    int
}

// list is the sets to try, in order.
func (l *podSetList) list() [][]*podState { return l.sets[:l.n] }

// allocateJob places the job's missing gang members on free capacity, all
// or nothing, trying each of its pod sets.
func (s *session) allocateJob(j *jobState, a Action) bool {
	l := s.podSets(j)
	if l.n == 0 {
		return false
	}
	// The reason given is the first set's: the job's pods as it asks.
	reason, gated := "", true
	for i, set := range l.list() {
		why := s.gates(j, sumRes(set), true)
		if why != "" && hasAlternatives(set) {
			// An alternative may pass where the pods' own requests do not
			// (each pod of a gang is checked as it is added).
			if ok, w := s.placeSetGated(j, set, a, why); ok {
				return true
			} else if i == 0 {
				why = w
			}
		}
		if why == "" {
			gated = false
			var ok bool
			if ok, why = s.placeSet(j, set, a); ok {
				return true
			}
			// Placed pod by pod, memory fractions may take small GPUs (a
			// bigger share) and leave the rest of a gang no room under a
			// limit: try them priced by GPU size, largest first.
			if s.pricedBySize(set) && s.byGPUSize(set, func(bool) bool {
				if s.gates(j, sumRes(set), true) != "" {
					return false
				}
				ok, _ := s.placeSet(j, set, a)
				return ok
			}) {
				return true
			}
		}
		if i == 0 {
			reason = why
		}
	}
	// Another choice of pods, or of nodes for them, may fit where the
	// greedy pass does not.
	if s.searchJob(j, l.all, needed(j), a) {
		return true
	}
	setReason(l.all, reason)
	j.gated = gated
	return false
}

// hasAlternatives says whether a pod of set has Pod.Alternatives.
func hasAlternatives(set []*podState) bool {
	return slices.ContainsFunc(set, func(p *podState) bool { return p.alts != nil })
}

// placeSet places set on free capacity, all or nothing, or says why not.
// The caller checked the set's gates; each pod of a gang is checked again
// as it is added, on the queue's live allocation: the set's check priced a
// memory fraction at the largest GPU's share, and one placed on a smaller
// GPU takes more (a 40Gi pod on a 40Gi GPU takes 1, not 0.5), which the
// pods after it must see. (Its own real share is checked where it is
// placed: milliRoom.)
func (s *session) placeSet(j *jobState, set []*podState, a Action) (bool, string) {
	return s.placeSetGated(j, set, a, "")
}

// placeSetGated is placeSet where setWhy, when not "", says why the set's
// own requests did not pass the gates: a pod alone then tries only its
// alternatives, each checked against the gates (a gang's pods are checked
// one by one anyway).
func (s *session) placeSetGated(j *jobState, set []*podState, a Action, setWhy string) (bool, string) {
	n := len(set)
	cp := s.checkpoint()
	placed, firstWhy := 0, ""
	for _, p := range set {
		pl, why := (*plan)(nil), setWhy
		if n > 1 {
			why = s.gates(j, p.res, true)
		}
		if why == "" {
			pl, why = s.findPlace(p)
		}
		if pl == nil {
			pl, why = s.alternatives(j, p, why)
		}
		if pl == nil {
			if firstWhy == "" {
				firstWhy = fmt.Sprintf("%s: %s", podLabel(p), why)
			}
			if n == 1 {
				firstWhy = why
			}
			continue // keep counting how many fit, for the reason
		}
		s.attach(p, pl, a, "")
		placed++
	}
	if placed == n {
		return true, ""
	}
	s.rollback(cp)
	if n > 1 || j.minMember > 1 || j.subs != nil {
		firstWhy = fmt.Sprintf("gang %s needs %s; only %d fit (%s)", j.name, j.gangWants(), j.placed+placed, firstWhy)
	}
	return false, firstWhy
}
