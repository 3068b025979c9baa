package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/controller/core"
)

// A claim still allocated to a pod that is gone is not shown to the core
// (it is being deallocated), but a bind onto its GPU waits for the release
// instead of failing in the allocator.
func TestReleasingClaims(t *testing.T) {
	podIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	live := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "live", UID: "live-uid"}}
	if err := podIndexer.Add(live); err != nil {
		t.Fatal(err)
	}
	s := &Scheduler{podLister: corelisters.NewPodLister(podIndexer)}
	claim := func(name, device string, pod string, uid types.UID) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)},
			Status: resourceapi.ResourceClaimStatus{
				Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: DriverName, Pool: "n1", Device: device}}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: uid}},
			},
		}
	}
	idx := &cycleIndex{
		claims: []*resourceapi.ResourceClaim{claim("of-gone", "gpu-0", "gone", "gone-uid"), claim("of-live", "gpu-1", "live", "live-uid")},
		gpus:   map[string]*nodeGPUs{"n1": {pool: "n1", gpus: []core.GPU{{Index: 0, Memory: 1}, {Index: 1, Memory: 1}}, byDevice: map[string]int{"gpu-0": 0, "gpu-1": 1}}},
		jobs:   map[string]*jobRef{},
	}
	jobs := map[string]*core.Job{}
	var order []string
	s.addUnattributedClaims(idx, map[types.UID]bool{}, map[string]string{"n1": "n1"}, jobs, &order)
	assert.Equal(t, map[string]string{"n1/gpu-0": "ns/of-gone"}, idx.releasing)
	assert.Equal(t, []string{"<external>/<claim>/ns/of-live"}, order, "a claim of a live pod (another scheduler's, not bound yet) holds its GPU")

	bind := func(gpus ...int) []core.Bind {
		return []core.Bind{{Pod: "ns/p", Placement: core.Placement{Node: "n1", GPUs: gpus}}}
	}
	assert.Equal(t, "waiting for GPU 0 of node n1: claim ns/of-gone of a pod that is gone is being deallocated", releasingGPU(idx, bind(0)))
	assert.Empty(t, releasingGPU(idx, bind(2)))
}
