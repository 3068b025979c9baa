package driver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
)

func TestSemverVersion(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{"9.0", "9.0.0", false},
		{"8", "8.0.0", false},
		{"550.54.15", "550.54.15", false},
		{"535.104.05", "535.104.5", false},
		{"12.4", "12.4.0", false},
		{"", "", true},
		{"1.2.3.4", "", true},
		{"v1.2", "", true},
		{"1..2", "", true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := SemverVersion(tc.in)
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestBuildDevices(t *testing.T) {
	h100 := gpu.Device{
		UUID: "GPU-1", Index: 1, ProductName: "NVIDIA H100 80GB HBM3", Architecture: "Hopper",
		CUDAComputeCapability: "9.0", DriverVersion: "550.54.15", MemoryBytes: 80 << 30,
		Multiprocessors: 132, PCIBusID: "0000:2a:00.0", PCIeRoot: "pci0000:20", NUMANode: 0,
		NVLinkPeers: []int{0}, NVLinkDomain: "dom-a",
	}
	lonely := gpu.Device{UUID: "GPU-0", Index: 0, ProductName: "NVIDIA L4", CUDAComputeCapability: "8.9",
		DriverVersion: "bogus", MemoryBytes: 24 << 30, NUMANode: -1, NVLinkDomain: "GPU-0"}

	for _, tc := range []struct {
		name   string
		devs   []gpu.Device
		health Health
		mode   string
		check  func(t *testing.T, out []resourceapi.Device)
	}{{
		name: "attributes and capacity",
		devs: []gpu.Device{h100},
		check: func(t *testing.T, out []resourceapi.Device) {
			require.Len(t, out, 1)
			d := out[0]
			assert.Equal(t, "gpu-1", d.Name)
			require.NotNil(t, d.AllowMultipleAllocations)
			assert.True(t, *d.AllowMultipleAllocations)
			a := d.Attributes
			assert.Equal(t, "GPU-1", *a[AttrUUID].StringValue)
			assert.Equal(t, int64(1), *a[AttrIndex].IntValue)
			assert.Equal(t, "NVIDIA H100 80GB HBM3", *a[AttrProductName].StringValue)
			assert.Equal(t, "Hopper", *a[AttrArchitecture].StringValue)
			assert.Equal(t, "9.0.0", *a[AttrCUDAComputeCapability].VersionValue)
			assert.Equal(t, "550.54.15", *a[AttrDriverVersion].VersionValue)
			assert.Equal(t, int64(132), *a[AttrMultiprocessors].IntValue)
			assert.Equal(t, "dom-a", *a[AttrNVLinkDomain].StringValue)
			assert.Equal(t, int64(1), *a[AttrNVLinkPeers].IntValue)
			assert.Equal(t, "0000:2a:00.0", *a["resource.kubernetes.io/pciBusID"].StringValue)
			assert.Equal(t, "pci0000:20", *a["resource.kubernetes.io/pcieRoot"].StringValue)
			assert.Equal(t, int64(0), *a[AttrNUMANode].IntValue)
			assert.NotContains(t, a, AttrMode)
			mem := d.Capacity[CapacityMemory]
			assert.Equal(t, int64(80<<30), mem.Value.Value())
			require.NotNil(t, mem.RequestPolicy)
			require.NotNil(t, mem.RequestPolicy.Default, "a request without memory must take the whole GPU")
			assert.Equal(t, 0, mem.RequestPolicy.Default.Cmp(*resource.NewQuantity(80<<30, resource.BinarySI)))
			assert.Empty(t, d.Taints)
			assert.LessOrEqual(t, len(d.Attributes)+len(d.Capacity), resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
		},
	}, {
		name: "sorted by index, unparsable version and unknown NUMA left out",
		devs: []gpu.Device{h100, lonely},
		check: func(t *testing.T, out []resourceapi.Device) {
			require.Len(t, out, 2)
			assert.Equal(t, "gpu-0", out[0].Name)
			assert.Equal(t, "gpu-1", out[1].Name)
			assert.NotContains(t, out[0].Attributes, AttrDriverVersion)
			assert.NotContains(t, out[0].Attributes, AttrNUMANode)
			assert.Equal(t, int64(0), *out[0].Attributes[AttrNVLinkPeers].IntValue)
		},
	}, {
		name:   "unhealthy GPU is tainted NoSchedule",
		devs:   []gpu.Device{h100, lonely},
		health: Health{"GPU-1": {UUID: "GPU-1", Healthy: false, XID: 79, Reason: "XID 79: GPU has fallen off the bus", Time: time.Now()}},
		check: func(t *testing.T, out []resourceapi.Device) {
			assert.Empty(t, out[0].Taints)
			require.Len(t, out[1].Taints, 1)
			assert.Equal(t, resourceapi.DeviceTaint{Key: TaintUnhealthy, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}, out[1].Taints[0])
		},
	}, {
		name:   "healthy entry is no taint",
		devs:   []gpu.Device{h100},
		health: Health{"GPU-1": {UUID: "GPU-1", Healthy: true}},
		check:  func(t *testing.T, out []resourceapi.Device) { assert.Empty(t, out[0].Taints) },
	}, {
		name: "admin-fixed mode",
		devs: []gpu.Device{h100},
		mode: "MPS",
		check: func(t *testing.T, out []resourceapi.Device) {
			assert.Equal(t, "MPS", *out[0].Attributes[AttrMode].StringValue)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, BuildDevices(tc.devs, tc.health, tc.mode))
		})
	}
}

func TestBuildDevicesDevicePluginTaint(t *testing.T) {
	devs := []gpu.Device{{UUID: "GPU-0", Index: 0, MemoryBytes: 1 << 30}, {UUID: "GPU-1", Index: 1, MemoryBytes: 1 << 30}}
	held := func(v string) resourceapi.DeviceTaint {
		return resourceapi.DeviceTaint{Key: TaintDevicePlugin, Value: v, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	unhealthy := resourceapi.DeviceTaint{Key: TaintUnhealthy, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	const uid = "0f6b7c1e-3a5d-4c2b-9e8f-1a2b3c4d5e6f"
	whole := DevicePluginMark{Taint: TaintValueWhole, Pod: uid}
	shared := DevicePluginMark{Taint: TaintValueShared}
	for _, tc := range []struct {
		name    string
		health  Health
		held    DevicePluginHeld
		want    [][]resourceapi.DeviceTaint // per GPU
		wantPod []string                    // per GPU: its AttrDevicePluginPod, "" for none
	}{
		{"nothing held", nil, nil, [][]resourceapi.DeviceTaint{nil, nil}, []string{"", ""}},
		{"whole", nil, DevicePluginHeld{"GPU-1": whole}, [][]resourceapi.DeviceTaint{nil, {held("whole")}}, []string{"", uid}},
		{"shared", nil, DevicePluginHeld{"GPU-0": shared}, [][]resourceapi.DeviceTaint{{held("shared")}, nil}, []string{"", ""}},
		{"with the unhealthy taint", Health{"GPU-1": {UUID: "GPU-1", XID: 79}}, DevicePluginHeld{"GPU-1": shared},
			[][]resourceapi.DeviceTaint{nil, {unhealthy, held("shared")}}, []string{"", ""}},
		{"released again", Health{"GPU-1": {UUID: "GPU-1", XID: 79}}, DevicePluginHeld{},
			[][]resourceapi.DeviceTaint{nil, {unhealthy}}, []string{"", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := BuildDevicesHeld(devs, tc.health, tc.held, "")
			require.Len(t, out, 2)
			for i := range out {
				assert.Equal(t, tc.want[i], out[i].Taints, out[i].Name)
				got := ""
				if a, ok := out[i].Attributes[AttrDevicePluginPod]; ok {
					got = *a.StringValue
				}
				assert.Equal(t, tc.wantPod[i], got, out[i].Name)
			}
		})
	}
}

func TestDevicePluginHeld(t *testing.T) {
	const gi = uint64(1) << 30
	d, _ := newUnitDriver(t, "h100-sxm-8")
	t.Cleanup(func() { releaseAllPods(d) })
	ctx := context.Background()
	assert.Empty(t, d.devicePluginHeld())
	_, err := d.AllocatePod(ctx, wholePod("w", 0, 1))
	require.NoError(t, err)
	_, err = d.AllocatePod(ctx, sharePod("s", 2, 10*gi, v1alpha1.NewTimeSlicingConfig("")))
	require.NoError(t, err)
	// A claim is not the device plugin's: no taint for it.
	c := claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-3", "")}, exclusive)
	prepare(t, d, c)
	t.Cleanup(func() { unprepare(t, d, c) })
	w := DevicePluginMark{Taint: TaintValueWhole, Pod: "pod-w"}
	shared := DevicePluginMark{Taint: TaintValueShared}
	assert.Equal(t, DevicePluginHeld{fakeUUID(0): w, fakeUUID(1): w, fakeUUID(2): shared}, d.devicePluginHeld())
	_, err = d.ReleasePod(ctx, "pod-w")
	require.NoError(t, err)
	assert.Equal(t, DevicePluginHeld{fakeUUID(2): shared}, d.devicePluginHeld())
}

func TestBuildDevicesFakeProfiles(t *testing.T) {
	for _, tc := range []struct {
		profile string
		gpus    int
		domains int
		peers   int64
		clique  string
	}{
		{"h100-sxm-8", 8, 1, 7, ""},
		{"a100-pcie-4", 4, 2, 1, ""},
		{"l4-2", 2, 2, 0, ""},
		{"gb200-nvl72", 4, 1, 3, gpu.FakeClusterUUID.String() + ".1"},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			f, err := gpu.NewFake(tc.profile, "node-a")
			require.NoError(t, err)
			devs, err := f.Devices()
			require.NoError(t, err)
			out := BuildDevices(devs, nil, "")
			require.Len(t, out, tc.gpus)
			domains := map[string]bool{}
			for _, d := range out {
				domains[*d.Attributes[AttrNVLinkDomain].StringValue] = true
				assert.Equal(t, tc.peers, *d.Attributes[AttrNVLinkPeers].IntValue)
				if c, ok := d.Attributes[AttrClique]; tc.clique == "" {
					assert.False(t, ok, "a clique attribute without a clique")
				} else {
					assert.Equal(t, tc.clique, *c.StringValue)
				}
			}
			assert.Len(t, domains, tc.domains)
			// Deterministic: equal input, deeply equal output (no churn on restart).
			assert.Equal(t, out, BuildDevices(devs, nil, ""))
		})
	}
}

func TestDeviceIndex(t *testing.T) {
	for in, want := range map[string]int{"gpu-0": 0, "gpu-12": 12, "gpu-01": -1, "gpu-": -1, "cpu-1": -1, "gpu--1": -1} {
		assert.Equal(t, want, deviceIndex(in), in)
	}
}
