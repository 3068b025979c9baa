package driver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

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

func TestBuildDevicesFakeProfiles(t *testing.T) {
	for _, tc := range []struct {
		profile string
		gpus    int
		domains int
		peers   int64
	}{
		{"h100-sxm-8", 8, 1, 7},
		{"a100-pcie-4", 4, 2, 1},
		{"l4-2", 2, 2, 0},
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
