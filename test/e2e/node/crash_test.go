package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/killpoint"
	"github.com/tessera-gpu/tessera/sharing"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// tesseraNode builds cmd/tessera-node once per test binary.
func tesseraNode(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-node-bin")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "tessera-node")
		cmd := exec.Command("go", "build", "-o", binary, "github.com/tessera-gpu/tessera/cmd/tessera-node")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = err
			t.Logf("go build: %s", out)
		}
	})
	require.NoError(t, buildErr)
	return binary
}

// proc is a tessera-node subprocess.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

// syncBuffer is the process' output, written by exec's copier while the
// test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitOutput waits until the process has written s.
func (p *proc) waitOutput(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), s) }, timeout, 20*time.Millisecond,
		"tessera-node did not log %q; output:\n%s", s, p.out)
}

// spawnKill starts tessera-node with the test kill point spec armed
// (killpoint.Env) and waits until it is armed.
func (e *nodeEnv) spawnKill(t testing.TB, kubeconfig, spec string, extraArgs ...string) *proc {
	t.Helper()
	p := e.spawn(t, kubeconfig, []string{killpoint.Env + "=" + spec}, extraArgs...)
	p.waitOutput(t, "Test kill point armed", 30*time.Second)
	return p
}

// killed waits for the process to die at its kill point.
func (p *proc) killed(t testing.TB, point string) {
	t.Helper()
	err := p.wait(t, 30*time.Second)
	require.Error(t, err, "killed at %s", point)
	assert.Contains(t, err.Error(), "killed")
	assert.Contains(t, p.out.String(), `"Test kill point reached; killing tessera-node" point="`+point+`"`)
}

// startProc starts cmd with its output captured, and kills it when the
// test ends, showing the output if the test failed.
func startProc(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out.String())
		}
	})
	return p
}

func (e *nodeEnv) spawn(t testing.TB, kubeconfig string, env []string, extraArgs ...string) *proc {
	t.Helper()
	return e.spawnWrapped(t, nil, kubeconfig, env, extraArgs...)
}

// spawnWrapped is spawn with tessera-node run by wrapper (a command that
// ends by exec'ing its arguments), e.g. to start it in a cgroup.
func (e *nodeEnv) spawnWrapped(t testing.TB, wrapper []string, kubeconfig string, env []string, extraArgs ...string) *proc {
	t.Helper()
	args := append([]string{
		"--node-name=" + e.name, "--kubeconfig=" + kubeconfig, "--fake-gpus=h100-sxm-8",
		"--kubelet-registrar-dir=" + e.registrar, "--kubelet-plugin-dir=" + e.plugins,
		"--cdi-root=" + e.cdi, "--mps-root=" + e.mpsRoot, "--mps-control=" + e.control,
		"--boot-id-path=" + e.bootID, "--http-address=127.0.0.1:0", "-v=2",
		"--device-plugin-dir=" + e.devicePlugins,
	}, extraArgs...)
	argv := append(append(append([]string{}, wrapper...), tesseraNode(t)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), drivertest.RecordEnv+"="+e.record), env...)
	p := startProc(t, "tessera-node", cmd)
	return p
}

// wait returns the process' exit error, or fails after timeout.
func (p *proc) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // keep it for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("tessera-node did not exit; output:\n%s", p.out.String())
		return nil
	}
}

func (p *proc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	require.NoError(t, p.wait(t, 30*time.Second), "clean shutdown; output:\n%s", p.out.String())
}

func readCheckpoint(t testing.TB, e *nodeEnv) *driver.Checkpoint {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.plugins, driver.CheckpointFile))
	require.NoError(t, err)
	c, err := driver.DecodeCheckpoint(data)
	require.NoError(t, err)
	return c
}

// TestCrashBetweenCheckpointWrites kills tessera-node after its "preparing"
// checkpoint write, starts it again and checks that the claim is prepared
// exactly once; then unprepare, corrupt/future checkpoints, and an MPS root
// too long for the MPS sockets.
func TestCrashBetweenCheckpointWrites(t *testing.T) {
	ns := "crash"
	c, client, e := kwokNode(t, "crash-h100", "h100-sxm-8", ns)
	kubeconfig := c.KubeconfigPath
	socket := filepath.Join(e.plugins, "dra.sock")

	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "mps", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-3", "20Gi"),
	}, drivertest.Strategy("MPS")))

	// 1. Crash between the two writes.
	p := e.spawnKill(t, kubeconfig, killpoint.AfterPreparingSave)
	k := direct(t, socket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := k.prepare(ctx, claim)
	cancel()
	require.Error(t, err, "the process dies mid-call")
	p.killed(t, killpoint.AfterPreparingSave)
	ck := readCheckpoint(t, e)
	require.Contains(t, ck.Claims, string(claim.UID))
	assert.Equal(t, driver.StatePreparing, ck.Claims[string(claim.UID)].State)
	assert.Empty(t, drivertest.Record(t, e.record), "nothing was done yet")

	// 2. Restart; the kubelet retries; the claim is prepared once.
	os.Remove(socket)
	p = e.spawn(t, kubeconfig, nil)
	k = direct(t, socket)
	res := k.mustPrepare(t, claim)
	res2 := k.mustPrepare(t, claim) // and a kubelet retry changes nothing
	assert.Equal(t, res[string(claim.UID)].Devices[0].CdiDeviceIds, res2[string(claim.UID)].Devices[0].CdiDeviceIds)
	ck = readCheckpoint(t, e)
	require.Len(t, ck.Claims, 1)
	assert.Equal(t, driver.StatePrepared, ck.Claims[string(claim.UID)].State)
	uuid := gpu.FakeUUID(e.name, 3)
	assert.Equal(t, []string{"start_" + uuid}, drivertest.Record(t, e.record), "one MPS daemon start")
	env := envOf(t, readSpec(t, e.cdi, string(claim.UID)))
	assert.Equal(t, uuid+"=20480M", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	assert.Equal(t, "25", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])

	// 3. A clean restart keeps the claim (and adopts the daemon).
	p.stop(t)
	p = e.spawn(t, kubeconfig, nil)
	k = direct(t, socket)
	k.mustPrepare(t, claim)
	assert.Equal(t, []string{"start_" + uuid}, drivertest.Record(t, e.record), "daemon adopted, not restarted")

	// 4. Unprepare removes the spec and stops the daemon (last MPS claim).
	k.mustUnprepare(t, claim)
	_, err = readSpecErr(e.cdi, string(claim.UID))
	assert.True(t, os.IsNotExist(err))
	assert.Equal(t, []string{"start_" + uuid, "quit_" + uuid}, drivertest.Record(t, e.record))
	assert.Empty(t, readCheckpoint(t, e).Claims)
	p.stop(t)

	// 5. A corrupt or future checkpoint stops the start with a clear error
	// naming the recovery; the recovery flag moves it aside.
	ckptPath := filepath.Join(e.plugins, driver.CheckpointFile)
	for _, tc := range []struct{ name, content, want string }{
		{"corrupt", `{"version":1,"claims":{"x":`, "checkpoint is corrupt"},
		{"future", `{"version":7,"bootID":"x","claims":{}}`, "written by a newer tessera-node: version 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(ckptPath, []byte(tc.content), 0o600))
			p := e.spawn(t, kubeconfig, nil)
			require.Error(t, p.wait(t, 30*time.Second))
			out := p.out.String()
			assert.Contains(t, out, tc.want)
			assert.Contains(t, out, "--recover-checkpoint")

			p = e.spawn(t, kubeconfig, []string{"TESSERA_RECOVER_CHECKPOINT=true"})
			direct(t, socket)
			require.Eventually(t, func() bool { return strings.Contains(p.out.String(), "moved aside") }, 10*time.Second, 50*time.Millisecond)
			moved, _ := filepath.Glob(ckptPath + ".bad-*")
			require.NotEmpty(t, moved)
			data, err := os.ReadFile(moved[len(moved)-1])
			require.NoError(t, err)
			assert.Equal(t, tc.content, string(data), "the bad file is kept for inspection")
			assert.Empty(t, readCheckpoint(t, e).Claims)
			p.stop(t)
			for _, m := range moved {
				os.Remove(m)
			}
		})
	}

	// 6. An MPS root too long for the MPS daemon's sockets stops the start,
	// naming the limit, before any GPU is touched.
	t.Run("mps root too long", func(t *testing.T) {
		long := filepath.Join(e.mpsRoot, strings.Repeat("x", sharing.MaxRootLen))
		p := e.spawn(t, kubeconfig, nil, "--mps-root="+long)
		require.Error(t, p.wait(t, 30*time.Second))
		out := p.out.String()
		assert.Contains(t, out, fmt.Sprintf("at most %d fit", sharing.MaxRootLen))
		assert.Contains(t, out, "--mps-root")
	})
}
