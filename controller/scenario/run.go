package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Pod states in the report. Nominated pods hold capacity that this cycle's
// evictions free (a preemptor, a reclaimer, a pod moved by consolidation) and
// are bound at the start of the next cycle.
const (
	StatePending   = "Pending"
	StateNominated = "Nominated"
	StateBound     = "Bound"
	StateRunning   = "Running"
	// Timed runs: a job's pods before it arrives, and after it finished.
	StateArriving  = "Arriving"
	StateSucceeded = "Succeeded"
)

// Options change how a scenario runs.
type Options struct {
	// Trace, when set, receives every decision cycle by cycle.
	Trace io.Writer
	// Timing records each cycle's wall time in the report; off by default so
	// that the same input always gives byte-identical reports.
	Timing bool
	// OnCycle, when set, is called as each cycle starts, so a caller that
	// gives up on a long run can say how far it got.
	OnCycle func(cycle int)
	// Step runs every cycle of a timed run, also those after which nothing
	// can change (they are skipped otherwise); the report is the same.
	Step bool
}

// CycleError is RunContext's error when its context ends: the scenario
// stopped before the cycle Cycle of Cycles.
type CycleError struct {
	Scenario      string
	Cycle, Cycles int
	Err           error
}

func (e *CycleError) Error() string {
	return fmt.Sprintf("scenario %q: stopped before cycle %d of %d: %v", e.Scenario, e.Cycle, e.Cycles, e.Err)
}

func (e *CycleError) Unwrap() error { return e.Err }

type simPod struct {
	job   *Job
	spec  *Pod
	state string
	place core.Placement
	// reason is why the pod stayed pending in the last cycle.
	reason string
	// started is when the pod was placed (core.Pod.StartedAt): the cycle
	// that bound or nominated it, or the run's start for a pod given
	// running.
	started time.Time
}

type runner struct {
	spec     *Spec
	opts     Options
	pods     []*simPod // job order, then pod index
	byName   map[string]*simPod
	evicted  map[string]int       // per job, moves included
	since    map[string]time.Time // when each job was first seen below minMember
	nodes    []core.Node
	nodeIdx  map[string]*core.Node
	queues   []core.Queue
	cfg      core.Config
	last     *core.Result
	cycles   []CycleReport
	failures []string
	// gpuMemory is each node's GPU memory, for pods that need at least so
	// much on every GPU (Pod.MinGPUMemory).
	gpuMemory map[string]int64
	// jobs is each job's life in a timed run, by index in spec.Jobs.
	jobs []jobLife
	// cyclesRun counts the cycles that ran (a timed run skips some).
	cyclesRun int
	fair      *fairness // timed runs only
	// history is the usage history of a run with config.usage; usage its
	// decayed sums as the core reads them (they change at bucket ends).
	history *core.UsageHistory
	usage   map[string]core.Resources
	// protect is each queue's time protections, inherited values resolved.
	protect map[string]protections
}

// jobLife is where a job is in a timed run.
type jobLife struct {
	arrived, finished bool
	// heldSince is when the job's gang last started holding (seconds from
	// the run's start), -1 while it does not: it finishes RunFor after.
	heldSince int64
}

// simEpoch is the sim's clock origin: createdAt seconds count from it, and
// cycle i (from 1) runs i seconds after the newest job was created.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs one scenario and checks its expectations.
func Run(s *Spec, opts Options) *Report {
	rep, _ := RunContext(context.Background(), s, opts) // never ends: no error
	return rep
}

// RunContext is Run that stops between cycles once ctx ends, with a
// *CycleError and no report.
func RunContext(ctx context.Context, s *Spec, opts Options) (*Report, error) {
	r := newRunner(s, opts)
	for c := 1; c <= s.Cycles; {
		if err := ctx.Err(); err != nil {
			return nil, &CycleError{Scenario: s.Name, Cycle: c, Cycles: s.Cycles, Err: err}
		}
		if opts.OnCycle != nil {
			opts.OnCycle(c)
		}
		t, now := r.begin(c)
		quiet, err := r.cycle(c, now)
		if err != nil {
			r.failures = append(r.failures, fmt.Sprintf("cycle %d: %v", c, err))
			break
		}
		c = r.end(c, t, now, quiet)
	}
	return r.report(), nil
}

// begin brings the run to cycle c: its time t (seconds from the start) and
// clock; a timed run's arrivals, finishes and schedule windows; the usage
// the core reads.
func (r *runner) begin(c int) (t int64, now time.Time) {
	s := r.spec
	// Untimed, cycle c runs c seconds after the newest job was created;
	// timed, (c-1) cycles after the run's start, so the run covers [0,
	// duration).
	t = int64(c)
	if s.Timed {
		t = int64(c-1) * s.CycleSeconds
		r.advance(t)
	}
	now = simEpoch.Add(time.Duration(runStart(s)+t) * time.Second)
	if s.Timed {
		r.applySchedules(t)
	}
	if r.history != nil {
		r.history.AdvanceTo(now)
		r.usage = r.history.Decayed()
	}
	return t, now
}

// end closes cycle c at t (quiet: it bound and evicted nothing) and returns
// the cycle to run next: a timed run skips to the next event after a quiet
// cycle (unless Options.Step), and counts what the queues held until then
// for the fairness report and the usage history.
func (r *runner) end(c int, t int64, now time.Time, quiet bool) int {
	s := r.spec
	next := c + 1
	if !s.Timed {
		return next
	}
	if quiet && !r.opts.Step {
		next = r.nextCycle(c, t, now)
	}
	t2 := min(int64(next-1)*s.CycleSeconds, s.Seconds())
	r.fair.account(r, t, t2)
	if r.history != nil {
		r.history.Add(now, now.Add(timeDuration(t2-t)), r.held())
	}
	return next
}

// runStart is when the run starts, in seconds from simEpoch: when the newest
// job present from the start was created.
func runStart(s *Spec) int64 {
	var newest int64
	for _, j := range s.Jobs {
		if j.ArriveAt == 0 {
			newest = max(newest, j.CreatedAt)
		}
	}
	return newest
}

// advance brings a timed run to time t (seconds from its start), before the
// cycle at t: jobs whose time has come arrive (their pods pending) and jobs
// that ran for RunFor finish (their pods leave).
func (r *runner) advance(t int64) {
	for ji := range r.spec.Jobs {
		j, l := &r.spec.Jobs[ji], &r.jobs[ji]
		if !l.arrived && j.ArriveAt <= t {
			l.arrived = true
			for pi := range j.Pods {
				if p := r.byName[j.Pods[pi].Name]; p.state == StateArriving {
					p.state = StatePending
				}
			}
			r.tracef("%s: at %s: job %s arrives\n", r.spec.Name, hours(t), j.Name)
		}
		if l.arrived && !l.finished && j.RunFor > 0 && l.heldSince >= 0 && l.heldSince+j.RunFor <= t {
			l.finished = true
			delete(r.since, j.Name)
			for pi := range j.Pods {
				p := r.byName[j.Pods[pi].Name]
				p.state, p.place, p.reason = StateSucceeded, core.Placement{}, ""
			}
			r.tracef("%s: at %s: job %s finished (ran %s)\n", r.spec.Name, hours(t), j.Name, hours(j.RunFor))
		}
	}
}

// held is what each leaf queue's bound and running pods hold, as the usage
// history counts it: milli-GPU (a placement's shares), milli-CPU, MiB.
func (r *runner) held() map[string]core.Resources {
	out := map[string]core.Resources{}
	for _, p := range r.pods {
		if p.state != StateRunning && p.state != StateBound {
			continue
		}
		h := out[p.job.Queue]
		for _, m := range p.place.GPUMilli {
			h[core.ResGPU] += m
		}
		h[core.ResCPU] += p.spec.CPUMilli
		h[core.ResMemory] += p.spec.Memory >> 20
		out[p.job.Queue] = h
	}
	return out
}

// holdSince notes, after a timed run's cycle at t, when each job's gang started
// holding (at least minMember pods, and each subgroup its minimum, bound or
// running).
func (r *runner) holdSince(t int64) {
	for ji := range r.spec.Jobs {
		j, l := &r.spec.Jobs[ji], &r.jobs[ji]
		n := 0
		placed := func(p *Pod) bool {
			st := r.byName[p.Name].state
			return st == StateBound || st == StateRunning
		}
		for pi := range j.Pods {
			if placed(&j.Pods[pi]) {
				n++
			}
		}
		switch {
		case n == 0 || j.Below(placed):
			l.heldSince = -1
		case l.heldSince < 0:
			l.heldSince = t
		}
	}
}

// nextCycle is the cycle a timed run goes on with after a quiet cycle c at t
// (nothing bound, nothing evicted): the first at or after the next event
// that can change anything — a job arriving or finishing, a gang's
// stale-gang timeout — and at the latest the last cycle. Every cycle between
// would see the same snapshot but for the clock, so it would decide nothing.
func (r *runner) nextCycle(c int, t int64, now time.Time) int {
	next := r.spec.Seconds()
	for ji := range r.spec.Jobs {
		j, l := &r.spec.Jobs[ji], &r.jobs[ji]
		switch {
		case !l.arrived:
			next = min(next, j.ArriveAt)
		case !l.finished && j.RunFor > 0 && l.heldSince >= 0:
			next = min(next, l.heldSince+j.RunFor)
		}
		if since, ok := r.since[j.Name]; ok {
			next = min(next, t+int64(since.Add(core.DefaultStaleGangTimeout).Sub(now)/time.Second))
		}
	}
	if r.history != nil {
		// The usage the core reads changes when a bucket closes.
		next = min(next, t+int64(r.history.NextBoundary().Sub(now)/time.Second))
	}
	next = min(next, r.nextScheduleChange(t), r.nextProtectionEnd(t, now))
	next = max(next, t+1)
	nc := int((next+r.spec.CycleSeconds-1)/r.spec.CycleSeconds) + 1
	return max(c+1, min(nc, r.spec.Cycles))
}

func newRunner(s *Spec, opts Options) *runner {
	r := &runner{spec: s, opts: opts, byName: map[string]*simPod{}, evicted: map[string]int{}, since: map[string]time.Time{}, nodeIdx: map[string]*core.Node{}, gpuMemory: map[string]int64{}}
	r.cfg = core.Config{Placement: core.PlacementPolicy(s.Placement), DisableConsolidation: !s.Consolidation}
	if s.Usage != nil {
		r.cfg.UsageCoefficient = s.Usage.Coefficient
		// The history starts with the run: (cycle 1's time).
		r.history, _ = core.NewUsageHistory(s.Usage.Config, simEpoch.Add(timeDuration(runStart(s)))) // validated by normalize
	}
	for _, n := range s.Nodes {
		cn := core.Node{Name: n.Name, Labels: n.Labels, CPU: n.CPUMilli, Memory: n.Memory}
		r.gpuMemory[n.Name] = n.GPUMemory
		for g := 0; g < n.GPUs; g++ {
			cn.GPUs = append(cn.GPUs, core.GPU{Index: g, Memory: n.GPUMemory, Model: n.GPUModel, NVLinkDomain: n.NVLinkDomain(g)})
		}
		r.nodes = append(r.nodes, cn)
	}
	for i := range r.nodes {
		r.nodeIdx[r.nodes[i].Name] = &r.nodes[i]
	}
	for _, q := range s.Queues {
		cq := core.Queue{Name: q.Name, Parent: q.Parent, Priority: int32(q.Priority),
			PreemptMinRuntime: protection(q.PreemptMinRuntime), ReclaimMinRuntime: protection(q.ReclaimMinRuntime), PreemptionDelay: protection(q.PreemptionDelay)}
		for res, v := range map[core.Resource]Resource{core.ResGPU: q.GPU, core.ResCPU: q.CPU, core.ResMemory: q.Memory} {
			cq.Resources[res] = core.QueueResource{Quota: v.Quota, Limit: v.Limit, OverQuotaWeight: v.Weight}
		}
		r.queues = append(r.queues, cq)
	}
	r.jobs = make([]jobLife, len(s.Jobs))
	r.protect = resolveProtections(s)
	if s.Timed {
		r.fair = newFairness(s)
	}
	for ji := range s.Jobs {
		j := &s.Jobs[ji]
		r.jobs[ji] = jobLife{arrived: j.ArriveAt == 0, heldSince: -1}
		for pi := range j.Pods {
			p := &j.Pods[pi]
			sp := &simPod{job: j, spec: p, state: StatePending}
			if !r.jobs[ji].arrived {
				sp.state = StateArriving
			}
			if p.Running != nil {
				sp.state = StateRunning
				sp.started = simEpoch.Add(timeDuration(runStart(s)))
				sp.place = r.fillPlacement(p, core.Placement{Node: p.Running.Node, GPUs: slices.Clone(p.Running.GPUs)})
			}
			r.pods = append(r.pods, sp)
			r.byName[p.Name] = sp
		}
	}
	return r
}

// request converts a pod's ask to the core's Request.
func request(p *Pod) core.Request {
	req := core.Request{CPU: p.CPUMilli, Memory: p.Memory}
	switch {
	case p.GPUMemory > 0:
		req.GPUMemory = p.GPUMemory
	case p.Fractional():
		req.GPUMilli = p.GPUMilli
	default:
		req.GPUs = p.WholeGPUs()
	}
	if req.IsFraction() {
		req.Sharing = core.Sharing(p.Sharing)
	}
	if p.NVLinkReq {
		req.NVLink = core.NVLinkRequired
	} else if p.WholeGPUs() > 1 {
		req.NVLink = core.NVLinkPreferred
	}
	return req
}

// fillPlacement completes a placement's per-GPU shares the way the core
// describes them, so pods that start running carry the same data as bound
// ones: those of the request the placement holds (pl.Alternative).
func (r *runner) fillPlacement(p *Pod, pl core.Placement) core.Placement {
	if a, ok := p.As(pl.Alternative); ok {
		p = a // else checkCapacity reports it
	}
	n := r.nodeIdx[pl.Node]
	pl.GPUMilli, pl.GPUMemory = nil, nil
	for _, g := range pl.GPUs {
		mem := n.GPUs[g].Memory
		switch {
		case p.GPUMemory > 0:
			pl.GPUMilli = append(pl.GPUMilli, ceilDiv(p.GPUMemory*1000, mem))
			pl.GPUMemory = append(pl.GPUMemory, p.GPUMemory)
		case p.Fractional():
			pl.GPUMilli = append(pl.GPUMilli, p.GPUMilli)
			pl.GPUMemory = append(pl.GPUMemory, mem*p.GPUMilli/1000)
		default:
			pl.GPUMilli = append(pl.GPUMilli, 1000)
			pl.GPUMemory = append(pl.GPUMemory, mem)
		}
	}
	if p.Fractional() {
		pl.Sharing = core.Sharing(p.Sharing)
	}
	return pl
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// actionLabel names a decision's action in the trace, with its plan's
// number when an evicting plan made it, so that a plan's evictions and binds
// can be read together.
func actionLabel(a core.Action, plan int) string {
	if plan == 0 {
		return string(a)
	}
	return fmt.Sprintf("%s plan %d", a, plan)
}

func (r *runner) tracef(format string, args ...any) {
	if r.opts.Trace != nil {
		fmt.Fprintf(r.opts.Trace, format, args...)
	}
}

func (r *runner) snapshot(now time.Time) *core.Snapshot {
	s := &core.Snapshot{Now: now, Nodes: r.nodes, Queues: r.queues, Usage: r.usage, Topologies: r.spec.Topologies}
	for ji := range r.spec.Jobs {
		j := &r.spec.Jobs[ji]
		if l := r.jobs[ji]; !l.arrived || l.finished {
			continue
		}
		cj := core.Job{Name: j.Name, Queue: j.Queue, Priority: int32(j.Priority), Preemptible: j.Preemptible, NeverEvicts: j.NeverEvicts,
			Disruption: core.Disruption(j.Disruption), MinMember: j.MinMember, BelowMinMemberSince: r.since[j.Name], SubGroups: subGroups(j), Topology: j.Topology,
			CreatedAt: r.jobCreated(ji)}
		for pi := range j.Pods {
			sp := r.byName[j.Pods[pi].Name]
			cp := core.Pod{Name: sp.spec.Name, SubGroup: sp.spec.SubGroup, Request: request(sp.spec), Feasible: r.leastMemory(sp.spec)}
			for i := range sp.spec.Alternatives {
				a, _ := sp.spec.As(i + 1)
				cp.Alternatives = append(cp.Alternatives, core.Alternative{Request: request(a), Feasible: r.leastMemory(a)})
			}
			switch sp.state {
			case StatePending:
				cp.Phase = core.PodPending
			case StateBound:
				cp.Phase = core.PodBound
				cp.Placement = clonePlacement(sp.place)
				cp.StartedAt = sp.started
			case StateRunning:
				cp.Phase = core.PodRunning
				cp.Placement = clonePlacement(sp.place)
				cp.StartedAt = sp.started
			}
			cj.Pods = append(cj.Pods, cp)
		}
		s.Jobs = append(s.Jobs, cj)
	}
	return s
}

// jobCreated is job ji's creation time for the core. Jobs created in the
// same second are older in file order (SCENARIOS.md: createdAt, default
// file order): a nanosecond per position from the end breaks the tie
// without moving any second — earlier, so a preemption delay of whole
// seconds ends at a cycle's time, not a nanosecond after it.
func (r *runner) jobCreated(ji int) time.Time {
	return simEpoch.Add(time.Duration(r.spec.Jobs[ji].CreatedAt)*time.Second - time.Duration(len(r.spec.Jobs)-ji))
}

// leastMemory is the check for a pod that needs so much memory on each of
// its whole GPUs (Pod.MinGPUMemory); nil when it needs none.
func (r *runner) leastMemory(p *Pod) func(string, int) bool {
	least := p.MinGPUMemory
	if least == 0 {
		return nil
	}
	return func(node string, _ int) bool { return r.gpuMemory[node] >= least }
}

func clonePlacement(p core.Placement) core.Placement {
	p.GPUs = slices.Clone(p.GPUs)
	p.GPUMilli = slices.Clone(p.GPUMilli)
	p.GPUMemory = slices.Clone(p.GPUMemory)
	return p
}

// cycle runs one scheduling cycle and applies its decisions as SCENARIOS.md's
// "Rules of a run" say. quiet is true when it bound and evicted nothing.
func (r *runner) cycle(c int, now time.Time) (quiet bool, err error) {
	r.cyclesRun++
	r.tracef("%s: cycle %d\n", r.spec.Name, c)
	bound := r.promotePods()
	r.trackStaleGangs(now)
	res, elapsed, err := r.schedule(now)
	if err != nil {
		return false, err
	}
	r.last = res

	// Evictions first, in decision order: the pods keep their capacity until
	// the end of the cycle.
	problems, moving := r.applyEvictions(res.Evictions, now)
	boundNow, bindProblems := r.applyBinds(res.Binds, now)
	bound += boundNow
	problems = append(problems, bindProblems...)
	// Before the evicted pods leave, the pods bound right away must fit next
	// to them; afterwards, everyone holding capacity must fit.
	problems = append(problems, r.checkCapacity(moving, false)...)
	r.recreateEvicted()
	problems = append(problems, r.checkCapacity(nil, true)...)
	problems = append(problems, r.recordPending(res.Pending)...)
	r.traceQueues(res)
	for _, pr := range problems {
		r.tracef("  PROBLEM  %s\n", pr)
		r.failures = append(r.failures, fmt.Sprintf("cycle %d: %s", c, pr))
	}
	return r.reportCycle(c, res, bound, elapsed), nil
}

// promotePods starts the cycle: last cycle's binds now run; pods nominated
// onto capacity that last cycle's evictions freed are bound now. It returns
// how many it bound.
func (r *runner) promotePods() (bound int) {
	for _, p := range r.pods {
		switch p.state {
		case StateBound:
			p.state = StateRunning
		case StateNominated:
			p.state = StateBound
			bound++
			r.tracef("  bind     %s → %s (nominated last cycle)\n", p.spec.Name, placementString(p.place))
		}
	}
	return bound
}

// trackStaleGangs keeps the stale-gang bookkeeping as the controller's
// adapter keeps it: when a job was first seen with some but fewer than
// minMember pods placed (or fewer than a subgroup's minimum).
func (r *runner) trackStaleGangs(now time.Time) {
	for ji := range r.spec.Jobs {
		j := &r.spec.Jobs[ji]
		if l := r.jobs[ji]; !l.arrived || l.finished {
			continue
		}
		if j.Below(func(p *Pod) bool { st := r.byName[p.Name].state; return st == StateBound || st == StateRunning }) {
			if r.since[j.Name].IsZero() {
				r.since[j.Name] = now
			}
		} else {
			delete(r.since, j.Name)
		}
	}
}

// schedule runs the core on the snapshot of now and returns its result and
// how long the core took.
func (r *runner) schedule(now time.Time) (*core.Result, time.Duration, error) {
	snap := r.snapshot(now)
	start := time.Now()
	res, err := core.Schedule(snap, r.cfg)
	elapsed := time.Since(start)
	if err != nil {
		return nil, 0, fmt.Errorf("core: %w", err)
	}
	if res == nil {
		return nil, 0, fmt.Errorf("core returned no result")
	}
	if len(res.Problems) > 0 {
		// The loader refuses what the core would; a problem here is a bug.
		return nil, 0, fmt.Errorf("core: the snapshot has problems: %s: %s", res.Problems[0].Object, res.Problems[0].Reason)
	}
	return res, elapsed, nil
}

// applyEvictions applies the core's evictions in decision order. moving
// keeps the old placement of pods that consolidation moves.
func (r *runner) applyEvictions(evictions []core.Eviction, now time.Time) (problems []string, moving []*simPod) {
	for _, e := range evictions {
		p := r.byName[e.Pod]
		if p == nil {
			problems = append(problems, fmt.Sprintf("core evicted unknown pod %s", e.Pod))
			continue
		}
		if p.state != StateRunning && p.state != StateBound {
			problems = append(problems, fmt.Sprintf("core evicted pod %s, which is %s", e.Pod, p.state))
			continue
		}
		r.evicted[p.job.Name]++
		if e.MoveTo != nil {
			r.tracef("  move     %s %s → %s (%s): %s\n", e.Pod, placementString(p.place), placementString(*e.MoveTo), actionLabel(e.Action, e.Plan), e.Reason)
		} else {
			r.tracef("  evict    %s on %s (%s): %s\n", e.Pod, placementString(p.place), actionLabel(e.Action, e.Plan), e.Reason)
		}
		if e.MoveTo != nil {
			moving = append(moving, &simPod{job: p.job, spec: p.spec, state: "moving", place: p.place})
			p.place = r.fillPlacementFrom(p.spec, *e.MoveTo)
			p.state, p.started = StateNominated, now
		} else {
			p.state = "evicting"
			// The core saw it running, so it gives no pending reason this
			// cycle; the eviction is the reason.
			p.reason = fmt.Sprintf("evicted (%s): %s", e.Action, e.Reason)
		}
	}
	return problems, moving
}

// applyBinds applies the core's binds: a pipelined bind nominates the pod,
// bound at the start of the next cycle. It returns how many it bound now.
func (r *runner) applyBinds(binds []core.Bind, now time.Time) (bound int, problems []string) {
	for _, b := range binds {
		p := r.byName[b.Pod]
		if p == nil {
			problems = append(problems, fmt.Sprintf("core bound unknown pod %s", b.Pod))
			continue
		}
		if p.state != StatePending {
			problems = append(problems, fmt.Sprintf("core bound pod %s, which is %s", b.Pod, p.state))
			continue
		}
		p.place = r.fillPlacementFrom(p.spec, b.Placement)
		p.reason, p.started = "", now
		if b.Pipelined {
			p.state = StateNominated
			r.tracef("  nominate %s → %s (%s; bound next cycle, once the evicted pods are gone)\n", b.Pod, placementString(p.place), actionLabel(b.Action, b.Plan))
		} else {
			p.state = StateBound
			bound++
			r.tracef("  bind     %s → %s (%s)\n", b.Pod, placementString(p.place), actionLabel(b.Action, b.Plan))
		}
	}
	return bound, problems
}

// recreateEvicted ends the evicted pods' cycle: its job's controller
// recreates each as a new pending pod of the same job, keeping the job's age.
func (r *runner) recreateEvicted() {
	for _, p := range r.pods {
		if p.state == "evicting" {
			p.state = StatePending
			p.place = core.Placement{}
		}
	}
}

// recordPending gives every pending pod the core's reason (an evicted pod
// keeps its eviction as the reason when the core gives none) and reports a
// pending pod without one.
func (r *runner) recordPending(pending []core.PendingPod) (problems []string) {
	reasons := map[string]string{}
	for _, pp := range pending {
		reasons[pp.Pod] = pp.Reason
	}
	for _, p := range r.pods {
		if p.state != StatePending {
			continue
		}
		if reason, ok := reasons[p.spec.Name]; ok || !strings.HasPrefix(p.reason, "evicted (") {
			p.reason = reason
		}
		if p.reason == "" {
			problems = append(problems, fmt.Sprintf("pod %s is pending without a reason", p.spec.Name))
		}
		r.tracef("  pending  %s: %s\n", p.spec.Name, p.reason)
	}
	return problems
}

func (r *runner) traceQueues(res *core.Result) {
	for _, q := range r.spec.Queues {
		st := res.Queues[q.Name]
		r.tracef("  queue    %s: gpu fair share %s, allocated %s\n", q.Name, formatMilli(st.FairShare[core.ResGPU]), formatMilli(st.Allocated[core.ResGPU]))
	}
}

// reportCycle records cycle c's report and says whether the cycle was
// quiet (bound and evicted nothing).
func (r *runner) reportCycle(c int, res *core.Result, bound int, elapsed time.Duration) (quiet bool) {
	cr := CycleReport{Bound: bound, Evicted: len(res.Evictions)}
	if r.opts.Timing {
		cr.DurationMs = float64(elapsed.Microseconds()) / 1000
	}
	quiet = bound == 0 && len(res.Evictions) == 0 && len(res.Binds) == 0
	if r.spec.Timed {
		r.holdSince(int64(c-1) * r.spec.CycleSeconds)
		if quiet {
			// A timed run lists the cycles that did something, so that a
			// run that skips the others reports the same.
			return true
		}
		cr.Cycle = c
	}
	r.cycles = append(r.cycles, cr)
	return quiet
}

func (r *runner) fillPlacementFrom(p *Pod, pl core.Placement) core.Placement {
	pl = clonePlacement(pl)
	if r.nodeIdx[pl.Node] == nil {
		return pl // reported by checkCapacity
	}
	for _, g := range pl.GPUs {
		if g < 0 || g >= len(r.nodeIdx[pl.Node].GPUs) {
			return pl
		}
	}
	if len(pl.GPUMilli) != len(pl.GPUs) || len(pl.GPUMemory) != len(pl.GPUs) {
		return r.fillPlacement(p, pl)
	}
	return pl
}

// checkCapacity verifies the core's decisions never hand out more than a node
// has: whole GPUs exclusive, fractions within a GPU's memory and of one
// sharing mode, CPU and memory within the node. Before the end of the cycle
// (final false) evicted pods still hold their capacity, and extra holds the old
// places of pods being moved.
func (r *runner) checkCapacity(extra []*simPod, final bool) []string {
	type gpuUse struct {
		exclusive []string
		shared    []string
		mem       int64
		modes     map[core.Sharing]bool
	}
	use := map[string]map[int]*gpuUse{}
	cpu := map[string]int64{}
	mem := map[string]int64{}
	var problems []string
	holders := append([]*simPod(nil), extra...)
	for _, p := range r.pods {
		if p.state == StateRunning || p.state == StateBound || p.state == "evicting" || (final && p.state == StateNominated) {
			holders = append(holders, p)
		}
	}
	for _, p := range holders {
		n := r.nodeIdx[p.place.Node]
		if n == nil {
			problems = append(problems, fmt.Sprintf("pod %s placed on unknown node %q", p.spec.Name, p.place.Node))
			continue
		}
		// The request the pod holds: its own or the alternative its
		// placement names.
		held, ok := p.spec.As(p.place.Alternative)
		if !ok {
			problems = append(problems, fmt.Sprintf("pod %s holds alternative %d, but it has %d", p.spec.Name, p.place.Alternative, len(p.spec.Alternatives)))
		}
		want := held.WholeGPUs()
		if held.Fractional() {
			want = 1
		}
		if len(p.place.GPUs) != want {
			problems = append(problems, fmt.Sprintf("pod %s asks for %d GPUs but got %v%s", p.spec.Name, want, p.place.GPUs, altSuffix(p.place.Alternative)))
		}
		if use[n.Name] == nil {
			use[n.Name] = map[int]*gpuUse{}
		}
		for i, g := range p.place.GPUs {
			if g < 0 || g >= len(n.GPUs) {
				problems = append(problems, fmt.Sprintf("pod %s placed on GPU %d of %s, which has %d", p.spec.Name, g, n.Name, len(n.GPUs)))
				continue
			}
			u := use[n.Name][g]
			if u == nil {
				u = &gpuUse{modes: map[core.Sharing]bool{}}
				use[n.Name][g] = u
			}
			if held.Fractional() {
				u.shared = append(u.shared, p.spec.Name)
				if i < len(p.place.GPUMemory) {
					u.mem += p.place.GPUMemory[i]
				}
				u.modes[core.Sharing(held.Sharing)] = true
			} else {
				u.exclusive = append(u.exclusive, p.spec.Name)
			}
		}
		cpu[n.Name] += p.spec.CPUMilli
		mem[n.Name] += p.spec.Memory
	}
	for _, n := range r.nodes {
		for g := range n.GPUs {
			u := use[n.Name][g]
			switch {
			case u == nil:
			case len(u.exclusive) > 1 || len(u.exclusive) == 1 && len(u.shared) > 0:
				problems = append(problems, fmt.Sprintf("GPU %d of %s is given to %s at once", g, n.Name, strings.Join(append(u.exclusive, u.shared...), " and ")))
			case u.mem > n.GPUs[g].Memory:
				problems = append(problems, fmt.Sprintf("GPU %d of %s: fractions %s take %s of its %s", g, n.Name, strings.Join(u.shared, ", "), formatBytes(u.mem), formatBytes(n.GPUs[g].Memory)))
			case len(u.modes) > 1:
				problems = append(problems, fmt.Sprintf("GPU %d of %s mixes MPS and time-sliced fractions (%s)", g, n.Name, strings.Join(u.shared, ", ")))
			}
		}
		if cpu[n.Name] > n.CPU {
			problems = append(problems, fmt.Sprintf("node %s: pods take %s CPUs of its %s", n.Name, formatMilli(cpu[n.Name]), formatMilli(n.CPU)))
		}
		if mem[n.Name] > n.Memory {
			problems = append(problems, fmt.Sprintf("node %s: pods take %s of its %s memory", n.Name, formatBytes(mem[n.Name]), formatBytes(n.Memory)))
		}
	}
	if !final && len(problems) > 0 {
		for i := range problems {
			problems[i] += " (before the evicted pods are gone: a bind that needs their capacity must be pipelined)"
		}
	}
	sort.Strings(problems)
	return problems
}

func placementString(p core.Placement) string {
	var b strings.Builder
	b.WriteString(p.Node)
	if len(p.GPUs) > 0 {
		fmt.Fprintf(&b, " gpus %s", intsString(p.GPUs))
	}
	var mem int64
	for _, m := range p.GPUMemory {
		mem += m
	}
	if mem > 0 {
		fmt.Fprintf(&b, " %s", formatBytes(mem))
	}
	if p.Sharing != "" {
		fmt.Fprintf(&b, " %s", p.Sharing)
	}
	b.WriteString(altSuffix(p.Alternative))
	return b.String()
}

// altSuffix names the alternative a placement holds, "" for the pod's own
// request.
func altSuffix(alt int) string {
	if alt == 0 {
		return ""
	}
	return fmt.Sprintf(" (alternative %d)", alt)
}

func intsString(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// subGroups is the job's subgroups for the core (nil: none).
func subGroups(j *Job) []core.SubGroup {
	var out []core.SubGroup
	for _, g := range j.SubGroups {
		out = append(out, core.SubGroup{Name: g.Name, MinMember: g.MinMember, Topology: g.Topology})
	}
	return out
}
