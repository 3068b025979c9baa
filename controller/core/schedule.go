package core

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Schedule runs one scheduling cycle on the snapshot: stale-gang eviction,
// fair share, then allocate → consolidate → reclaim → preempt, each simulated
// on a transaction and committed only when its plan holds. It never modifies
// the snapshot. A queue, job or pod the core cannot take as given (an
// unknown queue or parent, a job in a parent queue, duplicate names, an
// invalid request, a pod placed on an unknown node or GPU) fails alone: it
// is left out with a reason in Result.Problems, its pending pods wait with
// that reason in Result.Pending, and its placed pods keep their capacity.
// The error is for a nil snapshot or an unknown Config only.
func Schedule(snap *Snapshot, cfg Config) (*Result, error) {
	if snap == nil {
		return nil, fmt.Errorf("core: nil snapshot")
	}
	start := time.Now()
	s, err := newSession(snap, cfg)
	if err != nil {
		return nil, fmt.Errorf("core: invalid snapshot: %w", err)
	}
	res := &Result{}
	step := func(a Action, f func()) {
		t := time.Now()
		f()
		res.Timings = append(res.Timings, Timing{Action: a, Duration: time.Since(t)})
	}
	res.Timings = append(res.Timings, Timing{Action: "snapshot", Duration: time.Since(start)})
	step("fair-share", func() {
		s.computeFairShare()
		s.buildVictimOrder()
	})
	step(ActionStaleGang, s.staleGangs)
	step(ActionAllocate, s.allocate)
	if !s.cfg.DisableConsolidation {
		step(ActionConsolidate, s.consolidate)
	}
	step(ActionReclaim, s.reclaim)
	step(ActionPreempt, s.preempt)
	s.explainDelays()
	step("result", func() { s.result(res) })
	return res, nil
}

// explainDelays adds to the reasons of the pending pods of jobs whose
// queue's preemption delay has not passed that they may not evict yet: the
// time is absolute, so the reason does not change from cycle to cycle, and
// rounded up to the second.
func (s *session) explainDelays() {
	for _, j := range s.jobs {
		if j.neverEvicts || !s.now.Before(j.evictFrom) {
			continue
		}
		for _, p := range s.candidates(j) {
			if p.reason != "" {
				p.reason += fmt.Sprintf("; may not evict others before %s (queue %s's preemption delay, %s from the job's creation)",
					j.evictFrom.Add(time.Second-1).UTC().Format(time.RFC3339), j.queue.name, j.queue.delay)
			}
		}
	}
}

// result turns the committed log into decisions: each pod whose final state
// differs from the snapshot's, in the order of its last change.
func (s *session) result(res *Result) {
	// Each pod's last operation and last eviction, in log order.
	var changed, bound, held []*podState
	for i := range s.log {
		p := s.log[i].pod
		if p.held {
			if p.node != nil && s.log[i].attach {
				held = append(held, p)
			}
			continue
		}
		if p.lastOp < 0 {
			changed = append(changed, p)
		}
		p.lastOp = i
		if !s.log[i].attach {
			p.lastDetach = i
		}
	}
	slices.SortFunc(changed, func(a, b *podState) int { return a.lastOp - b.lastOp })
	for _, p := range changed {
		o := &s.log[p.lastOp]
		wasPlaced := p.origNode != nil && p.phase != PodReleasing
		switch {
		case wasPlaced && p.atOrig:
			// Evicted and put back within one plan: no decision.
		case wasPlaced:
			d := &s.log[p.lastDetach]
			ev := Eviction{Pod: p.name, Job: p.job.name, Node: p.origNode.name, Action: d.action, Reason: d.reason, Plan: s.planOf(p.lastDetach)}
			if p.node != nil {
				pl := s.export(p)
				ev.MoveTo = &pl
			}
			p.origNode.evicted = true
			res.Evictions = append(res.Evictions, ev)
		case p.node != nil:
			res.Binds = append(res.Binds, Bind{Pod: p.name, Job: p.job.name, Placement: s.export(p), Action: o.action, Plan: s.planOf(p.lastOp)})
			bound = append(bound, p)
		}
	}
	s.markPipelined(res, bound, held)
	res.Jobs = make(map[string]JobStatus, len(s.jobs)+len(s.rejected))
	for name, st := range s.rejected {
		res.Jobs[name] = st
	}
	for _, j := range s.jobs {
		st := JobStatus{Placed: j.placed, Pending: j.invalid}
		for _, p := range j.pods {
			if p.node == nil {
				st.Pending++
			}
			if p.phase == PodPending && p.node == nil {
				why := p.reason
				if why == "" {
					why = "not reached in this cycle"
				}
				if j.neverEvicts {
					why += "; it evicts no pod to run (preemptionPolicy Never)"
				}
				res.Pending = append(res.Pending, PendingPod{Pod: p.name, Job: j.name, Reason: why})
			}
		}
		st.BelowMinMember = j.belowMin()
		res.Jobs[j.name] = st
	}
	if len(s.invalid) > 0 {
		// By job name then pod order, as the rest.
		res.Pending = append(res.Pending, s.invalid...)
		slices.SortStableFunc(res.Pending, func(a, b PendingPod) int { return strings.Compare(a.Job, b.Job) })
	}
	res.Problems = s.problems
	// Pending is kept on leaves (where pods are); a parent reports its
	// subtree's, as Allocated does.
	pending := make(map[*queueState]Resources, len(s.queues))
	for _, q := range s.queues {
		for a := q; a != nil; a = a.parent {
			sum := pending[a]
			addRes(&sum, q.pending, 1)
			pending[a] = sum
		}
	}
	res.Queues = make(map[string]QueueStatus, len(s.queues))
	for _, q := range s.queues {
		res.Queues[q.name] = QueueStatus{FairShare: q.fairShare, Allocated: q.allocated, Pending: pending[q], Quota: q.quota, Limit: q.limit}
	}
}

// export writes a pod's live placement in the API's terms.
func (s *session) export(p *podState) Placement {
	pl := Placement{Node: p.node.name, Sharing: p.sharing, Alternative: p.alt}
	for i, gi := range p.gpus {
		pl.GPUs = append(pl.GPUs, p.node.gpus[gi].index)
		pl.GPUMilli = append(pl.GPUMilli, p.gpuMilli[i])
		pl.GPUMemory = append(pl.GPUMemory, p.gpuMem[i])
	}
	return pl
}

// transit is a node's usage while this cycle's victims are still on it:
// everything at the cycle's start, plus the targets of moves, plus the binds
// made right away. Only nodes with evictions need it.
type transit struct {
	cpu, mem int64
	other    []int64    // like nodeState.usedOther
	gpus     []gpuState // usedMilli, usedMem, pods, sharing
}

// markPipelined sets Bind.Pipelined exactly: a bind is pipelined when it
// does not fit next to the pods evicted from its node (they keep their
// capacity until they are gone). The adapter holds pipelined binds back, so
// a false positive would delay a pod for nothing. Binds are tried in
// decision order, each one made right away that fits. held are the
// stand-ins that keep the victims' unused capacity (holdFreed): the victims
// themselves are put back, so their stand-ins are taken out.
func (s *session) markPipelined(res *Result, bound, held []*podState) {
	var tr map[*nodeState]*transit
	get := func(n *nodeState) *transit {
		if t := tr[n]; t != nil {
			return t
		}
		// Start from the final state, take the binds out, put the
		// victims back.
		t := &transit{cpu: n.usedCPU, mem: n.usedMem, other: slices.Clone(n.usedOther), gpus: slices.Clone(n.gpus)}
		for _, ps := range [2][]*podState{bound, held} {
			for _, p := range ps {
				if p.node == n {
					t.remove(p)
				}
			}
		}
		for _, v := range n.victims {
			if v.origNode == n && !v.atOrig {
				t.addAt(v, v.origGPUs, v.origMilli, v.origMem, v.origShare)
			}
		}
		if tr == nil {
			tr = map[*nodeState]*transit{}
		}
		tr[n] = t
		return t
	}
	for i := range res.Binds {
		b, p := &res.Binds[i], bound[i]
		if !p.node.evicted {
			continue
		}
		if p.matches != nil || p.avoids != nil || p.needs != nil || p.spread != nil {
			// (Anti-)affinity with a victim is not tracked in transit:
			// such a bind waits for the node's victims to be gone.
			b.Pipelined = true
			continue
		}
		t := get(p.node)
		if t.fits(p) {
			t.add(p)
		} else {
			b.Pipelined = true
		}
	}
}

func (t *transit) remove(p *podState) {
	t.cpu -= p.req.CPU
	t.mem -= p.req.Memory
	for i, x := range p.other {
		t.other[i] -= x
	}
	for i, gi := range p.gpus {
		g := &t.gpus[gi]
		g.pods--
		g.usedMilli -= p.gpuMilli[i]
		g.usedMem -= p.gpuMem[i]
		g.addFraction(&p.req, p.gpuMilli[i], p.gpuMem[i], -1)
		if g.pods == 0 {
			g.sharing = ""
		}
	}
}

func (t *transit) add(p *podState) { t.addAt(p, p.gpus, p.gpuMilli, p.gpuMem, p.sharing) }

// addAt adds p's use with its GPUs' part given: where it is now (add) or
// where a victim was (put back).
func (t *transit) addAt(p *podState, gpus []int, milli, mem []int64, sharing Sharing) {
	t.cpu += p.req.CPU
	t.mem += p.req.Memory
	for i, x := range p.other {
		t.other[i] += x
	}
	for i, gi := range gpus {
		g := &t.gpus[gi]
		g.pods++
		g.usedMilli += milli[i]
		g.usedMem += mem[i]
		g.addFraction(&p.req, milli[i], mem[i], 1)
		g.sharing = sharing
	}
}

// fits: p's final placement is free while the victims are still there.
func (t *transit) fits(p *podState) bool {
	n := p.node
	if t.cpu+p.req.CPU > n.cpu || t.mem+p.req.Memory > n.mem {
		return false
	}
	for i, x := range p.other {
		if x > 0 && t.other[i]+x > n.other[i] {
			return false
		}
	}
	for i, gi := range p.gpus {
		g := &t.gpus[gi]
		if g.pods == 0 {
			continue
		}
		if p.sharing == "" || g.sharing != p.sharing || !g.fitsFraction(&p.req, p.gpuMilli[i], p.gpuMem[i]) {
			return false
		}
	}
	return true
}
