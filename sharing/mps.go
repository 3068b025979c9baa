package sharing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/gpu"
)

// How the MPS control daemon is supervised.
//
// It is started with `nvidia-cuda-mps-control -d`, which forks a daemon and
// exits; the daemon writes its pid to nvidia-cuda-mps-control.pid in its
// pipe directory. The manager reads that pid and checks it every
// CheckInterval (signal 0, and not a zombie); a dead daemon is started again.
// This rather than a foreground child we could wait on, because a daemon
// outlives a restart of tessera-node: running MPS clients keep working, and
// the restarted manager adopts the daemon through its pid file instead of
// starting a second one.

const (
	// DefaultMPSControl is the MPS control program, looked up on PATH.
	DefaultMPSControl = "nvidia-cuda-mps-control"
	// DefaultMPSRoot holds one directory per GPU: <root>/<uuid>/{pipe,log}.
	DefaultMPSRoot = "/run/tessera/mps"
	// PIDFile is the file the control daemon writes in its pipe directory.
	PIDFile = "nvidia-cuda-mps-control.pid"
)

// The control daemon binds Unix sockets in its pipe directory ("control",
// and the longest, "control_privileged", as seen on driver 580). A socket
// path holds at most 107 bytes on Linux, and a longer one makes `-d` exit 1
// with nothing in its logs, so the length is checked before starting.
const (
	maxSocketPath = 107
	longestSocket = "control_privileged"
	// uuidLen is the length of a GPU UUID ("GPU-" and 36).
	uuidLen = 40
)

// MaxRootLen is the longest MPS root (--mps-root) whose per-GPU pipe
// directories still hold the daemon's sockets.
const MaxRootLen = maxSocketPath - len("/"+longestSocket) - len("/pipe") - 1 - uuidLen

// CheckRoot says whether root is short enough for the MPS daemons' sockets.
func CheckRoot(root string) error {
	if root == "" {
		root = DefaultMPSRoot
	}
	if len(root) > MaxRootLen {
		return fmt.Errorf("MPS root %s is %d characters long: at most %d fit, because the MPS daemon's sockets (<root>/<GPU UUID>/pipe/%s) must stay within the %d characters of a Unix socket path; use a shorter --mps-root",
			root, len(root), MaxRootLen, longestSocket, maxSocketPath)
	}
	return nil
}

func checkPipeDir(dir string) error {
	if n := len(dir) + len("/"+longestSocket); n > maxSocketPath {
		return fmt.Errorf("MPS pipe directory %s is too long: its socket %s would be %d characters, over the %d of a Unix socket path; use a shorter --mps-root (at most %d characters)",
			dir, longestSocket, n, maxSocketPath, MaxRootLen)
	}
	return nil
}

// MPSOptions configure an MPSManager.
type MPSOptions struct {
	// Control is the control program, a name looked up on PATH or a path;
	// DefaultMPSControl when empty.
	Control string
	// Root is the parent of the per-GPU pipe and log directories;
	// DefaultMPSRoot when empty.
	Root string
	// CheckInterval is how often daemons are checked; 2s when zero.
	CheckInterval time.Duration
	// Timeout bounds starting a daemon (until its pid file shows up) and
	// stopping it (until it has exited); 10s when zero.
	Timeout time.Duration
	// Env is added to the daemons' environment.
	Env []string
	// ControlArgs come before the control program's own arguments (the
	// built-in stand-in of fake mode is `tessera-node mps-standin`).
	ControlArgs []string
	// Supervisor is the Unix socket of the tessera-mps supervisor; when
	// set, daemons are started there, outside this process' container,
	// instead of as children of this process (Control, ControlArgs and Env
	// are then the supervisor's business).
	Supervisor string
}

// MPSDaemon describes the daemon of one GPU.
type MPSDaemon struct {
	GPU     string
	PipeDir string
	LogDir  string
	PID     int
	Claims  []string
}

// MPSManager runs one MPS control daemon per GPU that has MPS claims,
// reference-counted by claim UID.
type MPSManager struct {
	inv    gpu.Inventory
	opts   MPSOptions
	runner DaemonRunner

	mu      sync.Mutex
	daemons map[string]*mpsDaemon // by GPU UUID

	restarts atomic.Int64
}

type mpsDaemon struct {
	uuid    string
	pipeDir string
	logDir  string
	pid     int
	claims  map[string]struct{}
}

// NewMPSManager returns a manager; nothing runs until Acquire. Call
// Supervise to restart daemons that die.
func NewMPSManager(inv gpu.Inventory, opts MPSOptions) *MPSManager {
	if opts.Control == "" {
		opts.Control = DefaultMPSControl
	}
	if opts.Root == "" {
		opts.Root = DefaultMPSRoot
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = 2 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	var runner DaemonRunner = &ProcessRunner{Control: opts.Control, ControlArgs: opts.ControlArgs, Timeout: opts.Timeout, Env: opts.Env}
	if opts.Supervisor != "" {
		runner = NewSupervisorClient(opts.Supervisor, opts.Root, opts.Timeout)
	}
	return &MPSManager{inv: inv, opts: opts, runner: runner, daemons: map[string]*mpsDaemon{}}
}

// PipeDir is the host pipe directory of a GPU's daemon (what containers mount).
func (m *MPSManager) PipeDir(gpuUUID string) string {
	return filepath.Join(m.opts.Root, gpuUUID, "pipe")
}

// LogDir is the log directory of a GPU's daemon.
func (m *MPSManager) LogDir(gpuUUID string) string {
	return filepath.Join(m.opts.Root, gpuUUID, "log")
}

// Daemons is the number of daemons running (for the metrics).
func (m *MPSManager) Daemons() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.daemons)
}

// Restarts is how many times a dead daemon was started again: the metric
// tessera_node_mps_daemon_restarts_total (alerted on by the chart's rules).
func (m *MPSManager) Restarts() int64 { return m.restarts.Load() }

// Daemon returns the daemon of a GPU, if it has one.
func (m *MPSManager) Daemon(gpuUUID string) (MPSDaemon, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.daemons[gpuUUID]
	if !ok {
		return MPSDaemon{}, false
	}
	return d.info(), true
}

func (d *mpsDaemon) info() MPSDaemon {
	claims := make([]string, 0, len(d.claims))
	for c := range d.claims {
		claims = append(claims, c)
	}
	sort.Strings(claims)
	return MPSDaemon{GPU: d.uuid, PipeDir: d.pipeDir, LogDir: d.logDir, PID: d.pid, Claims: claims}
}

// Acquire records that a claim uses MPS on a GPU, and on the GPU's first
// claim sets it to EXCLUSIVE_PROCESS and starts (or adopts) its daemon.
// Acquiring the same claim again is a no-op, so the driver can replay its
// checkpoint after a restart.
func (m *MPSManager) Acquire(ctx context.Context, claimUID, gpuUUID string) (MPSDaemon, error) {
	if claimUID == "" || gpuUUID == "" {
		return MPSDaemon{}, errors.New("MPS acquire: empty claim UID or GPU UUID")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.daemons[gpuUUID]; ok {
		d.claims[claimUID] = struct{}{}
		return d.info(), nil
	}
	d := &mpsDaemon{uuid: gpuUUID, pipeDir: m.PipeDir(gpuUUID), logDir: m.LogDir(gpuUUID), claims: map[string]struct{}{claimUID: {}}}
	if err := checkPipeDir(d.pipeDir); err != nil {
		return MPSDaemon{}, fmt.Errorf("MPS on GPU %s: %w", gpuUUID, err)
	}
	if err := m.inv.SetComputeMode(gpuUUID, gpu.ComputeModeExclusiveProcess); err != nil {
		return MPSDaemon{}, fmt.Errorf("MPS on GPU %s: setting compute mode EXCLUSIVE_PROCESS: %w", gpuUUID, err)
	}
	if err := m.start(ctx, d); err != nil {
		if rerr := m.inv.SetComputeMode(gpuUUID, gpu.ComputeModeDefault); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Restoring compute mode after failed MPS start", "gpu", gpuUUID)
		}
		return MPSDaemon{}, err
	}
	m.daemons[gpuUUID] = d
	klog.FromContext(ctx).Info("MPS daemon running", "gpu", gpuUUID, "pid", d.pid, "pipeDir", d.pipeDir, "claim", claimUID)
	return d.info(), nil
}

// Release drops a claim from a GPU; when it was the last, the daemon is told
// to quit and the GPU's compute mode goes back to DEFAULT. Releasing a claim
// the manager does not know is a no-op.
func (m *MPSManager) Release(ctx context.Context, claimUID, gpuUUID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.daemons[gpuUUID]
	if !ok {
		return nil
	}
	if _, ok := d.claims[claimUID]; !ok {
		return nil
	}
	delete(d.claims, claimUID)
	if len(d.claims) > 0 {
		return nil
	}
	if err := m.stop(ctx, d); err != nil {
		// Keep the claim so that a retried Unprepare tries again.
		d.claims[claimUID] = struct{}{}
		return err
	}
	delete(m.daemons, gpuUUID)
	if err := m.inv.SetComputeMode(gpuUUID, gpu.ComputeModeDefault); err != nil {
		return fmt.Errorf("MPS on GPU %s stopped, but restoring compute mode DEFAULT failed: %w", gpuUUID, err)
	}
	klog.FromContext(ctx).Info("MPS daemon stopped", "gpu", gpuUUID, "lastClaim", claimUID)
	return nil
}

// Supervise checks the daemons every CheckInterval and starts dead ones
// again, until ctx is done. Daemons keep running after it returns.
func (m *MPSManager) Supervise(ctx context.Context) {
	t := time.NewTicker(m.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.check(ctx)
		}
	}
}

func (m *MPSManager) check(ctx context.Context) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	for uuid, d := range m.daemons {
		ok, err := m.runner.Alive(ctx, d.spec(), d.pid)
		if err != nil {
			logger.Error(err, "Checking MPS daemon; will retry", "gpu", uuid, "pid", d.pid)
			continue
		}
		if ok {
			continue
		}
		logger.Info("MPS daemon died; starting it again", "gpu", uuid, "pid", d.pid)
		m.restarts.Add(1)
		// The mode may have been reset by whoever killed the daemon.
		if err := m.inv.SetComputeMode(uuid, gpu.ComputeModeExclusiveProcess); err != nil {
			logger.Error(err, "Setting compute mode EXCLUSIVE_PROCESS before MPS restart", "gpu", uuid)
		}
		if err := m.start(ctx, d); err != nil {
			logger.Error(err, "Restarting MPS daemon; will retry", "gpu", uuid)
		}
	}
}

func (d *mpsDaemon) spec() DaemonSpec {
	return DaemonSpec{GPU: d.uuid, PipeDir: d.pipeDir, LogDir: d.logDir}
}

// start starts the daemon of d through the runner, or adopts one already
// running, and sets d.pid.
func (m *MPSManager) start(ctx context.Context, d *mpsDaemon) error {
	pid, err := m.runner.Start(ctx, d.spec())
	if err != nil {
		return err
	}
	d.pid = pid
	return nil
}

// stop stops the daemon of d through the runner.
func (m *MPSManager) stop(ctx context.Context, d *mpsDaemon) error {
	return m.runner.Stop(ctx, d.spec(), d.pid)
}

// logTail is the last lines of a daemon log, for an error message: what
// the daemon said is usually the cause. Empty when there is nothing to show.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return ": " + strings.Join(lines, " | ")
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", path, string(b))
	}
	return pid, nil
}

func waitPID(ctx context.Context, path string) (int, error) {
	for {
		if pid, err := readPID(path); err == nil && alive(pid) {
			return pid, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no live pid in %s: %w", path, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func waitExit(ctx context.Context, pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// alive says whether pid is a running process. A zombie counts as dead: the
// daemon is reparented when its starter exits, and not every init reaps.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return !os.IsNotExist(err)
	}
	// The state follows the command name, which is in parentheses and may
	// hold spaces.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}
