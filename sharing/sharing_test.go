package sharing

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
)

const (
	gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
	gpu1 = "GPU-11111111-1111-1111-1111-111111111111"
)

// fakeInventory records what the sharing code asks of the GPUs.
type fakeInventory struct {
	mu        sync.Mutex
	modes     map[string]gpu.ComputeMode
	slices    map[string]gpu.TimeSliceInterval
	calls     []string
	modeError error
}

func newFakeInventory() *fakeInventory {
	return &fakeInventory{modes: map[string]gpu.ComputeMode{}, slices: map[string]gpu.TimeSliceInterval{}}
}

func (f *fakeInventory) Devices() ([]gpu.Device, error)                    { return nil, nil }
func (f *fakeInventory) Health(ctx context.Context) <-chan gpu.HealthEvent { return nil }
func (f *fakeInventory) Close() error                                      { return nil }

func (f *fakeInventory) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "mode "+uuid)
	if f.modeError != nil {
		return f.modeError
	}
	f.modes[uuid] = mode
	return nil
}

func (f *fakeInventory) SetTimeSlice(uuid string, iv gpu.TimeSliceInterval) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "slice "+uuid+" "+string(iv))
	f.slices[uuid] = iv
	return nil
}

func (f *fakeInventory) mode(uuid string) gpu.ComputeMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.modes[uuid]
}

func (f *fakeInventory) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// standIn is a stand-in nvidia-cuda-mps-control: it records each call (args
// and the MPS env) and each stdin line, and for -d leaves a background
// sleeper whose pid it writes where the real daemon writes its own; `quit`
// kills that sleeper.
const standIn = `#!/bin/sh
echo "call args=[$*] pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY visible=$CUDA_VISIBLE_DEVICES" >> "$STANDIN_LOG"
if [ "$1" = "-d" ]; then
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  exit 0
fi
while IFS= read -r line; do
  echo "stdin pipe=$CUDA_MPS_PIPE_DIRECTORY line=$line" >> "$STANDIN_LOG"
  if [ "$line" = quit ]; then kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"; fi
done
`

type harness struct {
	inv  *fakeInventory
	root string
	log  string
	opts MPSOptions
}

// newHarness puts the stand-in on PATH under the real program's name.
func newHarness(t *testing.T) *harness {
	t.Helper()
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, DefaultMPSControl), []byte(standIn), 0o755))
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	// A short root, as the real daemon's sockets need (MaxRootLen).
	root, err := os.MkdirTemp("", "mps")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	h := &harness{inv: newFakeInventory(), root: root, log: filepath.Join(t.TempDir(), "calls.log")}
	h.opts = MPSOptions{Root: h.root, CheckInterval: 20 * time.Millisecond, Timeout: 5 * time.Second, Env: []string{"STANDIN_LOG=" + h.log}}
	t.Cleanup(func() {
		// Do not leave sleepers behind, whatever the test did.
		pids, _ := filepath.Glob(filepath.Join(h.root, "*", "pipe", PIDFile))
		for _, p := range pids {
			if pid, err := readPID(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return h
}

func (h *harness) lines(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(h.log)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (h *harness) starts(t *testing.T) []string { return h.lines(t, "call args=[-d]") }

func TestMPSStartOncePerGPUAndQuitOnLastRelease(t *testing.T) {
	h := newHarness(t)
	m := NewMPSManager(h.inv, h.opts)
	ctx := context.Background()

	d, err := m.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(h.root, gpu0, "pipe"), d.PipeDir)
	assert.Equal(t, filepath.Join(h.root, gpu0, "log"), d.LogDir)
	assert.True(t, alive(d.PID))
	assert.Equal(t, gpu.ComputeModeExclusiveProcess, h.inv.mode(gpu0))

	_, err = m.Acquire(ctx, "claim-b", gpu0)
	require.NoError(t, err)
	d2, err := m.Acquire(ctx, "claim-a", gpu0) // replay: no-op
	require.NoError(t, err)
	assert.Equal(t, d.PID, d2.PID)
	assert.Equal(t, []string{"claim-a", "claim-b"}, d2.Claims)

	starts := h.starts(t)
	require.Len(t, starts, 1, "one daemon per GPU")
	assert.Equal(t, "call args=[-d] pipe="+d.PipeDir+" log="+d.LogDir+" visible="+gpu0, starts[0])
	assert.Equal(t, 1, m.Daemons())

	require.NoError(t, m.Release(ctx, "claim-a", gpu0))
	assert.Empty(t, h.lines(t, "stdin"), "a claim is left: no quit")
	assert.True(t, alive(d.PID))
	require.NoError(t, m.Release(ctx, "unknown", gpu0), "unknown claim is a no-op")

	require.NoError(t, m.Release(ctx, "claim-b", gpu0))
	assert.Equal(t, []string{"stdin pipe=" + d.PipeDir + " line=quit"}, h.lines(t, "stdin"))
	assert.False(t, alive(d.PID), "daemon gone after quit")
	assert.Equal(t, gpu.ComputeModeDefault, h.inv.mode(gpu0), "compute mode restored")
	assert.Equal(t, 0, m.Daemons())
	_, ok := m.Daemon(gpu0)
	assert.False(t, ok)
	require.NoError(t, m.Release(ctx, "claim-b", gpu0), "releasing twice is a no-op")
	assert.Len(t, h.lines(t, "stdin"), 1)
}

func TestMPSSecondGPUGetsOwnDaemonAndDirs(t *testing.T) {
	h := newHarness(t)
	m := NewMPSManager(h.inv, h.opts)
	ctx := context.Background()
	d0, err := m.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	d1, err := m.Acquire(ctx, "claim-b", gpu1)
	require.NoError(t, err)
	assert.NotEqual(t, d0.PipeDir, d1.PipeDir)
	assert.NotEqual(t, d0.LogDir, d1.LogDir)
	assert.NotEqual(t, d0.PID, d1.PID)
	assert.Equal(t, 2, m.Daemons())
	starts := h.starts(t)
	require.Len(t, starts, 2)
	assert.Contains(t, starts[1], "pipe="+filepath.Join(h.root, gpu1, "pipe"))
	assert.Contains(t, starts[1], "visible="+gpu1)

	// Releasing one GPU's last claim quits that daemon only.
	require.NoError(t, m.Release(ctx, "claim-a", gpu0))
	assert.False(t, alive(d0.PID))
	assert.True(t, alive(d1.PID))
	assert.Equal(t, gpu.ComputeModeExclusiveProcess, h.inv.mode(gpu1))
	assert.Equal(t, 1, m.Daemons())
}

// TestMPSRestartAfterKill also checks that the manager logs to its
// callers' context loggers, with the GPU as a key.
func TestMPSRestartAfterKill(t *testing.T) {
	h := newHarness(t)
	m := NewMPSManager(h.inv, h.opts)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	logs := func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	d, err := m.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { m.Supervise(ctx); close(done) }()

	require.NoError(t, syscall.Kill(d.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		nd, ok := m.Daemon(gpu0)
		return ok && nd.PID != d.PID && alive(nd.PID)
	}, 5*time.Second, 10*time.Millisecond)
	assert.Len(t, h.starts(t), 2)
	assert.Equal(t, int64(1), m.Restarts())
	assert.Equal(t, 1, m.Daemons())

	cancel()
	<-done
	// The restarted daemon is the one told to quit.
	nd, _ := m.Daemon(gpu0)
	require.NoError(t, m.Release(klog.NewContext(context.Background(), logger), "claim-a", gpu0))
	assert.False(t, alive(nd.PID))
	assert.Contains(t, logs(), "INFO MPS daemon running gpu=\""+gpu0+"\" pid=")
	assert.Contains(t, logs(), "INFO MPS daemon died; starting it again gpu=\""+gpu0+"\" pid=")
	assert.Contains(t, logs(), "INFO MPS daemon stopped gpu=\""+gpu0+"\" lastClaim=\"claim-a\"")
}

func TestMPSAdoptsRunningDaemonAfterRestart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	first := NewMPSManager(h.inv, h.opts)
	d, err := first.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)

	// tessera-node restarts: a new manager, same directories.
	second := NewMPSManager(h.inv, h.opts)
	d2, err := second.Acquire(ctx, "claim-a", gpu0)
	require.NoError(t, err)
	assert.Equal(t, d.PID, d2.PID)
	assert.Len(t, h.starts(t), 1, "no second daemon")
	require.NoError(t, second.Release(ctx, "claim-a", gpu0))
	assert.False(t, alive(d.PID))
}

func TestMPSFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("control program missing", func(t *testing.T) {
		h := newHarness(t)
		h.opts.Control = "no-such-mps-control"
		m := NewMPSManager(h.inv, h.opts)
		_, err := m.Acquire(ctx, "claim-a", gpu0)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no-such-mps-control not found")
		assert.Equal(t, gpu.ComputeModeDefault, h.inv.mode(gpu0), "mode restored")
		assert.Equal(t, 0, m.Daemons())
	})
	t.Run("daemon start fails", func(t *testing.T) {
		h := newHarness(t)
		bad := filepath.Join(t.TempDir(), "failing-control")
		require.NoError(t, os.WriteFile(bad, []byte("#!/bin/sh\necho no GPU >&2\nexit 3\n"), 0o755))
		h.opts.Control = bad
		m := NewMPSManager(h.inv, h.opts)
		_, err := m.Acquire(ctx, "claim-a", gpu0)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "exit status 3")
		log, _ := os.ReadFile(filepath.Join(h.root, gpu0, "log", "tessera-start.log"))
		assert.Contains(t, string(log), "no GPU")
	})
	t.Run("compute mode fails", func(t *testing.T) {
		h := newHarness(t)
		h.inv.modeError = errors.New("insufficient permissions")
		m := NewMPSManager(h.inv, h.opts)
		_, err := m.Acquire(ctx, "claim-a", gpu0)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "EXCLUSIVE_PROCESS: insufficient permissions")
		assert.Empty(t, h.starts(t), "no daemon without the compute mode")
	})
	t.Run("empty ids", func(t *testing.T) {
		m := NewMPSManager(newFakeInventory(), MPSOptions{})
		_, err := m.Acquire(ctx, "", gpu0)
		assert.Error(t, err)
	})
}

func TestManager(t *testing.T) {
	h := newHarness(t)
	mps := NewMPSManager(h.inv, h.opts)
	m := NewManager(h.inv, mps)
	ctx := context.Background()
	mpsCfg := v1alpha1.NewGpuConfig(v1alpha1.MPS)
	ts := v1alpha1.NewTimeSlicingConfig

	// Exclusive: nothing to enforce.
	p, err := m.Prepare(ctx, "excl", gpu1, nil)
	require.NoError(t, err)
	assert.Equal(t, v1alpha1.Exclusive, p.Strategy)
	assert.Equal(t, 0, h.inv.callCount())
	mode, n := m.Mode(gpu1)
	assert.Equal(t, v1alpha1.Exclusive, mode)
	assert.Equal(t, 1, n)

	// A time-sliced claim cannot join an exclusive GPU.
	_, err = m.Prepare(ctx, "ts-1", gpu1, ts(v1alpha1.IntervalLong))
	require.ErrorIs(t, err, ErrModeConflict)
	var conflict *ModeConflictError
	require.ErrorAs(t, err, &conflict)
	assert.Equal(t, v1alpha1.Exclusive, conflict.Current)
	assert.Contains(t, err.Error(), "sharing mode Exclusive; a TimeSlicing claim cannot share it")
	require.NoError(t, m.Unprepare(ctx, "excl", gpu1))
	mode, n = m.Mode(gpu1)
	assert.Equal(t, v1alpha1.SharingStrategy(""), mode)
	assert.Equal(t, 0, n)

	// Time-slicing sets the interval, and restores Default with the last claim.
	_, err = m.Prepare(ctx, "ts-1", gpu1, ts(v1alpha1.IntervalLong))
	require.NoError(t, err)
	_, err = m.Prepare(ctx, "ts-2", gpu1, ts(v1alpha1.IntervalLong))
	require.NoError(t, err)
	_, err = m.Prepare(ctx, "ts-2", gpu1, ts(v1alpha1.IntervalLong)) // replay
	require.NoError(t, err)
	require.NoError(t, m.Unprepare(ctx, "ts-1", gpu1))
	require.NoError(t, m.Unprepare(ctx, "ts-2", gpu1))
	assert.Equal(t, []string{"slice " + gpu1 + " Long", "slice " + gpu1 + " Long", "slice " + gpu1 + " Default"}, h.inv.calls)

	// MPS goes through the daemon manager.
	p, err = m.Prepare(ctx, "mps-1", gpu0, mpsCfg)
	require.NoError(t, err)
	assert.Equal(t, mps.PipeDir(gpu0), p.MPSPipeDir)
	assert.Equal(t, 1, m.MPSDaemons())
	_, err = m.Prepare(ctx, "ts-3", gpu0, ts(v1alpha1.IntervalShort))
	require.ErrorIs(t, err, ErrModeConflict)
	require.NoError(t, m.Unprepare(ctx, "mps-1", gpu0))
	assert.Equal(t, 0, m.MPSDaemons())
	assert.Len(t, h.lines(t, "stdin"), 1)
	require.NoError(t, m.Unprepare(ctx, "mps-1", gpu0), "unprepare twice is a no-op")

	// Without MPS on the node, MPS claims fail clearly.
	_, err = NewManager(h.inv, nil).Prepare(ctx, "mps-2", gpu0, mpsCfg)
	assert.ErrorContains(t, err, "MPS is not enabled on this node")
}

func TestCheckMode(t *testing.T) {
	tests := []struct {
		current, requested v1alpha1.SharingStrategy
		claims             int
		conflict           bool
	}{
		{"", v1alpha1.MPS, 0, false},
		{v1alpha1.MPS, v1alpha1.MPS, 3, false},
		{v1alpha1.MPS, v1alpha1.TimeSlicing, 1, true},
		{v1alpha1.TimeSlicing, v1alpha1.Exclusive, 2, true},
		{v1alpha1.MPS, v1alpha1.Exclusive, 0, false},
	}
	for _, tt := range tests {
		err := CheckMode(gpu0, tt.current, tt.requested, tt.claims)
		assert.Equal(t, tt.conflict, errors.Is(err, ErrModeConflict), "%+v", tt)
	}
}

func TestAlive(t *testing.T) {
	assert.True(t, alive(os.Getpid()))
	assert.False(t, alive(0))
	assert.False(t, alive(-1))
}

// TestMPSRootLength: the daemon's sockets live below the root, and a path
// over 107 characters makes `nvidia-cuda-mps-control -d` exit 1 with nothing
// logged (seen on a real H200). The root is refused with the limit named,
// before the GPU's compute mode is touched.
func TestMPSRootLength(t *testing.T) {
	const uuid = "GPU-9bd41c17-a9f7-92ee-d0c1-ba0606825ff1"
	ok := "/" + strings.Repeat("r", MaxRootLen-1)
	long := ok + "x"
	assert.NoError(t, CheckRoot(ok))
	assert.NoError(t, CheckRoot(""), "the default root")
	err := CheckRoot(long)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "43 characters long: at most 42 fit")
	assert.Contains(t, err.Error(), "--mps-root")
	// The longest socket of the longest root that fits is exactly the limit.
	assert.Len(t, filepath.Join(ok, uuid, "pipe", longestSocket), maxSocketPath)

	h := newHarness(t)
	h.opts.Root = long
	m := NewMPSManager(h.inv, h.opts)
	_, err = m.Acquire(context.Background(), "c1", uuid)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Unix socket path")
	assert.Empty(t, h.inv.calls, "compute mode changed for a daemon that cannot start")
	assert.Empty(t, h.starts(t))
}
