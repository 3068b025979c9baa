package sharing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/killpoint"
)

// DaemonSpec names the MPS control daemon of one GPU and its directories.
type DaemonSpec struct {
	GPU     string
	PipeDir string
	LogDir  string
}

// DaemonRunner starts, checks and stops MPS control daemons. The process
// runner does it itself (daemons run beside whoever called it); the
// supervisor client asks the tessera-mps supervisor, so that daemons run in
// its pod and outlive tessera-node's container (see docs/DESIGN.md).
type DaemonRunner interface {
	// Start returns the pid of the GPU's running daemon, adopting one
	// found through its pid file, or starting one.
	Start(ctx context.Context, d DaemonSpec) (int, error)
	// Alive says whether the daemon with this pid still runs.
	Alive(ctx context.Context, d DaemonSpec, pid int) (bool, error)
	// Stop tells the daemon to quit and waits for it; a daemon already
	// gone is not an error.
	Stop(ctx context.Context, d DaemonSpec, pid int) error
}

// ProcessRunner runs the control program itself: `<Control> <ControlArgs>
// -d` in its own session. Daemons are children of this process' container.
type ProcessRunner struct {
	// Control is the control program (a name on PATH or a path).
	Control string
	// ControlArgs come before the program's own arguments (the built-in
	// stand-in is `tessera-node mps-standin`).
	ControlArgs []string
	// Timeout bounds a start (until the pid file shows up) and a stop.
	Timeout time.Duration
	// Env is added to the daemons' environment.
	Env []string
}

func (r *ProcessRunner) env(d DaemonSpec) []string {
	env := append(os.Environ(),
		"CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.LogDir,
		"CUDA_VISIBLE_DEVICES="+d.GPU,
	)
	return append(env, r.Env...)
}

func (r *ProcessRunner) command(ctx context.Context, control string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, control, append(append([]string{}, r.ControlArgs...), args...)...)
}

// Start implements DaemonRunner.
func (r *ProcessRunner) Start(ctx context.Context, d DaemonSpec) (int, error) {
	for _, dir := range []string{d.PipeDir, d.LogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, fmt.Errorf("MPS on GPU %s: creating %s: %w", d.GPU, dir, err)
		}
	}
	pidPath := filepath.Join(d.PipeDir, PIDFile)
	if pid, err := readPID(pidPath); err == nil && alive(pid) {
		klog.FromContext(ctx).Info("Adopting running MPS daemon", "gpu", d.GPU, "pid", pid)
		return pid, nil
	}
	_ = os.Remove(pidPath) // stale: its daemon is gone

	control, err := exec.LookPath(r.Control)
	if err != nil {
		return 0, fmt.Errorf("MPS on GPU %s: %s not found (is the driver's MPS installed and on PATH?): %w", d.GPU, r.Control, err)
	}
	// Output goes to a file, not a pipe: the forked daemon inherits the
	// descriptors, and Wait on a pipe would block until the daemon exits.
	out, err := os.OpenFile(filepath.Join(d.LogDir, "tessera-start.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("MPS on GPU %s: opening start log: %w", d.GPU, err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	cmd := r.command(ctx, control, "-d")
	cmd.Env = r.env(d)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own session: signals to our process group must not reach the
	// daemon.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("MPS on GPU %s: %s -d: %w%s (see %s)", d.GPU, control, err, logTail(out.Name()), out.Name())
	}
	// The daemon runs; nothing but its pid file knows it yet. A restart
	// adopts it through that file (above), so no second daemon starts.
	killpoint.Reach(killpoint.MPSBeforePIDFile)
	pid, err := waitPID(ctx, pidPath)
	if err != nil {
		return 0, fmt.Errorf("MPS on GPU %s: daemon did not come up: %w%s (see %s)", d.GPU, err, logTail(filepath.Join(d.LogDir, "control.log")), d.LogDir)
	}
	return pid, nil
}

// Alive implements DaemonRunner.
func (r *ProcessRunner) Alive(_ context.Context, _ DaemonSpec, pid int) (bool, error) {
	return alive(pid), nil
}

// Stop sends `quit` to the daemon through the control program and waits for
// it to exit; after Timeout it is killed.
func (r *ProcessRunner) Stop(ctx context.Context, d DaemonSpec, pid int) error {
	if !alive(pid) {
		_ = os.Remove(filepath.Join(d.PipeDir, PIDFile))
		return nil
	}
	control, err := exec.LookPath(r.Control)
	if err == nil {
		qctx, cancel := context.WithTimeout(ctx, r.Timeout)
		cmd := r.command(qctx, control)
		cmd.Env = r.env(d)
		cmd.Stdin = strings.NewReader("quit\n")
		out, qerr := cmd.CombinedOutput()
		cancel()
		if qerr != nil {
			klog.FromContext(ctx).Error(qerr, "MPS quit failed; killing the daemon", "gpu", d.GPU, "output", string(out))
		}
	}
	if waitExit(ctx, pid, r.Timeout) {
		_ = os.Remove(filepath.Join(d.PipeDir, PIDFile))
		return nil
	}
	klog.FromContext(ctx).Info("MPS daemon did not quit in time; killing it", "gpu", d.GPU, "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if waitExit(ctx, pid, r.Timeout) {
		_ = os.Remove(filepath.Join(d.PipeDir, PIDFile))
		return nil
	}
	return fmt.Errorf("MPS on GPU %s: daemon %d does not exit", d.GPU, pid)
}

// StopAll stops every daemon below root that its pid file shows running:
// what uninstalling leaves must not keep GPUs in MPS. It returns the GPUs
// whose daemons it stopped.
func (r *ProcessRunner) StopAll(ctx context.Context, root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing MPS root %s: %w", root, err)
	}
	var stopped []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || ValidateGPU(e.Name()) != nil {
			continue
		}
		d := DaemonSpec{GPU: e.Name(), PipeDir: filepath.Join(root, e.Name(), "pipe"), LogDir: filepath.Join(root, e.Name(), "log")}
		pid, err := readPID(filepath.Join(d.PipeDir, PIDFile))
		if err != nil || !alive(pid) {
			continue
		}
		if err := r.Stop(ctx, d, pid); err != nil {
			errs = append(errs, err)
			continue
		}
		stopped = append(stopped, d.GPU)
	}
	if len(errs) > 0 {
		return stopped, fmt.Errorf("stopping MPS daemons below %s: %v", root, errs)
	}
	return stopped, nil
}

// RemoveDaemonDirs removes what MPS leaves below root once its daemons are
// stopped: each GPU's pipe and log directories whose daemon no longer runs
// (a running one's are kept, and named in the error), the supervisor's
// socket, and root itself when that leaves it empty. For an uninstall, after
// StopAll; a later start creates them again.
func RemoveDaemonDirs(root string) error {
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing MPS root %s: %w", root, err)
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(root, e.Name())
		switch {
		case e.Name() == SupervisorSocket:
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
			continue
		case !e.IsDir() || ValidateGPU(e.Name()) != nil:
			continue // not ours
		}
		if pid, err := readPID(filepath.Join(path, "pipe", PIDFile)); err == nil && alive(pid) {
			errs = append(errs, fmt.Errorf("MPS daemon %d of GPU %s still runs: %s kept", pid, e.Name(), path))
			continue
		}
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", path, err))
		}
	}
	// Fails while something else is in it, or where root is a mount point.
	_ = os.Remove(root)
	return errors.Join(errs...)
}

// ValidateGPU checks a GPU UUID that names a directory below the MPS root:
// letters, digits and dashes only, so that it cannot reach outside it.
func ValidateGPU(uuid string) error {
	if uuid == "" {
		return fmt.Errorf("empty GPU UUID")
	}
	if len(uuid) > 64 {
		return fmt.Errorf("GPU UUID %.64q... is %d characters long, at most 64", uuid, len(uuid))
	}
	for _, c := range uuid {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("GPU UUID %q has %q: only letters, digits and '-' are allowed", uuid, c)
		}
	}
	return nil
}
