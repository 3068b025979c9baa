package core

import "slices"

// computeFairShare fills demand and fairShare of every queue, per resource,
// top-down from the cluster's capacity, as DESIGN.md's "Fair share" says.
func (s *session) computeFairShare() {
	s.computeDemand(s.root)
	for r := Resource(0); r < NumResources; r++ {
		s.root.fairShare[r] = s.capacity[r]
		s.divide(s.root, r)
	}
}

// computeDemand sets demand = allocated + pending for leaves and the sum of
// the children's for parents, each capped at the queue's own limit.
func (s *session) computeDemand(q *queueState) {
	if len(q.children) == 0 {
		for r := range q.demand {
			q.demand[r] = q.allocated[r] + q.pending[r]
		}
	} else {
		q.demand = Resources{}
		for _, c := range q.children {
			s.computeDemand(c)
			addRes(&q.demand, c.demand, 1)
		}
	}
	if q == s.root {
		return
	}
	for r := range q.demand {
		if q.limit[r] != Unlimited {
			q.demand[r] = min(q.demand[r], q.limit[r])
		}
	}
}

// divide hands q's fair share of resource r to its children (children are
// sorted by name, which is the order leftover units go in).
func (s *session) divide(q *queueState, r Resource) {
	kids := q.children
	if len(kids) == 0 {
		return
	}
	share := q.fairShare[r]
	got := make([]int64, len(kids))

	// 1. Each child's guarantee: min(quota, demand), scaled down in
	// proportion when they do not all fit.
	var sum int64
	for i, c := range kids {
		g := c.demand[r]
		if c.quota[r] != Unlimited {
			g = min(g, c.quota[r])
		}
		got[i] = g
		sum += g
	}
	rest := share - sum
	if sum > share {
		want := slices.Clone(got)
		var given int64
		for i := range got {
			got[i] = mulDiv(want[i], share, sum)
			given += got[i]
		}
		for i := 0; given < share; i = (i + 1) % len(kids) {
			if got[i] < want[i] {
				got[i]++
				given++
			}
		}
		rest = 0
	}

	// 2. The rest, by queue priority (highest first), among equal priority
	// in proportion to over-quota weight, each capped at its demand (which
	// is already capped at its limit).
	if rest > 0 {
		plain := make([]int64, len(kids))
		for i, c := range kids {
			plain[i] = c.weight[r]
		}
		weights, history := s.overQuotaWeights(kids, r)
		prios := make([]int32, 0, len(kids))
		for _, c := range kids {
			prios = append(prios, c.priority)
		}
		slices.Sort(prios)
		prios = slices.Compact(prios)
		for pi := len(prios) - 1; pi >= 0 && rest > 0; pi-- {
			rest = waterFill(kids, r, weights, got, activeAt(kids, r, prios[pi], weights, got), rest)
			if history && rest > 0 {
				// What the queues of weight above 0 after history could
				// not take goes by weight alone, so that idle capacity
				// stays usable by queues that used much.
				rest = waterFill(kids, r, plain, got, activeAt(kids, r, prios[pi], plain, got), rest)
			}
		}
	}
	for i, c := range kids {
		c.fairShare[r] = got[i]
		s.divide(c, r)
	}
}

// activeAt is the children of priority p with a weight above 0 (in
// weights) that still want more than they got.
func activeAt(kids []*queueState, r Resource, p int32, weights, got []int64) []int {
	var active []int
	for i, c := range kids {
		if c.priority == p && weights[i] > 0 && got[i] < c.demand[r] {
			active = append(active, i)
		}
	}
	return active
}

// waterFill divides rest among the active children in proportion to their
// weights, capping each at its demand, and returns what nobody could take.
func waterFill(kids []*queueState, r Resource, weights []int64, got []int64, active []int, rest int64) int64 {
	for len(active) > 0 && rest > 0 {
		var w int64
		for _, i := range active {
			w += weights[i]
		}
		// Children whose proportional share covers their need are capped
		// first; the others then share what remains.
		capped := false
		next := active[:0:0]
		round := rest
		for _, i := range active {
			need := kids[i].demand[r] - got[i]
			if mulDiv(round, weights[i], w) >= need {
				got[i] += need
				rest -= need
				capped = true
			} else {
				next = append(next, i)
			}
		}
		if capped {
			active = next
			continue
		}
		var given int64
		for _, i := range active {
			g := mulDiv(rest, weights[i], w)
			got[i] += g
			given += g
		}
		left := rest - given
		// Leftover units one at a time in name order; each active child
		// still needs more than it got, and left < len(active).
		for _, i := range active {
			if left == 0 {
				break
			}
			got[i]++
			left--
		}
		return 0
	}
	return rest
}

// usageScale is the fixed point of the shares overQuotaWeights compares.
const usageScale = 1 << 30

// overQuotaWeights is the weight each child takes the over-quota rest by
// (DESIGN.md, "Fair share with history"): its over-quota weight w, or, with
// a usage coefficient k > 0 and some usage among the children of weight
// above 0 (history true), max(0, e + k·(e − u)) where e is w's share of
// those children's weights and u the child's share of their usage, both in
// units of 2^-30. A child of weight 0 stays 0.
func (s *session) overQuotaWeights(kids []*queueState, r Resource) (weights []int64, history bool) {
	out := make([]int64, len(kids))
	var w, u int64
	for i, c := range kids {
		out[i] = c.weight[r]
		if c.weight[r] > 0 {
			w += c.weight[r]
			u = satAdd(u, c.usage[r])
		}
	}
	k := s.cfg.UsageCoefficient
	if k == 0 || u == 0 {
		return out, false
	}
	for i, c := range kids {
		if c.weight[r] == 0 {
			continue
		}
		e := mulDiv(c.weight[r], usageScale, w)
		f := mulDiv(c.usage[r], usageScale, u)
		out[i] = max(0, ((1000+k)*e-k*f)/1000)
	}
	return out, true
}

// addUsage reads Snapshot.Usage into the leaves and sums it up the tree.
func (s *session) addUsage(snap *Snapshot) {
	if s.cfg.UsageCoefficient == 0 {
		return
	}
	for name, u := range snap.Usage {
		q := s.queueByN[name]
		if q == nil || len(q.children) > 0 {
			continue // unknown and parent queues' own usage is not read
		}
		for ; q != nil; q = q.parent {
			for r := range u {
				q.usage[r] = satAdd(q.usage[r], max(u[r], 0))
			}
		}
	}
}

// satAdd adds non-negative amounts, saturating at 2^62.
func satAdd(a, b int64) int64 {
	if b >= 1<<62-a {
		return 1 << 62
	}
	return a + b
}
