package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/sharing"
)

// container stands in for a container's cgroup: what the container runtime
// kills, all of it, when a container is stopped or replaced (runc kills
// every process in the cgroup of a container that shares the host's PID
// namespace; and with its own PID namespace, as tessera-node now has, the
// kernel kills them all when its init exits).
type container struct{ dir string }

// newContainer makes a cgroup for one test. It needs root and a writable
// cgroup hierarchy (v1 "pids", or v2).
func newContainer(t *testing.T, name string) *container {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a cgroup stands in for tessera-node's container")
	}
	parent := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		parent = "/sys/fs/cgroup" // v2
	}
	dir := filepath.Join(parent, fmt.Sprintf("tessera-test-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("needs a writable cgroup hierarchy to stand in for tessera-node's container: %v", err)
	}
	c := &container{dir: dir}
	t.Cleanup(func() {
		c.kill(t)
		_ = os.Remove(dir)
	})
	return c
}

// wrapper runs a command in the cgroup (sh writes its pid, then execs).
func (c *container) wrapper() []string {
	return []string{"/bin/sh", "-c", `echo $$ > "` + filepath.Join(c.dir, "cgroup.procs") + `" && exec "$@"`, "sh"}
}

func (c *container) pids(t testing.TB) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	require.NoError(t, err)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}

// kill does what the runtime does to a replaced container: SIGKILL to every
// process in its cgroup until none is left.
func (c *container) kill(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		pids := c.pids(t)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0
	}, 10*time.Second, 10*time.Millisecond)
}

// supervisor is `tessera-node mps-supervisor` (the tessera-mps pod), run
// with the built-in stand-in of fake mode.
func (e *nodeEnv) supervisor(t *testing.T) *proc {
	t.Helper()
	cmd := exec.Command(tesseraNode(t), "mps-supervisor", "--mps-root="+e.mpsRoot, "--fake", "-v=2")
	cmd.Env = append(os.Environ(), drivertest.RecordEnv+"="+e.record)
	p := startProc(t, "mps-supervisor", cmd)
	p.waitOutput(t, "MPS supervisor serving", 30*time.Second)
	return p
}

func daemonPIDs(t testing.TB, e *nodeEnv, uuid string) []int {
	t.Helper()
	return drivertest.Daemons(t, e.record)[uuid]
}

// TestMPSDaemonOutlivesNodeContainer: with an MPS claim prepared, the
// container of tessera-node is replaced (every process in it killed, as on
// an upgrade or a crash). The MPS daemon, run by the supervisor outside that
// container, keeps running with the same pid; the new tessera-node adopts
// it (no second start) and the claim stays prepared. A daemon that dies is
// started again and counted in tessera_node_mps_daemon_restarts_total; the
// last unprepare stops it; stopping the supervisor (uninstall) leaves no
// daemon. Without the supervisor (the old design), the daemon dies with the
// container: the first check, which keeps the stand-in honest.
func TestMPSDaemonOutlivesNodeContainer(t *testing.T) {
	ns := "mps-outlive"
	c, client, e := kwokNode(t, "mps-outlive", "h100-sxm-8", ns)
	kubeconfig := c.KubeconfigPath
	socket := filepath.Join(e.plugins, "dra.sock")
	ctr := newContainer(t, "node")
	uuid := gpu.FakeUUID(e.name, 2)
	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "mps", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-2", "20Gi"),
	}, drivertest.Strategy("MPS")))
	builtin := "--mps-control=" // the built-in stand-in of fake mode

	// 1. Old design: the daemon is tessera-node's child and dies with its
	// container.
	p := e.spawnWrapped(t, ctr.wrapper(), kubeconfig, nil, builtin)
	k := direct(t, socket)
	k.mustPrepare(t, claim)
	require.Len(t, daemonPIDs(t, e, uuid), 1)
	ctr.kill(t)
	_ = p.wait(t, 30*time.Second)
	require.Eventually(t, func() bool { return len(daemonPIDs(t, e, uuid)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"without the supervisor the daemon is in the container and dies with it")
	// The restarted tessera-node (old design) starts it again, and stops it
	// on unprepare.
	os.Remove(socket)
	p = e.spawnWrapped(t, ctr.wrapper(), kubeconfig, nil, builtin)
	k = direct(t, socket)
	k.mustUnprepare(t, claim)
	p.stop(t)
	require.Empty(t, daemonPIDs(t, e, uuid))
	base := len(drivertest.Record(t, e.record))

	// 2. With the supervisor, in its own pod.
	sup := e.supervisor(t)
	supArg := "--mps-supervisor=" + filepath.Join(e.mpsRoot, sharing.SupervisorSocket)
	os.Remove(socket)
	p = e.spawnWrapped(t, ctr.wrapper(), kubeconfig, nil, builtin, supArg)
	k = direct(t, socket)
	res := k.mustPrepare(t, claim)
	pids := daemonPIDs(t, e, uuid)
	require.Len(t, pids, 1)
	daemon := pids[0]

	ctr.kill(t) // the container is replaced
	_ = p.wait(t, 30*time.Second)
	time.Sleep(200 * time.Millisecond) // the daemon would be dead by now
	assert.Equal(t, []int{daemon}, daemonPIDs(t, e, uuid), "the daemon outlives tessera-node's container")

	os.Remove(socket)
	p = e.spawnWrapped(t, ctr.wrapper(), kubeconfig, nil, builtin, supArg)
	k = direct(t, socket)
	res2 := k.mustPrepare(t, claim) // the kubelet's retry
	assert.Equal(t, res[string(claim.UID)].Devices[0].CdiDeviceIds, res2[string(claim.UID)].Devices[0].CdiDeviceIds)
	ck := readCheckpoint(t, e)
	require.Contains(t, ck.Claims, string(claim.UID))
	assert.Equal(t, driver.StatePrepared, ck.Claims[string(claim.UID)].State)
	assert.Equal(t, []int{daemon}, daemonPIDs(t, e, uuid), "adopted: same daemon, no second one")
	assert.Equal(t, []string{"start_" + uuid}, drivertest.Record(t, e.record)[base:], "started once across the replacement")
	assert.Contains(t, scrapeProc(t, p), "tessera_node_mps_daemon_restarts_total 0")

	// 3. The daemon dies: started again and counted.
	require.NoError(t, syscall.Kill(daemon, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		pids := daemonPIDs(t, e, uuid)
		return len(pids) == 1 && pids[0] != daemon
	}, 20*time.Second, 50*time.Millisecond, "a dead daemon is started again")
	require.Eventually(t, func() bool {
		return strings.Contains(scrapeProc(t, p), "tessera_node_mps_daemon_restarts_total 1")
	}, 10*time.Second, 100*time.Millisecond)

	// 4. The last unprepare stops it.
	k.mustUnprepare(t, claim)
	assert.Empty(t, daemonPIDs(t, e, uuid), "stopped with its last claim")
	assert.Equal(t, []string{"start_" + uuid, "start_" + uuid, "quit_" + uuid}, drivertest.Record(t, e.record)[base:])

	// 5. Uninstall: the supervisor's pod is deleted (SIGTERM) with a daemon
	// running; none stays behind.
	k.mustPrepare(t, claim)
	require.Len(t, daemonPIDs(t, e, uuid), 1)
	require.NoError(t, sup.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, sup.wait(t, 30*time.Second))
	assert.Empty(t, drivertest.Daemons(t, e.record), "no MPS daemon left after the supervisor stopped")
	p.stop(t)
}

// TestFakeModeMPSStandIn: with fake GPUs and no MPS control program
// anywhere (as in tessera-node's image), MPS and time-sliced claims are
// prepared: the built-in stand-in runs the daemon, records what it was told
// in the daemon's log directory, and stops it on unprepare.
func TestFakeModeMPSStandIn(t *testing.T) {
	ns := "fake-standin"
	c, client, e := kwokNode(t, "fake-standin", "h100-sxm-8", ns)
	socket := filepath.Join(e.plugins, "dra.sock")
	mps := createAllocatedClaim(t, client, drivertest.Claim(ns, "mps", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-1", "20Gi"),
	}, drivertest.Strategy("MPS")))
	ts := createAllocatedClaim(t, client, drivertest.Claim(ns, "ts", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-4", "20Gi"),
	}, drivertest.Strategy("TimeSlicing")))

	// No nvidia-cuda-mps-control on PATH, and no --mps-control.
	p := e.spawn(t, c.KubeconfigPath, []string{"PATH=/nonexistent"}, "--mps-control=")
	k := direct(t, socket)
	k.mustPrepare(t, mps, ts)
	uuid := gpu.FakeUUID(e.name, 1)
	require.Len(t, daemonPIDs(t, e, uuid), 1, "the stand-in daemon runs")
	log, err := os.ReadFile(filepath.Join(e.mpsRoot, uuid, "log", "control.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "tessera stand-in: start "+uuid)
	env := envOf(t, readSpec(t, e.cdi, string(mps.UID)))
	assert.Equal(t, cdi.ContainerMPSPipeDir, env[cdi.EnvMPSPipeDir])

	k.mustUnprepare(t, mps, ts)
	assert.Empty(t, daemonPIDs(t, e, uuid), "stopped on unprepare")
	assert.Equal(t, []string{"start_" + uuid, "quit_" + uuid}, drivertest.Record(t, e.record))

	// `tessera-node mps-cleanup` (uninstall by hand) stops a daemon left
	// running; the claim's unprepare afterwards is clean.
	k.mustPrepare(t, mps)
	require.Len(t, daemonPIDs(t, e, uuid), 1)
	out, err := exec.Command(tesseraNode(t), "mps-cleanup", "--mps-root="+e.mpsRoot, "--fake").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), uuid, "names the GPUs it stopped")
	assert.Empty(t, daemonPIDs(t, e, uuid), "no daemon after the cleanup")
	k.mustUnprepare(t, mps)
	p.stop(t)
}
