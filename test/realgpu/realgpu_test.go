// Package realgpu checks the node side against a real NVIDIA GPU and driver:
// discovery, the published device, MPS limits as a CUDA program sees them,
// time-slicing, CDI specs and health. See README.md.
package realgpu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/sharing"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// realGPU opens NVML and returns the GPU under test, skipping (with the
// reason) where these checks must not run.
func realGPU(t *testing.T) (*gpu.NVMLInventory, gpu.Device) {
	t.Helper()
	if os.Getenv("TESSERA_REAL_GPU") != "1" {
		t.Skip("TESSERA_REAL_GPU=1 not set: these checks change GPU state and need an idle real GPU (make real-gpu)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: setting compute modes and time-slices")
	}
	inv, err := gpu.NewNVML(gpu.WithHealthProbeInterval(100*time.Millisecond), gpu.WithRecoveryQuietPeriod(time.Second))
	require.NoError(t, err, "TESSERA_REAL_GPU=1 but NVML does not load")
	t.Cleanup(func() { assert.NoError(t, inv.Close()) })
	devs, err := inv.Devices()
	require.NoError(t, err)
	require.NotEmpty(t, devs, "NVML reports no GPUs")
	want := os.Getenv("TESSERA_REAL_GPU_UUID")
	for _, d := range devs {
		if want == "" || d.UUID == want {
			return inv, d
		}
	}
	t.Fatalf("TESSERA_REAL_GPU_UUID=%s: no such GPU among %d", want, len(devs))
	return nil, gpu.Device{}
}

func TestInventoryAndSlice(t *testing.T) {
	inv, _ := realGPU(t)
	devs, err := inv.Devices()
	require.NoError(t, err)
	built := driver.BuildDevices(devs, nil, "")
	require.Len(t, built, len(devs))
	for i, d := range devs {
		t.Logf("GPU %d: %+v", i, d)
		assert.Regexp(t, `^GPU-[0-9a-f-]{36}$`, d.UUID)
		assert.True(t, strings.HasPrefix(d.ProductName, "NVIDIA"), d.ProductName)
		assert.NotEqual(t, "Unknown", d.Architecture)
		assert.Positive(t, d.Multiprocessors, "SM count")
		assert.NotZero(t, d.MemoryBytes)
		assert.NotEmpty(t, d.NVLinkDomain)

		dev := built[i]
		attr := func(name string) resourceapi.DeviceAttribute {
			a, ok := dev.Attributes[resourceapi.QualifiedName(driver.DriverName+"/"+name)]
			assert.True(t, ok, "attribute %s missing", name)
			return a
		}
		// Versions must parse as semver, or the attribute is left out.
		assert.NotNil(t, attr("driverVersion").VersionValue)
		assert.NotNil(t, attr("cudaComputeCapability").VersionValue)
		assert.Equal(t, int64(d.Multiprocessors), *attr("multiprocessors").IntValue)

		// What a user writes in a DeviceClass or claim selector.
		for _, expr := range []string{
			`device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA")`,
			`device.attributes["gpu.tessera.dev"].multiprocessors >= 1`,
			`device.attributes["gpu.tessera.dev"].cudaComputeCapability.isGreaterThan(semver("3.0.0"))`,
			`device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("450.0.0"))`,
			`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("1Gi")) > 0`,
			`device.attributes["gpu.tessera.dev"].uuid == "` + d.UUID + `"`,
		} {
			c := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(expr, cel.Options{})
			require.Nil(t, c.Error, expr)
			ok, _, err := c.DeviceMatches(context.Background(), cel.Device{
				Driver: driver.DriverName, Attributes: dev.Attributes, Capacity: dev.Capacity,
				AllowMultipleAllocations: dev.AllowMultipleAllocations,
			})
			require.NoError(t, err, expr)
			assert.True(t, ok, "%s does not match %s", expr, d.UUID)
		}
	}
}

// probe is what testdata/probe.cu prints.
type probe struct {
	SMs   int    `json:"sms"`
	Free  uint64 `json:"free"`
	Total uint64 `json:"total"`
	Alloc string `json:"alloc"`
	Error string `json:"error"`
}

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// probeBinary builds testdata/probe.cu once per test binary.
func probeBinary(t *testing.T) string {
	t.Helper()
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		t.Skip("nvcc not on PATH: the CUDA probe cannot be built")
	}
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-probe")
		if err != nil {
			probeErr = err
			return
		}
		probeBin = filepath.Join(dir, "probe")
		out, err := exec.Command(nvcc, "-o", probeBin, "testdata/probe.cu").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("nvcc: %w: %s", err, out)
		}
	})
	require.NoError(t, probeErr)
	return probeBin
}

// container is how a container started from CDI device ids sees its env:
// the spec injected by the CDI library, the way containerd does it, with each
// bind mount's host path in place of its container path (this process is not
// in a mount namespace of its own).
func containerEnv(t *testing.T, root string, ids ...string) []string {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	require.NoError(t, err)
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(spec, ids...)
	require.NoError(t, err, "unresolved: %v", unresolved)
	env := os.Environ()
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		for _, m := range spec.Mounts {
			if v == m.Destination {
				v = m.Source
			}
		}
		env = append(env, k+"="+v)
	}
	return env
}

func runProbe(t *testing.T, env []string, alloc uint64, hold time.Duration) probe {
	t.Helper()
	p, err := probeRun(probeBinary(t), env, alloc, hold)
	require.NoError(t, err)
	return p
}

// probeRun runs the probe; it does not touch t, so goroutines may call it.
func probeRun(bin string, env []string, alloc uint64, hold time.Duration) (probe, error) {
	cmd := exec.Command(bin, strconv.FormatUint(alloc, 10), strconv.FormatInt(hold.Milliseconds(), 10))
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return probe{}, fmt.Errorf("probe: %w: %s %s", err, out, stderr.String())
	}
	var p probe
	if err := json.Unmarshal(out, &p); err != nil {
		return probe{}, fmt.Errorf("probe printed %q: %w", out, err)
	}
	if p.Error != "" {
		return probe{}, fmt.Errorf("probe: CUDA: %s", p.Error)
	}
	return p, nil
}

func computeMode(t *testing.T, inv *gpu.NVMLInventory, uuid string) nvml.ComputeMode {
	t.Helper()
	h, ret := inv.NVML().DeviceGetHandleByUUID(uuid)
	require.Equal(t, nvml.SUCCESS, ret, nvml.ErrorString(ret))
	m, ret := h.GetComputeMode()
	require.Equal(t, nvml.SUCCESS, ret, nvml.ErrorString(ret))
	return m
}

var mpsConfig = v1alpha1.NewMPSConfig

func TestMPSEnforcesClaimLimits(t *testing.T) {
	inv, g := realGPU(t)
	probeBinary(t)
	if _, err := exec.LookPath(sharing.DefaultMPSControl); err != nil {
		t.Fatalf("%s not on PATH on a GPU machine: %v", sharing.DefaultMPSControl, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := sharing.MPSOptions{Root: drivertest.ShortTempDir(t), CheckInterval: 100 * time.Millisecond}
	mps := sharing.NewMPSManager(inv, opts)
	superviseCtx, stopSupervising := context.WithCancel(ctx)
	go mps.Supervise(superviseCtx)
	mgr := sharing.NewManager(inv, mps)
	cdiRoot := t.TempDir()
	w, err := cdi.New(cdi.Options{Root: cdiRoot})
	require.NoError(t, err)

	claims := []struct {
		uid     string
		memory  uint64
		percent int32 // configured; 0 follows the memory share
	}{
		{"claim-a", 4 * gib, 25},
		{"claim-b", 16 * gib, 0},
	}
	t.Cleanup(func() {
		// Leave the GPU as found even when an assertion failed half-way.
		for _, c := range claims {
			_ = mgr.Unprepare(context.Background(), c.uid, g.UUID)
		}
		_ = inv.SetComputeMode(g.UUID, gpu.ComputeModeDefault)
	})

	envs := make([][]string, len(claims))
	for i, c := range claims {
		cfg := mpsConfig(c.percent)
		prep, err := mgr.Prepare(ctx, c.uid, g.UUID, cfg)
		require.NoError(t, err, c.uid)
		ids, err := w.Write(cdi.Claim{UID: c.uid, Namespace: "default", Name: c.uid, Devices: []cdi.Device{{
			Request: "gpu", GPU: g, MemoryBytes: c.memory, Config: cfg, MPSPipeDir: prep.MPSPipeDir,
		}}})
		require.NoError(t, err, c.uid)
		envs[i] = containerEnv(t, cdiRoot, ids...)
	}
	assert.Equal(t, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, computeMode(t, inv, g.UUID))
	assert.Equal(t, 1, mps.Daemons(), "one daemon per GPU, shared by its claims")

	check := func(t *testing.T) {
		clients := make([]mpsClient, len(claims))
		for i, c := range claims {
			clients[i] = mpsClient{name: c.uid, env: envs[i], memory: c.memory, percent: int(cdi.ActiveThreadPercentage(c.percent, c.memory, g.MemoryBytes))}
		}
		checkMPSLimits(t, g, clients)
	}
	t.Run("limits", check)

	// A daemon killed behind Tessera's back is started again, and clients
	// are served with their limits as before.
	d, ok := mps.Daemon(g.UUID)
	require.True(t, ok)
	require.NoError(t, syscall.Kill(d.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		nd, ok := mps.Daemon(g.UUID)
		return ok && nd.PID != d.PID && mps.Restarts() == 1
	}, 15*time.Second, 50*time.Millisecond, "MPS daemon not restarted")
	t.Run("limits after a daemon restart", check)

	// tessera-node restarts: its new manager, over the same root, adopts
	// the running daemon (its pid file) instead of starting a second one,
	// and replaying the claims changes nothing for their clients.
	running, _ := mps.Daemon(g.UUID)
	stopSupervising()
	mps = sharing.NewMPSManager(inv, opts)
	go mps.Supervise(ctx)
	mgr = sharing.NewManager(inv, mps)
	for _, c := range claims {
		_, err := mgr.Prepare(ctx, c.uid, g.UUID, mpsConfig(c.percent))
		require.NoError(t, err, c.uid)
	}
	adopted, ok := mps.Daemon(g.UUID)
	require.True(t, ok)
	assert.Equal(t, running.PID, adopted.PID, "a second daemon was started")
	t.Run("limits after tessera-node restarts", check)

	require.NoError(t, mgr.Unprepare(ctx, "claim-a", g.UUID))
	assert.Equal(t, 1, mps.Daemons(), "the daemon stays while claim-b holds the GPU")
	assert.Equal(t, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, computeMode(t, inv, g.UUID))
	last, _ := mps.Daemon(g.UUID)
	require.NoError(t, mgr.Unprepare(ctx, "claim-b", g.UUID))
	assert.Equal(t, 0, mps.Daemons())
	assert.Eventually(t, func() bool { return syscall.Kill(last.PID, 0) != nil }, 5*time.Second, 50*time.Millisecond, "daemon still running")
	assert.Equal(t, nvml.COMPUTEMODE_DEFAULT, computeMode(t, inv, g.UUID))

	// The GPU is whole again: a plain client sees all of it.
	p := runProbe(t, os.Environ(), 0, 0)
	assert.Equal(t, g.Multiprocessors, p.SMs)
	assert.Greater(t, p.Free, 16*gib)
}

// mpsClient is a container's view of an MPS share: its environment from
// the CDI spec, and the limits it must see.
type mpsClient struct {
	name    string
	env     []string
	memory  uint64
	percent int
}

// checkMPSLimits runs the probe for every client at once, each holding an
// allocation just under its limit (so the daemon serves the limits side by
// side), and checks that each sees its memory limit and SM share; then
// that an allocation over each limit fails.
func checkMPSLimits(t *testing.T, g gpu.Device, clients []mpsClient) {
	t.Helper()
	bin := probeBinary(t)
	var wg sync.WaitGroup
	held := make([]probe, len(clients))
	errs := make([]error, len(clients))
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[i], errs[i] = probeRun(bin, c.env, c.memory-512*mib, 2*time.Second)
		}()
	}
	wg.Wait()
	for i, c := range clients {
		require.NoError(t, errs[i], c.name)
		p := held[i]
		t.Logf("%s: limit %d MiB, %d%% of %d SMs: %+v", c.name, c.memory>>20, c.percent, g.Multiprocessors, p)
		assert.Equal(t, "no error", p.Alloc, "%s: allocation under its limit", c.name)
		assert.LessOrEqual(t, p.Free, c.memory, "%s: free memory beyond its limit", c.name)
		// MPS hands out SMs in pairs (TPCs): allow that rounding.
		share := float64(c.percent) * float64(g.Multiprocessors) / 100
		assert.LessOrEqual(t, p.SMs, int(math.Ceil(share))+1, "%s: SMs", c.name)
		assert.GreaterOrEqual(t, p.SMs, int(math.Floor(share))-2, "%s: SMs", c.name)
		assert.Less(t, p.SMs, g.Multiprocessors, "%s: SM share not applied", c.name)

		over := runProbe(t, c.env, c.memory+512*mib, 0)
		assert.Equal(t, "out of memory", over.Alloc, "%s: allocation over its limit", c.name)
	}
}

// timeSlice reads a GPU's time-slice interval back from nvidia-smi.
func timeSlice(t *testing.T, uuid string) string {
	t.Helper()
	out, err := exec.Command("nvidia-smi", "compute-policy", "-i", uuid, "-l").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(strings.Trim(line, "| "))
		if len(f) == 3 && f[1] == "Timeslice" {
			return f[2]
		}
	}
	t.Fatalf("no Timeslice line in nvidia-smi output:\n%s", out)
	return ""
}

func TestTimeSlicing(t *testing.T) {
	inv, g := realGPU(t)
	mgr := sharing.NewManager(inv, nil)
	ctx := context.Background()
	cfg := v1alpha1.NewTimeSlicingConfig
	t.Cleanup(func() { _ = inv.SetTimeSlice(g.UUID, gpu.TimeSliceDefault) })

	_, err := mgr.Prepare(ctx, "ts-1", g.UUID, cfg(v1alpha1.IntervalShort))
	require.NoError(t, err)
	assert.Equal(t, "Short", timeSlice(t, g.UUID))
	_, err = mgr.Prepare(ctx, "ts-2", g.UUID, cfg(v1alpha1.IntervalLong))
	require.NoError(t, err)
	assert.Equal(t, "Long", timeSlice(t, g.UUID), "the newest claim's interval")

	// MPS is refused while the GPU is time-sliced.
	_, err = mgr.Prepare(ctx, "mps-1", g.UUID, mpsConfig(0))
	require.ErrorIs(t, err, sharing.ErrModeConflict)

	require.NoError(t, mgr.Unprepare(ctx, "ts-1", g.UUID))
	assert.Equal(t, "Long", timeSlice(t, g.UUID))
	require.NoError(t, mgr.Unprepare(ctx, "ts-2", g.UUID))
	assert.Equal(t, "Default", timeSlice(t, g.UUID))
}

func TestCDISpecAgainstDriver(t *testing.T) {
	_, g := realGPU(t)
	root := t.TempDir()
	w, err := cdi.New(cdi.Options{Root: root})
	require.NoError(t, err)
	c := cdi.Claim{UID: "exclusive", Namespace: "default", Name: "exclusive", Devices: []cdi.Device{{Request: "gpu", GPU: g}}}
	spec, _, err := w.Spec(c)
	require.NoError(t, err)
	edits := []cdispec.ContainerEdits{spec.ContainerEdits}
	for _, d := range spec.Devices {
		edits = append(edits, d.ContainerEdits)
	}
	var libcuda bool
	for _, e := range edits {
		for _, n := range e.DeviceNodes {
			assert.FileExists(t, n.Path, "device node")
		}
		for _, m := range e.Mounts {
			assert.FileExists(t, m.HostPath, "mount source for %s", m.ContainerPath)
			libcuda = libcuda || filepath.Base(m.ContainerPath) == "libcuda.so.1"
		}
	}
	assert.True(t, libcuda, "libcuda.so.1 not mounted")
	ids, err := w.Write(c)
	require.NoError(t, err)
	env := containerEnv(t, root, ids...)
	assert.Contains(t, env, cdi.EnvNvidiaVisibleDevices+"="+g.UUID)
}

func TestHealth(t *testing.T) {
	inv, _ := realGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for ev := range inv.Health(ctx) {
		assert.True(t, ev.Healthy, "GPU %s reported unhealthy: %s", ev.UUID, ev.Reason)
	}
}

// TestHealthIgnoresApplicationFault faults a kernel on purpose (a write to
// an unmapped address): the driver reports an XID, which reaches NVML's
// events, and the GPU must stay healthy and usable: one team's bug must not
// take a shared GPU away from the others.
func TestHealthIgnoresApplicationFault(t *testing.T) {
	inv, g := realGPU(t)
	bin := probeBinary(t)

	// An event set of the test's own, to know that the fault reached NVML.
	set, ret := inv.NVML().EventSetCreate()
	require.Equal(t, nvml.SUCCESS, ret, nvml.ErrorString(ret))
	defer set.Free()
	h, ret := inv.NVML().DeviceGetHandleByUUID(g.UUID)
	require.Equal(t, nvml.SUCCESS, ret, nvml.ErrorString(ret))
	require.Equal(t, nvml.SUCCESS, h.RegisterEvents(nvml.EventTypeXidCriticalError, set))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	events := inv.Health(ctx)
	time.Sleep(time.Second) // Health registers its own event set first

	out, err := exec.Command(bin, "0", "0", "fault").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("faulting kernel: %s", strings.TrimSpace(string(out)))
	assert.NotContains(t, string(out), `"no error"`, "the kernel did not fault")

	var xid uint64
	for deadline := time.Now().Add(10 * time.Second); xid == 0 && time.Now().Before(deadline); {
		if e, ret := set.Wait(500); ret == nvml.SUCCESS && e.EventType == nvml.EventTypeXidCriticalError {
			xid = e.EventData
		}
	}
	require.NotZero(t, xid, "no XID event after a faulting kernel")
	t.Logf("XID %d (%s)", xid, gpu.XIDReason(xid))
	assert.False(t, gpu.IsCriticalXID(xid), "an application fault's XID %d counted as a GPU fault", xid)

	// Whatever Health says in the next seconds, it must not be "unhealthy".
	quiet := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-events:
			if !ok {
				done = true
				break
			}
			assert.True(t, ev.Healthy, "GPU %s reported unhealthy after an application fault: %s", ev.UUID, ev.Reason)
		case <-quiet:
			done = true
		}
	}
	p := runProbe(t, os.Environ(), gib, 0)
	assert.Equal(t, "no error", p.Alloc, "the GPU is not usable after the fault")
}
