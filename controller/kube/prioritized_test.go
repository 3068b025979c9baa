package kube

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// firstAvailable builds a claim with one request "gpu" of subrequests.
func firstAvailable(name string, subs ...resourceapi.DeviceSubRequest) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", FirstAvailable: subs}}
	return c
}

func memRequest(q string) *resourceapi.CapacityRequirements {
	return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{draname.CapacityMemory: resource.MustParse(q)}}
}

func TestPodGPURequestFirstAvailable(t *testing.T) {
	classes := map[string]*resourceapi.DeviceClass{
		"gpu.tessera.dev":     class("gpu.tessera.dev", gpuconfig.Exclusive),
		"mps.gpu.tessera.dev": class("mps.gpu.tessera.dev", gpuconfig.MPS),
		"nic.example.com":     {ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}},
	}
	lookup := func(n string) *resourceapi.DeviceClass { return classes[n] }
	whole := func(name string, count int64) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	}
	share := func(name, mem string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: "mps.gpu.tessera.dev", Capacity: memRequest(mem)}
	}
	choices := func(claim string, subs ...string) []subrequestChoice {
		var out []subrequestChoice
		for _, s := range subs {
			out = append(out, subrequestChoice{claim: claim, request: "gpu", subrequest: s})
		}
		return out
	}
	tests := []gpuRequestCase{
		{name: "two GPUs, else one", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("two", 2), whole("one", 1))},
			want: core.Request{GPUs: 2}, alts: []core.Request{{GPUs: 1}}, choices: choices("c", "two", "one"), tessera: true},
		{name: "a whole GPU, else a 40Gi MPS share", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("whole", 1), share("share", "40Gi"))},
			want: core.Request{GPUs: 1}, alts: []core.Request{{GPUMemory: 40 << 30, Sharing: core.SharingMPS}}, choices: choices("c", "whole", "share"), tessera: true},
		{name: "one subrequest: no alternatives", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 0))},
			want: core.Request{GPUs: 1}, choices: choices("c", "one"), tessera: true},
		{name: "the pod's other requests count in every alternative", claims: []*resourceapi.ResourceClaim{
			claim("x", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Count: 2}),
			firstAvailable("c", whole("four", 4), whole("two", 2)),
		}, want: core.Request{GPUs: 6}, alts: []core.Request{{GPUs: 4}}, choices: choices("c", "four", "two"), tessera: true},
		{name: "other drivers' subrequests only: left to the allocator", claims: []*resourceapi.ResourceClaim{
			firstAvailable("c", resourceapi.DeviceSubRequest{Name: "nic", DeviceClassName: "nic.example.com"}),
		}},
		{name: "a subrequest's unknown class", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 1), resourceapi.DeviceSubRequest{Name: "x", DeviceClassName: "nope"})},
			err: `claim c request "gpu" subrequest "x": DeviceClass "nope" not found`},
		{name: "memory on the exclusive class", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 1),
			resourceapi.DeviceSubRequest{Name: "half", DeviceClassName: "gpu.tessera.dev", Capacity: memRequest("40Gi")})},
			err: `claim c request "gpu" subrequest "half": a memory request shares a GPU; use DeviceClass mps.gpu.tessera.dev or timeslice.gpu.tessera.dev`},
		{name: "allocation mode All", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 1),
			resourceapi.DeviceSubRequest{Name: "all", DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeAll})},
			err: `claim c request "gpu" subrequest "all": allocationMode All is not supported for GPUs; ask for a count`},
		{name: "a share beside whole GPUs", claims: []*resourceapi.ResourceClaim{
			claim("x", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}),
			firstAvailable("c", whole("two", 2), share("share", "10Gi")),
		}, err: `claim c request "gpu" subrequest "share": a pod may ask for whole GPUs or for one share of one GPU, not both or several shares`},
		{name: "GPUs and another driver's devices in one list", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 1),
			resourceapi.DeviceSubRequest{Name: "nic", DeviceClassName: "nic.example.com"})},
			err: `claim c request "gpu": subrequest "nic" asks for another driver's devices and "one" for Tessera GPUs`},
		{name: "two prioritized lists", claims: []*resourceapi.ResourceClaim{firstAvailable("c", whole("one", 1)), firstAvailable("d", whole("one", 1))},
			err: `claim d request "gpu": tessera-scheduler supports one firstAvailable request for GPUs per pod; c/gpu is another`},
	}
	checkGPURequests(t, lookup, tests)
}

// The commit's allocator, on the slice narrowed to the GPU the core chose,
// allocates the subrequest the core chose, and the result names it
// ("request/subrequest"): on a partly used GPU the narrowing alone does
// it; on a free GPU where the core chose a share (a limit stopped the
// whole one), only the claim narrowed to that subrequest does.
func TestAllocatorPicksTheCoreAlternative(t *testing.T) {
	classes := []*resourceapi.DeviceClass{class("gpu.tessera.dev", gpuconfig.Exclusive), class("mps.gpu.tessera.dev", gpuconfig.MPS)}
	dev := func(i int) resourceapi.Device {
		return resourceapi.Device{Name: draname.DeviceName(i), AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{draname.AttrIndex: {IntValue: ptr.To(int64(i))}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{draname.CapacityMemory: {Value: resource.MustParse("80Gi")}}}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	slice := func(devs ...int) *resourceapi.ResourceSlice {
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n-gpu"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: DriverName, NodeName: ptr.To("n"), Pool: resourceapi.ResourcePool{Name: "n", Generation: 1, ResourceSliceCount: 1}}}
		for _, i := range devs {
			s.Spec.Devices = append(s.Spec.Devices, dev(i))
		}
		return s
	}
	claim := firstAvailable("c",
		resourceapi.DeviceSubRequest{Name: "whole", DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		resourceapi.DeviceSubRequest{Name: "share", DeviceClassName: "mps.gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Capacity: memRequest("40Gi")})
	// GPU 0 holds a 20Gi share of another claim.
	other := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	other.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: DriverName, Pool: "n", Device: draname.DeviceName(0), ShareID: ptr.To(types.UID("a")),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{draname.CapacityMemory: resource.MustParse("20Gi")},
	}}}}
	used := *allocatedState([]*resourceapi.ResourceClaim{other})
	allocate := func(gpu int, claims ...*resourceapi.ResourceClaim) string {
		t.Helper()
		a, err := structured.NewAllocator(context.Background(), allocatorFeatures, used, fakeClasses(classes), []*resourceapi.ResourceSlice{slice(gpu)}, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
		require.NoError(t, err)
		res, err := a.Allocate(context.Background(), node, claims)
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.Len(t, res[0].Devices.Results, 1)
		assert.Equal(t, draname.DeviceName(gpu), res[0].Devices.Results[0].Device)
		return res[0].Devices.Results[0].Request
	}
	choice := func(sub string) subrequestChoice {
		return subrequestChoice{claim: "c", request: "gpu", subrequest: sub}
	}
	assert.Equal(t, "gpu/share", allocate(0, claim), "the partly used GPU: the whole one does not fit it")
	assert.Equal(t, "gpu/share", allocate(0, onlySubrequest([]*resourceapi.ResourceClaim{claim}, choice("share"))...))
	assert.Equal(t, "gpu/whole", allocate(1, claim), "a free GPU: the allocator alone takes the first subrequest")
	assert.Equal(t, "gpu/share", allocate(1, onlySubrequest([]*resourceapi.ResourceClaim{claim}, choice("share"))...), "narrowed to the core's choice")
	assert.Equal(t, "gpu/whole", allocate(1, onlySubrequest([]*resourceapi.ResourceClaim{claim}, choice("whole"))...))
	assert.Len(t, claim.Spec.Devices.Requests[0].FirstAvailable, 2, "the claim itself is not changed")
}

type fakeClasses []*resourceapi.DeviceClass

func (f fakeClasses) List() ([]*resourceapi.DeviceClass, error) { return f, nil }
func (f fakeClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range f {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, assert.AnError
}

// The README's prioritized-list example is a valid ResourceClaimTemplate
// (strict decoding) and Tessera reads it as written: one whole GPU, else a
// 20Gi MPS share.
func TestReadmePrioritizedListExample(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	require.NoError(t, err)
	s := string(doc)
	at := strings.Index(s, "kind: ResourceClaimTemplate")
	require.Positive(t, at, "README.md has no ResourceClaimTemplate example")
	start := strings.LastIndex(s[:at], "```yaml\n") + len("```yaml\n")
	end := start + strings.Index(s[start:], "```")
	var tmpl resourceapi.ResourceClaimTemplate
	require.NoError(t, yaml.UnmarshalStrict([]byte(s[start:end]), &tmpl))

	classes := map[string]*resourceapi.DeviceClass{
		"gpu.tessera.dev":     class("gpu.tessera.dev", gpuconfig.Exclusive),
		"mps.gpu.tessera.dev": class("mps.gpu.tessera.dev", gpuconfig.MPS),
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: tmpl.Spec.Spec}
	got, err := podGPURequest([]*resourceapi.ResourceClaim{c}, func(n string) *resourceapi.DeviceClass { return classes[n] })
	require.NoError(t, err)
	assert.Equal(t, core.Request{GPUs: 1}, got.req)
	assert.Equal(t, []core.Request{{GPUMemory: 20 << 30, Sharing: core.SharingMPS}}, got.alts)
}
