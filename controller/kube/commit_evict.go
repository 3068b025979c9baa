package kube

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
)

// commitEvictions sends the cycle's evictions, in parallel, none of a plan
// a PodDisruptionBudget refuses part of (refusedPlans). It returns the pods
// evicted.
func (s *Scheduler) commitEvictions(ctx context.Context, st *commitStats, evs []core.Eviction, idx *cycleIndex, now time.Time) map[string]bool {
	spared := s.refusedPlans(ctx, evs, idx, now)
	evictedOK := map[string]bool{}
	var evictionsSent atomic.Int64
	s.parallel(len(evs), func(i int) {
		ev := evs[i]
		ref := idx.pods[ev.Pod]
		if ref == nil || spared[ev.Plan] {
			return
		}
		if evictionsSent.Add(1) > 1 {
			s.hook(HookMidEvictions)
		}
		if s.fence(ctx, st, "evicting pod "+ev.Pod) != nil {
			return
		}
		err := s.evict(ctx, ref.pod, ev, false)
		st.mu.Lock()
		defer st.mu.Unlock()
		switch {
		case err == nil:
			st.evicted++
			st.evictionsByWhat[ev.Action]++
			evictedOK[ev.Pod] = true
		case apierrors.IsTooManyRequests(err):
			s.refused(ref.pod, ev, now, "other victims will be chosen")
		case apierrors.IsNotFound(err):
		default:
			st.apiErrors.Add(1)
			klog.FromContext(ctx).Error(err, "Evicting pod", "pod", ev.Pod)
		}
	})
	return evictedOK
}

// nominatePipelined returns the jobs that wait for their victims to be
// gone: those with a pipelined bind. Their pods are nominated (left out of
// the next snapshots until the victims on their nodes have terminated, so
// nothing is evicted twice for them), then a later cycle places them on the
// freed capacity. A job with any pipelined bind waits whole, so a gang is
// never half-bound.
func (s *Scheduler) nominatePipelined(res *core.Result, idx *cycleIndex, evicted map[string]bool, now time.Time) map[string]bool {
	victimsOn := map[string][]string{}
	for _, ev := range res.Evictions {
		if evicted[ev.Pod] {
			victimsOn[ev.Node] = append(victimsOn[ev.Node], ev.Pod)
		}
	}
	waiting := map[string]bool{}
	for _, b := range res.Binds {
		if b.Pipelined {
			waiting[b.Job] = true
		}
	}
	for _, b := range res.Binds {
		if waiting[b.Job] {
			if ref := idx.pods[b.Pod]; ref != nil {
				s.nominated[b.Pod] = nomination{uid: ref.pod.UID, node: b.Placement.Node, victims: victimsOn[b.Placement.Node], until: now.Add(nominationTimeout)}
			}
		}
	}
	return waiting
}

// nominationTimeout bounds how long a nominated pod waits for its victims
// before it is considered afresh.
const nominationTimeout = 2 * time.Minute

// nomination is a pod placed onto capacity that evictions are freeing.
type nomination struct {
	uid     types.UID
	node    string
	victims []string // pod keys
	until   time.Time
}

// pdbBackoff is how long a pod whose eviction a PodDisruptionBudget refused
// is left out of the victims.
const pdbBackoff = time.Minute

// evict evicts pod through the Eviction API (or, dryRun, only asks whether
// its PodDisruptionBudgets would allow it).
func (s *Scheduler) evict(ctx context.Context, pod *v1.Pod, ev core.Eviction, dryRun bool) error {
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	} else {
		s.recorder.Eventf(pod, v1.EventTypeNormal, "Evicting", "%s: %s", ev.Action, ev.Reason)
	}
	return s.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: opts,
	})
}

// refused records that a PodDisruptionBudget refused ev's eviction: the pod
// is left out of the victims for pdbBackoff, and an event says what happens
// instead (then). The caller holds whatever lock guards the maps.
func (s *Scheduler) refused(pod *v1.Pod, ev core.Eviction, now time.Time, then string) {
	s.pdbBlocked[ev.Pod] = true
	s.pdbExpiry[ev.Pod] = now.Add(pdbBackoff)
	s.recorder.Eventf(pod, v1.EventTypeNormal, "EvictionBlocked", "Not evicted for %s: a PodDisruptionBudget does not allow it; %s", ev.Action, then)
}

// refusedPlans returns the evicting plans (core.Eviction.Plan) of which a
// PodDisruptionBudget refuses a victim. A plan's victims go together: with
// one refused, evicting the others frees what the plan cannot use, and
// those pods are stopped for nothing. So the victims of every plan of
// several evictions are first evicted as a dry run (the API server checks
// the budgets as for a real eviction), and a refused plan evicts none. The
// refused pods are left out of the victims for pdbBackoff, and the next
// cycle plans again without them.
func (s *Scheduler) refusedPlans(ctx context.Context, evs []core.Eviction, idx *cycleIndex, now time.Time) map[int]bool {
	size := map[int]int{}
	for _, ev := range evs {
		if ev.Plan > 0 {
			size[ev.Plan]++
		}
	}
	var check []core.Eviction
	for _, ev := range evs {
		if size[ev.Plan] > 1 && idx.pods[ev.Pod] != nil {
			check = append(check, ev)
		}
	}
	refused := map[int]bool{}
	var mu sync.Mutex
	s.parallel(len(check), func(i int) {
		ev := check[i]
		pod := idx.pods[ev.Pod].pod
		if err := s.evict(ctx, pod, ev, true); !apierrors.IsTooManyRequests(err) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		refused[ev.Plan] = true
		s.refused(pod, ev, now, "the other victims of the same plan are spared, and other victims will be chosen")
	})
	for plan := range refused {
		klog.FromContext(ctx).Info("Evicting plan dropped: a PodDisruptionBudget refuses one of its victims", "plan", plan, "victims", size[plan])
	}
	return refused
}
