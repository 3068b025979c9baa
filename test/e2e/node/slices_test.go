package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
)

// nodeEnv is one in-process tessera-node: its directories and fake GPUs.
type nodeEnv struct {
	name                     string
	registrar, plugins, cdi  string
	mpsRoot, control, record string
	bootID                   string
	// devicePlugins is the kubelet's device-plugin directory of this node.
	devicePlugins string
	fake          *gpu.Fake
}

func newNodeEnv(t testing.TB, name, profile string) *nodeEnv {
	t.Helper()
	dir := shortTempDir(t)
	f, err := gpu.NewFake(profile, name, gpu.WithHealthProbeInterval(50*time.Millisecond), gpu.WithRecoveryQuietPeriod(200*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	e := &nodeEnv{
		name: name, fake: f,
		registrar: filepath.Join(dir, "reg"), plugins: filepath.Join(dir, "plugins"),
		cdi: filepath.Join(dir, "cdi"), mpsRoot: filepath.Join(dir, "mps"),
		bootID: filepath.Join(dir, "boot_id"), devicePlugins: filepath.Join(dir, "dp"),
	}
	require.NoError(t, os.WriteFile(e.bootID, []byte("boot-"+name+"\n"), 0o644))
	e.control, e.record = mpsStandIn(t, dir)
	return e
}

// start runs the plugin in this process.
func (e *nodeEnv) start(t testing.TB, reg prometheus.Registerer) *driver.Driver {
	t.Helper()
	c := cluster(t)
	d, err := driver.Start(context.Background(), driver.Options{
		NodeName: e.name, KubeClient: c.Client(t), Inventory: e.fake,
		RegistrarDir: e.registrar, PluginDataDir: e.plugins,
		CDI:        cdi.Options{Root: e.cdi, Fake: true},
		MPS:        mpsOptions(e),
		BootIDPath: e.bootID,
		Registerer: reg,
	})
	require.NoError(t, err)
	return d
}

func sliceDevices(slices []resourceapi.ResourceSlice) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// TestSlicesMatchProfile: published devices carry the profile's
// attributes, capacities and NVLink domains; a GPU fault taints the device
// and recovery removes the taint; a restart changes nothing.
func TestSlicesMatchProfile(t *testing.T) {
	c := cluster(t)
	client := c.Client(t)
	e := newNodeEnv(t, "slices-a100", "a100-pcie-4")
	c.AddKwokNode(t, e.name, nil)

	began := time.Now()
	d := e.start(t, prometheus.NewRegistry())
	slices := waitSlices(t, client, e.name, time.Minute, func(s []resourceapi.ResourceSlice) bool { return len(sliceDevices(s)) == 4 })
	t.Logf("start → published ResourceSlices: %v", time.Since(began))

	gpus, err := e.fake.Devices()
	require.NoError(t, err)
	devs := sliceDevices(slices)
	require.Len(t, slices, 1)
	assert.Equal(t, e.name, *slices[0].Spec.NodeName)
	assert.Equal(t, e.name, slices[0].Spec.Pool.Name)
	domains := map[string][]string{}
	for _, g := range gpus {
		dev, ok := devs[driver.DeviceName(g.Index)]
		require.True(t, ok, "device for GPU %d", g.Index)
		a := dev.Attributes
		assert.Equal(t, g.UUID, *a[driver.AttrUUID].StringValue)
		assert.Equal(t, int64(g.Index), *a[driver.AttrIndex].IntValue)
		assert.Equal(t, g.ProductName, *a[driver.AttrProductName].StringValue)
		assert.Equal(t, "Ampere", *a[driver.AttrArchitecture].StringValue)
		assert.Equal(t, "8.0.0", *a[driver.AttrCUDAComputeCapability].VersionValue)
		assert.Equal(t, "550.54.15", *a[driver.AttrDriverVersion].VersionValue)
		assert.Equal(t, int64(108), *a[driver.AttrMultiprocessors].IntValue)
		assert.Equal(t, int64(1), *a[driver.AttrNVLinkPeers].IntValue)
		assert.Equal(t, g.PCIBusID, *a[driver.AttrPCIBusID].StringValue)
		assert.Equal(t, g.PCIeRoot, *a[driver.AttrPCIeRoot].StringValue)
		assert.Equal(t, int64(g.NUMANode), *a[driver.AttrNUMANode].IntValue)
		mem := dev.Capacity[driver.CapacityMemory]
		assert.Equal(t, int64(40<<30), mem.Value.Value())
		require.NotNil(t, mem.RequestPolicy)
		assert.Equal(t, int64(40<<30), mem.RequestPolicy.Default.Value())
		require.NotNil(t, dev.AllowMultipleAllocations)
		assert.True(t, *dev.AllowMultipleAllocations)
		domain := *a[driver.AttrNVLinkDomain].StringValue
		domains[domain] = append(domains[domain], dev.Name)
	}
	// a100-pcie-4: NVLink bridges in pairs.
	assert.ElementsMatch(t, [][]string{{"gpu-0", "gpu-1"}, {"gpu-2", "gpu-3"}}, valuesOf(domains))

	// Fault: GPU 2 falls off the bus → NoSchedule taint on gpu-2 only.
	require.NoError(t, e.fake.Remove(2))
	slices = waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		return len(sliceDevices(s)["gpu-2"].Taints) == 1
	})
	taint := sliceDevices(slices)["gpu-2"].Taints[0]
	assert.Equal(t, driver.TaintUnhealthy, taint.Key)
	assert.Equal(t, resourceapi.DeviceTaintEffectNoSchedule, taint.Effect)
	assert.Equal(t, "xid-79", taint.Value)
	assert.NotNil(t, taint.TimeAdded, "the apiserver stamps the taint")
	assert.Empty(t, sliceDevices(slices)["gpu-0"].Taints)

	// Recovery removes it.
	require.NoError(t, e.fake.Recover(2))
	slices = waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		return len(sliceDevices(s)) == 4 && len(sliceDevices(s)["gpu-2"].Taints) == 0
	})

	// Restart: same slice object, same generation, no write.
	before := slices[0]
	d.Stop()
	began = time.Now()
	d = e.start(t, prometheus.NewRegistry())
	defer d.Stop()
	require.Eventually(t, d.Ready, 30*time.Second, 20*time.Millisecond)
	t.Logf("restart → ready: %v", time.Since(began))
	time.Sleep(3 * time.Second) // give a (wrong) republish time to happen
	after, err := nodeSlices(context.Background(), client, e.name)
	require.NoError(t, err)
	require.Len(t, after, 1)
	assert.Equal(t, before.Name, after[0].Name)
	assert.Equal(t, before.ResourceVersion, after[0].ResourceVersion, "a restart must not rewrite unchanged slices")
	assert.Equal(t, before.Spec.Pool.Generation, after[0].Spec.Pool.Generation)
}

func valuesOf(m map[string][]string) [][]string {
	var out [][]string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
