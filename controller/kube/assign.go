package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// The device-plugin path: a pod that asks for GPUs through extended
// resources (whole GPUs as nvidia.com/gpu, a share as the fraction
// annotations plus one tessera.dev/gpu-share slot) is placed by the core like
// a pod with claims; the commit writes the core's choice into the pod's
// tessera.dev/gpu-assignment annotation before binding it, and tessera-node's
// device plugin reads it in Allocate. A placed pod's annotation says where it
// is, as an allocated claim does for a DRA pod.

// assignmentPlacement reads where a pod's assignment puts it on node. GPUs
// the node's slices no longer list are left out (as allocatedPlacement
// does for claims).
func assignmentPlacement(node string, a assignment.Assignment, gpus *nodeGPUs) core.Placement {
	pl := core.Placement{Node: node}
	if gpus == nil {
		return pl
	}
	for _, idx := range a.GPUs {
		pos, ok := gpus.byDevice[draname.DeviceName(idx)]
		if !ok {
			continue
		}
		g := gpus.gpus[pos]
		pl.GPUs = append(pl.GPUs, g.Index)
		if a.IsShare() {
			pl.GPUMemory = append(pl.GPUMemory, min(a.MemoryBytes, g.Memory))
			pl.GPUMilli = append(pl.GPUMilli, a.ComputeMilli)
			pl.Sharing = core.SharingMPS
			if a.Sharing == assignment.SharingTimeSlicing {
				pl.Sharing = core.SharingTimeSlice
			}
			continue
		}
		pl.GPUMemory = append(pl.GPUMemory, g.Memory)
		pl.GPUMilli = append(pl.GPUMilli, 1000)
	}
	return pl
}

// malformedPlacement is where a bound pod with a malformed assignment is
// counted, conservatively, since the device plugin may have given it any of
// them in any mode: the GPUs the annotation names, when it is JSON with GPU
// indices, each held whole; every GPU of the node when it is not.
func malformedPlacement(node, value string, gpus *nodeGPUs) core.Placement {
	var a assignment.Assignment
	whole := assignment.Assignment{}
	if json.Unmarshal([]byte(value), &a) == nil && len(a.GPUs) > 0 {
		for _, g := range a.GPUs {
			if g >= 0 && !slices.Contains(whole.GPUs, g) {
				whole.GPUs = append(whole.GPUs, g)
			}
		}
		slices.Sort(whole.GPUs)
	} else if gpus != nil {
		for _, g := range gpus.gpus {
			whole.GPUs = append(whole.GPUs, g.Index)
		}
	}
	return assignmentPlacement(node, whole, gpus)
}

// mergePlacements adds b's GPUs to a's (a pod with both claims and an
// assignment), keeping indices ascending.
func mergePlacements(a, b core.Placement) core.Placement {
	if len(b.GPUs) == 0 {
		return a
	}
	if len(a.GPUs) == 0 {
		return b
	}
	type entry struct {
		gpu       int
		milli, mm int64
	}
	var es []entry
	for _, p := range []core.Placement{a, b} {
		for i, g := range p.GPUs {
			es = append(es, entry{g, p.GPUMilli[i], p.GPUMemory[i]})
		}
	}
	slices.SortFunc(es, func(x, y entry) int { return x.gpu - y.gpu })
	out := core.Placement{Node: a.Node, Sharing: a.Sharing}
	if out.Sharing == "" {
		out.Sharing = b.Sharing
	}
	for _, e := range es {
		out.GPUs = append(out.GPUs, e.gpu)
		out.GPUMilli = append(out.GPUMilli, e.milli)
		out.GPUMemory = append(out.GPUMemory, e.mm)
	}
	return out
}

// placementAssignment is the assignment of the core's placement of a
// device-plugin pod: GPU indices, their UUIDs from the node's slice, and for
// a share its memory, compute (at most 999: a memory request as large as the
// GPU still shares it) and sharing mode.
func placementAssignment(pl core.Placement, req core.Request, gpus *nodeGPUs) (assignment.Assignment, error) {
	a := assignment.Assignment{GPUs: slices.Clone(pl.GPUs)}
	slices.Sort(a.GPUs)
	if gpus != nil {
		for _, g := range a.GPUs {
			d := gpus.devices[g]
			if d == nil {
				a.UUIDs = nil
				break
			}
			u, ok := d.Attributes[draname.AttrUUID]
			if !ok || u.StringValue == nil {
				a.UUIDs = nil
				break
			}
			a.UUIDs = append(a.UUIDs, *u.StringValue)
		}
	}
	if req.IsFraction() {
		if len(pl.GPUs) != 1 || len(pl.GPUMilli) != 1 || len(pl.GPUMemory) != 1 {
			return a, fmt.Errorf("a share placed on %d GPUs", len(pl.GPUs))
		}
		a.MemoryBytes = pl.GPUMemory[0]
		a.ComputeMilli = min(max(pl.GPUMilli[0], 1), 999)
		a.Sharing = assignment.SharingMPS
		if pl.Sharing == core.SharingTimeSlice || (pl.Sharing == "" && req.Sharing == core.SharingTimeSlice) {
			a.Sharing = assignment.SharingTimeSlicing
		}
	}
	return a, a.Validate()
}

// writeAssignment records a device-plugin pod's assignment in its
// annotation before it is bound (a merge patch with the pod's UID as a
// precondition, so a recreated pod of the same name is never annotated).
// A pod that already carries an assignment (a bind that failed after the
// patch, then a new decision) gets the new one: the annotation is only
// read once the pod is bound, and the bind that follows is the one that
// counts. An error means: do not bind.
func (s *Scheduler) writeAssignment(ctx context.Context, pod *v1.Pod, a assignment.Assignment) error {
	if pod.Annotations[AnnotationAssignment] == a.String() {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]string{AnnotationAssignment: a.String()},
	}})
	if err != nil {
		return err
	}
	return retryOnError(retry.DefaultBackoff, func(err error) bool { return retriable(err) && !apierrors.IsConflict(err) }, func() error {
		_, err := s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// warnMalformed reports, once per pod and annotation value, that a bound
// pod's assignment cannot be read and how it is counted.
func (s *Scheduler) warnMalformed(logger klog.Logger, pod *v1.Pod, value string, err error) {
	if !s.warnOnce(pod.UID, "malformed", value) {
		return
	}
	logger.Error(err, "Malformed GPU assignment on a bound pod; counting it as holding the GPUs it names (every GPU of its node when none can be read) whole", "pod", klog.KObj(pod), "node", pod.Spec.NodeName)
	s.recorder.Eventf(pod, v1.EventTypeWarning, "MalformedAssignment", "%v; Tessera counts the pod as holding the GPUs it names (every GPU of node %s when none can be read) whole", err, pod.Spec.NodeName)
}

// warnOnce says whether a warning of this kind and subject is new for the
// pod: s.malformed remembers the last one given per pod, so a pod's
// unchanged state is reported once, not every cycle.
func (s *Scheduler) warnOnce(uid types.UID, kind, subject string) bool {
	key := kind + "\x00" + subject
	if s.malformed[uid] == key {
		return false
	}
	s.malformed[uid] = key
	return true
}

// Why an assignment annotation is not trusted (label of
// tessera_assignments_ignored_total).
const (
	// ignoredNoRequest: the pod asks for no GPUs through the device plugin.
	ignoredNoRequest = "no_request"
	// ignoredMismatch: the pod asks for other device-plugin resources than
	// the assignment gives (a share on a whole-GPU pod, another count).
	ignoredMismatch = "mismatch"
)

// podAssignment is a bound pod's tessera.dev/gpu-assignment annotation as
// the controller reads it.
type podAssignment struct {
	value string
	a     assignment.Assignment
	// err: malformed, on a pod that asks for device-plugin GPUs.
	err error
	// ignored is why it is not trusted (ignoredNoRequest, ignoredMismatch),
	// "" when it is; why says it in words.
	ignored, why string
}

// readAssignment reads a pod's assignment annotation (nil when it has
// none) and decides whether to trust it: only on a pod that asks for what
// it assigns. Whole GPUs: the pod asks for as many of gpuResource as it
// names (other: the pod's requests as the kubelet counts them,
// podResources). A share: the pod asks for the share slot and carries a
// fraction annotation. Anyone who may write a pod could have written the
// annotation (the chart's tessera-gpu-assignment policy lets only the
// controller write it; this rule holds without the policy too), and the
// device plugin gives a pod nothing through an assignment for resources
// it does not ask for: so a CPU-only pod with the annotation holds no GPU.
func readAssignment(pod *v1.Pod, other map[string]int64, gpuResource string) *podAssignment {
	v, ok := pod.Annotations[AnnotationAssignment]
	if !ok {
		return nil
	}
	pa := &podAssignment{value: v}
	whole := other[gpuResource]
	_, hasFrac := pod.Annotations[AnnotationGPUFraction]
	_, hasMem := pod.Annotations[AnnotationGPUMemory]
	share := other[ResourceShare] > 0 && (hasFrac || hasMem)
	if whole == 0 && !share {
		pa.ignored, pa.why = ignoredNoRequest, fmt.Sprintf("the pod asks for no GPUs through the device plugin (no %s, no %s with %s or %s)",
			gpuResource, ResourceShare, AnnotationGPUFraction, AnnotationGPUMemory)
		return pa
	}
	pa.a, pa.err = assignment.Parse(v)
	switch {
	case pa.err != nil:
	case pa.a.IsShare() && !share:
		pa.ignored, pa.why = ignoredMismatch, fmt.Sprintf("it assigns a share of GPU %d, but the pod asks for %d %s and no share", pa.a.GPUs[0], whole, gpuResource)
	case !pa.a.IsShare() && int64(len(pa.a.GPUs)) != whole:
		pa.ignored, pa.why = ignoredMismatch, fmt.Sprintf("it assigns %d whole GPUs, but the pod asks for %d %s", len(pa.a.GPUs), whole, gpuResource)
	}
	return pa
}

// recordOf lists (ascending) the GPUs the node's slice records as held
// whole by the pod with uid (draname.AttrDevicePluginPod): what the kubelet really
// gave it.
func (g *nodeGPUs) recordOf(uid types.UID) []int {
	if g == nil {
		return nil
	}
	var out []int
	for _, gp := range g.gpus {
		if g.dpPod[draname.DeviceName(gp.Index)] == uid {
			out = append(out, gp.Index)
		}
	}
	return out
}

// devicePluginPlacement is what a bound pod holds through the device
// plugin, ok false when nothing. The node's record (recordOf) is the truth
// for whole GPUs: the kubelet may give other GPUs than the assignment
// (GetPreferredAllocation is only a preference), and counting the
// assignment and the node's marks apart counted such a pod twice. While the
// kubelet has allocated only some of the pod's containers, the rest is
// taken from the assignment (never a GPU the node records for another pod),
// so the pod counts as many GPUs as it asks for. A pod without a record
// holds its trusted assignment; a malformed one counts conservatively
// (malformedPlacement); an untrusted one is ignored and reported.
func (s *Scheduler) devicePluginPlacement(logger klog.Logger, pod *v1.Pod, other map[string]int64, node string, gpus *nodeGPUs) (core.Placement, bool) {
	rec := gpus.recordOf(pod.UID)
	pa := readAssignment(pod, other, s.opts.GPUResource)
	if pa != nil && pa.ignored != "" {
		s.warnIgnored(logger, pod, pa)
		pa = nil
	}
	trusted := pa != nil && pa.err == nil
	if len(rec) == 0 {
		switch {
		case pa == nil:
			return core.Placement{}, false
		case pa.err != nil:
			s.warnMalformed(logger, pod, pa.value, pa.err)
			return malformedPlacement(node, pa.value, gpus), true
		}
		return assignmentPlacement(node, pa.a, gpus), true
	}
	held := rec
	if trusted && !pa.a.IsShare() {
		want := int(other[s.opts.GPUResource])
		held = topUp(rec, pa.a.GPUs, want, gpus, pod.UID)
		if len(rec) >= want && !slices.Equal(rec, pa.a.GPUs) {
			s.reportDisagreement(logger, pod, node, pa.a.GPUs, rec)
		}
	}
	pl := assignmentPlacement(node, assignment.Assignment{GPUs: held}, gpus)
	if trusted && pa.a.IsShare() {
		pl = mergePlacements(pl, assignmentPlacement(node, pa.a, gpus))
	}
	return pl, true
}

// boundDevicePluginPlacement is devicePluginPlacement for a bound pod of
// the snapshot, with its requests from its cached translation.
func (s *Scheduler) boundDevicePluginPlacement(logger klog.Logger, pod *v1.Pod, e *podEntry, node string, gpus *nodeGPUs) (core.Placement, bool) {
	if pod.Spec.NodeName == "" {
		return core.Placement{}, false // adopted: bound by the commit, held by its claims
	}
	other := e.req.Other
	if other == nil {
		// Its claims could not be read; an amount out of range is counted
		// at the maximum (podResources), which is what a bound pod needs.
		_, _, other, _ = podResources(pod)
	}
	return s.devicePluginPlacement(logger, pod, other, node, gpus)
}

// topUp adds to the recorded GPUs rec the assigned GPUs not recorded yet,
// up to want in all, leaving out GPUs the node records for another pod.
func topUp(rec, assigned []int, want int, gpus *nodeGPUs, uid types.UID) []int {
	out := slices.Clone(rec)
	for _, g := range assigned {
		if len(out) >= want {
			break
		}
		if slices.Contains(out, g) {
			continue
		}
		if holder := gpus.dpPod[draname.DeviceName(g)]; holder != "" && holder != uid {
			continue
		}
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// warnIgnored reports, once per pod and annotation value, an assignment
// the controller does not trust: log, metric, event.
func (s *Scheduler) warnIgnored(logger klog.Logger, pod *v1.Pod, pa *podAssignment) {
	if !s.warnOnce(pod.UID, "ignored", pa.value) {
		return
	}
	logger.Info("Ignoring the GPU assignment of a pod that does not ask for what it assigns", "pod", klog.KObj(pod), "node", pod.Spec.NodeName,
		"annotation", AnnotationAssignment, "reason", pa.ignored, "why", pa.why)
	s.opts.Metrics.assignmentIgnored(pa.ignored)
	s.recorder.Eventf(pod, v1.EventTypeWarning, "AssignmentIgnored", "annotation %s ignored: %s; Tessera counts no GPU for it", AnnotationAssignment, pa.why)
}

// reportDisagreement reports, once per pod and record, that the node
// records other GPUs for a pod than its assignment: the kubelet chose
// others. The controller counts the node's.
func (s *Scheduler) reportDisagreement(logger klog.Logger, pod *v1.Pod, node string, assigned, recorded []int) {
	if !s.warnOnce(pod.UID, "disagree", fmt.Sprint(recorded)) {
		return
	}
	logger.Info("The node gave a device-plugin pod other GPUs than its assignment; counting the node's", "pod", klog.KObj(pod), "node", node,
		"assigned", assigned, "recorded", recorded)
	s.opts.Metrics.nodeDisagreed()
}
