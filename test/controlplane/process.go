package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// process is one child of the harness (etcd, kube-apiserver, ...). Its
// stdout and stderr go to Dir/<name>.log.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	err     error         // Wait's result, valid once done is closed
}

// startProcess starts bin with args in its own process group, so that stop
// can signal everything it may have spawned. Pdeathsig kills it even when
// the test binary dies without running cleanups (e.g. go test -timeout).
func startProcess(dir, name, bin string, args []string, env []string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	fmt.Fprintf(f, "# %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{})}
	// The pid goes into Dir so that whoever inspects a kept Dir can see
	// what ran (and clean up by hand if the harness itself was SIGKILLed).
	_ = os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	klog.V(2).InfoS("Started control-plane process", "name", name, "pid", cmd.Process.Pid)
	return p, nil
}

// exited reports whether the process has already ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// it. It always waits for the process to be reaped.
func (p *process) stop(grace time.Duration) {
	defer p.logFile.Close()
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the child's pid
	if done, _ := p.exited(); !done {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			klog.InfoS("Control-plane process ignored SIGTERM, killing it", "name", p.name, "pid", pgid)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
	}
	// Anything the process spawned into its group and left behind goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	klog.V(2).InfoS("Stopped control-plane process", "name", p.name, "pid", pgid)
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	// Logs can be large; only the end matters.
	const maxRead = 256 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		_, _ = f.Seek(st.Size()-maxRead, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// addrInUse tells whether a process failed because another process took its
// port between our probe and its bind; then the whole start is retried.
func (p *process) addrInUse() bool {
	return strings.Contains(p.tail(50), "address already in use")
}

// portAllocator hands out free loopback ports. It keeps the probe listeners
// of one start open until all ports are chosen, so one start never gets the
// same port twice; other test binaries may still race us, which the retry
// in Start absorbs.
type portAllocator struct {
	mu        sync.Mutex
	listeners []net.Listener
}

func (a *portAllocator) get() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	a.listeners = append(a.listeners, l)
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (a *portAllocator) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.listeners {
		_ = l.Close()
	}
	a.listeners = nil
}

// errExited is returned while waiting for a process that has already died.
var errExited = errors.New("process exited")
