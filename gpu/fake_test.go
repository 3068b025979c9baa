package gpu

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const gib = uint64(1) << 30

func newFake(t *testing.T, profile string) *Fake {
	t.Helper()
	f, err := NewFake(profile, "node-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func TestProfilesListed(t *testing.T) {
	assert.Equal(t, []string{"a100-pcie-4", "gb200-nvl72", "h100-sxm-8", "h200-sxm-8", "l4-2"}, Profiles())
}

func TestFakeProfiles(t *testing.T) {
	tests := []struct {
		profile        string
		count          int
		product        string
		arch           string
		cc             string
		memory         uint64
		sms            int
		mig            bool
		domains        int   // distinct NVLink domains
		peers          []int // NVLink peer count per GPU
		numa           []int
		firstBus, root string
	}{
		{
			profile: "h100-sxm-8", count: 8, product: "NVIDIA H100 80GB HBM3", arch: "Hopper", cc: "9.0",
			memory: 80 * gib, sms: 132, mig: true, domains: 1,
			peers:    []int{7, 7, 7, 7, 7, 7, 7, 7},
			numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
			firstBus: "0000:18:00.0", root: "pci0000:10",
		},
		{
			profile: "h200-sxm-8", count: 8, product: "NVIDIA H200 141GB HBM3e", arch: "Hopper", cc: "9.0",
			memory: 141 * gib, sms: 132, mig: true, domains: 1,
			peers:    []int{7, 7, 7, 7, 7, 7, 7, 7},
			numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
			firstBus: "0000:18:00.0", root: "pci0000:10",
		},
		{
			profile: "a100-pcie-4", count: 4, product: "NVIDIA A100-PCIE-40GB", arch: "Ampere", cc: "8.0",
			memory: 40 * gib, sms: 108, mig: true, domains: 2,
			peers:    []int{1, 1, 1, 1},
			numa:     []int{0, 0, 1, 1},
			firstBus: "0000:31:00.0", root: "pci0000:30",
		},
		{
			profile: "gb200-nvl72", count: 4, product: "NVIDIA GB200", arch: "Blackwell", cc: "10.0",
			memory: 189471 << 20, sms: 148, mig: true, domains: 1,
			peers:    []int{3, 3, 3, 3},
			numa:     []int{0, 0, 1, 1},
			firstBus: "0000:01:00.0", root: "pci0000:00",
		},
		{
			profile: "l4-2", count: 2, product: "NVIDIA L4", arch: "Ada Lovelace", cc: "8.9",
			memory: 24 * gib, sms: 58, mig: false, domains: 2,
			peers:    []int{0, 0},
			numa:     []int{0, 1},
			firstBus: "0000:01:00.0", root: "pci0000:00",
		},
	}
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			f := newFake(t, tc.profile)
			devs, err := f.Devices()
			require.NoError(t, err)
			require.Len(t, devs, tc.count)
			domains := map[string]bool{}
			for i, d := range devs {
				assert.Equal(t, i, d.Index)
				assert.Regexp(t, uuidRE, d.UUID)
				assert.Equal(t, FakeUUID("node-a", i), d.UUID)
				assert.Equal(t, tc.product, d.ProductName)
				assert.Equal(t, tc.arch, d.Architecture)
				assert.Equal(t, tc.cc, d.CUDAComputeCapability)
				assert.Equal(t, "550.54.15", d.DriverVersion)
				assert.Equal(t, "12.4", d.CUDADriverVersion)
				assert.Equal(t, tc.memory, d.MemoryBytes)
				assert.Equal(t, tc.sms, d.Multiprocessors)
				assert.Equal(t, tc.mig, d.MIGCapable)
				assert.Equal(t, tc.numa[i], d.NUMANode)
				assert.Len(t, d.NVLinkPeers, tc.peers[i], "GPU %d peers %v", i, d.NVLinkPeers)
				assert.NotContains(t, d.NVLinkPeers, i)
				assert.Regexp(t, `^0000:[0-9a-f]{2}:00\.0$`, d.PCIBusID)
				assert.Regexp(t, `^pci0000:[0-9a-f]{2}$`, d.PCIeRoot)
				domains[d.NVLinkDomain] = true
			}
			assert.Len(t, domains, tc.domains)
			assert.Equal(t, tc.firstBus, devs[0].PCIBusID)
			assert.Equal(t, tc.root, devs[0].PCIeRoot)
			// The domain is named after its lowest-indexed member.
			assert.Equal(t, devs[0].UUID, devs[0].NVLinkDomain)
		})
	}
}

func TestA100PairsShareDomains(t *testing.T) {
	devs, err := newFake(t, "a100-pcie-4").Devices()
	require.NoError(t, err)
	assert.Equal(t, []int{1}, devs[0].NVLinkPeers)
	assert.Equal(t, []int{0}, devs[1].NVLinkPeers)
	assert.Equal(t, []int{3}, devs[2].NVLinkPeers)
	assert.Equal(t, []int{2}, devs[3].NVLinkPeers)
	assert.Equal(t, devs[0].NVLinkDomain, devs[1].NVLinkDomain)
	assert.Equal(t, devs[2].NVLinkDomain, devs[3].NVLinkDomain)
	assert.NotEqual(t, devs[0].NVLinkDomain, devs[2].NVLinkDomain)
	assert.Equal(t, devs[2].UUID, devs[3].NVLinkDomain)
}

func TestH100AllPeers(t *testing.T) {
	devs, err := newFake(t, "h100-sxm-8").Devices()
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6}, devs[7].NVLinkPeers)
	for _, d := range devs {
		assert.Equal(t, devs[0].UUID, d.NVLinkDomain)
	}
}

func TestL4OwnDomains(t *testing.T) {
	devs, err := newFake(t, "l4-2").Devices()
	require.NoError(t, err)
	for _, d := range devs {
		assert.Empty(t, d.NVLinkPeers)
		assert.Equal(t, d.UUID, d.NVLinkDomain)
	}
}

func TestUUIDs(t *testing.T) {
	a1, err := NewFake("h100-sxm-8", "node-a")
	require.NoError(t, err)
	a2, err := NewFake("h100-sxm-8", "node-a")
	require.NoError(t, err)
	b, err := NewFake("h100-sxm-8", "node-b")
	require.NoError(t, err)
	da1, err := a1.Devices()
	require.NoError(t, err)
	da2, err := a2.Devices()
	require.NoError(t, err)
	db, err := b.Devices()
	require.NoError(t, err)

	seen := map[string]bool{}
	for i := range da1 {
		assert.Equal(t, da1[i].UUID, da2[i].UUID, "stable across restarts")
		assert.NotEqual(t, da1[i].UUID, db[i].UUID, "different across nodes")
		seen[da1[i].UUID] = true
		seen[db[i].UUID] = true
	}
	assert.Len(t, seen, 16, "unique on and across nodes")
	// The mock looks GPUs up by the same UUIDs.
	h, ret := a1.NVML().DeviceGetHandleByUUID(da1[3].UUID)
	require.Equal(t, "SUCCESS", retName(ret))
	idx, _ := h.GetIndex()
	assert.Equal(t, 3, idx)
}

func TestNewFakeErrors(t *testing.T) {
	_, err := NewFake("h100-sxm-9", "node-a")
	assert.ErrorContains(t, err, `unknown fake GPU profile "h100-sxm-9"`)
	assert.ErrorContains(t, err, "h100-sxm-8")
	_, err = NewFake("/nonexistent/profile.yaml", "node-a")
	assert.ErrorContains(t, err, "no such file")
	_, err = NewFake("l4-2", "")
	assert.ErrorContains(t, err, "node name")
}

func TestSettingsRecorded(t *testing.T) {
	f := newFake(t, "l4-2")
	uuid := FakeUUID("node-a", 1)
	assert.Equal(t, ComputeModeDefault, f.ComputeMode(1))
	require.NoError(t, f.SetComputeMode(uuid, ComputeModeExclusiveProcess))
	assert.Equal(t, ComputeModeExclusiveProcess, f.ComputeMode(1))
	assert.Equal(t, ComputeModeDefault, f.ComputeMode(0))
	require.NoError(t, f.SetComputeMode(uuid, ComputeModeDefault))
	assert.Equal(t, ComputeModeDefault, f.ComputeMode(1))

	assert.Equal(t, TimeSliceDefault, f.TimeSlice(1))
	require.NoError(t, f.SetTimeSlice(uuid, TimeSliceLong))
	assert.Equal(t, TimeSliceLong, f.TimeSlice(1))

	assert.ErrorContains(t, f.SetTimeSlice(uuid, "Forever"), "unknown interval")
	assert.ErrorContains(t, f.SetComputeMode("GPU-nope", ComputeModeDefault), "GPU-nope")
	assert.ErrorContains(t, f.SetTimeSlice("GPU-nope", TimeSliceShort), "GPU-nope")

	require.NoError(t, f.Remove(1))
	assert.ErrorContains(t, f.SetComputeMode(uuid, ComputeModeExclusiveProcess), "lost")
}

func nextEvent(t *testing.T, ch <-chan HealthEvent) HealthEvent {
	t.Helper()
	select {
	case e, ok := <-ch:
		require.True(t, ok, "health stream closed")
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no health event within 5s")
	}
	return HealthEvent{}
}

func noEvent(t *testing.T, ch <-chan HealthEvent, d time.Duration) {
	t.Helper()
	select {
	case e := <-ch:
		t.Fatalf("unexpected health event %+v", e)
	case <-time.After(d):
	}
}

func TestHealthXIDAndRecovery(t *testing.T) {
	f, err := NewFake("h100-sxm-8", "node-a", WithHealthProbeInterval(20*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := f.Health(ctx)
	time.Sleep(50 * time.Millisecond) // let the stream register for events

	// An application XID leaves the GPU healthy.
	require.NoError(t, f.InjectXID(2, 13))
	noEvent(t, ch, 150*time.Millisecond)

	require.NoError(t, f.InjectXID(2, 48))
	e := nextEvent(t, ch)
	assert.False(t, e.Healthy)
	assert.Equal(t, 2, e.Index)
	assert.Equal(t, FakeUUID("node-a", 2), e.UUID)
	assert.Equal(t, uint64(48), e.XID)
	assert.Contains(t, e.Reason, "XID 48")
	assert.False(t, e.Time.IsZero())

	// Still faulted: no recovery without a reset.
	noEvent(t, ch, 150*time.Millisecond)

	require.NoError(t, f.Recover(2))
	e = nextEvent(t, ch)
	assert.True(t, e.Healthy)
	assert.Equal(t, 2, e.Index)

	// A GPU that falls off the bus.
	require.NoError(t, f.Remove(5))
	e = nextEvent(t, ch)
	assert.False(t, e.Healthy)
	assert.Equal(t, 5, e.Index)
	assert.Equal(t, FakeUUID("node-a", 5), e.UUID)

	// Devices skips the lost GPU; the others keep their indices and links.
	devs, err := f.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 7)
	for _, d := range devs {
		assert.NotEqual(t, 5, d.Index)
		assert.NotContains(t, d.NVLinkPeers, 5)
		assert.Len(t, d.NVLinkPeers, 6)
	}

	require.NoError(t, f.Recover(5))
	e = nextEvent(t, ch)
	assert.True(t, e.Healthy)
	assert.Equal(t, 5, e.Index)
	devs, err = f.Devices()
	require.NoError(t, err)
	assert.Len(t, devs, 8)

	cancel()
	for range ch { // the stream closes when ctx is done
	}

	assert.Error(t, f.InjectXID(8, 79))
	assert.Error(t, f.Remove(-1))
	assert.Error(t, f.Recover(99))
}

func TestHealthQuietPeriod(t *testing.T) {
	f, err := NewFake("l4-2", "node-a",
		WithHealthProbeInterval(20*time.Millisecond), WithRecoveryQuietPeriod(300*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := f.Health(ctx)
	time.Sleep(50 * time.Millisecond)

	require.NoError(t, f.InjectXID(0, 119))
	start := time.Now()
	assert.False(t, nextEvent(t, ch).Healthy)
	require.NoError(t, f.Recover(0))
	e := nextEvent(t, ch)
	assert.True(t, e.Healthy)
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "recovered before the quiet period")
}

func TestHealthTwoStreams(t *testing.T) {
	f, err := NewFake("l4-2", "node-a", WithHealthProbeInterval(20*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := f.Health(ctx), f.Health(ctx)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, f.InjectXID(1, 79))
	assert.Equal(t, 1, nextEvent(t, a).Index)
	assert.Equal(t, 1, nextEvent(t, b).Index)
}

// TestHealthXIDRightAfterSubscribing: an XID raised the moment Health
// returns is reported; the event set is registered before the call returns
// (it once was not, and a test that wrote its fault at once lost it).
func TestHealthXIDRightAfterSubscribing(t *testing.T) {
	for range 20 {
		f, err := NewFake("l4-2", "node-a", WithHealthProbeInterval(time.Hour))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		ch := f.Health(ctx)
		require.NoError(t, f.InjectXID(1, 48))
		e := nextEvent(t, ch)
		assert.Equal(t, 1, e.Index)
		assert.False(t, e.Healthy)
		cancel()
		_ = f.Close()
	}
}

func TestCustomProfile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mixed.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
driverVersion: "560.35.03"
cudaDriverVersion: "12.6"
gpus:
- model: a100-sxm-80gb
  count: 2
  numaNode: 1
  pciBusIDs: ["0000:a1:00.0", "0000:a2:00.0"]
  pcieRoot: pci0000:a0
- productName: Tessera Test GPU
  architecture: Hopper
  computeCapability: "9.0"
  memory: 96Gi
  multiprocessors: 100
nvlink:
  bridges:
  - gpus: [0, 1]
    links: 6
`), 0o644))
	f, err := NewFake(path, "node-x")
	require.NoError(t, err)
	devs, err := f.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 3)
	assert.Equal(t, "NVIDIA A100-SXM4-80GB", devs[0].ProductName)
	assert.Equal(t, 80*gib, devs[0].MemoryBytes)
	assert.Equal(t, "560.35.03", devs[0].DriverVersion)
	assert.Equal(t, "12.6", devs[0].CUDADriverVersion)
	assert.Equal(t, 1, devs[1].NUMANode)
	assert.Equal(t, "0000:a2:00.0", devs[1].PCIBusID)
	assert.Equal(t, "pci0000:a0", devs[1].PCIeRoot)
	assert.Equal(t, []int{1}, devs[0].NVLinkPeers)
	assert.Equal(t, devs[0].NVLinkDomain, devs[1].NVLinkDomain)
	assert.True(t, devs[0].MIGCapable)

	c := devs[2]
	assert.Equal(t, "Tessera Test GPU", c.ProductName)
	assert.Equal(t, "Hopper", c.Architecture)
	assert.Equal(t, 96*gib, c.MemoryBytes)
	assert.Equal(t, 100, c.Multiprocessors)
	assert.False(t, c.MIGCapable)
	assert.Equal(t, 0, c.NUMANode)
	assert.Equal(t, "0000:28:00.0", c.PCIBusID) // generated from the index
	assert.Equal(t, "pci0000:20", c.PCIeRoot)
	assert.Empty(t, c.NVLinkPeers)
	assert.Equal(t, c.UUID, c.NVLinkDomain)
	assert.Equal(t, FakeUUID("node-x", 2), c.UUID)

	// go-gpuallocator picks the bridged pair.
	got, err := PreferredAllocation(f, []string{devs[2].UUID, devs[1].UUID, devs[0].UUID}, nil, 2)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{devs[0].UUID, devs[1].UUID}, got)
}

func TestCustomProfileInvalid(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown field", "gpus:\n- model: l4-24gb\n  cout: 2\n", `unknown field "gpus[0].cout"`},
		{"unknown top field", "gpu: []\n", `unknown field "gpu"`},
		{"wrong type", "gpus:\n- model: l4-24gb\n  count: two\n", "count"},
		{"no gpus", "driverVersion: \"1\"\n", "gpus: at least one"},
		{"unknown model", "gpus:\n- model: h300\n", `gpus[0].model: unknown model "h300"`},
		{"missing attribute", "gpus:\n- productName: X\n  architecture: Hopper\n  computeCapability: \"9.0\"\n  memory: 1Gi\n", "gpus[0].multiprocessors: required"},
		{"bad arch", "gpus:\n- model: l4-24gb\n  architecture: Fermi\n", `gpus[0].architecture: unknown architecture "Fermi"`},
		{"bad memory", "gpus:\n- model: l4-24gb\n  memory: 24GB\n", `gpus[0].memory: "24GB"`},
		{"bad cc", "gpus:\n- model: l4-24gb\n  computeCapability: nine\n", "gpus[0].computeCapability"},
		{"bus count", "gpus:\n- model: l4-24gb\n  count: 2\n  pciBusIDs: [\"0000:01:00.0\"]\n", "gpus[0].pciBusIDs: has 1 entries for 2 GPUs"},
		{"bad bus", "gpus:\n- model: l4-24gb\n  pciBusIDs: [\"1:2:3\"]\n", "gpus[0].pciBusIDs[0]"},
		{"dup bus", "gpus:\n- model: l4-24gb\n  pciBusIDs: [\"0000:01:00.0\"]\n- model: l4-24gb\n  pciBusIDs: [\"0000:01:00.0\"]\n", "gpus[1].pciBusIDs[0]: 0000:01:00.0 is already used by GPU 0"},
		{"bad root", "gpus:\n- model: l4-24gb\n  pcieRoot: root0\n", "gpus[0].pcieRoot"},
		{"negative numa", "gpus:\n- model: l4-24gb\n  numaNode: -2\n", "gpus[0].numaNode"},
		{"no mig profiles", "gpus:\n- model: l4-24gb\n  migCapable: true\n", "gpus[0].migCapable"},
		{"too many", "gpus:\n- model: l4-24gb\n  count: 17\n", "gpus[0].count: a profile holds at most 16"},
		{"bridge range", "gpus:\n- model: l4-24gb\n  count: 2\nnvlink:\n  bridges:\n  - gpus: [0, 2]\n", "nvlink.bridges[0].gpus: index 2 out of range"},
		{"bridge self", "gpus:\n- model: l4-24gb\n  count: 2\nnvlink:\n  bridges:\n  - gpus: [1, 1]\n", "nvlink.bridges[0].gpus: a GPU cannot be bridged to itself"},
		{"bridge dup", "gpus:\n- model: l4-24gb\n  count: 2\nnvlink:\n  bridges:\n  - gpus: [0, 1]\n  - gpus: [1, 0]\n", "nvlink.bridges[1].gpus: GPUs 0 and 1 are already bridged"},
		{"too many links", "gpus:\n- model: l4-24gb\n  count: 2\nnvlink:\n  bridges:\n  - gpus: [0, 1]\n    links: 19\n", "nvlink.bridges[0].links: 19 is out of range (0 to 18, 0 meaning 4)"},
		{"too many links in all", "gpus:\n- model: l4-24gb\n  count: 3\nnvlink:\n  bridges:\n  - gpus: [0, 1]\n    links: 10\n  - gpus: [0, 2]\n    links: 10\n", "GPU 0 has 20 links"},
		// Found by FuzzParseProfile: the per-GPU sums overflowed to negative
		// and passed, and building the fake then made 2⁶² links.
		{"links that overflow", "gpus: [{model: l4-24gb, count: 3}]\nnvlink: {bridges: [{gpus: [0, 1], links: 4611686018427387904}, {gpus: [1, 2], links: 4611686018427387904}, {gpus: [0, 2], links: 4611686018427387904}]}\n", "nvlink.bridges[0].links: 4611686018427387904 is out of range"},
		{"switch and bridges", "gpus:\n- model: l4-24gb\n  count: 2\nnvlink:\n  nvswitch: true\n  bridges:\n  - gpus: [0, 1]\n", "either nvswitch or bridges"},
		{"bad cuda version", "cudaDriverVersion: twelve\ngpus:\n- model: l4-24gb\n", "cudaDriverVersion"},
	}
	dir := t.TempDir()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, string(rune('a'+i))+".yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o644))
			_, err := NewFake(path, "node-a")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), path, "the error names the file")
		})
	}
}

func TestProfileExampleInReadme(t *testing.T) {
	f, err := NewFake("testdata/example-profile.yaml", "node-a")
	require.NoError(t, err)
	devs, err := f.Devices()
	require.NoError(t, err)
	assert.NotEmpty(t, devs)
}
