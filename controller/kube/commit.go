package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// commitStats says what a commit did.
type commitStats struct {
	bound, evicted  int
	apiErrors       atomic.Int64
	evictionsByWhat map[core.Action]int
	// failed maps pods whose placement could not be committed to why.
	failed map[string]string
	// waiting maps pods whose placement waits for a GPU being released
	// (not a failure) to why.
	waiting map[string]string
	// fenced is set (to an error wrapping ErrFenced) once Options.Fence
	// refused a write: nothing more is written, rollbacks neither.
	fenced atomic.Pointer[error]
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

	var mu sync.Mutex
	// Pods whose claims a previous scheduler allocated but that it did not
	// bind: bind them where their claims are.
	s.parallel(len(idx.adopt), func(i int) {
		a := idx.adopt[i]
		ref := idx.pods[a.pod]
		if ref == nil || s.fence(ctx, st, "binding a pod whose claims are allocated") != nil {
			return
		}
		adopted, err := s.bind(ctx, ref.pod, a.node)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			st.apiErrors.Add(1)
			st.failed[a.pod] = fmt.Sprintf("binding to %s, where its claims are allocated: %v", a.node, err)
			klog.ErrorS(err, "Binding a pod whose claims are allocated already", "pod", a.pod, "node", a.node)
		case !adopted:
			st.bound++
			s.own.bound(ref.pod.Namespace, ref.pod.Name, ref.pod.UID)
			s.recorder.Eventf(ref.pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s (its claims were allocated there already)", ref.pod.Namespace, ref.pod.Name, a.node)
		}
	})

	// Evictions, in parallel; none of a plan a budget refuses part of.
	spared := s.refusedPlans(ctx, res.Evictions, idx, now)
	evictedOK := map[string]bool{}
	var evictionsSent atomic.Int64
	s.parallel(len(res.Evictions), func(i int) {
		ev := res.Evictions[i]
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
		mu.Lock()
		defer mu.Unlock()
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
			klog.ErrorS(err, "Evicting pod", "pod", ev.Pod)
		}
	})

	// Pipelined binds wait for their victims to be gone: their pods are
	// nominated (left out of the next snapshots until the victims on their
	// nodes have terminated, so nothing is evicted twice for them), then a
	// later cycle places them on the freed capacity. A job with any
	// pipelined bind waits whole, so a gang is never half-bound.
	victimsOn := map[string][]string{}
	for _, ev := range res.Evictions {
		if evictedOK[ev.Pod] {
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

	// Binds: work out every allocation first, in decision order, so each
	// sees the devices the previous ones took; then write jobs in parallel.
	byJob := map[string][]core.Bind{}
	var jobOrder []string
	for _, b := range res.Binds {
		if waiting[b.Job] {
			continue
		}
		if _, ok := byJob[b.Job]; !ok {
			jobOrder = append(jobOrder, b.Job)
		}
		byJob[b.Job] = append(byJob[b.Job], b)
	}
	if len(jobOrder) == 0 || st.fenced.Load() != nil {
		return st
	}
	state := idx.allocatedState(s)
	type podPlan struct {
		ref    *podRef
		node   string
		allocs map[string]*resourceapi.AllocationResult // by claim name
		// assign is a device-plugin pod's assignment, written before
		// its bind.
		assign *assignment.Assignment
	}
	plans := make([][]podPlan, len(jobOrder))
	for j, job := range jobOrder {
		if why := releasingGPU(idx, byJob[job]); why != "" {
			// The whole job waits a cycle or two; nothing was written.
			for _, b := range byJob[job] {
				st.waiting[b.Pod] = why
			}
			continue
		}
		var jp []podPlan
		var undo []func()
		ok := true
		for _, b := range byJob[job] {
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
			for _, b := range byJob[job] {
				if _, failed := st.failed[b.Pod]; !failed {
					st.failed[b.Pod] = "another pod of its gang could not be placed"
				}
			}
			continue
		}
		plans[j] = jp
	}

	volumes := &volumeReservations{taken: map[string]bool{}}
	var jobsStarted atomic.Int64
	s.parallel(len(jobOrder), func(j int) {
		jp := plans[j]
		if jp == nil {
			return
		}
		if jobsStarted.Add(1) > 1 {
			s.hook(HookBetweenJobs)
		}
		// Volumes to provision are sent to the chosen node first (as
		// kube-scheduler's VolumeBinding does before DynamicResources),
		// then the claims of every pod; a failure rolls the job's claims
		// back.
		var written []writtenClaim
		var failure error
		for _, p := range jp {
			if err := s.fence(ctx, st, "writing job "+jobOrder[j]); err != nil {
				failure = err
				break
			}
			if err := s.selectNode(ctx, p.ref.pod, idx.nodes[p.node], volumes); err != nil {
				failure = err
				break
			}
		}
		for _, p := range jp {
			if failure != nil {
				break
			}
			for _, c := range p.ref.claims {
				if failure = s.fence(ctx, st, "writing claim "+c.Namespace+"/"+c.Name); failure != nil {
					break
				}
				a, ok := p.allocs[c.Name]
				c2, added, err := s.reserveClaim(ctx, c, a, ok, p.ref.pod)
				if err != nil {
					failure = fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
					break
				}
				if ok || added {
					written = append(written, writtenClaim{claim: c2, fresh: ok})
				}
			}
			if failure != nil {
				break
			}
		}
		// Device-plugin pods: the assignment annotation, which the node's
		// device plugin reads in Allocate, before any bind of the job; a
		// failed write binds none of them.
		for _, p := range jp {
			if failure != nil {
				break
			}
			if p.assign != nil {
				if failure = s.fence(ctx, st, "writing the GPU assignment of pod "+p.ref.pod.Namespace+"/"+p.ref.pod.Name); failure != nil {
					break
				}
				if err := s.writeAssignment(ctx, p.ref.pod, *p.assign); err != nil {
					failure = fmt.Errorf("writing the GPU assignment of pod %s/%s: %w", p.ref.pod.Namespace, p.ref.pod.Name, err)
				}
			}
		}
		if failure == nil {
			s.hook(HookAfterClaims)
			var bound []*v1.Pod
			adopted := 0
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
				// A gang is never left half-bound: remove the members that
				// were bound; their controllers recreate them.
				for _, pod := range bound {
					if err := s.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}); err != nil && !apierrors.IsNotFound(err) {
						klog.ErrorS(err, "Rolling back a half-bound gang", "pod", klog.KObj(pod))
					}
				}
			}
			if failure == nil {
				mu.Lock()
				st.bound += len(jp) - adopted
				mu.Unlock()
				for _, p := range jp {
					s.own.bound(p.ref.pod.Namespace, p.ref.pod.Name, p.ref.pod.UID)
				}
				for _, w := range written {
					s.own.claim(w.claim.Namespace, w.claim.Name, w.claim.UID, w.claim.ResourceVersion)
				}
				for _, p := range jp {
					s.recorder.Eventf(p.ref.pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", p.ref.pod.Namespace, p.ref.pod.Name, p.node)
				}
				return
			}
		}
		if errors.Is(failure, ErrFenced) {
			// No rollback either: those are writes too. What was written
			// is what a crash at this point leaves; the next leader adopts
			// pods whose claims are allocated (cache.go) and the stale-gang
			// rule ends a gang left below its minimum.
			return
		}
		st.apiErrors.Add(1)
		klog.ErrorS(failure, "Committing job failed; rolling back its claims", "job", jobOrder[j])
		uids := sets.New[types.UID]()
		for _, p := range jp {
			uids.Insert(p.ref.pod.UID)
		}
		for _, w := range written {
			if err := s.releaseClaim(ctx, w, uids); err != nil {
				klog.ErrorS(err, "Rolling back claim", "claim", klog.KObj(w.claim))
			}
		}
		mu.Lock()
		for _, p := range jp {
			st.failed[p.ref.pod.Namespace+"/"+p.ref.pod.Name] = failure.Error()
		}
		mu.Unlock()
	})
	return st
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
		klog.InfoS("Evicting plan dropped: a PodDisruptionBudget refuses one of its victims", "plan", plan, "victims", size[plan])
	}
	return refused
}

// allocatedState collects what every allocated claim holds, as the
// structured allocator wants it.
func allocatedState(claims []*resourceapi.ResourceClaim) *structured.AllocatedState {
	st := &structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation != nil {
			addAllocation(st, c.Status.Allocation)
		}
	}
	return st
}

func addAllocation(st *structured.AllocatedState, a *resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			st.AllocatedDevices.Insert(id)
			continue
		}
		st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
}

func removeAllocation(st *structured.AllocatedState, a *resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			st.AllocatedDevices.Delete(id)
			continue
		}
		st.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
		st.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
}

// classLister adapts the informer's lister to the allocator's interface.
type classLister struct{ s *Scheduler }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	return l.s.classLister.List(everything)
}
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	return l.s.classLister.Get(name)
}

var allocatorFeatures = structured.Features{
	AdminAccess:        true,
	ConsumableCapacity: true,
	DeviceTaints:       true,
	PrioritizedList:    true,
}

// allocate works out the allocation of a pod's unallocated claims on the
// node and GPUs the core chose. The structured allocator does the work, on the
// node's slices with the Tessera devices narrowed to the chosen GPUs, so
// class and claim CEL selectors, matchAttribute constraints, consumable
// capacity and other drivers' devices are honoured exactly as kube-scheduler
// would. Of a prioritized list (firstAvailable) of GPUs, the allocator is
// given only the subrequest the core chose (pl.Alternative): with the GPUs
// narrowed alone, an earlier subrequest could still match them where the
// core chose a later one (a whole GPU on the free GPU the core gave a
// share, when the queue's limit stopped the whole one). The allocations
// are added to state; undo removes them.
func (s *Scheduler) allocate(ctx context.Context, ref *podRef, idx *cycleIndex, pl core.Placement, state *structured.AllocatedState, undo *[]func()) (map[string]*resourceapi.AllocationResult, error) {
	var pending []*resourceapi.ResourceClaim
	for _, c := range ref.claims {
		if c.Status.Allocation == nil {
			pending = append(pending, c)
		}
	}
	if ref.choices != nil {
		if pl.Alternative < 0 || pl.Alternative >= len(ref.choices) {
			return nil, fmt.Errorf("the core chose alternative %d of %d", pl.Alternative, len(ref.choices))
		}
		pending = onlySubrequest(pending, ref.choices[pl.Alternative])
	}
	if len(pending) == 0 {
		return nil, nil
	}
	node := idx.nodes[pl.Node]
	if node == nil {
		return nil, fmt.Errorf("node %s is gone", pl.Node)
	}
	chosen := sets.New[string]()
	for _, g := range pl.GPUs {
		chosen.Insert(draname.DeviceName(g))
	}
	local, err := s.sliceIndexer.ByIndex(sliceNodeIndex, pl.Node)
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	shared, err := s.sliceIndexer.ByIndex(sliceNodeIndex, "")
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	var slices []*resourceapi.ResourceSlice
	for _, obj := range append(local, shared...) {
		sl := obj.(*resourceapi.ResourceSlice)
		onNode := sl.Spec.NodeName != nil && *sl.Spec.NodeName == pl.Node
		if !onNode && (sl.Spec.AllNodes == nil || !*sl.Spec.AllNodes) && sl.Spec.NodeSelector == nil {
			continue
		}
		if sl.Spec.Driver == DriverName {
			if !onNode {
				continue
			}
			narrowed := sl.DeepCopy()
			narrowed.Spec.Devices = slicesFilter(narrowed.Spec.Devices, func(d resourceapi.Device) bool { return chosen.Has(d.Name) })
			for i := range narrowed.Spec.Devices {
				// The core placed a share next to device-plugin shares of
				// the same mode (it knows them by their assignment): the
				// "shared" taint, meant for kube-scheduler, must not stop
				// the allocator. "whole" stays, a second guard.
				d := &narrowed.Spec.Devices[i]
				d.Taints = slicesFilter(d.Taints, func(t resourceapi.DeviceTaint) bool {
					return t.Key != draname.TaintDevicePlugin || t.Value != draname.TaintShared
				})
			}
			sl = narrowed
		}
		slices = append(slices, sl)
	}
	alloc, err := structured.NewAllocator(ctx, allocatorFeatures, *state, classLister{s}, slices, s.celCache)
	if err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	results, err := alloc.Allocate(ctx, node, pending)
	if err != nil {
		return nil, fmt.Errorf("allocating claims on %s: %w", pl.Node, err)
	}
	if results == nil {
		return nil, fmt.Errorf("the claims' device selectors or constraints do not fit GPUs %v of node %s", pl.GPUs, pl.Node)
	}
	out := map[string]*resourceapi.AllocationResult{}
	for i, c := range pending {
		r := results[i]
		out[c.Name] = &r
		addAllocation(state, &r)
		*undo = append(*undo, func() { removeAllocation(state, &r) })
	}
	return out, nil
}

// onlySubrequest returns claims with ch's request narrowed to subrequest
// ch: a copy of that claim, the others as they are. The allocator's result
// still names "request/subrequest", as the claim's status must.
func onlySubrequest(claims []*resourceapi.ResourceClaim, ch subrequestChoice) []*resourceapi.ResourceClaim {
	out := slices.Clone(claims)
	for i, c := range out {
		if c.Name != ch.claim {
			continue
		}
		c = c.DeepCopy()
		for k := range c.Spec.Devices.Requests {
			r := &c.Spec.Devices.Requests[k]
			if r.Name == ch.request {
				r.FirstAvailable = slicesFilter(r.FirstAvailable, func(sub resourceapi.DeviceSubRequest) bool { return sub.Name == ch.subrequest })
			}
		}
		out[i] = c
	}
	return out
}

func slicesFilter[T any](in []T, keep func(T) bool) []T {
	out := in[:0:0]
	for _, x := range in {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// reserveClaim writes a claim's allocation (when it has a new one) and
// reserves it for the pod: the delete-protection finalizer first, then
// status.allocation and reservedFor, retried on conflict.
func (s *Scheduler) reserveClaim(ctx context.Context, c *resourceapi.ResourceClaim, a *resourceapi.AllocationResult, fresh bool, pod *v1.Pod) (out *resourceapi.ResourceClaim, added bool, _ error) {
	claims := s.client.ResourceV1().ResourceClaims(c.Namespace)
	cur := c
	first := true
	err := retryOnConflict(func() error {
		if !first {
			latest, err := claims.Get(ctx, c.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur = latest
		}
		first = false
		if cur.DeletionTimestamp != nil {
			return fmt.Errorf("claim is being deleted")
		}
		if fresh && cur.Status.Allocation != nil {
			return fmt.Errorf("claim was allocated by someone else meanwhile")
		}
		if !fresh && cur.Status.Allocation == nil {
			return fmt.Errorf("claim lost its allocation meanwhile")
		}
		upd := cur.DeepCopy()
		if fresh && !slices.Contains(upd.Finalizers, finalizerDeleteProtection) {
			upd.Finalizers = append(upd.Finalizers, finalizerDeleteProtection)
			var err error
			if upd, err = claims.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
				return err
			}
			cur = upd
			upd = upd.DeepCopy()
		}
		if fresh {
			upd.Status.Allocation = a
		}
		reserved := slices.ContainsFunc(upd.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID })
		if !reserved {
			upd.Status.ReservedFor = append(upd.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
		}
		if !fresh && reserved {
			out, added = upd, false
			return nil
		}
		res, err := claims.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		out, added = res, !reserved
		return nil
	})
	return out, added, err
}

// releaseClaim undoes reserveClaim for a job that could not be committed
// whole: the job's pods leave reservedFor (only reservations this commit
// added are written), and a claim this commit allocated that nobody else
// reserves loses its allocation, then the finalizer.
func (s *Scheduler) releaseClaim(ctx context.Context, w writtenClaim, podUIDs sets.Set[types.UID]) error {
	claims := s.client.ResourceV1().ResourceClaims(w.claim.Namespace)
	return retryOnConflict(func() error {
		cur, err := claims.Get(ctx, w.claim.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		upd := cur.DeepCopy()
		upd.Status.ReservedFor = slicesFilter(upd.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return !podUIDs.Has(r.UID) })
		if w.fresh && len(upd.Status.ReservedFor) == 0 {
			upd.Status.Allocation = nil
		}
		if upd, err = claims.UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return err
		}
		if upd.Status.Allocation == nil && slices.Contains(upd.Finalizers, finalizerDeleteProtection) {
			upd.Finalizers = slicesFilter(upd.Finalizers, func(f string) bool { return f != finalizerDeleteProtection })
			_, err = claims.Update(ctx, upd, metav1.UpdateOptions{})
		}
		return err
	})
}

type writtenClaim struct {
	claim *resourceapi.ResourceClaim
	fresh bool
}

// releasingGPU says why binds must wait when one of the GPUs they were
// given is still allocated to a claim of a pod that is gone ("" when none
// is): kube-controller-manager deallocates such a claim shortly, and the
// allocator would refuse the GPU until then.
func releasingGPU(idx *cycleIndex, binds []core.Bind) string {
	if len(idx.releasing) == 0 {
		return ""
	}
	for _, b := range binds {
		g := idx.gpus[b.Placement.Node]
		if g == nil {
			continue
		}
		for _, gpu := range b.Placement.GPUs {
			if claim, ok := idx.releasing[g.pool+"/"+draname.DeviceName(gpu)]; ok {
				return fmt.Sprintf("waiting for GPU %d of node %s: claim %s of a pod that is gone is being deallocated", gpu, b.Placement.Node, claim)
			}
		}
	}
	return ""
}
