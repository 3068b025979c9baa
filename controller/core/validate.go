package core

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// One bad object fails alone: a queue, job or pod that breaks the model's
// rules is left out of the cycle with a reason (Result.Problems, and
// Result.Pending for its pending pods), and the rest is scheduled. Placed
// pods are never forgotten, since losing a pod's accounting would offer
// its GPUs twice: a placed pod the core cannot read is frozen (freeze).

// problem records what the core could not take as given.
func (s *session) problem(object, format string, args ...any) {
	s.problems = append(s.problems, Problem{Object: object, Reason: fmt.Sprintf(format, args...)})
}

// checkAmount refuses an amount below 0 or above most, naming it.
func checkAmount(name string, v, most int64) error {
	switch {
	case v < 0:
		return fmt.Errorf("request: %s %d is negative", name, v)
	case v > most:
		return fmt.Errorf("request: %s %d is above the most a pod may ask, %d", name, v, most)
	}
	return nil
}

// clampAmount brings v into [0, MaxAmount]; ok is false when it had to.
func clampAmount(v int64) (int64, bool) {
	switch {
	case v < 0:
		return 0, false
	case v > MaxAmount:
		return MaxAmount, false
	}
	return v, true
}

// checkNode clamps a node's amounts into [0, MaxAmount], recording each it
// changed: a negative capacity offers nothing, a larger one no more than
// any pod may ask.
func (s *session) checkNode(n *Node) {
	for _, a := range []struct {
		name string
		v    *int64
	}{{"CPU", &n.CPU}, {"Memory", &n.Memory}} {
		if c, ok := clampAmount(*a.v); !ok {
			s.problem("node "+n.Name, "%s %d is outside 0..%d; counted as %d", a.name, *a.v, MaxAmount, c)
			*a.v = c
		}
	}
	var bad []string
	for name, v := range n.Other {
		if _, ok := clampAmount(v); !ok {
			bad = append(bad, name)
		}
	}
	if len(bad) == 0 {
		return
	}
	slices.Sort(bad)
	other := make(map[string]int64, len(n.Other))
	for name, v := range n.Other {
		other[name], _ = clampAmount(v)
	}
	for _, name := range bad {
		s.problem("node "+n.Name, "%s %d is outside 0..%d; counted as %d", name, n.Other[name], MaxAmount, other[name])
	}
	n.Other = other
}

// checkQueue validates a queue's own fields.
func checkQueue(q *Queue) error {
	for r, qr := range q.Resources {
		for _, a := range []struct {
			name string
			v    int64
		}{{"quota", qr.Quota}, {"limit", qr.Limit}} {
			if a.v < Unlimited || a.v > MaxQueueAmount {
				return fmt.Errorf("queue %s: %s %s %d must be -1 (unlimited) or from 0 to %d", q.Name, Resource(r), a.name, a.v, MaxQueueAmount)
			}
		}
		if qr.OverQuotaWeight < 0 || qr.OverQuotaWeight > MaxWeight {
			return fmt.Errorf("queue %s: %s over-quota weight %d must be from 0 to %d", q.Name, Resource(r), qr.OverQuotaWeight, MaxWeight)
		}
	}
	return nil
}

// addQueues builds the queue tree under a virtual root. A queue that is
// invalid itself, whose parent is unknown or invalid, or that sits in a
// parent loop is left out (badQueues), and so are its descendants.
func (s *session) addQueues(snap *Snapshot) {
	s.root = &queueState{name: "", depth: 0}
	queues := slices.Clone(snap.Queues)
	if len(queues) == 0 {
		queues = []Queue{NewQueue("default", "")}
	}
	slices.SortStableFunc(queues, func(a, b Queue) int { return strings.Compare(a.Name, b.Name) })
	byName := map[string]*Queue{}
	var order []*Queue
	own := map[string]string{}
	for i := range queues {
		q := &queues[i]
		switch {
		case q.Name == "":
			s.problem(`queue ""`, "empty name; left out")
			continue
		case byName[q.Name] != nil:
			s.problem("queue "+q.Name, "listed twice; the first is used")
			continue
		}
		byName[q.Name] = q
		order = append(order, q)
		if err := checkQueue(q); err != nil {
			own[q.Name] = err.Error()
		}
	}
	// why is "" for a usable queue, else the reason; memoised.
	whys := map[string]string{}
	var why func(q *Queue, depth int) string
	why = func(q *Queue, depth int) string {
		if w, ok := whys[q.Name]; ok {
			return w
		}
		w := own[q.Name]
		switch {
		case w != "":
		case depth > len(order):
			w = fmt.Sprintf("queue %s: parent chain loops", q.Name)
		case q.Parent == "":
		case byName[q.Parent] == nil:
			w = fmt.Sprintf("queue %s: parent %s does not exist", q.Name, q.Parent)
		default:
			if pw := why(byName[q.Parent], depth+1); pw != "" {
				w = fmt.Sprintf("queue %s: its parent is left out (%s)", q.Name, pw)
			}
		}
		whys[q.Name] = w
		return w
	}
	for _, q := range order {
		if w := why(q, 0); w != "" {
			s.badQueues[q.Name] = w
			s.problem("queue "+q.Name, "%s; left out, its jobs wait", w)
			continue
		}
		qs := &queueState{name: q.Name, priority: q.Priority}
		for r, qr := range q.Resources {
			qs.quota[r], qs.limit[r], qs.weight[r] = qr.Quota, qr.Limit, qr.OverQuotaWeight
			qs.limited = qs.limited || qr.Limit != Unlimited
		}
		s.queues = append(s.queues, qs)
		s.queueByN[q.Name] = qs
	}
	for _, qs := range s.queues {
		qs.parent = s.root
		if p := byName[qs.name].Parent; p != "" {
			qs.parent = s.queueByN[p]
		}
		qs.parent.children = append(qs.parent.children, qs)
	}
	for _, q := range s.queues {
		for a := q; a != s.root; a = a.parent {
			q.depth++
		}
	}
	s.inheritProtections(byName)
}

// inheritProtections resolves each queue's time protections: its own, or
// (InheritDuration) its nearest ancestor's that sets one, else 0.
func (s *session) inheritProtections(byName map[string]*Queue) {
	for _, q := range s.queues {
		for _, f := range []struct {
			to  *time.Duration
			get func(*Queue) time.Duration
		}{
			{&q.preemptMin, func(q *Queue) time.Duration { return q.PreemptMinRuntime }},
			{&q.reclaimMin, func(q *Queue) time.Duration { return q.ReclaimMinRuntime }},
			{&q.delay, func(q *Queue) time.Duration { return q.PreemptionDelay }},
		} {
			for qs := q; qs != s.root; qs = qs.parent {
				if v := f.get(byName[qs.name]); v >= 0 {
					*f.to = v
					break
				}
			}
		}
	}
}

// jobProblem says why a job as a whole cannot be scheduled ("" if it can).
func (s *session) jobProblem(j *Job, twice bool) string {
	q := s.queueByN[j.Queue]
	switch {
	case j.Name == "":
		return "job with an empty name"
	case twice:
		return fmt.Sprintf("job %s is listed twice", j.Name)
	case s.badQueues[j.Queue] != "":
		return fmt.Sprintf("queue %s is invalid: %s", j.Queue, s.badQueues[j.Queue])
	case q == nil:
		return fmt.Sprintf("queue %s does not exist", j.Queue)
	case len(q.children) > 0:
		return fmt.Sprintf("queue %s is a parent queue; jobs belong in leaf queues", j.Queue)
	case j.Disruption != DisruptionGang && j.Disruption != DisruptionSingle && j.Disruption != DisruptionAll:
		return fmt.Sprintf("job %s: disruption %q is not %q, %q or %q", j.Name, j.Disruption, DisruptionGang, DisruptionSingle, DisruptionAll)
	}
	if why := subGroupsProblem(j); why != "" {
		return why
	}
	return s.jobTopologyProblem(j)
}

// addJobs builds the jobs and their pods. A job that cannot be scheduled
// as a whole is rejected (rejectJob); a job with an invalid pending pod
// keeps its placed pods but none of its pending pods is scheduled (gangs
// are all or nothing).
func (s *session) addJobs(snap *Snapshot) {
	jobs := slices.Clone(snap.Jobs)
	slices.SortStableFunc(jobs, func(a, b Job) int { return strings.Compare(a.Name, b.Name) })
	podNames := map[string]bool{}
	for ji := range jobs {
		j := &jobs[ji]
		if why := s.jobProblem(j, ji > 0 && jobs[ji-1].Name == j.Name); why != "" {
			s.rejectJob(j, why, podNames)
			continue
		}
		q := s.queueByN[j.Queue]
		js := &jobState{name: j.Name, queue: q, priority: j.Priority, preemptible: j.Preemptible, neverEvicts: j.NeverEvicts, disruption: j.Disruption, minMember: j.MinMember, declaredMin: j.MinMember, created: j.CreatedAt, belowSince: j.BelowMinMemberSince, subs: s.newSubs(j), topo: s.resolveTopo(j.Topology)}
		if q.delay > 0 {
			js.evictFrom = j.CreatedAt.Add(q.delay)
		}
		if js.minMember <= 0 || js.minMember > len(j.Pods) {
			js.minMember = max(len(j.Pods), 1)
		}
		q.jobs = append(q.jobs, js)
		s.jobs = append(s.jobs, js)
		s.addPods(js, j, podNames)
	}
}

// podRead is one pod of a job as readPod saw it.
type podRead struct {
	pod *Pod
	ps  *podState
	pl  *plan
	err error
}

// addPods reads a job's pods and admits them, unless one of its pending
// pods is invalid: then every pending pod waits with the reason.
func (s *session) addPods(js *jobState, j *Job, podNames map[string]bool) {
	reads := make([]podRead, len(j.Pods))
	blocked := ""
	for i := range j.Pods {
		p := &j.Pods[i]
		r := podRead{pod: p}
		if p.Name == "" || podNames[p.Name] {
			r.err = fmt.Errorf("pod %q: empty or duplicate name", p.Name)
		} else {
			podNames[p.Name] = true
			r.ps, r.pl, r.err = s.readPod(js, p)
		}
		if r.err != nil && isPending(p) && blocked == "" {
			blocked = fmt.Sprintf("its job %s cannot be scheduled: pod %s: %v", j.Name, p.Name, r.err)
		}
		reads[i] = r
	}
	for _, r := range reads {
		switch {
		case r.err != nil && !isPending(r.pod):
			s.freeze(js, r.pod, r.err)
		case r.err != nil:
			s.invalid = append(s.invalid, PendingPod{Pod: r.pod.Name, Job: j.Name, Reason: r.err.Error()})
			js.invalid++
		case blocked != "" && isPending(r.pod):
			s.invalid = append(s.invalid, PendingPod{Pod: r.pod.Name, Job: j.Name, Reason: blocked})
			js.invalid++
		default:
			s.admitPod(r.ps, r.pl)
			js.pods = append(js.pods, r.ps)
			s.pods = append(s.pods, r.ps)
		}
	}
	if blocked != "" {
		s.problem("job "+j.Name, "%s; none of its pending pods is scheduled", blocked)
	}
}

func isPending(p *Pod) bool { return p.Phase == PodPending || p.Phase == "" }

// rejectJob leaves a job out: its pending pods wait with the reason, its
// placed pods are frozen where they are.
func (s *session) rejectJob(j *Job, why string, podNames map[string]bool) {
	s.problem("job "+j.Name, "%s; left out", why)
	st := JobStatus{}
	for i := range j.Pods {
		p := &j.Pods[i]
		podNames[p.Name] = true
		if isPending(p) {
			s.invalid = append(s.invalid, PendingPod{Pod: p.Name, Job: j.Name, Reason: why})
			st.Pending++
			continue
		}
		if s.freeze(s.frozenJob, p, fmt.Errorf("%s", why)) {
			st.Placed++
		}
	}
	if _, ok := s.rejected[j.Name]; !ok && j.Name != "" {
		s.rejected[j.Name] = st
	}
}

// freeze keeps the capacity of a placed pod the core cannot schedule by
// the rules (its job is rejected, or its request or placement is invalid):
// a stand-in that no queue counts and no action moves or evicts holds the
// GPUs its placement names, whole, with its CPU, memory and other
// resources — or, when those are not readable either, the whole node. It
// reports whether anything was held (not on an unknown node).
func (s *session) freeze(j *jobState, p *Pod, cause error) bool {
	obj := "pod " + p.Name
	n, ok := s.nodeByN[p.Placement.Node]
	if !ok {
		s.problem(obj, "%v; placed on unknown node %q, so nothing is counted for it", cause, p.Placement.Node)
		return false
	}
	h := &podState{name: p.Name, job: j, phase: PodRunning, rank: -1, lastOp: -1, lastDetach: -1}
	var gpus []int
	r := p.Request
	readable := checkAmount("", r.CPU, MaxAmount) == nil && checkAmount("", r.Memory, MaxAmount) == nil
	for _, v := range r.Other {
		readable = readable && checkAmount("", v, MaxAmount) == nil
	}
	how := "its GPUs are counted as taken whole"
	if readable {
		h.req = Request{CPU: r.CPU, Memory: r.Memory}
		if len(r.Other) > 0 {
			h.other = s.otherVector(r.Other)
		}
		for _, idx := range p.Placement.GPUs {
			pos := slices.IndexFunc(n.gpus, func(g gpuState) bool { return g.index == idx })
			if pos >= 0 && !slices.Contains(gpus, pos) {
				gpus = append(gpus, pos)
			}
		}
		slices.Sort(gpus)
	} else {
		// Its amounts cannot be counted: nothing else goes on its node.
		how = "its whole node is counted as taken"
		h.req = Request{CPU: n.cpu, Memory: n.mem}
		h.other = slices.Clone(n.other)
		for pos := range n.gpus {
			gpus = append(gpus, pos)
		}
	}
	milli, mem := make([]int64, len(gpus)), make([]int64, len(gpus))
	for i, pos := range gpus {
		milli[i], mem[i] = 1000, n.gpus[pos].memory
	}
	s.place(h, n, gpus, milli, mem, "", Resources{})
	s.problem(obj, "%v; placed on node %s, %s", cause, n.name, how)
	return true
}

// ValidateRequest says why the core would refuse a pod asking r (nil when
// it would not): adapters and their tests check what they read against it.
func ValidateRequest(r Request) error {
	if _, err := normRequest(r); err != nil {
		return err
	}
	for name, v := range r.Other {
		if err := checkAmount(name, v, MaxAmount); err != nil {
			return err
		}
	}
	return nil
}

// ValidateQueue says why the core would leave a queue out for its own
// fields (nil when it would not); its parent is not looked at.
func ValidateQueue(q Queue) error { return checkQueue(&q) }

// checkTopology validates a topology's own fields (Topology's rules).
func checkTopology(t *Topology) error {
	if len(t.Levels) == 0 {
		return fmt.Errorf("topology %s has no levels", t.Name)
	}
	for i, l := range t.Levels {
		switch {
		case l == "":
			return fmt.Errorf("topology %s: level %d is empty", t.Name, i)
		case slices.Index(t.Levels, l) < i:
			return fmt.Errorf("topology %s: level %s is listed twice", t.Name, l)
		}
	}
	return nil
}

// addTopologies indexes the snapshot's topologies; one without a name, a
// second of one name or one that is invalid itself is left out, and a
// job naming it waits with the reason (constraintProblem).
func (s *session) addTopologies(snap *Snapshot) {
	s.topos = map[string]*topoState{}
	s.badTopos = map[string]string{}
	for i := range snap.Topologies {
		t := &snap.Topologies[i]
		switch {
		case t.Name == "":
			s.problem(`topology ""`, "empty name; left out")
		case s.topos[t.Name] != nil || s.badTopos[t.Name] != "":
			s.problem("topology "+t.Name, "listed twice; the first is used")
		default:
			if err := checkTopology(t); err != nil {
				s.badTopos[t.Name] = err.Error()
				s.problem("topology "+t.Name, "%v; left out, the jobs naming it wait", err)
				continue
			}
			s.topos[t.Name] = &topoState{name: t.Name, levels: slices.Clone(t.Levels)}
		}
	}
}

// constraintProblem says why a job's or subgroup's topology constraint
// cannot be taken as given (nil when it can): the topology must exist and
// be valid, each level must be one of its levels, and the preferred level
// may not be broader than the required one. Levels are named by their
// label keys, as the constraint names them.
func constraintProblem(c *TopologyConstraint, topos map[string]*topoState, bad map[string]string) error {
	if bad[c.Topology] != "" {
		return fmt.Errorf("topology %s is invalid: %s", c.Topology, bad[c.Topology])
	}
	t := topos[c.Topology]
	if t == nil {
		return fmt.Errorf("topology %q does not exist", c.Topology)
	}
	if c.Required == "" && c.Preferred == "" {
		return fmt.Errorf("topology %s: neither a required nor a preferred level is set", t.name)
	}
	for _, l := range []struct{ what, key string }{{"required", c.Required}, {"preferred", c.Preferred}} {
		if l.key != "" && t.level(l.key) < 0 {
			return fmt.Errorf("topology %s: %s level %q is not one of its levels (%s)", t.name, l.what, l.key, strings.Join(t.levels, ", "))
		}
	}
	if c.Required != "" && c.Preferred != "" && t.level(c.Preferred) < t.level(c.Required) {
		return fmt.Errorf("topology %s: preferred level %s is broader than required level %s (a gang in one %s is in one %s already)",
			t.name, c.Preferred, c.Required, levelName(c.Required), levelName(c.Preferred))
	}
	return nil
}

// jobTopologyProblem checks a job's constraint and its subgroups'; a
// subgroup's must name the job's topology when the job has one, so that
// its domain can lie inside the job's.
func (s *session) jobTopologyProblem(j *Job) string {
	if j.Topology != nil {
		if err := constraintProblem(j.Topology, s.topos, s.badTopos); err != nil {
			return fmt.Sprintf("job %s: %v", j.Name, err)
		}
	}
	for _, g := range j.SubGroups {
		if g.Topology == nil {
			continue
		}
		if j.Topology != nil && g.Topology.Topology != j.Topology.Topology {
			return fmt.Sprintf("job %s: subgroup %s: topology %q is not the job's topology %s", j.Name, g.Name, g.Topology.Topology, j.Topology.Topology)
		}
		if err := constraintProblem(g.Topology, s.topos, s.badTopos); err != nil {
			return fmt.Sprintf("job %s: subgroup %s: %v", j.Name, g.Name, err)
		}
	}
	return ""
}

// ValidateTopology says why the core would leave a topology out for its
// own fields (nil when it would not).
func ValidateTopology(t Topology) error {
	if t.Name == "" {
		return fmt.Errorf("topology has an empty name")
	}
	return checkTopology(&t)
}

// ValidateTopologyConstraint says why the core would refuse a job or
// subgroup with constraint c given the topologies (nil when it would not).
func ValidateTopologyConstraint(c TopologyConstraint, topologies []Topology) error {
	s := &session{}
	s.addTopologies(&Snapshot{Topologies: topologies})
	return constraintProblem(&c, s.topos, s.badTopos)
}
