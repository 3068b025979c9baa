package kube

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// A job's commit: its allocations planned in decision order (planJobs), then
// written all-or-nothing (writeJob): volumes, claims, device-plugin
// assignments, bindings; a failure rolls the job back.

// podPlan is what the commit writes for one pod.
type podPlan struct {
	ref    *podRef
	node   string
	allocs map[string]*resourceapi.AllocationResult // by claim name
	// assign is a device-plugin pod's assignment, written before
	// its bind.
	assign *assignment.Assignment
}

// planJobs works out the allocations of every job's pods, in decision
// order, so each sees the devices the previous ones took. A job that waits
// for a GPU being released, or that cannot be placed whole, has no plan.
func (s *Scheduler) planJobs(ctx context.Context, st *commitStats, idx *cycleIndex, byJob map[string][]core.Bind, jobOrder []string) [][]podPlan {
	state := idx.allocatedState(s)
	plans := make([][]podPlan, len(jobOrder))
	for j, job := range jobOrder {
		if why := releasingGPU(idx, byJob[job]); why != "" {
			// The whole job waits a cycle or two; nothing was written.
			for _, b := range byJob[job] {
				st.waiting[b.Pod] = why
			}
			continue
		}
		plans[j] = s.planJob(ctx, st, idx, byJob[job], state)
	}
	return plans
}

// planJob allocates one job's pods, all or none: a pod that cannot be placed
// undoes the job's allocations in state and fails every pod of the job.
func (s *Scheduler) planJob(ctx context.Context, st *commitStats, idx *cycleIndex, binds []core.Bind, state *structured.AllocatedState) []podPlan {
	var jp []podPlan
	var undo []func()
	ok := true
	for _, b := range binds {
		ref := idx.pods[b.Pod]
		allocs, err := s.allocate(ctx, ref, idx, b.Placement, state, &undo)
		if err != nil {
			st.failed[b.Pod] = err.Error()
			ok = false
			break
		}
		plan := podPlan{ref: ref, node: b.Placement.Node, allocs: allocs}
		if ref.dp {
			a, err := placementAssignment(b.Placement, ref.req, idx.gpus[b.Placement.Node])
			if err != nil {
				st.failed[b.Pod] = fmt.Sprintf("assignment of GPUs %v on %s: %v", b.Placement.GPUs, b.Placement.Node, err)
				ok = false
				break
			}
			plan.assign = &a
		}
		jp = append(jp, plan)
	}
	if !ok {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		for _, b := range binds {
			if _, failed := st.failed[b.Pod]; !failed {
				st.failed[b.Pod] = "another pod of its gang could not be placed"
			}
		}
		return nil
	}
	return jp
}

// writeJob writes one job's plan: volumes to provision are sent to the
// chosen node first (as kube-scheduler's VolumeBinding does before
// DynamicResources), then the claims of every pod, the device-plugin
// assignments, and the bindings. A failure rolls the job back, unless the
// commit was fenced.
func (s *Scheduler) writeJob(ctx context.Context, st *commitStats, idx *cycleIndex, job string, jp []podPlan, volumes *volumeReservations) {
	written, failure := s.writeClaims(ctx, st, idx, job, jp, volumes)
	if failure == nil {
		failure = s.writeAssignments(ctx, st, jp)
	}
	if failure == nil {
		s.hook(HookAfterClaims)
		var adopted int
		if adopted, failure = s.bindJob(ctx, st, jp); failure == nil {
			s.jobBound(st, jp, adopted, written)
			return
		}
	}
	if errors.Is(failure, ErrFenced) {
		// No rollback either: those are writes too. What was written
		// is what a crash at this point leaves; the next leader adopts
		// pods whose claims are allocated (read_pods.go) and the
		// stale-gang rule ends a gang left below its minimum.
		return
	}
	s.rollBackJob(ctx, st, job, jp, written, failure)
}

// writeClaims sends each pod's volumes to its node, then writes every claim
// of the job (allocation, finalizer, reservation). It returns the claims it
// wrote, for a rollback.
func (s *Scheduler) writeClaims(ctx context.Context, st *commitStats, idx *cycleIndex, job string, jp []podPlan, volumes *volumeReservations) ([]writtenClaim, error) {
	for _, p := range jp {
		if err := s.fence(ctx, st, "writing job "+job); err != nil {
			return nil, err
		}
		if err := s.selectNode(ctx, p.ref.pod, idx.nodes[p.node], volumes); err != nil {
			return nil, err
		}
	}
	var written []writtenClaim
	for _, p := range jp {
		for _, c := range p.ref.claims {
			if err := s.fence(ctx, st, "writing claim "+c.Namespace+"/"+c.Name); err != nil {
				return written, err
			}
			a, ok := p.allocs[c.Name]
			c2, added, err := s.reserveClaim(ctx, c, a, ok, p.ref.pod)
			if err != nil {
				return written, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
			}
			if ok || added {
				written = append(written, writtenClaim{claim: c2, fresh: ok})
			}
		}
	}
	return written, nil
}

// writeAssignments writes the assignment annotation of the job's
// device-plugin pods, which the node's device plugin reads in Allocate,
// before any bind of the job; a failed write binds none of them.
func (s *Scheduler) writeAssignments(ctx context.Context, st *commitStats, jp []podPlan) error {
	for _, p := range jp {
		if p.assign == nil {
			continue
		}
		if err := s.fence(ctx, st, "writing the GPU assignment of pod "+p.ref.pod.Namespace+"/"+p.ref.pod.Name); err != nil {
			return err
		}
		if err := s.writeAssignment(ctx, p.ref.pod, *p.assign); err != nil {
			return fmt.Errorf("writing the GPU assignment of pod %s/%s: %w", p.ref.pod.Namespace, p.ref.pod.Name, err)
		}
	}
	return nil
}

// bindJob binds the job's pods, counting those found bound already
// (adopted). A gang is never left half-bound: on a failure the members
// bound are deleted (their controllers recreate them), unless fenced.
func (s *Scheduler) bindJob(ctx context.Context, st *commitStats, jp []podPlan) (adopted int, failure error) {
	var bound []*v1.Pod
	for i, p := range jp {
		if i > 0 {
			s.hook(HookBetweenBinds)
		}
		if failure = s.fence(ctx, st, "binding pod "+p.ref.pod.Namespace+"/"+p.ref.pod.Name); failure != nil {
			break
		}
		a, err := s.bind(ctx, p.ref.pod, p.node)
		if err != nil {
			failure = fmt.Errorf("binding pod %s/%s: %w", p.ref.pod.Namespace, p.ref.pod.Name, err)
			break
		}
		if a {
			adopted++
		}
		bound = append(bound, p.ref.pod)
	}
	if failure != nil && len(bound) > 0 && !errors.Is(failure, ErrFenced) {
		for _, pod := range bound {
			if err := s.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}); err != nil && !apierrors.IsNotFound(err) {
				klog.FromContext(ctx).Error(err, "Rolling back a half-bound gang", "pod", klog.KObj(pod))
			}
		}
	}
	return adopted, failure
}

// jobBound records a job written whole: the binds counted (but adopted
// ones), our own writes for the next cycle to wait for, and the events.
func (s *Scheduler) jobBound(st *commitStats, jp []podPlan, adopted int, written []writtenClaim) {
	st.mu.Lock()
	st.bound += len(jp) - adopted
	st.mu.Unlock()
	for _, p := range jp {
		s.own.bound(p.ref.pod.Namespace, p.ref.pod.Name, p.ref.pod.UID)
	}
	for _, w := range written {
		s.own.claim(w.claim.Namespace, w.claim.Name, w.claim.UID, w.claim.ResourceVersion)
	}
	for _, p := range jp {
		s.recorder.Eventf(p.ref.pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", p.ref.pod.Namespace, p.ref.pod.Name, p.node)
	}
}

// rollBackJob undoes the claims a failed job wrote and fails its pods with
// the reason.
func (s *Scheduler) rollBackJob(ctx context.Context, st *commitStats, job string, jp []podPlan, written []writtenClaim, failure error) {
	st.apiErrors.Add(1)
	klog.FromContext(ctx).Error(failure, "Committing job failed; rolling back its claims", "job", job)
	uids := sets.New[types.UID]()
	for _, p := range jp {
		uids.Insert(p.ref.pod.UID)
	}
	for _, w := range written {
		if err := s.releaseClaim(ctx, w, uids); err != nil {
			klog.FromContext(ctx).Error(err, "Rolling back claim", "claim", klog.KObj(w.claim))
		}
	}
	st.mu.Lock()
	for _, p := range jp {
		st.failed[p.ref.pod.Namespace+"/"+p.ref.pod.Name] = failure.Error()
	}
	st.mu.Unlock()
}
