package kube

import (
	"context"
	"encoding/json"
	"reflect"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// report tells people what the cycle decided: PodScheduled=False with the
// reason on every waiting pod (and an event when the reason changes), Queue
// status and PodGroup status. Unchanged facts cost no API call.
func (s *Scheduler) report(ctx context.Context, res *core.Result, idx *cycleIndex, st *commitStats, usage map[string]core.Resources) {
	now := time.Now()
	for name, js := range res.Jobs {
		if js.BelowMinMember {
			if _, ok := s.belowSince[name]; !ok {
				s.belowSince[name] = now
			}
		} else {
			delete(s.belowSince, name)
		}
	}

	reasons := map[string]string{}
	for _, p := range idx.problems {
		reasons[p.Pod] = p.Reason
	}
	for _, p := range res.Pending {
		reasons[p.Pod] = p.Reason
	}
	for pod, why := range st.failed {
		reasons[pod] = why
	}
	for pod, why := range st.waiting {
		reasons[pod] = why
	}
	type update struct {
		pod    *v1.Pod
		reason string
	}
	var updates []update
	for key, reason := range reasons {
		ref := idx.pods[key]
		if ref == nil || s.pending[key] == reason {
			continue
		}
		updates = append(updates, update{ref.pod, reason})
	}
	for key := range s.pending {
		if _, ok := reasons[key]; !ok {
			delete(s.pending, key)
		}
	}
	var mu sync.Mutex
	s.parallel(len(updates), func(i int) {
		u := updates[i]
		if err := s.setUnschedulable(ctx, u.pod, u.reason); err != nil {
			if !apierrors.IsNotFound(err) {
				klog.FromContext(ctx).Error(err, "Writing PodScheduled condition", "pod", klog.KObj(u.pod))
			}
			return
		}
		s.recorder.Event(u.pod, v1.EventTypeWarning, "FailedScheduling", u.reason)
		mu.Lock()
		s.pending[u.pod.Namespace+"/"+u.pod.Name] = u.reason
		mu.Unlock()
	})

	s.reportQueues(ctx, res, idx, usage)
	s.reportPodGroups(ctx, res, idx, reasons)
	s.reportUpstreamGroups(ctx, res, idx, reasons, st.evictedOK)
}

func (s *Scheduler) setUnschedulable(ctx context.Context, pod *v1.Pod, reason string) error {
	patch, err := json.Marshal(map[string]any{
		"status": map[string]any{
			"conditions": []v1.PodCondition{{
				Type:               v1.PodScheduled,
				Status:             v1.ConditionFalse,
				Reason:             v1.PodReasonUnschedulable,
				Message:            reason,
				LastTransitionTime: metav1.Now(),
			}},
		},
	})
	if err != nil {
		return err
	}
	_, err = s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func toQuantity(r core.Resource, v int64) resource.Quantity {
	if r == core.ResMemory {
		return *resource.NewQuantity(v, resource.BinarySI)
	}
	return *resource.NewMilliQuantity(v, resource.DecimalSI)
}

// reportQueues writes each Queue's status; usage, when there is a usage
// history, is each queue's decayed usage (usageOf).
// usageAmount converts a decayed usage to the unit Queue status and
// metrics show: milli-GPU- and milli-CPU-seconds as they are (toQuantity
// reads them as milli), memory from MiB-seconds to byte-seconds.
func usageAmount(r core.Resource, v int64) int64 {
	if r == core.ResMemory {
		return min(v, 1<<42) << 20
	}
	return v
}

func (s *Scheduler) reportQueues(ctx context.Context, res *core.Result, idx *cycleIndex, usage map[string]core.Resources) {
	running, pending := map[string]int32{}, map[string]int32{}
	parent := map[string]string{}
	for name, q := range idx.queues {
		parent[name] = q.Spec.Parent
	}
	count := func(m map[string]int32, queue string) {
		for q, hops := queue, 0; q != "" && hops < 64; q, hops = parent[q], hops+1 {
			m[q]++
		}
	}
	jobQueue := map[string]string{}
	for _, p := range idx.pods {
		if p.job == "" || p.pod == nil {
			continue
		}
		q := p.pod.Labels[LabelQueue]
		if ref := idx.jobs[p.job]; ref != nil && ref.group != nil && ref.group.Spec.Queue != "" {
			q = ref.group.Spec.Queue
		}
		if q == "" {
			q = DefaultQueue
		}
		jobQueue[p.job] = q
		if p.pod.Spec.NodeName != "" {
			count(running, q)
		}
	}
	for _, p := range res.Pending {
		if q, ok := jobQueue[p.Job]; ok {
			count(pending, q)
		}
	}
	for name, obj := range idx.queues {
		qs, ok := res.Queues[name]
		if !ok {
			continue
		}
		status := schedv1.QueueStatus{Resources: map[string]schedv1.QueueResourceStatus{}, RunningPods: running[name], PendingPods: pending[name]}
		for r := core.Resource(0); r < core.NumResources; r++ {
			rs := schedv1.QueueResourceStatus{
				FairShare: toQuantity(r, qs.FairShare[r]),
				Allocated: toQuantity(r, qs.Allocated[r]),
				Pending:   toQuantity(r, qs.Pending[r]),
			}
			if usage != nil {
				q := toQuantity(r, usageAmount(r, usage[name][r]))
				rs.Usage = &q
			}
			status.Resources[r.String()] = rs
		}
		if prev, ok := s.queueStatus[name]; ok && reflect.DeepEqual(prev, status) {
			continue
		}
		q := obj.DeepCopy()
		q.Status = status
		if err := s.writeStatus(ctx, QueueGVR, "", q); err != nil {
			klog.FromContext(ctx).Error(err, "Writing Queue status", "queue", name)
			continue
		}
		s.queueStatus[name] = status
	}
}

func (s *Scheduler) reportPodGroups(ctx context.Context, res *core.Result, idx *cycleIndex, reasons map[string]string) {
	for job, ref := range idx.jobs {
		if ref.group == nil {
			continue
		}
		pg := ref.group
		js := res.Jobs[job]
		status := schedv1.PodGroupStatus{Scheduled: int32(js.Placed), Conditions: pg.Status.Conditions}
		runningIn := map[string]int32{}
		for _, key := range ref.pods {
			if p := idx.pods[key]; p != nil && p.pod.Status.Phase == v1.PodRunning {
				status.Running++
				runningIn[p.pod.Annotations[AnnotationPodSubGroup]]++
			}
		}
		cond := metav1.Condition{Type: schedv1.PodGroupConditionScheduled, ObservedGeneration: pg.Generation}
		status.Phase = groupPhase(pg.Spec, js, status.Running, runningIn)
		if status.Phase == schedv1.PodGroupPending {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Unschedulable", "waiting to be scheduled"
			for _, key := range ref.pods {
				if why, ok := reasons[key]; ok {
					cond.Message = why
					break
				}
			}
		} else {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Scheduled", "at least minMember pods are placed, and each subgroup's minMember"
		}
		conds := append([]metav1.Condition(nil), pg.Status.Conditions...)
		meta.SetStatusCondition(&conds, cond)
		status.Conditions = conds
		key := pg.Namespace + "/" + pg.Name
		if prev, ok := s.groupStatus[key]; ok && podGroupStatusEqual(prev, status) {
			continue
		}
		if podGroupStatusEqual(pg.Status, status) {
			s.groupStatus[key] = status
			continue
		}
		upd := pg.DeepCopy()
		upd.Status = status
		if err := s.writeStatus(ctx, PodGroupGVR, pg.Namespace, upd); err != nil {
			klog.FromContext(ctx).Error(err, "Writing PodGroup status", "podGroup", key)
			continue
		}
		if status.Phase == schedv1.PodGroupPending {
			s.recorder.Event(upd, v1.EventTypeWarning, "Unschedulable", cond.Message)
		}
		s.groupStatus[key] = status
	}
}

// groupPhase is a PodGroup's phase: Running when minMember of its pods run
// and so do each subgroup's minMember (runningIn counts running pods by the
// subgroup they name); Scheduled when the core placed as many (its
// BelowMinMember counts subgroups too); Pending otherwise. A gang whose
// total is met but one subgroup is not (its leader gone) does not hold.
func groupPhase(spec schedv1.PodGroupSpec, js core.JobStatus, running int32, runningIn map[string]int32) schedv1.PodGroupPhase {
	subsRun := true
	for _, sg := range spec.SubGroups {
		subsRun = subsRun && runningIn[sg.Name] >= sg.MinMember
	}
	switch {
	case running >= spec.MinMember && subsRun:
		return schedv1.PodGroupRunning
	case int32(js.Placed) >= spec.MinMember && !js.BelowMinMember:
		return schedv1.PodGroupScheduled
	}
	return schedv1.PodGroupPending
}

// podGroupStatusEqual compares statuses ignoring condition timestamps.
func podGroupStatusEqual(a, b schedv1.PodGroupStatus) bool {
	strip := func(s schedv1.PodGroupStatus) schedv1.PodGroupStatus {
		s.Conditions = append([]metav1.Condition(nil), s.Conditions...)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// writeStatus writes obj's status through the dynamic client.
func (s *Scheduler) writeStatus(ctx context.Context, gvr schemaGVR, namespace string, obj runtime.Object) error {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetAPIVersion(schedv1.SchemeGroupVersion.String())
	switch obj.(type) {
	case *schedv1.Queue:
		u.SetKind("Queue")
	case *schedv1.PodGroup:
		u.SetKind("PodGroup")
	}
	var ri dynamicResource = s.dyn.Resource(gvr)
	if namespace != "" {
		ri = s.dyn.Resource(gvr).Namespace(namespace)
	}
	_, err = ri.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}
