package core

import (
	"maps"
	"slices"
)

// Gang search. A gang is placed greedily: each pod, biggest first, on its
// best node. That misses assignments where an early pod's best node is the
// only one a later pod fits (two 2-GPU pods needing 40 CPUs and two needing
// 8, on two 4-GPU nodes of 48 CPUs: the small ones, placed first, take one
// node, and the second big one fits nowhere). When the greedy pass fails,
// searchSet backtracks over the nodes each pod fits, best first, within a
// budget of node evaluations, so a gang that fits by another assignment
// runs instead of waiting for capacity it does not need.

const (
	// searchBudget bounds one gang's search, in node evaluations: a few
	// thousand on small clusters, a few levels on a large one.
	searchBudget = 20000
	// searchBranch bounds the nodes tried per pod: past the best few
	// distinct ones, another node rarely changes what the rest can fit.
	searchBranch = 8
)

// sessionSearchBudget bounds all searches of one cycle (a variable so that
// the benchmark can measure a cycle without them).
var sessionSearchBudget = 200000

// searchSet places set by backtracking search, or leaves everything as it
// was and returns false. The caller has already tried the greedy order.
func (s *session) searchSet(set []*podState, a Action) bool {
	if len(set) < 2 || s.searchLeft <= 0 || !s.mayHold(set) {
		return false
	}
	// A pod that fits nowhere now fits nowhere after others are placed.
	seen := map[string]bool{}
	for _, p := range set {
		if seen[p.shape] {
			continue
		}
		seen[p.shape] = true
		if pl, _ := s.findPlace(p); pl == nil {
			return false
		}
	}
	budget := min(searchBudget, s.searchLeft)
	// Nodes that look alike to every pod of the set are one branch: a
	// pod's hooks that tell nodes apart by name rule that out.
	alike := !slices.ContainsFunc(set, func(p *podState) bool {
		return p.feasible != nil || p.nodeScore != nil || p.matches != nil || p.avoids != nil || p.needs != nil || p.spread != nil
	})
	cp := s.checkpoint()
	var dfs func(i int) bool
	dfs = func(i int) bool {
		if i == len(set) {
			return true
		}
		p := set[i]
		var plans []*plan
		var keys []int64
		for _, n := range s.nodes {
			if budget <= 0 {
				return false
			}
			budget--
			if p.req.GPUs > 0 && n.freeWhole < p.req.GPUs {
				continue
			}
			if pl, why, _ := fitOnNode(p, n); why == fitOK {
				plans, keys = append(plans, pl), append(keys, s.scorePlan(p, pl))
			}
		}
		// Best first, as the greedy pass ranks them (stable: node order on
		// ties); at most searchBranch distinct nodes per pod.
		idx := make([]int, len(plans))
		for k := range idx {
			idx[k] = k
		}
		slices.SortStableFunc(idx, func(x, y int) int {
			switch {
			case s.better(p, plans[x], keys[x], plans[y], keys[y]):
				return -1
			case s.better(p, plans[y], keys[y], plans[x], keys[x]):
				return 1
			}
			return 0
		})
		var tried []*nodeState
		for _, k := range idx {
			n := plans[k].node
			if alike && slices.ContainsFunc(tried, func(o *nodeState) bool {
				return sameState(o, n) && maps.Equal(o.labels, n.labels)
			}) {
				continue
			}
			if len(tried) == searchBranch {
				break
			}
			tried = append(tried, n)
			c := s.checkpoint()
			s.attach(p, plans[k], a, "")
			if dfs(i + 1) {
				return true
			}
			s.rollback(c)
			if budget <= 0 {
				return false
			}
		}
		return false
	}
	start := budget
	ok := dfs(0)
	s.searchLeft -= start - budget
	if !ok {
		s.rollback(cp)
	}
	return ok
}

// mayHold is a cheap necessary condition for set to fit the free capacity:
// enough free whole GPUs, CPU and memory over all schedulable nodes.
func (s *session) mayHold(set []*podState) bool {
	var gpus int
	var cpu, mem int64
	for _, p := range set {
		gpus += p.req.GPUs
		cpu += p.req.CPU
		mem += p.req.Memory
	}
	for _, n := range s.nodes {
		if n.unschedulable {
			continue
		}
		gpus -= n.freeWhole
		cpu -= n.cpu - n.usedCPU
		mem -= n.mem - n.usedMem
	}
	return gpus <= 0 && cpu <= 0 && mem <= 0
}
