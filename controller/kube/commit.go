package kube

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
)

// commitStats says what a commit did.
type commitStats struct {
	bound, evicted  int
	apiErrors       atomic.Int64
	evictionsByWhat map[core.Action]int
	// evictedOK holds the pods evicted (upstream PodGroups' DisruptionTarget).
	evictedOK map[string]bool
	// failed maps pods whose placement could not be committed to why.
	failed map[string]string
	// waiting maps pods whose placement waits for a GPU being released
	// (not a failure) to why.
	waiting map[string]string
	// fenced is set (to an error wrapping ErrFenced) once Options.Fence
	// refused a write: nothing more is written, rollbacks neither.
	fenced atomic.Pointer[error]
	// mu guards the fields above but for the atomics, written from the
	// commit's parallel workers.
	mu sync.Mutex
}

// commit carries the core's decisions out: evictions first (through the
// Eviction API, so PodDisruptionBudgets hold), then each job's claims and
// bindings, a job at a time and all-or-nothing.
func (s *Scheduler) commit(ctx context.Context, res *core.Result, idx *cycleIndex) *commitStats {
	st := &commitStats{evictionsByWhat: map[core.Action]int{}, failed: map[string]string{}, waiting: map[string]string{}}
	now := time.Now()
	for pod, until := range s.pdbExpiry {
		if now.After(until) {
			delete(s.pdbExpiry, pod)
			delete(s.pdbBlocked, pod)
		}
	}
	s.bindAdopted(ctx, st, idx)
	evicted := s.commitEvictions(ctx, st, res.Evictions, idx, now)
	st.evictedOK = evicted
	waiting := s.nominatePipelined(res, idx, evicted, now)

	// Binds: work out every allocation first, in decision order, so each
	// sees the devices the previous ones took; then write jobs in parallel.
	byJob, jobOrder := jobsToWrite(res.Binds, waiting)
	if len(jobOrder) == 0 || st.fenced.Load() != nil {
		return st
	}
	plans := s.planJobs(ctx, st, idx, byJob, jobOrder)
	volumes := &volumeReservations{taken: map[string]bool{}}
	var jobsStarted atomic.Int64
	s.parallel(len(jobOrder), func(j int) {
		if plans[j] == nil {
			return
		}
		if jobsStarted.Add(1) > 1 {
			s.hook(HookBetweenJobs)
		}
		s.writeJob(ctx, st, idx, jobOrder[j], plans[j], volumes)
	})
	return st
}

// bindAdopted binds the pods whose claims a previous scheduler allocated but
// that it did not bind, where their claims are.
func (s *Scheduler) bindAdopted(ctx context.Context, st *commitStats, idx *cycleIndex) {
	s.parallel(len(idx.adopt), func(i int) {
		a := idx.adopt[i]
		ref := idx.pods[a.pod]
		if ref == nil || s.fence(ctx, st, "binding a pod whose claims are allocated") != nil {
			return
		}
		adopted, err := s.bind(ctx, ref.pod, a.node)
		st.mu.Lock()
		defer st.mu.Unlock()
		switch {
		case err != nil:
			st.apiErrors.Add(1)
			st.failed[a.pod] = fmt.Sprintf("binding to %s, where its claims are allocated: %v", a.node, err)
			klog.FromContext(ctx).Error(err, "Binding a pod whose claims are allocated already", "pod", a.pod, "node", a.node)
		case !adopted:
			st.bound++
			s.own.bound(ref.pod.Namespace, ref.pod.Name, ref.pod.UID)
			s.recorder.Eventf(ref.pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s (its claims were allocated there already)", ref.pod.Namespace, ref.pod.Name, a.node)
		}
	})
}

// jobsToWrite groups the binds by job, in decision order, leaving out the
// jobs that wait for their victims (waiting).
func jobsToWrite(binds []core.Bind, waiting map[string]bool) (map[string][]core.Bind, []string) {
	byJob := map[string][]core.Bind{}
	var jobOrder []string
	for _, b := range binds {
		if waiting[b.Job] {
			continue
		}
		if _, ok := byJob[b.Job]; !ok {
			jobOrder = append(jobOrder, b.Job)
		}
		byJob[b.Job] = append(byJob[b.Job], b)
	}
	return byJob, jobOrder
}

// bind binds a pod. A pod already bound to the same node counts as bound
// (adopted): after a restart or a failover the previous leader's last binds
// may not have reached the informers yet. Adopted binds are not ours to
// count in tessera_binds_total.
func (s *Scheduler) bind(ctx context.Context, pod *v1.Pod, node string) (adopted bool, _ error) {
	// A Bind conflict is never transient (the pod is bound already, or it
	// is another pod now): only timeouts and throttling are retried. A
	// retried Bind whose first try landed after all reads as adopted; that
	// rare miscount is the price of not guessing.
	err := retryOnError(retry.DefaultBackoff, func(err error) bool { return retriable(err) && !apierrors.IsConflict(err) }, func() error {
		return s.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
			Target:     v1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
	})
	if apierrors.IsConflict(err) {
		cur, gerr := s.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr == nil && cur.UID == pod.UID && cur.Spec.NodeName == node {
			return true, nil
		}
	}
	return false, err
}

func retriable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) || apierrors.IsTimeout(err)
}

// parallel runs f(0..n-1) on up to Workers goroutines.
func (s *Scheduler) parallel(n int, f func(int)) {
	if n == 0 {
		return
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(n, s.opts.Workers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
}
