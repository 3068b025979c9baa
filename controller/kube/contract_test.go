package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// TestDriverSliceContract feeds the ResourceSlice tessera-node publishes
// (driver.BuildDevicesHeld and driver.Resources, on a fake a100-pcie-4: two
// NVLink pairs) with one GPU unhealthy, one held whole and one shared by the
// device plugin, to the controller's reader, and checks everything the
// controller derives from it against the inventory. A key renamed on either
// side (driver/slices.go or controller/kube) fails it; the attribute keys
// the controller reads are also required to be present, since a missing
// index attribute would otherwise fall back to the device name unnoticed.
func TestDriverSliceContract(t *testing.T) {
	const node = "node-a"
	f, err := gpu.NewFake("a100-pcie-4", node)
	require.NoError(t, err)
	devs, err := f.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 4)
	byIndex := map[int]gpu.Device{}
	for _, d := range devs {
		byIndex[d.Index] = d
	}
	health := driver.Health{byIndex[1].UUID: {UUID: byIndex[1].UUID, Index: 1, XID: 79, Reason: "XID 79"}}
	held := driver.DevicePluginHeld{
		byIndex[2].UUID: {Taint: driver.TaintValueWhole, Pod: "pod-uid-2"},
		byIndex[3].UUID: {Taint: driver.TaintValueShared},
	}
	res := driver.Resources(node, driver.BuildDevicesHeld(devs, health, held, ""))

	// As the ResourceSlice controller publishes DriverResources.
	var slices []*resourceapi.ResourceSlice
	for pool, p := range res.Pools {
		for i, s := range p.Slices {
			slices = append(slices, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: pool + "-" + string(rune('a'+i))},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   driver.DriverName,
					Pool:     resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: int64(len(p.Slices))},
					NodeName: ptr.To(node),
					Devices:  s.Devices,
				},
			})
		}
	}
	require.Len(t, slices, 1)

	// The keys the controller reads are all published.
	for _, d := range slices[0].Spec.Devices {
		for _, key := range []resourceapi.QualifiedName{draname.AttrIndex, draname.AttrProductName, draname.AttrNVLinkDomain, draname.AttrUUID} {
			assert.Contains(t, d.Attributes, key, "device %s", d.Name)
		}
		assert.Contains(t, d.Capacity, resourceapi.QualifiedName(draname.CapacityMemory), "device %s", d.Name)
	}

	g := gpusFromSlices(klog.Background(), slices)
	require.Equal(t, node, g.pool)
	require.EqualValues(t, 1, g.generation)
	require.Len(t, g.gpus, 4)
	domains := map[string]bool{}
	for pos, cg := range g.gpus {
		inv := byIndex[pos]
		name := draname.DeviceName(inv.Index)
		assert.Equal(t, core.GPU{Index: inv.Index, Model: inv.ProductName, Memory: int64(inv.MemoryBytes), NVLinkDomain: inv.NVLinkDomain}, cg, name)
		assert.Equal(t, pos, g.byDevice[name], name)
		require.NotNil(t, g.devices[inv.Index], name)
		assert.Equal(t, name, g.devices[inv.Index].Name)
		assert.NotEmpty(t, cg.NVLinkDomain, name)
		domains[cg.NVLinkDomain] = true
	}
	// a100-pcie-4: bridges 0-1 and 2-3.
	assert.Len(t, domains, 2)
	assert.Equal(t, g.gpus[0].NVLinkDomain, g.gpus[1].NVLinkDomain)
	assert.Equal(t, g.gpus[2].NVLinkDomain, g.gpus[3].NVLinkDomain)

	// Health: the unhealthy GPU, and only it, is unusable; the device-plugin
	// taint is recorded apart, with the holder of the GPU held whole.
	assert.Equal(t, map[string]bool{"gpu-1": true}, g.tainted)
	assert.Equal(t, map[string]string{"gpu-2": draname.TaintWhole, "gpu-3": draname.TaintShared}, g.dpHeld)
	assert.Equal(t, map[string]types.UID{"gpu-2": "pod-uid-2"}, g.dpPod)

	// The UUIDs the commit writes into a device-plugin pod's assignment are
	// the node's.
	a, err := placementAssignment(core.Placement{Node: node, GPUs: []int{2, 0}}, core.Request{GPUs: 2}, g)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 2}, a.GPUs)
	assert.Equal(t, []string{byIndex[0].UUID, byIndex[2].UUID}, a.UUIDs)
}
