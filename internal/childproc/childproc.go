// Package childproc runs the child processes of the test cluster and of the
// local demo (etcd, the control-plane binaries, kwok, containerd, the
// kubelet, tessera-node, tessera-controller): each in its own process group
// with its output in a log file, stopped by SIGTERM then SIGKILL, and never
// outliving its parent.
package childproc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Process is a running child. Its exported fields are read-only.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string // dir/<name>.log; its first line is the command line
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	err     error         // Wait's result, valid once done is closed
}

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
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	klog.V(2).InfoS("Started test-cluster process", "name", name, "pid", cmd.Process.Pid)
	return p, nil
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
// it. It always waits for the process to be reaped, and kills whatever the
// process left in its group.
func (p *Process) Stop(grace time.Duration) {
	defer p.logFile.Close()
	pgid := p.Cmd.Process.Pid // Setpgid: the group id is the child's pid
	if done, _ := p.Exited(); !done {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			klog.InfoS("Test-cluster process ignored SIGTERM, killing it", "name", p.Name, "pid", pgid)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	klog.V(2).InfoS("Stopped test-cluster process", "name", p.Name, "pid", pgid)
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
