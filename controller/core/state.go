package core

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// gpuState is one GPU's live usage inside a cycle.
type gpuState struct {
	index     int
	memory    int64
	model     string
	domain    string
	usedMilli int64
	usedMem   int64
	// fracMilli and fracMem split the fractions on it by how they were
	// asked: the milli of those given as a share, the bytes of those given
	// as memory. A memory fraction's milli is rounded; fitsFraction uses
	// these to decide exactly (three 8Gi pods fill a 24Gi GPU).
	fracMilli, fracMem int64
	pods               int
	// sharing is the mode of the fractions on it; "" when free or exclusive.
	sharing Sharing
}

// addFraction counts (sign 1) or uncounts (-1) a fraction of r on g.
func (g *gpuState) addFraction(r *Request, milli, mem, sign int64) {
	switch {
	case r.GPUMemory > 0:
		g.fracMem += sign * mem
	case r.GPUMilli > 0:
		g.fracMilli += sign * milli
	}
}

// fitsFraction says whether a fraction of r, taking milli and mem here,
// fits beside what g holds: its memory, and its share counted exactly
// (milli asked as such, memory as bytes of the GPU's), so rounding a
// memory fraction to milli never refuses one that fits.
func (g *gpuState) fitsFraction(r *Request, milli, mem int64) bool {
	if g.usedMem+mem > g.memory {
		return false
	}
	fm, fb := g.fracMilli, g.fracMem
	if r.GPUMemory > 0 {
		fb += mem
	} else {
		fm += milli
	}
	return fm*g.memory+fb*1000 <= 1000*g.memory
}

type nodeState struct {
	idx           int
	name          string
	labels        map[string]string
	unschedulable bool
	cpu, mem      int64
	usedCPU       int64
	usedMem       int64
	gpus          []gpuState
	// other and usedOther are Node.Other and its use, indexed like
	// session.otherNames; nil when no node or pod has other resources.
	other, usedOther []int64
	// apart holds, per anti-affinity term (indexed like session.termNames),
	// the counts of the node's domain, shared by the nodes of the domain;
	// nil entries where the node has no domain, nil when there are no terms.
	apart []*apartCount
	// terms is the session's, for the cluster-wide counts.
	terms     *termState
	freeWhole int   // GPUs with no pod at all
	freeMilli int64 // Σ (1000 - usedMilli)
	// pods placed here at the cycle's start, in victim order.
	victims []*podState
	// seen marks the node as evaluated in the current victim search.
	seen int
	// evicted is set when a committed decision evicted a pod from here.
	evicted bool
	// shape numbers nodes alike when empty (capacity, labels aside, and
	// GPUs), so that ties between them need no per-GPU comparison.
	shape int
}

type podState struct {
	name     string
	job      *jobState
	req      Request
	selector map[string]string
	models   []string
	// other is req.Other indexed like session.otherNames; nil when the pod
	// asks for none.
	other []int64
	// matches, avoids and needs are Pod.Matches, .Avoids and .Needs as term
	// indices.
	matches, avoids, needs []int
	// spread are Pod.Spread, with the domains counted for each.
	spread []spreadState
	// prefers and nodeScore are Pod.Prefers (terms as indices) and
	// Pod.NodeScore.
	prefers   []prefTerm
	attracts  []prefTerm // Pod.Attracts
	nodeScore func(node string) int64
	feasible  func(node string, gpu int) bool
	pinned    bool
	phase     PodPhase
	started   time.Time // Pod.StartedAt
	// sub is the job's subgroup the pod names (Pod.SubGroup); nil: none.
	sub *subState
	// res is what the pod counts for its queue; res[ResGPU] is an estimate
	// while pending and exact once placed.
	res Resources
	// Live placement; node is nil when not placed.
	node       *nodeState
	gpus       []int // positions in node.gpus
	gpuMilli   []int64
	gpuMem     []int64
	sharing    Sharing
	origNode   *nodeState
	origGPUs   []int
	origMilli  []int64 // per entry of origGPUs
	origMem    []int64
	origShare  Sharing
	origRes    Resources
	atOrig     bool // placed at its original placement
	rank       int  // position in the global victim order; -1 if none
	lastOp     int  // index in the log of the last operation on it; -1 if none
	lastDetach int
	reason     string
	shape      string
	preferred  bool // pending candidate this cycle
	// milliCap, when set, keeps a memory fraction to GPUs where it takes
	// at most this much (reclaim prices it per GPU size: reclaimSet).
	milliCap int64
	// alts are the pod's requests in order of preference (Pod.Request,
	// then Pod.Alternatives), validated, with their feasibility hooks and
	// shapes; nil when it has no alternatives. alt is the one in use: req,
	// feasible and shape are alts[alt]'s (setAlt).
	alts []podRequest
	alt  int
	// mask, when not nil, keeps the pod to the nodes it marks (by node idx)
	// while a topology-constrained try runs (topology.go).
	mask []bool
	// held marks a stand-in that keeps an evicted pod's unused capacity
	// taken until the end of the cycle (session.holdFreed); it belongs to
	// no queue and makes no decision.
	held bool
}

// podRequest is one of a pod's requests with what follows from it.
type podRequest struct {
	req      Request
	feasible func(node string, gpu int) bool
	shape    string
}

// gangMin is the number of placed pods below which a gang is short of its
// minMember for the stale-gang eviction: its declared minMember even when
// fewer pods than that are left.
func (j *jobState) gangMin() int { return max(j.minMember, j.declaredMin) }

// evictsWhole says whether evicting v, one of j's placed pods, evicts its
// whole gang (Job.Disruption; by default when the gang would not hold
// without v).
func (j *jobState) evictsWhole(v *podState) bool {
	switch j.disruption {
	case DisruptionAll:
		return true
	case DisruptionSingle:
		return false
	}
	return !j.holdsWithout(v)
}

type jobState struct {
	name        string
	queue       *queueState
	priority    int32
	preemptible bool
	neverEvicts bool // Job.NeverEvicts
	disruption  Disruption
	minMember   int
	// declaredMin is the job's MinMember as given, which minMember clamps
	// to its pods: a running gang that lost pods (deleted, failed) below
	// its minMember is below it, and stale in time (gangMin).
	declaredMin int
	created     time.Time
	belowSince  time.Time
	// evictFrom is when the job may first evict: created plus its queue's
	// preemption delay (Queue.PreemptionDelay); zero without one.
	evictFrom time.Time
	// subs are Job.SubGroups, in order (subgroups.go).
	subs []*subState
	// topo is Job.Topology resolved; nil for none.
	topo   *topoReq
	pods   []*podState
	placed int
	// invalid counts its pending pods left out of the cycle (addPods).
	invalid int
	// gated is set when allocate left the job pending for a policy reason
	// (limit, quota) that evictions cannot change for consolidation.
	gated bool
}

type queueState struct {
	name      string
	parent    *queueState
	children  []*queueState
	depth     int
	priority  int32
	quota     Resources
	limit     Resources
	weight    Resources
	allocated Resources // live
	allocNP   Resources // live, non-preemptible jobs only
	// heldLimit is limit room that evictions of an earlier plan in this
	// cycle freed and that plan did not use: like the capacity of
	// holdFreed, it is free only at the end of the cycle (see holdLimits).
	heldLimit Resources
	limited   bool      // some resource has a limit
	pending   Resources // at the cycle's start
	demand    Resources
	fairShare Resources
	// usage is the decayed past usage (Snapshot.Usage; parents: their
	// children's sum), read only when Config.UsageCoefficient > 0.
	usage Resources
	// The time protections, inherited values resolved (Queue).
	preemptMin, reclaimMin, delay time.Duration
	jobs                          []*jobState
}

// op is one reversible change of the transaction log.
type op struct {
	attach bool
	pod    *podState
	// where the pod was attached (attach) or detached from (detach)
	node     *nodeState
	gpus     []int
	gpuMilli []int64
	gpuMem   []int64
	sharing  Sharing
	res      Resources
	// prev is the pod's res before an attach: what it counts while pending
	// (a memory fraction's share of the largest GPU), given back on rollback.
	prev Resources
	// prevAlt is the pod's alternative before an attach (setAlt).
	prevAlt int
	action  Action
	reason  string
}

// session is the state of one cycle: live usage plus a log of operations
// that can be rolled back to any checkpoint (the transaction).
type session struct {
	cfg       Config
	now       time.Time
	nodes     []*nodeState
	nodeByN   map[string]*nodeState
	root      *queueState
	queues    []*queueState // sorted by name
	queueByN  map[string]*queueState
	jobs      []*jobState // sorted by name
	pods      []*podState
	capacity  Resources
	free      Resources // schedulable free capacity, live
	maxGPUMem int64
	gpuSizes  []int64 // the GPUs' memory sizes, each once, largest first
	// memSlack: how much GPU milli the placed memory fractions would free if
	// each moved to the largest GPU (Σ its milli − its share of the largest
	// GPU), live. Consolidation's free-capacity trigger counts it, since a
	// move from a small GPU to a big one frees milli.
	memSlack int64
	victims  []*podState // global victim order
	log      []op
	seenGen  int
	scorer   scorer
	// refiner breaks ties between equally scored placements (FGD under
	// bin-packing); nil for spread.
	refiner *fgdRefiner
	// failCache remembers single-pod shapes that fit nowhere, keyed by
	// shape, valued by the freeEpoch at the time: capacity only shrinks
	// until something is freed, so the answer holds until then.
	failCache map[string]failEntry
	// heldJob owns the stand-ins of holdFreed: no queue, no decisions.
	heldJob *jobState
	// frozenJob owns the stand-ins of placed pods of rejected jobs
	// (freeze): no queue, no decisions.
	frozenJob *jobState
	// problems are what the snapshot held that the core could not take as
	// given (Result.Problems); invalid are the pods left pending for it.
	problems []Problem
	invalid  []PendingPod
	// badQueues maps the queues left out of the tree to the reason;
	// rejected are the statuses of the jobs left out (validate.go).
	badQueues map[string]string
	rejected  map[string]JobStatus
	// topos are the valid topologies by name; badTopos maps those left
	// out to the reason (validate.go).
	topos    map[string]*topoState
	badTopos map[string]string
	// limitHolds are the heldLimit changes, undone by a rollback past them.
	limitHolds []limitHold
	// planStarts are the log positions where the committed evicting plans
	// began, in order (commitPlan).
	planStarts []int
	freeEpoch  int
	// searchLeft is what this cycle's gang searches may still spend, in
	// node evaluations (searchJob).
	searchLeft int
	shapes     map[string]int // node shapes, see nodeShape
	// otherNames lists, sorted, every resource of Node.Other and
	// Request.Other in the snapshot.
	otherNames []string
	// termNames lists the anti-affinity terms, sorted; termByN indexes it.
	termNames []string
	termByN   map[string]int
	terms     termState
}

// prefTerm is one of Pod.Prefers, its term as an index.
type prefTerm struct {
	term   int
	weight int64
}

// spreadState is one spread constraint of a pod: its term, and the domains
// of the nodes the pod could use (found once per cycle, on first use).
type spreadState struct {
	term, maxSkew, minDomains int
	domains                   []*apartCount
	found                     bool
}

// termState counts, per term, the placed pods that match it anywhere and
// those that attract pods it selects (Pod.Attracts), and knows the nodes,
// for spread constraints' domains.
type termState struct {
	matching, attractors []int
	nodes                []*nodeState
}

// apartCount is one topology domain's pods for one term: those it selects,
// those that must avoid them (required anti-affinity), and the placed
// pods' pull on pods it selects (Pod.Attracts).
type apartCount struct {
	matching, avoiding int
	attract            int64
}

type failEntry struct {
	epoch  int
	reason string
}

func (s *session) checkpoint() int { return len(s.log) }

// limitHold is one addition to a queue's heldLimit, made when the log was
// at length at.
type limitHold struct {
	at  int
	q   *queueState
	res Resources
}

// rollback undoes every operation after checkpoint cp, newest first.
func (s *session) rollback(cp int) {
	for len(s.limitHolds) > 0 && s.limitHolds[len(s.limitHolds)-1].at >= cp {
		h := s.limitHolds[len(s.limitHolds)-1]
		addRes(&h.q.heldLimit, h.res, -1)
		s.limitHolds = s.limitHolds[:len(s.limitHolds)-1]
	}
	for len(s.planStarts) > 0 && s.planStarts[len(s.planStarts)-1] >= cp {
		s.planStarts = s.planStarts[:len(s.planStarts)-1]
	}
	for i := len(s.log) - 1; i >= cp; i-- {
		o := &s.log[i]
		if o.attach {
			s.unplace(o.pod)
			if o.pod.alt != o.prevAlt {
				s.setAlt(o.pod, o.prevAlt)
			}
			o.pod.res = o.prev
		} else {
			s.place(o.pod, o.node, o.gpus, o.gpuMilli, o.gpuMem, o.sharing, o.res)
		}
	}
	s.log = s.log[:cp]
}

// attach places a pod and logs it.
func (s *session) attach(p *podState, pl *plan, a Action, reason string) {
	prev, prevAlt := p.res, p.alt
	if pl.alt != p.alt {
		s.setAlt(p, pl.alt) // the alternative allocate chose
	}
	res := p.res
	res[ResGPU] = 0
	for _, m := range pl.milli {
		res[ResGPU] += m
	}
	s.place(p, pl.node, pl.gpus, pl.milli, pl.mem, pl.sharing, res)
	s.log = append(s.log, op{attach: true, pod: p, node: pl.node, gpus: pl.gpus, gpuMilli: pl.milli, gpuMem: pl.mem, sharing: pl.sharing, res: res, prev: prev, prevAlt: prevAlt, action: a, reason: reason})
}

// detach evicts a placed pod and logs it.
func (s *session) detach(p *podState, a Action, reason string) {
	o := op{pod: p, node: p.node, gpus: p.gpus, gpuMilli: p.gpuMilli, gpuMem: p.gpuMem, sharing: p.sharing, res: p.res, action: a, reason: reason}
	s.unplace(p)
	s.log = append(s.log, o)
}

func (s *session) place(p *podState, n *nodeState, gpus []int, milli, mem []int64, sh Sharing, res Resources) {
	p.node, p.gpus, p.gpuMilli, p.gpuMem, p.sharing, p.res = n, gpus, milli, mem, sh, res
	p.atOrig = n == p.origNode && slices.Equal(gpus, p.origGPUs)
	n.usedCPU += p.req.CPU
	n.usedMem += p.req.Memory
	for i, v := range p.other {
		n.usedOther[i] += v
	}
	for _, k := range p.matches {
		n.terms.matching[k]++
		if d := n.apart[k]; d != nil {
			d.matching++
		}
	}
	for _, k := range p.avoids {
		if d := n.apart[k]; d != nil {
			d.avoiding++
		}
	}
	for _, t := range p.attracts {
		n.terms.attractors[t.term]++
		if d := n.apart[t.term]; d != nil {
			d.attract += t.weight
		}
	}
	if !n.unschedulable {
		s.free[ResCPU] -= p.req.CPU
		s.free[ResMemory] -= p.req.Memory
		for _, m := range milli {
			s.free[ResGPU] -= m
		}
		s.memSlack += s.slackOf(p, milli)
	}
	for i, gi := range gpus {
		g := &n.gpus[gi]
		if g.pods == 0 {
			n.freeWhole--
		}
		g.pods++
		g.usedMilli += milli[i]
		g.usedMem += mem[i]
		g.addFraction(&p.req, milli[i], mem[i], 1)
		g.sharing = sh
		n.freeMilli -= milli[i]
	}
	j := p.job
	j.placed++
	if p.sub != nil {
		p.sub.placed++
	}
	for q := j.queue; q != nil; q = q.parent {
		addRes(&q.allocated, res, 1)
		if !j.preemptible {
			addRes(&q.allocNP, res, 1)
		}
	}
}

func (s *session) unplace(p *podState) {
	n := p.node
	n.usedCPU -= p.req.CPU
	n.usedMem -= p.req.Memory
	for i, v := range p.other {
		n.usedOther[i] -= v
	}
	for _, k := range p.matches {
		n.terms.matching[k]--
		if d := n.apart[k]; d != nil {
			d.matching--
		}
	}
	for _, k := range p.avoids {
		if d := n.apart[k]; d != nil {
			d.avoiding--
		}
	}
	for _, t := range p.attracts {
		n.terms.attractors[t.term]--
		if d := n.apart[t.term]; d != nil {
			d.attract -= t.weight
		}
	}
	if !n.unschedulable {
		s.free[ResCPU] += p.req.CPU
		s.free[ResMemory] += p.req.Memory
		for _, m := range p.gpuMilli {
			s.free[ResGPU] += m
		}
		s.memSlack -= s.slackOf(p, p.gpuMilli)
	}
	for i, gi := range p.gpus {
		g := &n.gpus[gi]
		g.pods--
		g.usedMilli -= p.gpuMilli[i]
		g.usedMem -= p.gpuMem[i]
		g.addFraction(&p.req, p.gpuMilli[i], p.gpuMem[i], -1)
		n.freeMilli += p.gpuMilli[i]
		if g.pods == 0 {
			n.freeWhole++
			g.sharing = ""
			g.usedMilli, g.usedMem = 0, 0
		}
	}
	j := p.job
	j.placed--
	if p.sub != nil {
		p.sub.placed--
	}
	for q := j.queue; q != nil; q = q.parent {
		addRes(&q.allocated, p.res, -1)
		if !j.preemptible {
			addRes(&q.allocNP, p.res, -1)
		}
	}
	p.node, p.gpus, p.gpuMilli, p.gpuMem, p.sharing = nil, nil, nil, nil, ""
	p.atOrig = false
	s.freeEpoch++
}

// slackOf is what p, placed with milli, adds to memSlack.
func (s *session) slackOf(p *podState, milli []int64) int64 {
	if p.req.GPUMemory == 0 || len(milli) != 1 {
		return 0
	}
	return max(0, milli[0]-memMilli(p.req.GPUMemory, s.maxGPUMem))
}

func addRes(dst *Resources, r Resources, sign int64) {
	for i := range dst {
		dst[i] += sign * r[i]
	}
}

// newSession builds the cycle's state. What it cannot take as given (a
// queue, job or pod that breaks the model's rules, a node with a broken
// GPU) fails alone, never the cycle: see validate.go. Only a config the
// core does not know is an error.
func newSession(snap *Snapshot, cfg Config) (*session, error) {
	s := &session{cfg: cfg, now: snap.Now, nodeByN: map[string]*nodeState{}, queueByN: map[string]*queueState{}, failCache: map[string]failEntry{}, shapes: map[string]int{}, searchLeft: sessionSearchBudget}
	s.heldJob = &jobState{name: "(held capacity)"}
	s.frozenJob = &jobState{name: "(unreadable pods)"}
	s.badQueues = map[string]string{}
	s.rejected = map[string]JobStatus{}
	if s.cfg.StaleGangTimeout == 0 {
		s.cfg.StaleGangTimeout = DefaultStaleGangTimeout
	}
	switch cfg.Placement {
	case Spread:
		s.scorer = spreadScorer{}
	case "", BinPack:
		s.scorer = binPackScorer{}
	default:
		return nil, fmt.Errorf("config: unknown placement policy %q (binpack or spread)", cfg.Placement)
	}
	if cfg.UsageCoefficient < 0 || cfg.UsageCoefficient > MaxUsageCoefficient {
		return nil, fmt.Errorf("config: usage coefficient %d is out of range (0 to %d thousandths)", cfg.UsageCoefficient, int64(MaxUsageCoefficient))
	}

	s.otherNames = otherNames(snap)
	domains := s.indexTerms(snap)
	s.addNodes(snap, domains)
	s.addQueues(snap)
	s.addUsage(snap)
	s.addTopologies(snap)
	s.addJobs(snap)
	if _, ok := s.scorer.(binPackScorer); ok {
		s.refiner = newFGDRefiner(s)
	}
	return s, nil
}

// addNodes builds the nodes, sorted by name so that every tie breaks the
// same way. A second node of one name is left out; a GPU listed twice or
// without memory is left out of its node (a pod placed on it is then
// frozen: see freeze); amounts out of range are clamped (checkNode).
func (s *session) addNodes(snap *Snapshot, domains []map[string]*apartCount) {
	nodes := slices.Clone(snap.Nodes)
	slices.SortStableFunc(nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range nodes {
		n := &nodes[i]
		if _, dup := s.nodeByN[n.Name]; dup {
			s.problem("node "+n.Name, "listed twice; the first is used")
			continue
		}
		s.checkNode(n)
		ns := &nodeState{idx: len(s.nodes), name: n.Name, labels: n.Labels, unschedulable: n.Unschedulable, cpu: n.CPU, mem: n.Memory}
		if len(s.otherNames) > 0 {
			ns.other = s.otherVector(n.Other)
			ns.usedOther = make([]int64, len(s.otherNames))
		}
		if len(s.termNames) > 0 {
			ns.terms = &s.terms
			ns.apart = make([]*apartCount, len(s.termNames))
			for k, name := range s.termNames {
				if v, ok := n.Labels[snap.PodTerms[name]]; ok {
					d := domains[k][v]
					if d == nil {
						d = &apartCount{}
						domains[k][v] = d
					}
					ns.apart[k] = d
				}
			}
		}
		gpus := slices.Clone(n.GPUs)
		slices.SortStableFunc(gpus, func(a, b GPU) int { return a.Index - b.Index })
		for k, g := range gpus {
			if k > 0 && gpus[k-1].Index == g.Index {
				s.problem("node "+n.Name, "GPU index %d listed twice; the first is used", g.Index)
				continue
			}
			if g.Memory <= 0 || g.Memory > MaxAmount {
				s.problem("node "+n.Name, "GPU %d: memory %d bytes is not from 1 to %d; the GPU is left out", g.Index, g.Memory, MaxAmount)
				continue
			}
			dom := g.NVLinkDomain
			if dom == "" {
				// No NVLink: a domain of its own; the NUL keeps it apart from real names.
				dom = fmt.Sprintf("\x00%d", g.Index)
			}
			ns.gpus = append(ns.gpus, gpuState{index: g.Index, memory: g.Memory, model: g.Model, domain: dom})
			s.maxGPUMem = max(s.maxGPUMem, g.Memory)
			if !slices.Contains(s.gpuSizes, g.Memory) {
				s.gpuSizes = append(s.gpuSizes, g.Memory)
			}
		}
		ns.freeWhole = len(ns.gpus)
		ns.shape = s.nodeShape(ns)
		ns.freeMilli = int64(len(ns.gpus)) * 1000
		s.capacity[ResGPU] += ns.freeMilli
		s.capacity[ResCPU] += n.CPU
		s.capacity[ResMemory] += n.Memory
		if !n.Unschedulable {
			s.free[ResGPU] += ns.freeMilli
			s.free[ResCPU] += n.CPU
			s.free[ResMemory] += n.Memory
		}
		s.nodes = append(s.nodes, ns)
		s.nodeByN[n.Name] = ns
	}
	s.terms.nodes = s.nodes
	slices.SortFunc(s.gpuSizes, func(a, b int64) int { return cmp.Compare(b, a) })
}

// normRequest validates a request's GPU fields and amounts (none
// negative, none above MaxGPUs or MaxAmount, so that no sum the core makes
// can wrap) and fills their defaults.
func normRequest(r Request) (Request, error) {
	n := 0
	if r.GPUs > 0 {
		n++
	}
	if r.GPUMilli > 0 {
		n++
	}
	if r.GPUMemory > 0 {
		n++
	}
	if n > 1 {
		return r, fmt.Errorf("request: set one of GPUs (%d), GPUMilli (%d) and GPUMemory (%d), not several", r.GPUs, r.GPUMilli, r.GPUMemory)
	}
	for _, a := range []struct {
		name string
		v    int64
		max  int64
	}{{"GPUs", int64(r.GPUs), MaxGPUs}, {"GPUMilli", r.GPUMilli, MaxAmount}, {"GPUMemory", r.GPUMemory, MaxAmount}, {"CPU", r.CPU, MaxAmount}, {"Memory", r.Memory, MaxAmount}} {
		if err := checkAmount(a.name, a.v, a.max); err != nil {
			return r, err
		}
	}
	if r.GPUMilli >= 1000 {
		return r, fmt.Errorf("request: GPUMilli %d must be below 1000 (use GPUs for whole GPUs)", r.GPUMilli)
	}
	if r.IsFraction() {
		if r.Sharing == "" {
			r.Sharing = SharingMPS
		}
		if r.Sharing != SharingMPS && r.Sharing != SharingTimeSlice {
			return r, fmt.Errorf("request: unknown sharing mode %q (mps or timeslice)", r.Sharing)
		}
	} else {
		r.Sharing = ""
	}
	if r.NVLink == "" {
		r.NVLink = NVLinkPreferred
	}
	return r, nil
}

// readPod validates a pod and builds its state, without counting it
// anywhere yet (admitPod does): a job is admitted only when all its pending
// pods are valid. For a placed pod, pl is its placement resolved.
func (s *session) readPod(j *jobState, p *Pod) (ps *podState, pl *plan, err error) {
	r, err := normRequest(p.Request)
	if err != nil {
		return nil, nil, err
	}
	ps = &podState{name: p.Name, job: j, req: r, selector: p.NodeSelector, models: p.GPUModels, feasible: p.Feasible, pinned: p.Pinned, phase: p.Phase, started: p.StartedAt, rank: -1, lastOp: -1}
	if ps.sub, err = subOf(j, p); err != nil {
		return nil, nil, err
	}
	for _, terms := range []struct {
		names []string
		dst   *[]int
	}{{p.Matches, &ps.matches}, {p.Avoids, &ps.avoids}, {p.Needs, &ps.needs}} {
		for _, name := range terms.names {
			k, ok := s.termByN[name]
			if !ok {
				return nil, nil, fmt.Errorf("anti-affinity term %q is not in the snapshot's PodTerms", name)
			}
			*terms.dst = append(*terms.dst, k)
		}
	}
	for _, c := range p.Spread {
		k, ok := s.termByN[c.Term]
		if !ok {
			return nil, nil, fmt.Errorf("spread term %q is not in the snapshot's PodTerms", c.Term)
		}
		if c.MaxSkew < 1 {
			return nil, nil, fmt.Errorf("spread term %q: maxSkew %d must be at least 1", c.Term, c.MaxSkew)
		}
		ps.spread = append(ps.spread, spreadState{term: k, maxSkew: c.MaxSkew, minDomains: max(c.MinDomains, 1)})
	}
	for _, t := range p.Prefers {
		k, ok := s.termByN[t.Term]
		if !ok {
			return nil, nil, fmt.Errorf("preferred term %q is not in the snapshot's PodTerms", t.Term)
		}
		ps.prefers = append(ps.prefers, prefTerm{term: k, weight: t.Weight})
	}
	for _, t := range p.Attracts {
		k, ok := s.termByN[t.Term]
		if !ok {
			return nil, nil, fmt.Errorf("attracting term %q is not in the snapshot's PodTerms", t.Term)
		}
		ps.attracts = append(ps.attracts, prefTerm{term: k, weight: t.Weight})
	}
	ps.nodeScore = p.NodeScore
	for name, v := range r.Other {
		if err := checkAmount(name, v, MaxAmount); err != nil {
			return nil, nil, err
		}
		if v > 0 && ps.other == nil {
			ps.other = s.otherVector(r.Other)
		}
	}
	ps.res[ResCPU], ps.res[ResMemory] = r.CPU, r.Memory
	ps.res[ResGPU] = s.pendingGPU(&r)
	ps.shape = shapeKey(ps)
	if len(p.Alternatives) > 0 {
		ps.alts = []podRequest{{req: r, feasible: p.Feasible, shape: ps.shape}}
		for i, a := range p.Alternatives {
			ar := a.Request
			ar.CPU, ar.Memory, ar.Other = r.CPU, r.Memory, r.Other
			ar, err := normRequest(ar)
			if err != nil {
				return nil, nil, fmt.Errorf("alternative %d: %w", i+1, err)
			}
			// shapeKey reads the pod's request in use and its alt.
			ps.req, ps.feasible, ps.alt = ar, a.Feasible, i+1
			ps.alts = append(ps.alts, podRequest{req: ar, feasible: a.Feasible, shape: shapeKey(ps)})
		}
		ps.req, ps.feasible, ps.alt = r, p.Feasible, 0
		if k := p.Placement.Alternative; k != 0 && p.Phase != PodPending && p.Phase != "" {
			if k < 0 || k > len(p.Alternatives) {
				return nil, nil, fmt.Errorf("placement: alternative %d, but the pod has %d", k, len(p.Alternatives))
			}
			s.setAlt(ps, k)
			ps.res[ResGPU] = s.pendingGPU(&ps.req)
		}
	} else if p.Placement.Alternative != 0 && p.Phase != PodPending && p.Phase != "" {
		return nil, nil, fmt.Errorf("placement: alternative %d, but the pod has none", p.Placement.Alternative)
	}
	switch p.Phase {
	case PodPending, "":
		ps.phase = PodPending
	case PodBound, PodRunning, PodReleasing:
		if pl, err = s.resolvePlacement(ps, &p.Placement); err != nil {
			return nil, nil, err
		}
	default:
		return nil, nil, fmt.Errorf("unknown phase %q", p.Phase)
	}
	return ps, pl, nil
}

// admitPod counts a pod readPod accepted: a pending pod for its queue's
// pending, a placed pod where it is.
func (s *session) admitPod(ps *podState, pl *plan) {
	j := ps.job
	if pl == nil {
		j.queue.pending[ResGPU] += ps.res[ResGPU]
		j.queue.pending[ResCPU] += ps.req.CPU
		j.queue.pending[ResMemory] += ps.req.Memory
		return
	}
	res := ps.res
	res[ResGPU] = 0
	for _, m := range pl.milli {
		res[ResGPU] += m
	}
	s.place(ps, pl.node, pl.gpus, pl.milli, pl.mem, pl.sharing, res)
	ps.origNode, ps.origGPUs, ps.origRes, ps.atOrig = pl.node, pl.gpus, res, true
	ps.origMilli, ps.origMem, ps.origShare = pl.milli, pl.mem, pl.sharing
	if ps.phase == PodReleasing {
		// Terminating: it holds the node's capacity but not its job's
		// or queue's.
		j.placed--
		if ps.sub != nil {
			ps.sub.placed--
		}
		for q := j.queue; q != nil; q = q.parent {
			addRes(&q.allocated, res, -1)
			if !j.preemptible {
				addRes(&q.allocNP, res, -1)
			}
		}
		ps.atOrig = false
	}
}

// pendingGPU is what a pending pod asking r counts on GPUs, in milli.
func (s *session) pendingGPU(r *Request) int64 {
	switch {
	case r.GPUs > 0:
		return int64(r.GPUs) * 1000
	case r.GPUMilli > 0:
		return r.GPUMilli
	case r.GPUMemory > 0:
		// While pending, a memory fraction counts as its share of the
		// largest GPU: the least it can be.
		if s.maxGPUMem > 0 {
			return memMilli(r.GPUMemory, s.maxGPUMem)
		}
		return 1
	}
	return 0
}

// setAlt makes the pod's k-th request (0: Pod.Request) the one in use. A
// pending pod's res follows it; a placed pod's is set by place.
func (s *session) setAlt(p *podState, k int) {
	a := &p.alts[k]
	p.alt, p.req, p.feasible, p.shape = k, a.req, a.feasible, a.shape
	if p.node == nil {
		p.res[ResGPU] = s.pendingGPU(&p.req)
	}
}

// nodeShape numbers the node's capacity and GPUs (model, memory, NVLink
// domain), giving alike nodes one number.
func (s *session) nodeShape(n *nodeState) int {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d/%v", n.cpu, n.mem, n.other)
	for i := range n.gpus {
		g := &n.gpus[i]
		fmt.Fprintf(&b, "|%s/%d/%q", g.model, g.memory, g.domain)
	}
	k := b.String()
	id, ok := s.shapes[k]
	if !ok {
		id = len(s.shapes)
		s.shapes[k] = id
	}
	return id
}

// memMilli is the milli-GPU a memory fraction takes of a GPU of gpuMem
// bytes, to the nearest milli (at least 1): 20Gi of 24Gi is 833, as a person
// would write it. Fits are decided exactly (gpuState.fitsFraction), so the
// rounding only affects what is counted for queues.
func memMilli(mem, gpuMem int64) int64 {
	if mem >= gpuMem {
		return 1000
	}
	// mem < gpuMem, so mem*1000 cannot overflow for any real GPU.
	return min(1000, max(1, (mem*1000+gpuMem/2)/gpuMem))
}

// resolvePlacement turns a snapshot placement into live positions and
// per-GPU amounts, deriving what the snapshot left out.
func (s *session) resolvePlacement(p *podState, in *Placement) (*plan, error) {
	n, ok := s.nodeByN[in.Node]
	if !ok {
		return nil, fmt.Errorf("placed on unknown node %q", in.Node)
	}
	pl := &plan{node: n, sharing: p.req.Sharing}
	if in.Sharing != "" {
		pl.sharing = in.Sharing
	}
	for i, idx := range in.GPUs {
		pos := slices.IndexFunc(n.gpus, func(g gpuState) bool { return g.index == idx })
		if pos < 0 {
			return nil, fmt.Errorf("placed on GPU %d, which node %q does not have", idx, n.name)
		}
		g := &n.gpus[pos]
		milli, mem := int64(1000), g.memory
		switch {
		case i < len(in.GPUMilli) && i < len(in.GPUMemory):
			milli, mem = in.GPUMilli[i], in.GPUMemory[i]
		case p.req.GPUMilli > 0:
			milli, mem = p.req.GPUMilli, mulDiv(p.req.GPUMilli, g.memory, 1000)
		case p.req.GPUMemory > 0:
			milli, mem = memMilliOn(g, p.req.GPUMemory), p.req.GPUMemory
		}
		pl.gpus = append(pl.gpus, pos)
		pl.milli = append(pl.milli, milli)
		pl.mem = append(pl.mem, mem)
	}
	if !p.req.IsFraction() {
		pl.sharing = ""
	}
	slices.Sort(pl.gpus) // positions follow indices, which are sorted
	return pl, nil
}

// shapeKey identifies pods that place identically.
func shapeKey(p *podState) string {
	var b strings.Builder
	r := p.req
	fmt.Fprintf(&b, "%d/%d/%d/%s/%s/%d/%d/%v/%v/%v/%v/%v|", r.GPUs, r.GPUMilli, r.GPUMemory, r.Sharing, r.NVLink, r.CPU, r.Memory, p.other, p.matches, p.avoids, p.needs, p.spread)
	keys := make([]string, 0, len(p.selector))
	for k := range p.selector {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString(k + "=" + p.selector[k] + ",")
	}
	b.WriteString("|" + strings.Join(p.models, ","))
	if r.GPUMemory > 0 {
		// Its fit depends on its queue's room (milliRoom).
		fmt.Fprintf(&b, "|queue:%s/%v", p.job.queue.name, p.job.preemptible)
	}
	if p.feasible != nil {
		// The hook is the pod's own: it shares a fit with no other pod.
		b.WriteString("|feasible:" + p.name)
		if p.alt > 0 {
			// An alternative may have a hook of its own.
			fmt.Fprintf(&b, "/%d", p.alt)
		}
	}
	return b.String()
}

// otherNames collects, sorted, the names of the other resources the
// snapshot's nodes hold and its pods ask for.
func otherNames(snap *Snapshot) []string {
	set := map[string]bool{}
	for i := range snap.Nodes {
		for name := range snap.Nodes[i].Other {
			set[name] = true
		}
	}
	for i := range snap.Jobs {
		for k := range snap.Jobs[i].Pods {
			for name := range snap.Jobs[i].Pods[k].Request.Other {
				set[name] = true
			}
		}
	}
	if len(set) == 0 {
		return nil
	}
	names := make([]string, 0, len(set))
	for name := range set {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// otherVector indexes amounts by session.otherNames.
func (s *session) otherVector(m map[string]int64) []int64 {
	v := make([]int64, len(s.otherNames))
	for i, name := range s.otherNames {
		v[i] = m[name]
	}
	return v
}

// otherFits reports whether n has room for what p asks of other resources.
func otherFits(p *podState, n *nodeState) bool {
	for i, v := range p.other {
		if v > 0 && n.usedOther[i]+v > n.other[i] {
			return false
		}
	}
	return true
}

// indexTerms numbers the anti-affinity terms and returns an empty domain
// map per term.
func (s *session) indexTerms(snap *Snapshot) []map[string]*apartCount {
	if len(snap.PodTerms) == 0 {
		return nil
	}
	s.termByN = map[string]int{}
	for name, topo := range snap.PodTerms {
		if topo == "" {
			// Left out: a pod naming it is then invalid on its own.
			s.problem("term "+name, "empty topology label; the term is left out")
			continue
		}
		s.termNames = append(s.termNames, name)
	}
	slices.Sort(s.termNames)
	s.terms.matching = make([]int, len(s.termNames))
	s.terms.attractors = make([]int, len(s.termNames))
	domains := make([]map[string]*apartCount, len(s.termNames))
	for k, name := range s.termNames {
		s.termByN[name] = k
		domains[k] = map[string]*apartCount{}
	}
	return domains
}

// nearOK reports whether n is in a domain of every term p needs where a
// pod matching it runs (or the first-of-a-group exception holds).
func nearOK(p *podState, n *nodeState) bool {
	first := true // no pod matches any needed term, and p matches them all
	for _, k := range p.needs {
		first = first && n.terms.matching[k] == 0 && slices.Contains(p.matches, k)
	}
	for _, k := range p.needs {
		d := n.apart[k]
		if d == nil || d.matching == 0 && !first {
			return false
		}
	}
	return true
}

// apartOK reports whether p may run on n as far as anti-affinity goes: no
// pod it avoids, and no pod avoiding it, in n's domain of each term.
func apartOK(p *podState, n *nodeState) bool {
	for _, k := range p.avoids {
		if d := n.apart[k]; d != nil && d.matching > 0 {
			return false
		}
	}
	for _, k := range p.matches {
		if d := n.apart[k]; d != nil && d.avoiding > 0 {
			return false
		}
	}
	return true
}

// spreadOK reports whether placing p on n keeps each of its spread
// constraints.
func spreadOK(p *podState, n *nodeState) bool {
	for i := range p.spread {
		c := &p.spread[i]
		d := n.apart[c.term]
		if d == nil {
			return false // no domain: the constraint cannot be met here
		}
		if !c.found {
			c.domains, c.found = spreadDomains(p, n.terms.nodes, c.term), true
		}
		fewest := 0
		if len(c.domains) >= c.minDomains {
			fewest = c.domains[0].matching
			for _, x := range c.domains[1:] {
				fewest = min(fewest, x.matching)
			}
		}
		self := 0
		if slices.Contains(p.matches, c.term) {
			self = 1
		}
		if d.matching+self-fewest > c.maxSkew {
			return false
		}
	}
	return true
}

// spreadDomains lists the distinct domains of term k among the nodes p
// could use (its node selector, Feasible, schedulable).
func spreadDomains(p *podState, nodes []*nodeState, k int) []*apartCount {
	var out []*apartCount
	seen := map[*apartCount]bool{}
	for _, n := range nodes {
		d := n.apart[k]
		if d == nil || seen[d] || staticFit(p, n) != fitOK {
			continue
		}
		seen[d] = true
		out = append(out, d)
	}
	return out
}
