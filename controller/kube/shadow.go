package kube

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// ShadowOptions run the scheduler in shadow mode (docs/DESIGN.md, "Shadow
// mode"): every cycle it decides for the pods of other schedulers as if they
// were its own, and writes nothing; the decisions become a ShadowReport.
type ShadowOptions struct {
	// Namespaces, when not empty, are the only namespaces whose pods are
	// taken.
	Namespaces []string
	// Selector, when set, takes only the pods whose labels it matches.
	Selector labels.Selector
}

// Shadowed says whether a shadow cycle takes pod as its own: a pod of
// another scheduler, not finished, not a static (mirror) pod nor a
// DaemonSet's (both are pinned to their node by their nature, not by a
// scheduler's choice), in the namespaces and with the labels asked for.
func (o *ShadowOptions) Shadowed(pod *v1.Pod) bool {
	switch {
	case pod.Spec.SchedulerName == SchedulerName,
		pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed,
		pod.Annotations[v1.MirrorPodAnnotationKey] != "":
		return false
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
		return false
	}
	if len(o.Namespaces) > 0 && !contains(o.Namespaces, pod.Namespace) {
		return false
	}
	return o.Selector == nil || o.Selector.Matches(labels.Set(pod.Labels))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ShadowReport is what a shadow cycle found (docs/DESIGN.md, "Shadow mode").
// Pod and node names are namespace/name and name.
type ShadowReport struct {
	// Time is the cycle's clock.
	Time time.Time `json:"time"`
	// Pods counts the pods taken (ShadowOptions.Shadowed); Running those
	// the other scheduler placed, Pending those it has not.
	Pods    int `json:"pods"`
	Running int `json:"running"`
	Pending int `json:"pending"`
	// WouldPlace counts the pods Tessera places when it schedules them all
	// from the start; Agree those of them on the node they run on.
	WouldPlace int `json:"wouldPlace"`
	Agree      int `json:"agree"`
	// Moved: running, and Tessera would have put them elsewhere.
	Moved []ShadowMove `json:"moved,omitempty"`
	// LeftPending: running, and Tessera would leave them pending (why).
	LeftPending []ShadowPending `json:"leftPending,omitempty"`
	// WouldStart: pending for the other scheduler, and Tessera places them.
	WouldStart []ShadowMove `json:"wouldStart,omitempty"`
	// StillPending: pending for both (Tessera's reason).
	StillPending []ShadowPending `json:"stillPending,omitempty"`
	// Queues: fair share and allocation per queue when Tessera schedules
	// every pod from the start (GPUs in milli-GPU).
	Queues map[string]ShadowQueue `json:"queues,omitempty"`
	// Takeover is what Tessera would do were it given the pods now, as they
	// run: the evictions (reclaim, preempt, consolidate) and binds of its
	// first cycle.
	Takeover ShadowTakeover `json:"takeover"`
}

// ShadowMove is a pod with where it runs (or "" for pending) and where
// Tessera puts it.
type ShadowMove struct {
	Pod     string `json:"pod"`
	Queue   string `json:"queue"`
	Actual  string `json:"actual,omitempty"`
	Tessera string `json:"tessera"`
}

// ShadowPending is a pod Tessera leaves pending, with where it runs ("" for
// pending) and Tessera's reason.
type ShadowPending struct {
	Pod    string `json:"pod"`
	Queue  string `json:"queue"`
	Actual string `json:"actual,omitempty"`
	Reason string `json:"reason"`
}

// ShadowQueue is a queue's fair share and what Tessera would allocate it,
// beside what its pods hold now.
type ShadowQueue struct {
	FairShareGPUMilli int64 `json:"fairShareGPUMilli"`
	FairShareCPUMilli int64 `json:"fairShareCPUMilli"`
	FairShareMemory   int64 `json:"fairShareMemoryBytes"`
	// WouldAllocateGPUMilli is the queue's allocation when Tessera places
	// every pod; AllocatedGPUMilli what its running pods hold now.
	WouldAllocateGPUMilli int64 `json:"wouldAllocateGPUMilli"`
	AllocatedGPUMilli     int64 `json:"allocatedGPUMilli"`
}

// ShadowTakeover is the first cycle of a takeover.
type ShadowTakeover struct {
	Evictions []EvictionDecision `json:"evictions,omitempty"`
	Binds     []BindDecision     `json:"binds,omitempty"`
}

// shadowState is the last report, read by the endpoint.
type shadowState struct {
	last atomic.Pointer[ShadowReport]
}

// ShadowReport returns the last shadow cycle's report; nil before the first
// or when not in shadow mode.
func (s *Scheduler) ShadowReport() *ShadowReport {
	return s.shadowLast.last.Load()
}

// shadowOnce is a shadow cycle: the cluster's objects as a dump, decided on
// twice (from the start, and as they run), nothing written.
func (s *Scheduler) shadowOnce(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	reqs := s.takeDumpRequests()
	d, err := s.captureDump(start)
	if err != nil {
		answerDumps(reqs, nil, err)
		return fmt.Errorf("shadow: reading the cluster: %w", err)
	}
	rep, takeover, err := ShadowDecide(ctx, d, s.opts.Shadow)
	if err != nil {
		answerDumps(reqs, nil, err)
		return fmt.Errorf("shadow: %w", err)
	}
	if len(reqs) > 0 {
		// A snapshot in shadow mode is the takeover's input, as decided:
		// tessera-sim replay gives the same decisions.
		b, err := MarshalDump(takeover)
		answerDumps(reqs, b, err)
	}
	s.shadowLast.last.Store(rep)
	if m := s.opts.Metrics; m != nil {
		m.observeShadow(rep)
	}
	logger.V(2).Info("Shadow cycle", "pods", rep.Pods, "wouldPlace", rep.WouldPlace, "moved", len(rep.Moved),
		"leftPending", len(rep.LeftPending), "wouldStart", len(rep.WouldStart), "evictions", len(rep.Takeover.Evictions),
		"took", time.Since(start))
	return nil
}

func answerDumps(reqs []*DumpRequest, b []byte, err error) {
	for _, r := range reqs {
		r.dump, r.err = b, err
		close(r.done)
	}
}

// ShadowDecide runs a shadow cycle on a dump of the live cluster: the
// report, and the takeover's dump with its decisions. d is not changed.
func ShadowDecide(ctx context.Context, d *Dump, o *ShadowOptions) (*ShadowReport, *Dump, error) {
	taken := takenPods(d, o)
	fresh, err := Replay(ctx, shadowDump(d, taken, fromStart))
	if err != nil {
		return nil, nil, fmt.Errorf("deciding from the start: %w", err)
	}
	takeover := shadowDump(d, taken, asRunning)
	now, err := Replay(ctx, takeover)
	if err != nil {
		return nil, nil, fmt.Errorf("deciding a takeover: %w", err)
	}
	takeover.Decisions = now
	// With the pending pods left out, nothing is placed or evicted: the
	// cycle's allocation is what the running pods hold.
	held, err := Replay(ctx, shadowDump(d, taken, runningOnly))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the running pods: %w", err)
	}
	rep := compareShadow(d.Now, taken, fresh, now)
	for name, q := range rep.Queues {
		q.AllocatedGPUMilli = held.FairShare[name].AllocatedGPUMilli
		rep.Queues[name] = q
	}
	return rep, takeover, nil
}

// shadowMode is how a shadow cycle shows the taken pods to the core.
type shadowMode int

const (
	// fromStart: every taken pod pending, as if waiting since created.
	fromStart shadowMode = iota
	// asRunning: as they are; the running ones hold their nodes.
	asRunning
	// runningOnly: as they are, the pending ones left out.
	runningOnly
)

// shadowPod is a taken pod: its queue and where it runs ("" pending).
type shadowPod struct {
	queue string
	node  string
	uid   types.UID
}

// takenPods are the pods a shadow cycle takes, by namespace/name.
func takenPods(d *Dump, o *ShadowOptions) map[string]shadowPod {
	nsQueue := map[string]string{}
	for _, ns := range d.Objects.Namespaces {
		nsQueue[ns.Name] = ns.Labels[LabelQueue]
	}
	out := map[string]shadowPod{}
	for i := range d.Objects.Pods {
		pod := &d.Objects.Pods[i]
		if !o.Shadowed(pod) {
			continue
		}
		q := pod.Labels[LabelQueue]
		if q == "" {
			q = nsQueue[pod.Namespace]
		}
		if q == "" {
			// Without a queue of their own, a namespace's pods share one
			// named after it: fair share between namespaces.
			q = pod.Namespace
		}
		out[pod.Namespace+"/"+pod.Name] = shadowPod{queue: q, node: pod.Spec.NodeName, uid: pod.UID}
	}
	return out
}

// shadowDump is d with the taken pods made Tessera's, in their queue (a
// Queue object made for a queue that has none), as mode says: fromStart
// also unbinds them and frees what they hold (their claims' allocations, the
// node's records of their device-plugin GPUs).
func shadowDump(d *Dump, taken map[string]shadowPod, mode shadowMode) *Dump {
	out := *d
	out.Decisions = nil
	o := d.Objects
	o.Pods = make([]v1.Pod, 0, len(d.Objects.Pods))
	uids := map[types.UID]bool{}
	for i := range d.Objects.Pods {
		pod := d.Objects.Pods[i].DeepCopy()
		if sp, ok := taken[pod.Namespace+"/"+pod.Name]; ok {
			if mode == runningOnly && sp.node == "" {
				continue
			}
			uids[pod.UID] = true
			takePod(pod, sp.queue, mode == fromStart)
		}
		o.Pods = append(o.Pods, *pod)
	}
	if mode == fromStart {
		o.ResourceClaims = freeClaims(d.Objects.ResourceClaims, uids)
		o.ResourceSlices = freeRecords(d.Objects.ResourceSlices, uids)
	}
	o.Queues = withQueues(d.Objects.Queues, taken)
	out.Objects = o
	return &out
}

// takePod makes pod Tessera's, in queue; pending also unbinds it.
func takePod(pod *v1.Pod, queue string, pending bool) {
	pod.Spec.SchedulerName = SchedulerName
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[LabelQueue] = queue
	if pending {
		pod.Spec.NodeName = ""
		// The claims made from templates stay the pod's: their names are
		// in the status.
		pod.Status = v1.PodStatus{Phase: v1.PodPending, ResourceClaimStatuses: pod.Status.ResourceClaimStatuses}
	}
}

// freeClaims drops the taken pods from the claims' reservations, and the
// allocation of a claim that only they used (or that one of them owns).
func freeClaims(claims []resourceapi.ResourceClaim, uids map[types.UID]bool) []resourceapi.ResourceClaim {
	out := make([]resourceapi.ResourceClaim, len(claims))
	for i := range claims {
		c := claims[i].DeepCopy()
		var keep []resourceapi.ResourceClaimConsumerReference
		freed := false
		for _, r := range c.Status.ReservedFor {
			if uids[r.UID] {
				freed = true
				continue
			}
			keep = append(keep, r)
		}
		if ref := metav1.GetControllerOf(c); ref != nil && uids[ref.UID] {
			freed = true
		}
		if freed {
			c.Status.ReservedFor = keep
			if len(keep) == 0 {
				c.Status.Allocation = nil
			}
		}
		out[i] = *c
	}
	return out
}

// freeRecords drops tessera-node's records of the GPUs the taken pods hold
// through the device plugin (the attribute naming the pod and the
// device-plugin taint).
func freeRecords(slices []resourceapi.ResourceSlice, uids map[types.UID]bool) []resourceapi.ResourceSlice {
	out := make([]resourceapi.ResourceSlice, len(slices))
	for i := range slices {
		sl := slices[i].DeepCopy()
		for j := range sl.Spec.Devices {
			dev := &sl.Spec.Devices[j]
			a, ok := dev.Attributes[draname.AttrDevicePluginPod]
			if !ok || a.StringValue == nil || !uids[types.UID(*a.StringValue)] {
				continue
			}
			delete(dev.Attributes, draname.AttrDevicePluginPod)
			var taints []resourceapi.DeviceTaint
			for _, t := range dev.Taints {
				if t.Key != draname.TaintDevicePlugin {
					taints = append(taints, t)
				}
			}
			dev.Taints = taints
		}
		out[i] = *sl
	}
	return out
}

// withQueues adds a top-level Queue, no quota, no limit, weight 1, for
// every queue of the taken pods that has no Queue object.
func withQueues(queues []map[string]any, taken map[string]shadowPod) []map[string]any {
	have := map[string]bool{DefaultQueue: true}
	for _, q := range queues {
		have[(&unstructured.Unstructured{Object: q}).GetName()] = true
	}
	out := append([]map[string]any(nil), queues...)
	var names []string
	for _, sp := range taken {
		if !have[sp.queue] {
			have[sp.queue] = true
			names = append(names, sp.queue)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, map[string]any{
			"apiVersion": schedv1.GroupName + "/v1alpha1", "kind": "Queue",
			"metadata": map[string]any{"name": n}, "spec": map[string]any{},
		})
	}
	return out
}

// compareShadow reads the report from the decisions from the start (fresh)
// and those of a takeover (now).
func compareShadow(at time.Time, taken map[string]shadowPod, fresh, now *Decisions) *ShadowReport {
	rep := &ShadowReport{Time: at, Pods: len(taken), Queues: map[string]ShadowQueue{}}
	bound := map[string]string{}
	for _, b := range fresh.Binds {
		bound[b.Pod] = b.Node
	}
	why := map[string]string{}
	for _, p := range fresh.Pending {
		why[p.Pod] = p.Reason
	}
	names := make([]string, 0, len(taken))
	for name := range taken {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		rep.addPod(name, taken[name], bound, why)
	}
	for name, fs := range fresh.FairShare {
		rep.Queues[name] = ShadowQueue{FairShareGPUMilli: fs.GPUMilli, FairShareCPUMilli: fs.CPUMilli,
			FairShareMemory: fs.MemoryBytes, WouldAllocateGPUMilli: fs.AllocatedGPUMilli}
	}
	rep.Takeover = ShadowTakeover{Evictions: now.Evictions, Binds: now.Binds}
	return rep
}

// addPod counts one taken pod: where it runs against where Tessera puts it.
func (rep *ShadowReport) addPod(name string, sp shadowPod, bound, why map[string]string) {
	node, placed := bound[name]
	reason := why[name]
	if reason == "" {
		reason = "not decided on"
	}
	if placed {
		rep.WouldPlace++
	}
	switch {
	case sp.node != "" && placed && node == sp.node:
		rep.Running++
		rep.Agree++
	case sp.node != "" && placed:
		rep.Running++
		rep.Moved = append(rep.Moved, ShadowMove{Pod: name, Queue: sp.queue, Actual: sp.node, Tessera: node})
	case sp.node != "":
		rep.Running++
		rep.LeftPending = append(rep.LeftPending, ShadowPending{Pod: name, Queue: sp.queue, Actual: sp.node, Reason: reason})
	case placed:
		rep.Pending++
		rep.WouldStart = append(rep.WouldStart, ShadowMove{Pod: name, Queue: sp.queue, Tessera: node})
	default:
		rep.Pending++
		rep.StillPending = append(rep.StillPending, ShadowPending{Pod: name, Queue: sp.queue, Reason: reason})
	}
}

// observeShadow sets the shadow gauges from a report; queues gone since the
// last report lose their series.
func (m *Metrics) observeShadow(rep *ShadowReport) {
	for outcome, n := range map[string]int{
		"taken": rep.Pods, "running": rep.Running, "pending": rep.Pending, "would_place": rep.WouldPlace,
		"agree": rep.Agree, "moved": len(rep.Moved), "left_pending": len(rep.LeftPending),
		"would_start": len(rep.WouldStart), "still_pending": len(rep.StillPending),
	} {
		m.shadowPods.WithLabelValues(outcome).Set(float64(n))
	}
	byAction := map[string]int{}
	for _, a := range []core.Action{core.ActionReclaim, core.ActionPreempt, core.ActionConsolidate} {
		byAction[string(a)] = 0
	}
	for _, e := range rep.Takeover.Evictions {
		byAction[string(e.Action)]++
	}
	for a, n := range byAction {
		m.shadowEvictions.WithLabelValues(a).Set(float64(n))
	}
	m.shadowQueueGPUs.Reset()
	for name, q := range rep.Queues {
		m.shadowQueueGPUs.WithLabelValues(name, "fair_share").Set(float64(q.FairShareGPUMilli) / 1000)
		m.shadowQueueGPUs.WithLabelValues(name, "would_allocate").Set(float64(q.WouldAllocateGPUMilli) / 1000)
		m.shadowQueueGPUs.WithLabelValues(name, "allocated").Set(float64(q.AllocatedGPUMilli) / 1000)
	}
}
