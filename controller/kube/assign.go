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
		pos, ok := gpus.byDevice[deviceName(idx)]
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
			u, ok := d.Attributes[attrUUID]
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
func (s *Scheduler) warnMalformed(pod *v1.Pod, value string, err error) {
	if v, ok := s.malformed[pod.UID]; ok && v == value {
		return
	}
	s.malformed[pod.UID] = value
	klog.ErrorS(err, "Malformed GPU assignment on a bound pod; counting it as holding the GPUs it names (every GPU of its node when none can be read) whole", "pod", klog.KObj(pod), "node", pod.Spec.NodeName)
	s.recorder.Eventf(pod, v1.EventTypeWarning, "MalformedAssignment", "%v; Tessera counts the pod as holding the GPUs it names (every GPU of node %s when none can be read) whole", err, pod.Spec.NodeName)
}
