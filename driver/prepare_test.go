package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/sharing"
)

const node = "node-a"

// newUnitDriver is a Driver without sockets or API server: the prepare path
// only (checkpoint, ledger, sharing, CDI).
func newUnitDriver(t *testing.T, profile string) (*Driver, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := gpu.NewFake(profile, node)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	devs, err := f.Devices()
	require.NoError(t, err)
	control, record := drivertest.MPSStandIn(t, dir)
	mps := sharing.NewMPSManager(f, sharing.MPSOptions{Control: control, Root: drivertest.ShortTempDir(t), Env: []string{drivertest.RecordEnv + "=" + record}})
	w, err := cdi.New(cdi.Options{Root: filepath.Join(dir, "cdi"), Fake: true})
	require.NoError(t, err)
	d := &Driver{
		opts:    Options{NodeName: node},
		store:   checkpointStore{path: filepath.Join(dir, CheckpointFile)},
		ckpt:    NewCheckpoint("boot"),
		cdi:     w,
		sharing: sharing.NewManager(f, mps),
		devices: map[string]gpu.Device{},
		byUUID:  map[string]gpu.Device{},
		sorted:  devs,
		changed: make(chan struct{}),
	}
	d.metrics = newMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 })
	for _, g := range devs {
		d.devices[DeviceName(g.Index)] = g
		d.byUUID[g.UUID] = g
	}
	t.Cleanup(func() {
		// Stop stand-in daemons left by a failing test.
		for _, cl := range d.ckpt.SortedClaims() {
			_ = d.undo(context.Background(), cl)
		}
	})
	return d, record
}

func prepare(t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	require.NoError(t, err)
	require.Len(t, res, len(claims))
	return res
}

func unprepare(t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, c := range claims {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: c.UID})
	}
	res, err := d.UnprepareResourceClaims(context.Background(), objs)
	require.NoError(t, err)
	for uid, err := range res {
		require.NoError(t, err, uid)
	}
}

var (
	r             = drivertest.Result
	claim         = drivertest.Claim
	mpsClass      = drivertest.Strategy("MPS")
	exclusive     = drivertest.Strategy("Exclusive")
	timeSliced    = drivertest.Strategy("TimeSlicing")
	claimSource   = resourceapi.AllocationConfigSourceClaim
	classSource   = resourceapi.AllocationConfigSourceClass
	configHeading = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",`
)

func TestPrepareRefusals(t *testing.T) {
	// h100-sxm-8: 80 GiB per GPU.
	type step struct {
		claim   *resourceapi.ResourceClaim
		wantErr string // "" = prepared
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		name: "two MPS halves fit, a third does not",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "40Gi")}, mpsClass), ""},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "40Gi")}, mpsClass), ""},
			{claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "40Gi")}, mpsClass), "over-committed"},
			{claim("ns", "d", "d", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "40Gi")}, mpsClass), ""},
		},
	}, {
		name: "one claim's two requests on one GPU add up",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("x", node, "gpu-0", "50Gi"), r("y", node, "gpu-0", "40Gi")}, mpsClass), "over-committed"},
		},
	}, {
		name: "MPS next to time-slicing is refused",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, mpsClass), ""},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, timeSliced), "sharing mode MPS"},
		},
	}, {
		name: "exclusive holds the whole GPU whatever it asked",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, exclusive), ""},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, exclusive), "over-committed"},
			{claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")}, mpsClass), "sharing mode Exclusive"},
		},
	}, {
		name: "whole GPU without consumed capacity, then a fraction",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-3", "")}), ""},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-3", "1Gi")}, timeSliced), "sharing mode Exclusive"},
		},
	}, {
		name: "bad config names the field",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")},
				mpsClass, drivertest.Config(claimSource, configHeading+`"sharing":{"mps":{"computePercent":250}}}`)), "sharing.mps.computePercent"},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")},
				drivertest.Config(classSource, configHeading+`"sharing":{"strategy":"Sliced"}}`)), "sharing.strategy"},
			{claim("ns", "c", "c", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "10Gi")},
				drivertest.Config(claimSource, configHeading+`"sharing":{"stratgy":"MPS"}}`)), "stratgy"},
		},
	}, {
		name: "device or pool not on this node",
		steps: []step{
			{claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-9", "")}), `no device "gpu-9"`},
			{claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", "node-b", "gpu-0", "")}), `pool "node-b"`},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newUnitDriver(t, "h100-sxm-8")
			for i, s := range tc.steps {
				res := prepare(t, d, s.claim)[s.claim.UID]
				if s.wantErr == "" {
					require.NoError(t, res.Err, "step %d", i)
					require.NotEmpty(t, res.Devices)
					continue
				}
				require.Error(t, res.Err, "step %d", i)
				assert.Contains(t, res.Err.Error(), s.wantErr, "step %d", i)
				assert.NotContains(t, d.ckpt.Claims, string(s.claim.UID), "a refused claim leaves no record")
				_, err := os.Stat(d.cdi.SpecPath(string(s.claim.UID)))
				assert.True(t, os.IsNotExist(err), "a refused claim has no CDI spec")
			}
		})
	}
}

func TestPrepareIdempotentAndUnprepare(t *testing.T) {
	d, record := newUnitDriver(t, "h100-sxm-8")
	a := claim("ns", "a", "uid-a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "40Gi")}, mpsClass)
	b := claim("ns", "b", "uid-b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "40Gi")}, mpsClass)

	first := prepare(t, d, a, b)
	require.NoError(t, first["uid-a"].Err)
	again := prepare(t, d, a)
	assert.Equal(t, first["uid-a"], again["uid-a"], "preparing twice gives the same answer")
	dev := again["uid-a"].Devices[0]
	assert.Equal(t, "gpu-0", dev.DeviceName)
	assert.Equal(t, node, dev.PoolName)
	require.NotNil(t, dev.ShareID)
	require.Len(t, dev.CDIDeviceIDs, 1)
	assert.True(t, strings.HasPrefix(dev.CDIDeviceIDs[0], "gpu.tessera.dev/claim=uid-a_gpu_"), dev.CDIDeviceIDs[0])

	assert.Len(t, drivertest.Record(t, record), 1, "one MPS daemon for both claims")
	stored, err := d.store.Load("boot")
	require.NoError(t, err)
	assert.Equal(t, StatePrepared, stored.Claims["uid-a"].State)

	unprepare(t, d, a)
	assert.Len(t, drivertest.Record(t, record), 1, "daemon stays while b uses it")
	unprepare(t, d, a) // idempotent
	unprepare(t, d, b)
	rec := drivertest.Record(t, record)
	require.Len(t, rec, 2)
	assert.True(t, strings.HasPrefix(rec[1], "quit_"), rec)
	_, err = os.Stat(d.cdi.SpecPath("uid-b"))
	assert.True(t, os.IsNotExist(err))
	stored, err = d.store.Load("boot")
	require.NoError(t, err)
	assert.Empty(t, stored.Claims)
}

func TestPrepareBatchSeesItself(t *testing.T) {
	d, _ := newUnitDriver(t, "a100-pcie-4") // 40 GiB GPUs
	a := claim("ns", "a", "a", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "30Gi")}, timeSliced)
	b := claim("ns", "b", "b", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "30Gi")}, timeSliced)
	res := prepare(t, d, a, b)
	require.NoError(t, res["a"].Err)
	require.Error(t, res["b"].Err)
	assert.Contains(t, res["b"].Err.Error(), "ns/a")
}
