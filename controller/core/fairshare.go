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
		prios := make([]int32, 0, len(kids))
		for _, c := range kids {
			prios = append(prios, c.priority)
		}
		slices.Sort(prios)
		prios = slices.Compact(prios)
		for pi := len(prios) - 1; pi >= 0 && rest > 0; pi-- {
			var active []int
			for i, c := range kids {
				if c.priority == prios[pi] && c.weight[r] > 0 && got[i] < c.demand[r] {
					active = append(active, i)
				}
			}
			rest = waterFill(kids, r, got, active, rest)
		}
	}
	for i, c := range kids {
		c.fairShare[r] = got[i]
		s.divide(c, r)
	}
}

// waterFill divides rest among the active children in proportion to their
// weights, capping each at its demand, and returns what nobody could take.
func waterFill(kids []*queueState, r Resource, got []int64, active []int, rest int64) int64 {
	for len(active) > 0 && rest > 0 {
		var w int64
		for _, i := range active {
			w += kids[i].weight[r]
		}
		// Children whose proportional share covers their need are capped
		// first; the others then share what remains.
		capped := false
		next := active[:0:0]
		round := rest
		for _, i := range active {
			need := kids[i].demand[r] - got[i]
			if mulDiv(round, kids[i].weight[r], w) >= need {
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
			g := mulDiv(rest, kids[i].weight[r], w)
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
