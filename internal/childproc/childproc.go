// Package childproc runs the child processes of the test cluster and of the
// local demo (etcd, the control-plane binaries, kwok, containerd, the
// kubelet, tessera-node, tessera-controller): each in its own process group
// with its output in a log file, stopped by SIGTERM then SIGKILL, and never
// outliving its parent.
//
// A process group is signalled only while its leader is not yet reaped: a
// reaped leader whose group has emptied frees its id, and with pids
// wrapping (pid_max is 32768 on some machines) kill(-pgid) could then hit
// another test's process. So the reaper first waits for the leader's exit
// without reaping it (waitid with WNOWAIT: the zombie keeps its id), kills
// what the leader left in its group, and only then reaps.
package childproc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Process is a running child. Its exported fields are read-only.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string // dir/<name>.log; its first line is the command line
	logFile *os.File
	done    chan struct{} // closed when the process has exited and is reaped
	err     error         // Wait's result, valid once done is closed

	mu      sync.Mutex
	reaping bool // set before the reap: no group signal may follow
}

// ErrReaped is returned by Signal once the process is (being) reaped: its
// group id may belong to another process by then.
var ErrReaped = errors.New("process exited and was reaped")

// killGroup sends sig to process group pgid; tests replace it to watch the
// order of signals and reaping.
var killGroup = func(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }

// Start starts bin with args in dir, in its own process group (so Stop can
// signal everything it spawned), with env added to this process's
// environment. Pdeathsig kills it even when the test binary dies without
// running cleanups (go test -timeout). Its pid goes to dir/<name>.pid, so
// whoever inspects a kept dir can see what ran.
func Start(dir, name, bin string, args, env []string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	fmt.Fprintf(f, "# %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, logFile: f, done: make(chan struct{})}
	_ = os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	go p.reap()
	klog.V(2).InfoS("Started test-cluster process", "name", name, "pid", cmd.Process.Pid)
	return p, nil
}

// reap waits for the leader to exit, kills what it left in its group while
// the unreaped leader still holds the group's id, then reaps it.
func (p *Process) reap() {
	pid := p.Cmd.Process.Pid
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			// Not expected for our own child; reaping still works, only
			// the leftovers in the group are not killed.
			klog.InfoS("Waiting for a test-cluster process without reaping it failed", "name", p.Name, "pid", pid, "err", err)
			p.mu.Lock()
			p.reaping = true
			p.mu.Unlock()
			p.err = p.Cmd.Wait()
			close(p.done)
			return
		}
	}
	p.mu.Lock()
	_ = killGroup(pid, syscall.SIGKILL) // the leader is a zombie: the id is still its own
	p.reaping = true
	p.mu.Unlock()
	p.err = p.Cmd.Wait()
	close(p.done)
}

// Signal sends sig to the process's group. It returns ErrReaped (and sends
// nothing) once the leader has exited and is being reaped; the group's
// leftovers are killed before that.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaping {
		return fmt.Errorf("signalling %s (pid %d): %w", p.Name, p.Cmd.Process.Pid, ErrReaped)
	}
	if err := killGroup(p.Cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d) with %v: %w", p.Name, p.Cmd.Process.Pid, sig, err)
	}
	return nil
}

// Exited reports whether the process has already ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// it. It always waits for the process to be reaped; whatever the process
// left in its group is killed before that (see reap).
func (p *Process) Stop(grace time.Duration) {
	defer p.logFile.Close()
	pid := p.Cmd.Process.Pid
	if p.Signal(syscall.SIGTERM) == nil {
		select {
		case <-p.done:
		case <-time.After(grace):
			klog.InfoS("Test-cluster process ignored SIGTERM, killing it", "name", p.Name, "pid", pid)
			_ = p.Signal(syscall.SIGKILL)
		}
	}
	<-p.done
	klog.V(2).InfoS("Stopped test-cluster process", "name", p.Name, "pid", pid)
}

// Kill SIGKILLs the process group (a crash: nothing runs after it) and
// waits until the process is reaped.
func (p *Process) Kill() {
	defer p.logFile.Close()
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return TailFile(p.LogPath, n) }

// TailFile returns the last n lines of a (possibly large) log file.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxRead = 256 << 10 // logs can be large; only the end matters
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		_, _ = f.Seek(st.Size()-maxRead, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	// Long lines (JSON logs, stack traces) would push a test's own failure
	// out of a CI log's tail.
	const maxLine = 400
	for i, l := range lines {
		if len(l) > maxLine {
			lines[i] = append(l[:maxLine:maxLine], []byte("…")...)
		}
	}
	return string(bytes.Join(lines, []byte("\n")))
}
