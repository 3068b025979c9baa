package core

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Topology-aware gangs (Job.Topology, SubGroup.Topology; DESIGN.md, "Gang,
// topology"): a gang with a required level is placed inside one domain of
// that level or not at all; a preferred level is tried domain by domain
// before the gang may spread over the fewest domains that fit. Each try
// keeps the gang's pending pods to the domain's nodes (podState.mask), so
// the node and NVLink rules, the gang search and the evicting actions'
// victim search run as they do without a topology, on those nodes only: an
// evicting action never takes a victim outside the domain it tries. Jobs
// without a constraint take the paths they took before.

// topoState is one valid topology of the snapshot; its domains are built
// on first use (buildDomains), so a cycle without constrained jobs pays
// nothing.
type topoState struct {
	name   string
	levels []string
	// domains per level, in path order; of[level][node idx] is the node's
	// domain of that level, nil when it has none.
	domains [][]*domain
	of      [][]*domain
}

// domain is the set of nodes sharing one value of a level's label and of
// every broader level's.
type domain struct {
	name  string // its own level's value ("r3")
	path  string // the values from the broadest level, NUL-separated
	level int
	nodes []*nodeState
	mask  []bool // by node idx; built on first use
}

// topoReq is a job's or subgroup's constraint, resolved: levels as
// positions in topo.levels, -1 for none.
type topoReq struct {
	topo      *topoState
	req, pref int
}

// level is the position of a label key among the topology's levels
// (0 the broadest), -1 when it is not one.
func (t *topoState) level(key string) int {
	return slices.Index(t.levels, key)
}

// levelName is the short name of a level in people's words: the last path
// segment of its label key ("topology.kubernetes.io/zone" → "zone",
// "kubernetes.io/hostname" → "hostname", "nvidia.com/gpu.clique" →
// "gpu.clique").
func levelName(key string) string {
	return key[strings.LastIndexByte(key, '/')+1:]
}

// resolveTopo turns a validated constraint into levels; nil for none.
func (s *session) resolveTopo(c *TopologyConstraint) *topoReq {
	if c == nil {
		return nil
	}
	t := s.topos[c.Topology]
	r := &topoReq{topo: t, req: -1, pref: -1}
	if c.Required != "" {
		r.req = t.level(c.Required)
	}
	if c.Preferred != "" {
		r.pref = t.level(c.Preferred)
	}
	if r.pref <= r.req {
		r.pref = -1 // the required domain is inside one of these already
	}
	return r
}

// buildDomains groups the nodes into the topology's domains, once.
func (s *session) buildDomains(t *topoState) {
	if t.domains != nil {
		return
	}
	t.domains = make([][]*domain, len(t.levels))
	t.of = make([][]*domain, len(t.levels))
	for l := range t.levels {
		byPath := map[string]*domain{}
		t.of[l] = make([]*domain, len(s.nodes))
		for _, n := range s.nodes {
			path, ok := domainPath(t, n, l)
			if !ok {
				continue
			}
			d := byPath[path]
			if d == nil {
				d = &domain{name: n.labels[t.levels[l]], path: path, level: l}
				byPath[path] = d
				t.domains[l] = append(t.domains[l], d)
			}
			d.nodes = append(d.nodes, n)
			t.of[l][n.idx] = d
		}
		slices.SortFunc(t.domains[l], func(a, b *domain) int { return strings.Compare(a.path, b.path) })
	}
}

// domainPath is the key of n's domain at level l: its values of levels
// 0..l; ok is false when it lacks one of those labels.
func domainPath(t *topoState, n *nodeState, l int) (string, bool) {
	var b strings.Builder
	for _, key := range t.levels[:l+1] {
		v, ok := n.labels[key]
		if !ok {
			return "", false
		}
		b.WriteString(v)
		b.WriteByte(0)
	}
	return b.String(), true
}

// maskOf is the domain's nodes as a mask by node idx.
func (s *session) maskOf(d *domain) []bool {
	if d.mask == nil {
		d.mask = make([]bool, len(s.nodes))
		for _, n := range d.nodes {
			d.mask[n.idx] = true
		}
	}
	return d.mask
}

// domFree is what a domain has free, live.
type domFree struct {
	res   Resources // GPU milli, CPU, memory on schedulable nodes
	nodes int       // schedulable nodes with some GPU capacity free
	slots int       // pods of the set's smallest whole-GPU ask that fit by GPU count
}

// freeIn sums a domain's free capacity; whole is the smallest whole-GPU
// ask of the set (0: none, or not all of the set asks whole GPUs).
func freeIn(d *domain, whole int) domFree {
	var f domFree
	for _, n := range d.nodes {
		if n.unschedulable {
			continue
		}
		f.res[ResGPU] += n.freeMilli
		f.res[ResCPU] += n.cpu - n.usedCPU
		f.res[ResMemory] += n.mem - n.usedMem
		if n.freeMilli > 0 {
			f.nodes++
		}
		if whole > 0 {
			f.slots += n.freeWhole / whole
		}
	}
	return f
}

// capacityIn is what a domain's schedulable nodes hold in all (the most an
// evicting action could free there).
func capacityIn(d *domain) Resources {
	var r Resources
	for _, n := range d.nodes {
		if !n.unschedulable {
			r[ResGPU] += int64(len(n.gpus)) * 1000
			r[ResCPU] += n.cpu
			r[ResMemory] += n.mem
		}
	}
	return r
}

// wholeAsk is the smallest GPU count of set when every pod of it asks
// whole GPUs, else 0.
func wholeAsk(set []*podState) int {
	least := 0
	for _, p := range set {
		if p.req.GPUs == 0 {
			return 0
		}
		if least == 0 || p.req.GPUs < least {
			least = p.req.GPUs
		}
	}
	return least
}

// fits says whether domains ds together may hold set (whose requests sum
// to need): by their free capacity (allocate) or by their whole capacity
// (the evicting actions).
func (s *session) fits(ds []*domain, set []*podState, need Resources, evicting bool) bool {
	var have Resources
	w, slots := wholeAsk(set), 0
	for _, d := range ds {
		if evicting {
			addRes(&have, capacityIn(d), 1)
			continue
		}
		f := freeIn(d, w)
		addRes(&have, f.res, 1)
		slots += f.slots
	}
	return have[ResGPU] >= need[ResGPU] && have[ResCPU] >= need[ResCPU] && have[ResMemory] >= need[ResMemory] &&
		(evicting || w == 0 || slots >= len(set))
}

// holding are the domains of level l (inside within, when not nil) that
// hold every placed pod of pods: a gang's later pods join its domain.
func (s *session) holding(t *topoState, l int, within []bool, pods []*podState) []*domain {
	var out []*domain
	var fixed *domain
	for _, p := range pods {
		if p.node == nil || p.phase == PodReleasing {
			continue
		}
		d := t.of[l][p.node.idx]
		if d == nil || fixed != nil && d != fixed {
			return nil
		}
		fixed = d
	}
	if fixed != nil {
		if meets(fixed, within) {
			out = append(out, fixed)
		}
		return out
	}
	for _, d := range t.domains[l] {
		if meets(d, within) {
			out = append(out, d)
		}
	}
	return out
}

// meets says whether some node of d is in within (nil: every node).
func meets(d *domain, within []bool) bool {
	if within == nil {
		return true
	}
	return slices.ContainsFunc(d.nodes, func(n *nodeState) bool { return within[n.idx] })
}

// packOrder sorts domains for a try: the fullest first (least GPU free,
// as bin-packing does for nodes, so big domains stay whole) for allocate;
// the emptiest first for the evicting actions (fewest victims).
func packOrder(ds []*domain, evicting bool) {
	free := make(map[*domain]int64, len(ds))
	for _, d := range ds {
		free[d] = freeIn(d, 0).res[ResGPU]
	}
	slices.SortStableFunc(ds, func(a, b *domain) int {
		if c := cmp.Compare(free[a], free[b]); c != 0 {
			if evicting {
				return -c
			}
			return c
		}
		return strings.Compare(a.path, b.path)
	})
}

// setMask keeps pods to mask (nil: every node).
func setMask(pods []*podState, mask []bool) {
	for _, p := range pods {
		p.mask = mask
	}
}

// union is the mask of several domains' nodes.
func (s *session) union(ds []*domain) []bool {
	m := make([]bool, len(s.nodes))
	for _, d := range ds {
		for _, n := range d.nodes {
			m[n.idx] = true
		}
	}
	return m
}

// hasTopology says whether the job or one of its subgroups has a
// constraint.
func (j *jobState) hasTopology() bool {
	if j.topo != nil {
		return true
	}
	for _, g := range j.subs {
		if g.topo != nil {
			return true
		}
	}
	return false
}

// inTopology runs try with the job's pending pods kept to each candidate
// domain in turn (packOrder), until it succeeds: for a required level its
// domains, each holding set (fits); for a preferred one, inside that, its
// domains one by one, then the fewest of them together, then the whole
// required domain (or cluster). Subgroups' domains are chosen inside each
// (maskSubs). Allocate stops at the first try its gates refuse: no domain
// changes them. Without a constraint, try runs once.
func (s *session) inTopology(j *jobState, set []*podState, evicting bool, try func(first bool) bool) bool {
	if !j.hasTopology() {
		return try(true)
	}
	pods := s.candidates(j)
	defer setMask(pods, nil)
	need, first := sumRes(set), true
	attempt := func(m []bool) (ok, stop bool) {
		if !s.maskSubs(j, pods, set, m, evicting) {
			return false, false
		}
		ok, first = try(first), false
		return ok, !ok && !evicting && j.gated
	}
	t := j.topo
	if t == nil {
		ok, _ := attempt(nil)
		return ok
	}
	s.buildDomains(t.topo)
	outer := []*domain{nil}
	if t.req >= 0 {
		outer = s.holding(t.topo, t.req, nil, j.pods)
		packOrder(outer, evicting)
	}
	for _, d := range outer {
		var m []bool
		if d != nil {
			if !s.fits([]*domain{d}, set, need, evicting) {
				continue
			}
			m = s.maskOf(d)
		}
		if t.pref >= 0 {
			if ok, stop := s.tryPreferred(j, t, m, set, evicting, attempt); ok || stop {
				return ok
			}
		}
		if ok, stop := attempt(m); ok || stop {
			return ok
		}
	}
	return false
}

// tryPreferred tries the preferred level's domains inside m one by one
// (packOrder), then the fewest of them, emptiest first, that hold set
// together.
func (s *session) tryPreferred(j *jobState, t *topoReq, m []bool, set []*podState, evicting bool, attempt func([]bool) (bool, bool)) (ok, stop bool) {
	need := sumRes(set)
	inner := s.holding(t.topo, t.pref, m, j.pods)
	packOrder(inner, evicting)
	for _, d := range inner {
		if s.fits([]*domain{d}, set, need, evicting) {
			if ok, stop := attempt(s.intersect(s.maskOf(d), m)); ok || stop {
				return ok, stop
			}
		}
	}
	all := s.holding(t.topo, t.pref, m, nil)
	packOrder(all, true)
	for k := 2; k < len(all); k++ {
		if s.fits(all[:k], set, need, evicting) {
			return attempt(s.intersect(s.union(all[:k]), m))
		}
	}
	return false, false
}

// intersect is a ∧ b, where nil is every node.
func (s *session) intersect(a, b []bool) []bool {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	m := make([]bool, len(s.nodes))
	for i := range m {
		m[i] = a[i] && b[i]
	}
	return m
}

// maskSubs keeps the job's pending pods to m, and the pods of each
// subgroup with a constraint to one domain of its level inside m: the
// fullest that holds the subgroup's pods of set beside the subgroups
// given a domain before it (allocate; the emptiest for the evicting
// actions). It is false when a subgroup's required level has no such
// domain. One choice per try: no other combination is searched.
func (s *session) maskSubs(j *jobState, pods, set []*podState, m []bool, evicting bool) bool {
	setMask(pods, m)
	var taken map[*domain]Resources
	for _, g := range j.subs {
		tr := g.topo
		if tr == nil {
			continue
		}
		l, required := tr.req, tr.req >= 0
		if !required {
			l = tr.pref
		}
		if j.topo != nil && j.topo.topo == tr.topo && l <= j.topo.req {
			continue // the job's domain is inside one of these already
		}
		s.buildDomains(tr.topo)
		mine := func(p *podState) bool { return p.sub == g }
		subSet, subPods := filterPods(set, mine), filterPods(pods, mine)
		if len(subSet) == 0 {
			continue
		}
		need := sumRes(subSet)
		cands := s.holding(tr.topo, l, m, filterPods(j.pods, mine))
		packOrder(cands, evicting)
		var chosen *domain
		for _, d := range cands {
			if s.fits([]*domain{d}, subSet, addedRes(need, taken[d]), evicting) {
				chosen = d
				break
			}
		}
		switch {
		case chosen != nil:
			setMask(subPods, s.intersect(s.maskOf(chosen), m))
			if taken == nil {
				taken = map[*domain]Resources{}
			}
			taken[chosen] = addedRes(taken[chosen], need)
		case required:
			return false
		}
	}
	return true
}

func filterPods(ps []*podState, keep func(*podState) bool) []*podState {
	var out []*podState
	for _, p := range ps {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

func addedRes(a, b Resources) Resources {
	addRes(&a, b, 1)
	return a
}

// allocateTopo is allocateJob for a job with a topology constraint, tried
// domain by domain (inTopology); when none holds the gang, its pods wait
// with the reason in people's words (topoWhy).
func (s *session) allocateTopo(j *jobState) bool {
	if !j.hasTopology() {
		return s.allocateJob(j, ActionAllocate)
	}
	c := s.candidates(j)
	set := pickSet(j, c, needed(j))
	if set == nil {
		return s.allocateJob(j, ActionAllocate)
	}
	if why := s.gates(j, sumRes(set), true); why != "" && !hasAlternatives(set) {
		setReason(c, why)
		j.gated = true
		return false
	}
	inner := ""
	if s.inTopology(j, set, false, func(bool) bool {
		ok := s.allocateJob(j, ActionAllocate)
		if !ok && inner == "" {
			inner = set[0].reason
		}
		return ok
	}) {
		return true
	}
	if !j.gated {
		setReason(c, s.topoWhy(j, set, inner))
	}
	return false
}

// topoWhy says why a gang found no domain: what it needs, in one domain of
// which level, and what the best such domain has free ("gang g needs 8
// pods × 8 GPUs in one rack (topology dc); the best rack has 40 GPUs free
// on 5 nodes"), with the reason of the first domain tried when one was.
func (s *session) topoWhy(j *jobState, set []*podState, inner string) string {
	t, what, l := j.topo, "gang "+j.name, -1
	if t != nil {
		l = t.req
	}
	if l < 0 {
		// A subgroup's required level.
		for _, g := range j.subs {
			if g.topo != nil && g.topo.req >= 0 {
				t, l, what = g.topo, g.topo.req, fmt.Sprintf("gang %s: subgroup %s", j.name, g.name)
				set = filterPods(set, func(p *podState) bool { return p.sub == g })
				break
			}
		}
	}
	if l < 0 {
		return inner
	}
	lvl := levelName(t.topo.levels[l])
	why := fmt.Sprintf("%s needs %s in one %s (topology %s)", what, podsAsk(set), lvl, t.topo.name)
	var best *domain
	var bestFree domFree
	for _, d := range s.holding(t.topo, l, nil, j.pods) {
		if f := freeIn(d, 0); best == nil || f.res[ResGPU] > bestFree.res[ResGPU] {
			best, bestFree = d, f
		}
	}
	switch {
	case best == nil && len(t.topo.domains[l]) == 0:
		why += fmt.Sprintf("; no node has the labels of a %s (%s)", lvl, strings.Join(t.topo.levels[:l+1], ", "))
	case best == nil:
		why += fmt.Sprintf("; its placed pods are not in one %s", lvl)
	default:
		why += fmt.Sprintf("; the best %s has %s free on %s", lvl, formatAmount(ResGPU, bestFree.res[ResGPU]), plural(bestFree.nodes, "node"))
	}
	if inner != "" {
		why += " (" + inner + ")"
	}
	return why
}

// podsAsk says what pods ask in all: "8 pods × 8 GPUs" when alike by GPU,
// else "3 pods (2.5 GPUs)".
func podsAsk(set []*podState) string {
	alike := !slices.ContainsFunc(set, func(p *podState) bool { return p.res[ResGPU] != set[0].res[ResGPU] })
	if alike && len(set) > 0 {
		return fmt.Sprintf("%s × %s", plural(len(set), "pod"), formatAmount(ResGPU, set[0].res[ResGPU]))
	}
	return fmt.Sprintf("%s (%s)", plural(len(set), "pod"), formatAmount(ResGPU, sumRes(set)[ResGPU]))
}

// maskExtra keeps a constrained job's pods beyond its minimum to the
// domains its placed pods are in: the job's required one, and each
// subgroup's (an empty mask where they span several).
func (s *session) maskExtra(j *jobState, c []*podState) {
	var m []bool
	if t := j.topo; t != nil && t.req >= 0 {
		s.buildDomains(t.topo)
		m = make([]bool, len(s.nodes))
		if ds := s.holding(t.topo, t.req, nil, j.pods); len(ds) == 1 {
			m = s.maskOf(ds[0])
		}
	}
	setMask(c, m)
	for _, g := range j.subs {
		if g.topo == nil || g.topo.req < 0 {
			continue
		}
		s.buildDomains(g.topo.topo)
		mine := func(p *podState) bool { return p.sub == g }
		sm := make([]bool, len(s.nodes))
		if ds := s.holding(g.topo.topo, g.topo.req, m, filterPods(j.pods, mine)); len(ds) == 1 {
			sm = s.intersect(s.maskOf(ds[0]), m)
		}
		setMask(filterPods(c, mine), sm)
	}
}
