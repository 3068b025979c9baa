package kube

import (
	"context"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Condition reasons Tessera writes on upstream PodGroups beside the API's
// own (schedulingv1beta1.PodGroupReason*).
const (
	// upstreamReasonScheduled is kube-scheduler's reason for
	// PodGroupInitiallyScheduled=True.
	upstreamReasonScheduled = "Scheduled"
	// upstreamReasonRescheduled sets DisruptionTarget back to False once the
	// group runs again after a disruption.
	upstreamReasonRescheduled = "Rescheduled"
)

// upstreamConditions are the conditions an upstream PodGroup should carry
// after a cycle, as kube-scheduler writes them:
//   - PodGroupInitiallyScheduled: False (Unschedulable, the pods' reason)
//     until minMember of its pods are bound, then True (Scheduled), for good
//     (the API says it never reverts);
//   - DisruptionTarget: True (PreemptionByScheduler, the eviction's reason)
//     when this cycle evicted every bound pod of the group; False
//     (Rescheduled) once it runs again with minMember bound.
//
// bound counts its pods bound at the cycle's start (the next cycle sees this
// one's binds: a commit that fails never reads as scheduled), evicted those
// this cycle evicted, with why.
func upstreamConditions(pg *schedulingv1beta1.PodGroup, minMember, bound, evicted int, evictedWhy, pendingWhy string) ([]metav1.Condition, bool) {
	conds := append([]metav1.Condition(nil), pg.Status.Conditions...)
	changed := false
	set := func(c metav1.Condition) {
		c.ObservedGeneration = pg.Generation
		changed = meta.SetStatusCondition(&conds, c) || changed
	}
	initially := meta.FindStatusCondition(conds, schedulingv1beta1.PodGroupInitiallyScheduled)
	switch {
	case initially != nil && initially.Status == metav1.ConditionTrue:
		// terminal
	case bound >= minMember:
		set(metav1.Condition{Type: schedulingv1beta1.PodGroupInitiallyScheduled, Status: metav1.ConditionTrue,
			Reason: upstreamReasonScheduled, Message: "tessera-scheduler placed at least minCount pods together"})
	case pendingWhy != "":
		set(metav1.Condition{Type: schedulingv1beta1.PodGroupInitiallyScheduled, Status: metav1.ConditionFalse,
			Reason: schedulingv1beta1.PodGroupReasonUnschedulable, Message: pendingWhy})
	}
	disrupted := meta.FindStatusCondition(conds, schedulingv1beta1.DisruptionTarget)
	switch {
	case bound > 0 && evicted >= bound:
		set(metav1.Condition{Type: schedulingv1beta1.DisruptionTarget, Status: metav1.ConditionTrue,
			Reason: schedulingv1beta1.PodGroupReasonPreemptionByScheduler, Message: evictedWhy})
	case evicted == 0 && bound >= minMember && disrupted != nil && disrupted.Status == metav1.ConditionTrue:
		set(metav1.Condition{Type: schedulingv1beta1.DisruptionTarget, Status: metav1.ConditionFalse,
			Reason: upstreamReasonRescheduled, Message: "the group runs again"})
	}
	return conds, changed
}

// reportUpstreamGroups writes the conditions of the upstream PodGroups of
// this cycle's jobs; an unchanged status costs no API call. A conflict (the
// lister lags our last write) is left to the next cycle.
func (s *Scheduler) reportUpstreamGroups(ctx context.Context, res *core.Result, idx *cycleIndex, reasons map[string]string, evictedOK map[string]bool) {
	logger := klog.FromContext(ctx)
	evictedWhy := map[string]string{}
	for _, ev := range res.Evictions {
		if evictedOK[ev.Pod] {
			evictedWhy[ev.Pod] = ev.Reason
		}
	}
	for job, ref := range idx.jobs {
		pg := ref.upstream
		if pg == nil {
			continue
		}
		g, err := readUpstreamGroup(pg)
		if err != nil {
			continue // its pods wait with the error
		}
		bound, evicted, why, pending := 0, 0, "", ""
		for _, key := range ref.pods {
			p := idx.pods[key]
			if p == nil {
				continue
			}
			// A pod evicted last cycle stays bound while it terminates: it
			// does not make the group run again.
			if p.pod.Spec.NodeName != "" && p.pod.DeletionTimestamp == nil {
				bound++
			}
			if w, ok := evictedWhy[key]; ok {
				evicted++
				why = w
			}
			if r, ok := reasons[key]; ok && pending == "" {
				pending = r
			}
		}
		conds, changed := upstreamConditions(pg, g.minMember, bound, evicted, why, pending)
		if !changed {
			continue
		}
		upd := pg.DeepCopy()
		upd.Status.Conditions = conds
		if _, err := s.client.SchedulingV1beta1().PodGroups(pg.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				logger.Error(err, "Writing PodGroup status", "podGroup", klog.KObj(pg), "job", job)
			}
			continue
		}
	}
}
