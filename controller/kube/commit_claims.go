package kube

// Claims: the structured allocator's work on the chosen GPUs, the writes of
// allocations and reservations, and their rollback.

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

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
