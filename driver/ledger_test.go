package driver

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
)

func fakeUUID(i int) string { return gpu.FakeUUID(node, i) }

// wholePod and sharePod are device-plugin requests as the deviceplugin
// package builds them.
func wholePod(name string, gpus ...int) PodRequest {
	req := PodRequest{UID: "pod-" + name, Namespace: "ns", Name: name, Resource: "nvidia.com/gpu"}
	for _, i := range gpus {
		req.GPUs = append(req.GPUs, fakeUUID(i))
		req.DeviceIDs = append(req.DeviceIDs, fakeUUID(i))
	}
	return req
}

func sharePod(name string, gpuIndex int, mem uint64, cfg *v1alpha1.GpuConfig) PodRequest {
	return PodRequest{UID: "pod-" + name, Namespace: "ns", Name: name, Resource: "tessera.dev/gpu-share",
		DeviceIDs: []string{"gpu-0-slot-0"}, GPUs: []string{fakeUUID(gpuIndex)}, MemoryBytes: mem, Config: cfg}
}

func releaseAllPods(d *Driver) {
	for _, p := range d.PodAllocations() {
		_, _ = d.ReleasePod(context.Background(), p.UID)
	}
}

// TestLedgerBothPaths: claims and device-plugin pods are checked against
// each other, both ways, and refusals name the holder and its path.
func TestLedgerBothPaths(t *testing.T) {
	const gi = uint64(1) << 30
	mps := v1alpha1.NewMPSConfig(0)
	ts := v1alpha1.NewTimeSlicingConfig("")
	// h100-sxm-8: 80 GiB per GPU.
	type step struct {
		claim   *resourceapi.ResourceClaim // or
		pod     *PodRequest
		wantErr []string // nil = granted
	}
	pod := func(r PodRequest) *PodRequest { return &r }
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		name: "whole GPU by the device plugin blocks a claim",
		steps: []step{
			{pod: pod(wholePod("p", 3))},
			{claim: claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-3", "10Gi")}, mpsClass),
				wantErr: []string{"claim ns/c refused on gpu-3", "held whole by pod ns/p (device plugin)"}},
			{claim: claim("ns", "d", "d", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-3", "")}),
				wantErr: []string{"held whole by pod ns/p (device plugin)"}},
			{claim: claim("ns", "e", "e", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-4", "")})},
		},
	}, {
		name: "whole GPU by a claim blocks the device plugin",
		steps: []step{
			{claim: claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-2", "")})},
			{pod: pod(wholePod("p", 1, 2)), wantErr: []string{"pod ns/p refused on gpu-2", "held whole by ResourceClaim ns/c"}},
			{pod: pod(sharePod("s", 2, 10*gi, mps)), wantErr: []string{"held whole by ResourceClaim ns/c"}},
			{pod: pod(wholePod("q", 1))},
		},
	}, {
		name: "a share by the device plugin blocks a whole claim and another mode",
		steps: []step{
			{pod: pod(sharePod("s", 0, 40*gi, mps))},
			{claim: claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "")}),
				wantErr: []string{"sharing mode MPS", "pod ns/s (device plugin)"}},
			{claim: claim("ns", "t", "t", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, timeSliced),
				wantErr: []string{"sharing mode MPS", "a TimeSlicing claim cannot share it", "pod ns/s (device plugin)"}},
			{pod: pod(wholePod("w", 0)), wantErr: []string{"sharing mode MPS", "pod ns/s (device plugin)"}},
		},
	}, {
		name: "mode mixing refused from the device plugin",
		steps: []step{
			{claim: claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-5", "10Gi")}, timeSliced)},
			{pod: pod(sharePod("s", 5, 10*gi, mps)), wantErr: []string{"pod ns/s refused on gpu-5", "sharing mode TimeSlicing", "ResourceClaim ns/c"}},
			{pod: pod(sharePod("t", 5, 10*gi, ts))},
		},
	}, {
		name: "memory over-commit refused both ways",
		steps: []step{
			{pod: pod(sharePod("a", 1, 50*gi, mps))},
			{claim: claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "40Gi")}, mpsClass),
				wantErr: []string{"over-committed", "pod ns/a (device plugin)"}},
			{claim: claim("ns", "d", "d", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "20Gi")}, mpsClass)},
			{pod: pod(sharePod("b", 1, 20*gi, mps)), wantErr: []string{"over-committed", "ResourceClaim ns/d", "pod ns/a (device plugin)"}},
			{pod: pod(sharePod("e", 1, 10*gi, mps))},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newUnitDriver(t, "h100-sxm-8")
			t.Cleanup(func() { releaseAllPods(d) })
			for i, s := range tc.steps {
				var err error
				var uid string
				if s.claim != nil {
					uid = string(s.claim.UID)
					err = prepare(t, d, s.claim)[s.claim.UID].Err
				} else {
					uid = s.pod.UID
					var p *PodCheckpoint
					p, err = d.AllocatePod(context.Background(), *s.pod)
					if err == nil {
						require.Len(t, p.CDIDeviceIDs(), len(s.pod.GPUs), "step %d", i)
						assert.Equal(t, StatePrepared, p.State)
					}
				}
				if s.wantErr == nil {
					require.NoError(t, err, "step %d", i)
					continue
				}
				require.Error(t, err, "step %d", i)
				for _, w := range s.wantErr {
					assert.Contains(t, err.Error(), w, "step %d", i)
				}
				if s.pod != nil {
					assert.ErrorIs(t, err, ErrConflict)
				}
				assert.NotContains(t, d.ckpt.Claims, uid, "a refusal leaves no record")
				assert.NotContains(t, d.ckpt.DevicePlugin, uid, "a refusal leaves no record")
				_, serr := os.Stat(d.cdi.SpecPath(uid))
				assert.True(t, os.IsNotExist(serr), "a refusal writes no CDI spec")
			}
		})
	}
}

// TestLedgerPodLifecycle: allocate is idempotent, sets up MPS like a claim,
// is durable (a restarted driver reloads it), and release undoes it.
func TestLedgerPodLifecycle(t *testing.T) {
	const gi = uint64(1) << 30
	d, record := newUnitDriver(t, "h100-sxm-8")
	t.Cleanup(func() { releaseAllPods(d) })
	ctx := context.Background()

	req := sharePod("s", 2, 20*gi, v1alpha1.NewMPSConfig(0))
	p, err := d.AllocatePod(ctx, req)
	require.NoError(t, err)
	again, err := d.AllocatePod(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, p.CDIDeviceIDs(), again.CDIDeviceIDs(), "a kubelet retry gets the same answer")
	assert.Equal(t, []string{"start_" + fakeUUID(2)}, recordOf(t, record), "one MPS daemon")
	_, err = os.Stat(d.cdi.SpecPath(req.UID))
	require.NoError(t, err, "CDI spec written")

	other := req
	other.Resource = "nvidia.com/gpu"
	_, err = d.AllocatePod(ctx, other)
	require.ErrorContains(t, err, "already holds tessera.dev/gpu-share")

	// "Crash": a new driver on the same files reloads the entry.
	stored, err := d.store.Load("boot")
	require.NoError(t, err)
	require.Contains(t, stored.DevicePlugin, req.UID)
	got := stored.DevicePlugin[req.UID]
	assert.Equal(t, StatePrepared, got.State)
	assert.Equal(t, "tessera.dev/gpu-share", got.Resource)
	assert.Equal(t, []string{"gpu-0-slot-0"}, got.DeviceIDs)
	require.Len(t, got.Devices, 1)
	assert.Equal(t, "gpu-2", got.Devices[0].Device)
	assert.Equal(t, 20*gi, got.Devices[0].MemoryBytes)
	assert.Equal(t, "MPS", got.Devices[0].Strategy)
	assert.Equal(t, p.CDIDeviceIDs()[0], got.Devices[0].CDIDeviceID)

	d2 := reopen(t, d)
	require.Len(t, d2.PodAllocations(), 1)
	_, err = d2.AllocatePod(ctx, sharePod("big", 2, 70*gi, v1alpha1.NewMPSConfig(0)))
	require.ErrorContains(t, err, "pod ns/s (device plugin)", "the reloaded entry still holds its memory")
	_, err = os.Stat(d2.cdi.SpecPath(req.UID))
	require.NoError(t, err, "restore keeps the pod's CDI spec")

	released, err := d.ReleasePod(ctx, req.UID)
	require.NoError(t, err)
	assert.True(t, released)
	released, err = d.ReleasePod(ctx, req.UID)
	require.NoError(t, err)
	assert.False(t, released, "release is idempotent")
	_, err = os.Stat(d.cdi.SpecPath(req.UID))
	assert.True(t, os.IsNotExist(err), "CDI spec removed")
	rec := recordOf(t, record)
	require.Len(t, rec, 2)
	assert.Equal(t, "quit_"+fakeUUID(2), rec[1])
	stored, err = d.store.Load("boot")
	require.NoError(t, err)
	assert.Empty(t, stored.DevicePlugin)
}

// TestLedgerPodContainers: the kubelet calls Allocate once per container;
// a pod's second container adds its GPUs to the pod's one entry, with its
// own request (CDI devices), and the pod's release frees them all.
func TestLedgerPodContainers(t *testing.T) {
	const gi = uint64(1) << 30
	d, _ := newUnitDriver(t, "h100-sxm-8")
	t.Cleanup(func() { releaseAllPods(d) })
	ctx := context.Background()

	first, err := d.AllocatePod(ctx, wholePod("p", 0))
	require.NoError(t, err)
	second, err := d.AllocatePod(ctx, wholePod("p", 1, 2))
	require.NoError(t, err)
	require.Len(t, d.PodAllocations(), 1, "one entry per pod")
	e := d.PodAllocations()[0]
	assert.Equal(t, []string{fakeUUID(0), fakeUUID(1), fakeUUID(2)}, e.DeviceIDs)
	require.Len(t, e.Devices, 3)
	assert.Equal(t, []string{"nvidia.com/gpu", "nvidia.com/gpu/1", "nvidia.com/gpu/1"}, []string{e.Devices[0].Request, e.Devices[1].Request, e.Devices[2].Request})
	assert.Equal(t, first.CDIDeviceIDs(), second.CDIDeviceIDs(fakeUUID(0)), "the first container's CDI device is unchanged")
	assert.Len(t, second.CDIDeviceIDs(fakeUUID(1), fakeUUID(2)), 2)

	// A retry of either container (or an init container's GPUs reused) is
	// answered from the entry, without counting anything twice.
	again, err := d.AllocatePod(ctx, wholePod("p", 2, 1))
	require.NoError(t, err)
	assert.Equal(t, second.CDIDeviceIDs(), again.CDIDeviceIDs())
	require.Len(t, d.PodAllocations()[0].Devices, 3)

	for _, tc := range []struct {
		name string
		req  PodRequest
		want string
	}{
		{"overlapping container", wholePod("p", 2, 3), "already holds GPUs"},
		{"GPU held by another pod", func() PodRequest { _, _ = d.AllocatePod(ctx, wholePod("q", 4)); return wholePod("p", 4) }(), "held whole by pod ns/q (device plugin)"},
		{"share after whole GPUs", func() PodRequest {
			r := sharePod("p", 5, gi, v1alpha1.NewMPSConfig(0))
			r.Resource = "nvidia.com/gpu"
			return r
		}(), "already holds GPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.AllocatePod(ctx, tc.req)
			require.ErrorContains(t, err, tc.want)
			assert.Len(t, d.PodAllocations()[0].Devices, 3, "the entry is unchanged")
		})
	}

	// Restart: the entry comes back with all three GPUs.
	d2 := reopen(t, d)
	_, err = d2.AllocatePod(ctx, wholePod("r", 2))
	require.ErrorContains(t, err, "held whole by pod ns/p (device plugin)")

	released, err := d.ReleasePod(ctx, "pod-p")
	require.NoError(t, err)
	assert.True(t, released)
	_, err = d.AllocatePod(ctx, wholePod("r", 0, 1, 2))
	require.NoError(t, err, "all of the pod's GPUs are free again")
}

func TestLedgerPodErrors(t *testing.T) {
	d, _ := newUnitDriver(t, "l4-2")
	ctx := context.Background()
	bad := wholePod("p", 0)
	bad.GPUs = []string{"GPU-not-here"}
	_, err := d.AllocatePod(ctx, bad)
	require.ErrorContains(t, err, "GPU GPU-not-here is not on node node-a")
	assert.NotErrorIs(t, err, ErrConflict)

	big := sharePod("s", 0, 1<<50, v1alpha1.NewMPSConfig(0))
	_, err = d.AllocatePod(ctx, big)
	require.ErrorContains(t, err, "share memory")

	two := sharePod("t", 0, 1<<30, v1alpha1.NewMPSConfig(0))
	two.GPUs = append(two.GPUs, fakeUUID(1))
	_, err = d.AllocatePod(ctx, two)
	require.ErrorContains(t, err, "a MPS share is of one GPU")
	assert.Empty(t, d.PodAllocations())
}

// reopen is a new driver on d's checkpoint and CDI directory, restored as
// at start: what a restarted tessera-node sees.
func reopen(t *testing.T, d *Driver) *Driver {
	t.Helper()
	d2, _ := newUnitDriver(t, "h100-sxm-8")
	d2.store = d.store
	d2.cdi = d.cdi
	d2.bootID = "boot"
	require.NoError(t, d2.restore(context.Background()))
	return d2
}

func recordOf(t *testing.T, record string) []string { return drivertest.Record(t, record) }
