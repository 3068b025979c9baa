package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// Decisions are what one cycle decided, in a form two runs can be compared
// by: the core's binds and evictions and every waiting pod's reason (the
// core's, with the adapter's gang words, and the pods the adapter kept out),
// each sorted by pod; and the fair share per queue.
type Decisions struct {
	Binds     []BindDecision     `json:"binds,omitempty"`
	Evictions []EvictionDecision `json:"evictions,omitempty"`
	Pending   []PendingDecision  `json:"pending,omitempty"`
	// FairShare per queue: milli-GPU, milli-CPU and bytes of memory.
	FairShare map[string]ShareDecision `json:"fairShare,omitempty"`
}

// BindDecision places a pod.
type BindDecision struct {
	Pod       string      `json:"pod"`
	Job       string      `json:"job"`
	Node      string      `json:"node"`
	GPUs      []int       `json:"gpus,omitempty"`
	GPUMemory []int64     `json:"gpuMemory,omitempty"`
	Sharing   string      `json:"sharing,omitempty"`
	Action    core.Action `json:"action"`
	Pipelined bool        `json:"pipelined,omitempty"`
}

// EvictionDecision evicts a pod.
type EvictionDecision struct {
	Pod    string      `json:"pod"`
	Node   string      `json:"node"`
	Action core.Action `json:"action"`
	Reason string      `json:"reason"`
	MoveTo string      `json:"moveTo,omitempty"`
}

// PendingDecision is a waiting pod and why.
type PendingDecision struct {
	Pod    string `json:"pod"`
	Reason string `json:"reason"`
}

// ShareDecision is a queue's fair share and allocation after the cycle.
type ShareDecision struct {
	GPUMilli          int64 `json:"gpuMilli"`
	CPUMilli          int64 `json:"cpuMilli"`
	MemoryBytes       int64 `json:"memoryBytes"`
	AllocatedGPUMilli int64 `json:"allocatedGPUMilli"`
}

// decisionsOf reads a cycle's decisions from the core's result (after
// gangWords) and the pods the snapshot kept out.
func decisionsOf(res *core.Result, idx *cycleIndex) *Decisions {
	d := &Decisions{FairShare: map[string]ShareDecision{}}
	for _, b := range res.Binds {
		d.Binds = append(d.Binds, BindDecision{Pod: b.Pod, Job: b.Job, Node: b.Placement.Node, GPUs: b.Placement.GPUs,
			GPUMemory: b.Placement.GPUMemory, Sharing: string(b.Placement.Sharing), Action: b.Action, Pipelined: b.Pipelined})
	}
	for _, e := range res.Evictions {
		ed := EvictionDecision{Pod: e.Pod, Node: e.Node, Action: e.Action, Reason: e.Reason}
		if e.MoveTo != nil {
			ed.MoveTo = e.MoveTo.Node
		}
		d.Evictions = append(d.Evictions, ed)
	}
	reasons := map[string]string{}
	for _, p := range idx.problems {
		reasons[p.Pod] = p.Reason
	}
	for _, p := range res.Pending {
		reasons[p.Pod] = p.Reason
	}
	for pod, why := range reasons {
		d.Pending = append(d.Pending, PendingDecision{Pod: pod, Reason: why})
	}
	for name, q := range res.Queues {
		if name == externalQueue {
			continue
		}
		d.FairShare[name] = ShareDecision{GPUMilli: q.FairShare[core.ResGPU], CPUMilli: q.FairShare[core.ResCPU],
			MemoryBytes: q.FairShare[core.ResMemory], AllocatedGPUMilli: q.Allocated[core.ResGPU]}
	}
	sort.Slice(d.Binds, func(i, j int) bool { return d.Binds[i].Pod < d.Binds[j].Pod })
	sort.Slice(d.Evictions, func(i, j int) bool { return d.Evictions[i].Pod < d.Evictions[j].Pod })
	sort.Slice(d.Pending, func(i, j int) bool { return d.Pending[i].Pod < d.Pending[j].Pod })
	return d
}

// Replay runs the cycle the controller ran on d: the same snapshot code on
// static listers over d's objects, with d's carried state and clock, and the
// same core; nothing is written anywhere.
func Replay(ctx context.Context, d *Dump) (*Decisions, error) {
	snap, idx, cfg, err := offlineSnapshot(ctx, d)
	if err != nil {
		return nil, err
	}
	res, err := core.Schedule(snap, cfg)
	if err != nil {
		return nil, err
	}
	gangWords(snap, idx, res)
	return decisionsOf(res, idx), nil
}

// SnapshotOf is the core's snapshot of a dump, as Replay builds it.
func SnapshotOf(d *Dump) (*core.Snapshot, error) {
	snap, _, _, err := offlineSnapshot(context.Background(), d)
	return snap, err
}

// offlineSnapshot builds a dump's snapshot with a scheduler that has no
// client: static listers, the dump's carried state and clock.
func offlineSnapshot(ctx context.Context, d *Dump) (*core.Snapshot, *cycleIndex, core.Config, error) {
	for i := range d.Objects.Pods {
		// Translations are cached by UID: a hand-written pod needs one.
		if p := &d.Objects.Pods[i]; p.UID == "" {
			p.UID = types.UID("replay:" + p.Namespace + "/" + p.Name)
		}
	}
	cfg := core.Config{Placement: d.Config.Placement, DisableConsolidation: d.Config.DisableConsolidation,
		StaleGangTimeout: d.Config.StaleGangTimeout, UsageCoefficient: d.Config.UsageCoefficient}
	v, err := viewOf(&d.Objects)
	if err != nil {
		return nil, nil, cfg, err
	}
	gpuResource := d.Config.GPUResource
	if gpuResource == "" {
		gpuResource = assignment.DefaultResourceGPU
	}
	s := &Scheduler{
		opts:      Options{Core: cfg, GPUResource: gpuResource, AwaitGrouper: groupAnswers(d)},
		recorder:  &record.FakeRecorder{}, // nil channel: events dropped,
		podCache:  map[types.UID]*podEntry{},
		gpuCache:  map[string]*nodeGPUs{},
		malformed: map[types.UID]string{},
		allDirty:  true,
		celCache:  cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true}),
	}
	s.restoreState(d)
	s.setView(v)
	snap, idx, err := s.buildSnapshot(ctx, d.Now)
	if err != nil {
		return nil, nil, cfg, fmt.Errorf("building snapshot: %w", err)
	}
	return snap, idx, cfg, nil
}

// DumpRequest asks the next cycle for its input; Wait returns it.
type DumpRequest struct {
	done chan struct{}
	dump []byte
	err  error
}

// dumpRequests are the requests waiting for a cycle.
type dumpRequests struct {
	mu   sync.Mutex
	reqs []*DumpRequest
}

// Snapshot asks the next cycle to record its exact input and decisions
// (docs/DESIGN.md, "Cycle snapshots and replay") and returns them as YAML.
func (s *Scheduler) Snapshot(ctx context.Context) ([]byte, error) {
	return s.RequestSnapshot().Wait(ctx)
}

// RequestSnapshot asks the next cycle for its input and decisions; the
// request is in place when it returns (a test asks before Run for the
// first cycle's).
func (s *Scheduler) RequestSnapshot() *DumpRequest {
	r := &DumpRequest{done: make(chan struct{})}
	s.dumps.mu.Lock()
	s.dumps.reqs = append(s.dumps.reqs, r)
	s.dumps.mu.Unlock()
	s.Kick()
	return r
}

// Wait returns the snapshot as YAML once a cycle has taken it.
func (r *DumpRequest) Wait(ctx context.Context) ([]byte, error) {
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a scheduling cycle: %w", ctx.Err())
	case <-r.done:
		return r.dump, r.err
	}
}

// takeDumpRequests returns the requests for this cycle, nil for none.
func (s *Scheduler) takeDumpRequests() []*DumpRequest {
	s.dumps.mu.Lock()
	defer s.dumps.mu.Unlock()
	r := s.dumps.reqs
	s.dumps.reqs = nil
	return r
}

// frozenCycle is a cycle that reads a dump taken at its start instead of
// the informers, so the dump is exactly what it decided on.
type frozenCycle struct {
	reqs    []*DumpRequest
	dump    *Dump
	live    listerView
	grouper func(*v1.Pod) string
}

// freeze starts a frozen cycle when a snapshot was asked for; nil otherwise
// or when the dump cannot be taken (the requests get the error).
func (s *Scheduler) freeze(now time.Time) *frozenCycle {
	reqs := s.takeDumpRequests()
	if len(reqs) == 0 {
		return nil
	}
	fail := func(err error) *frozenCycle {
		for _, r := range reqs {
			r.err = err
			close(r.done)
		}
		return nil
	}
	d, err := s.captureDump(now)
	if err != nil {
		return fail(err)
	}
	v, err := viewOf(&d.Objects)
	if err != nil {
		return fail(err)
	}
	f := &frozenCycle{reqs: reqs, dump: d, live: s.view(), grouper: s.opts.AwaitGrouper}
	s.setView(v)
	s.opts.AwaitGrouper = groupAnswers(d)
	s.markAllDirty() // the GPUs are read from the dump's slices
	return f
}

// record gives the requests the dump with the cycle's decisions.
func (f *frozenCycle) record(snap *core.Snapshot, res *core.Result, idx *cycleIndex) {
	if f == nil {
		return
	}
	f.dump.State.Usage = snap.Usage
	f.dump.Decisions = decisionsOf(res, idx)
	b, err := MarshalDump(f.dump)
	for _, r := range f.reqs {
		r.dump, r.err = b, err
		close(r.done)
	}
	f.reqs = nil
}

// thaw makes the cycle read the informers again; requests not answered
// (the cycle failed before deciding) get an error.
func (s *Scheduler) thaw(f *frozenCycle) {
	s.setView(f.live)
	s.opts.AwaitGrouper = f.grouper
	s.markAllDirty()
	for _, r := range f.reqs {
		r.err = fmt.Errorf("the cycle failed before deciding")
		close(r.done)
	}
}

func (s *Scheduler) markAllDirty() {
	s.dirtyMu.Lock()
	s.allDirty = true
	s.dirtyMu.Unlock()
}
