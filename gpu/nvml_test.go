package gpu

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRealNVML runs against the machine's GPUs, and skips where there are none.
func TestRealNVML(t *testing.T) {
	inv, err := NewNVML()
	if errors.Is(err, ErrNVMLUnavailable) {
		t.Skipf("no NVML on this machine: %v", err)
	}
	require.NoError(t, err)
	defer func() { assert.NoError(t, inv.Close()) }()
	devs, err := inv.Devices()
	require.NoError(t, err)
	if len(devs) == 0 {
		t.Skip("NVML loaded but reports no GPUs")
	}
	for _, d := range devs {
		t.Logf("%+v", d)
		assert.Regexp(t, `^GPU-`, d.UUID)
		assert.NotEmpty(t, d.ProductName)
		assert.NotZero(t, d.MemoryBytes)
		assert.Positive(t, d.Multiprocessors, "SM count: published as the multiprocessors attribute")
		assert.Regexp(t, `^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`, d.PCIBusID)
		assert.NotEmpty(t, d.NVLinkDomain)
	}
	if len(devs) > 1 {
		got, err := PreferredAllocation(inv, allUUIDs(devs), nil, 2)
		require.NoError(t, err)
		assert.Len(t, got, 2)
	}
}

// TestNewNVMLWithoutLibrary checks the error (not a panic) when
// libnvidia-ml is missing; on a GPU machine there is nothing to check.
func TestNewNVMLWithoutLibrary(t *testing.T) {
	inv, err := NewNVML()
	if err == nil {
		_ = inv.Close()
		t.Skip("NVML is present on this machine")
	}
	assert.ErrorIs(t, err, ErrNVMLUnavailable)
	assert.Contains(t, err.Error(), "libnvidia-ml.so.1")
	assert.Contains(t, err.Error(), "--fake-gpus")
}

func TestPCIBusIDFormat(t *testing.T) {
	assert.Equal(t, "0000:18:00.0", pciBusID(nvmlPciInfo("0000:18:00.0", 0)))
	assert.Equal(t, "0001:ab:00.0", pciBusID(nvmlPciInfo("0001:AB:00.0", 0)))
	assert.Equal(t, "", pciBusID(nvml.PciInfo{}))
}

func TestXIDs(t *testing.T) {
	assert.False(t, IsCriticalXID(13))
	assert.False(t, IsCriticalXID(31))
	assert.True(t, IsCriticalXID(79))
	assert.True(t, IsCriticalXID(48))
	assert.Equal(t, "XID 79: GPU has fallen off the bus", XIDReason(79))
	assert.Equal(t, "XID 1234: critical GPU error", XIDReason(1234))
	// A real H200 reports a kernel's write to an unmapped address as XID 31.
	assert.Equal(t, "XID 31: GPU memory page fault (an application's)", XIDReason(31))
	for xid := range applicationXIDs {
		assert.NotContains(t, XIDReason(xid), "critical", "XID %d", xid)
	}
}

// TestMultiprocessors covers the three sources of the SM count, in order: a
// real H200 on driver 580 answers only the core count.
func TestMultiprocessors(t *testing.T) {
	const h200 = 0x233510DE
	tests := []struct {
		name     string
		attrs    nvml.Return
		cores    int
		coresRet nvml.Return
		pciID    uint32
		cc       [2]int
		want     int
	}{
		{"attributes answer", nvml.SUCCESS, 0, nvml.ERROR_NOT_SUPPORTED, 0, [2]int{9, 0}, 77},
		{"core count, Hopper", nvml.ERROR_NOT_SUPPORTED, 132 * 128, nvml.SUCCESS, 0, [2]int{9, 0}, 132},
		{"core count, A100 (64 per SM)", nvml.ERROR_NOT_SUPPORTED, 108 * 64, nvml.SUCCESS, 0, [2]int{8, 0}, 108},
		{"core count, Ada (128 per SM)", nvml.ERROR_NOT_SUPPORTED, 58 * 128, nvml.SUCCESS, 0, [2]int{8, 9}, 58},
		{"core count not a multiple: table", nvml.ERROR_NOT_SUPPORTED, 1000, nvml.SUCCESS, h200, [2]int{9, 0}, 132},
		{"unknown capability: table", nvml.ERROR_NOT_SUPPORTED, 4096, nvml.SUCCESS, h200, [2]int{11, 0}, 132},
		{"nothing answers, unknown ID", nvml.ERROR_NOT_SUPPORTED, 0, nvml.ERROR_NOT_SUPPORTED, 0x1, [2]int{9, 0}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &mock.Device{
				GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
					return nvml.DeviceAttributes{MultiprocessorCount: 77}, tc.attrs
				},
				GetNumGpuCoresFunc: func() (int, nvml.Return) { return tc.cores, tc.coresRet },
			}
			assert.Equal(t, tc.want, multiprocessors(d, tc.pciID, tc.cc[0], tc.cc[1]))
		})
	}
}
