package core

import (
	"slices"
)

// Gang search. A gang is placed greedily: its biggest pods (then its
// smallest), each on its best node. That misses two kinds of fit:
//   - another assignment of the pods to nodes: two 2-GPU pods needing 40
//     CPUs and two needing 8, on two 4-GPU nodes of 48 CPUs; the small ones,
//     placed first, take a pair on each node and the big ones fit nowhere;
//   - another choice of pods, when the job has more than minMember: three
//     2-GPU pods that require NVLink and one that only prefers it and asks
//     more CPU, minMember 3, with one free NVLink node of 4 GPUs and one of
//     2 GPUs without NVLink (both greedy sets are the three NVLink pods).
//
// When the greedy pass fails, searchJob backtracks over both: which pods
// (biggest first, a pod tried before it is left out) and on which nodes
// (best first), within a budget, so a gang that fits runs instead of
// waiting for capacity it does not need.

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

// searchJob places n of the job's pending pods cands (biggest first) by
// backtracking search, each within the job's gates, or leaves everything as
// it was and returns false. The caller has already tried the greedy pass.
func (s *session) searchJob(j *jobState, cands []*podState, n int, a Action) bool {
	if s.searchLeft <= 0 || n < 1 || (n == 1 && len(cands) < 2) {
		return false
	}
	// A pod that fits nowhere now fits nowhere after others are placed.
	fits := map[string]bool{}
	var pods []*podState
	for _, p := range cands {
		ok, seen := fits[p.shape]
		if !seen {
			pl, _ := s.findPlace(p)
			ok = pl != nil
			fits[p.shape] = ok
		}
		if ok {
			pods = append(pods, p)
		}
	}
	if pickSet(j, pods, n) == nil || !s.mayHold(pods, n) {
		return false
	}
	budget := min(searchBudget, s.searchLeft)
	// Nodes that look alike to every pod are one branch: a pod's hooks
	// that tell nodes apart by name rule that out.
	var alike *alikeKeys
	if !slices.ContainsFunc(pods, func(p *podState) bool {
		return p.feasible != nil || p.nodeScore != nil || p.matches != nil || p.avoids != nil || p.needs != nil || p.spread != nil
	}) {
		alike = visibleLabels(j, pods)
	}
	// Pods of one shape (and subgroup) are interchangeable: once one is
	// left out, so are the later ones (the pods taken of a shape are its
	// first ones).
	key := func(p *podState) string { return p.shape }
	if j.subs != nil {
		key = func(p *podState) string {
			if p.sub == nil {
				return p.shape
			}
			return p.shape + "\x00" + p.sub.name
		}
	}
	// Subgroups: what each still lacks (lack in all); a set of n holds
	// only with every one met, and a pod is left out only when its
	// subgroup keeps enough other pods after it (spare).
	need, lack, spare := subSearch(j, pods, key)
	out := map[string]bool{}
	var dfs func(i, placed int) bool
	dfs = func(i, placed int) bool {
		// Fewer places left than pods the subgroups lack: no set of n
		// here holds (a full set with a subgroup short included).
		if n-placed < lack {
			return false
		}
		if placed == n {
			return true
		}
		if len(pods)-i < n-placed || budget <= 0 {
			return false
		}
		budget--
		p := pods[i]
		if out[key(p)] {
			return dfs(i+1, placed)
		}
		took := p.sub != nil && need[p.sub.idx] > 0
		// A pod no subgroup lacks takes a place only when one is spare.
		if (took || n-placed-1 >= lack) && s.gates(j, p.res, true) == "" {
			if took {
				need[p.sub.idx]--
				lack--
			}
			ok := s.tryNodes(p, a, alike, &budget, func() bool { return dfs(i+1, placed+1) })
			if took {
				need[p.sub.idx]++
				lack++
			}
			if ok {
				return true
			}
			if budget <= 0 {
				return false
			}
		}
		if p.sub != nil && spare[i] < need[p.sub.idx] {
			return false
		}
		out[key(p)] = true
		ok := dfs(i+1, placed)
		delete(out, key(p))
		return ok
	}
	start := budget
	ok := dfs(0, 0)
	s.searchLeft -= start - budget
	return ok
}

// tryNodes places p on each node it fits in turn, best first, at most
// searchBranch distinct ones, until rest succeeds; it undoes each failed
// placement and returns false when none succeeds.
func (s *session) tryNodes(p *podState, a Action, alike *alikeKeys, budget *int, rest func() bool) bool {
	var plans []*plan
	var keys []int64
	for _, n := range s.nodes {
		if *budget <= 0 {
			return false
		}
		*budget--
		if p.req.GPUs > 0 && n.freeWhole < p.req.GPUs {
			continue
		}
		if pl, why, _ := fitOnNode(p, n); why == fitOK {
			plans, keys = append(plans, pl), append(keys, s.scorePlan(p, pl))
		}
	}
	// Best first, as the greedy pass ranks them (stable: node order on ties).
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
		if alike != nil && slices.ContainsFunc(tried, func(o *nodeState) bool {
			return sameState(o, n) && alike.same(o, n)
		}) {
			continue
		}
		if len(tried) == searchBranch {
			break
		}
		tried = append(tried, n)
		c := s.checkpoint()
		s.attach(p, plans[k], a, "")
		if rest() {
			return true
		}
		s.rollback(c)
		if *budget <= 0 {
			return false
		}
	}
	return false
}

// mayHold is a cheap necessary condition for n of pods to fit the free
// capacity: the n smallest asks of whole GPUs, of CPU and of memory, each
// within the free total over all schedulable nodes.
func (s *session) mayHold(pods []*podState, n int) bool {
	var free [3]int64
	for _, nd := range s.nodes {
		if !nd.unschedulable {
			free[0] += int64(nd.freeWhole)
			free[1] += nd.cpu - nd.usedCPU
			free[2] += nd.mem - nd.usedMem
		}
	}
	ask := make([]int64, len(pods))
	for r, get := range [3]func(p *podState) int64{
		func(p *podState) int64 { return int64(p.req.GPUs) },
		func(p *podState) int64 { return p.req.CPU },
		func(p *podState) int64 { return p.req.Memory },
	} {
		for i, p := range pods {
			ask[i] = get(p)
		}
		slices.Sort(ask)
		var sum int64
		for _, v := range ask[:n] {
			sum += v
		}
		if sum > free[r] {
			return false
		}
	}
	return true
}

// alikeKeys are the node label keys a gang's pods can tell nodes apart by
// when they have no per-node hooks: their node selectors' keys and the
// levels of the job's and its subgroups' topologies. Every other label
// (kubernetes.io/hostname above all, which every node has and no two share)
// would make no two nodes alike and the search lose its symmetry.
type alikeKeys struct{ keys []string }

func visibleLabels(j *jobState, pods []*podState) *alikeKeys {
	k := &alikeKeys{}
	add := func(key string) {
		if !slices.Contains(k.keys, key) {
			k.keys = append(k.keys, key)
		}
	}
	for _, p := range pods {
		for key := range p.selector {
			add(key)
		}
	}
	if j.topo != nil {
		for _, l := range j.topo.topo.levels {
			add(l)
		}
	}
	for _, sub := range j.subs {
		if sub.topo != nil {
			for _, l := range sub.topo.topo.levels {
				add(l)
			}
		}
	}
	return k
}

// same reports whether o and n agree on every key (absent on both counts as
// agreeing).
func (k *alikeKeys) same(o, n *nodeState) bool {
	for _, key := range k.keys {
		x, okx := o.labels[key]
		y, oky := n.labels[key]
		if okx != oky || x != y {
			return false
		}
	}
	return true
}
