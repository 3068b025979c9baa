package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/childproc"
)

// Child is a process a test runs next to the control plane (a
// tessera-controller replica, for one) that the test kills, freezes and
// restarts at will. Its stdout and stderr go to Dir/<name>.log, which a
// restart appends to; the test's cleanup stops it and, when the test
// failed, logs the log's tail.
type Child struct {
	Name    string
	LogPath string

	dir string
	bin string

	mu   sync.Mutex
	args []string
	env  []string
	p    *childproc.Process
}

// ChildOptions say what StartChild runs.
type ChildOptions struct {
	// Name names the log (Dir/<Name>.log) and the messages; it must be
	// unique among the children of one control plane.
	Name string
	// Bin is the executable (e.g. from GoBinary); Args and Env (added to
	// the test's environment) are passed as given.
	Bin  string
	Args []string
	Env  []string
}

// StartChild starts a child process in the control plane's Dir. It is
// stopped (SIGTERM, then SIGKILL after 10 s) at t's cleanup.
func (cp *ControlPlane) StartChild(t testing.TB, opts ChildOptions) *Child {
	t.Helper()
	cp.mu.Lock()
	if cp.children == nil {
		cp.children = map[string]int{}
	}
	dup := cp.children[opts.Name] > 0
	if !dup {
		cp.children[opts.Name]++
	}
	cp.mu.Unlock()
	if dup {
		t.Fatalf("StartChild: a child named %q runs already", opts.Name)
	}
	c := &Child{Name: opts.Name, LogPath: cp.path(opts.Name + ".log"), dir: cp.Dir, bin: opts.Bin, args: opts.Args, env: opts.Env}
	if err := c.start(); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		c.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("---- last lines of %s ----\n%s", c.LogPath, c.Tail(40))
		}
		cp.mu.Lock()
		delete(cp.children, opts.Name)
		cp.mu.Unlock()
	})
	return c
}

func (c *Child) start() error {
	p, err := childproc.Start(c.dir, c.Name, c.bin, c.args, c.env)
	if err != nil {
		return err
	}
	c.p = p
	return nil
}

func (c *Child) proc() *childproc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.p
}

// Pid is the process id of the current process (it changes on Restart).
func (c *Child) Pid() int { return c.proc().Cmd.Process.Pid }

// Signal sends sig to the child's process group (an error once the child
// has exited: its group id may be another process's by then).
func (c *Child) Signal(sig syscall.Signal) error { return c.proc().Signal(sig) }

// Kill SIGKILLs the child (a crash: nothing runs after it) and waits until
// it is reaped.
func (c *Child) Kill() { c.proc().Kill() }

// Pause freezes the child with SIGSTOP: its goroutines, timers and
// connections stay as they are until Resume.
func (c *Child) Pause() error { return c.Signal(syscall.SIGSTOP) }

// Resume continues a paused child with SIGCONT.
func (c *Child) Resume() error { return c.Signal(syscall.SIGCONT) }

// Paused says whether the child is stopped by a signal (SIGSTOP from Pause
// or from the child itself), read from /proc/<pid>/stat.
func (c *Child) Paused() bool {
	switch state(c.Pid()) {
	case "T", "t":
		return true
	case "D":
		// Stopped while it vforked (a shell starting a command, Go's
		// os/exec): the child stopped before its exec, and the parent
		// waits for it uninterruptibly — as frozen as a stopped process.
		// Seen in TestChild, about once in 25 runs.
		kids := children(c.Pid())
		for _, k := range kids {
			if st := state(k); st != "T" && st != "t" {
				return false
			}
		}
		return len(kids) > 0
	}
	return false
}

// state is process pid's state letter in /proc/<pid>/stat ("?" when it
// cannot be read).
func state(pid int) string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "?"
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "?"
	}
	return s[i+2 : i+3]
}

// children are the pids of process pid's children.
func children(pid int) []int {
	p := strconv.Itoa(pid)
	data, err := os.ReadFile(filepath.Join("/proc", p, "task", p, "children"))
	if err != nil {
		return nil
	}
	var kids []int
	for _, f := range strings.Fields(string(data)) {
		if k, err := strconv.Atoi(f); err == nil {
			kids = append(kids, k)
		}
	}
	return kids
}

// WaitPaused waits until the child is stopped (see Paused), it exits, or
// ctx ends.
func (c *Child) WaitPaused(ctx context.Context) error {
	for !c.Paused() {
		if done, code := c.Exited(); done {
			return fmt.Errorf("%s exited (code %d) instead of pausing", c.Name, code)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to pause (state %s): %w", c.Name, state(c.Pid()), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Exited says whether the current process has ended and its exit code (-1
// when a signal ended it).
func (c *Child) Exited() (bool, int) {
	p := c.proc()
	done, _ := p.Exited()
	if !done {
		return false, 0
	}
	return true, p.Cmd.ProcessState.ExitCode()
}

// Wait waits for the current process to end and returns its exit code (-1
// when a signal ended it).
func (c *Child) Wait(ctx context.Context) (int, error) {
	for {
		if done, code := c.Exited(); done {
			return code, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s to exit: %w", c.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the child cleanly: SIGCONT (a paused process cannot act on
// SIGTERM), SIGTERM, then SIGKILL after grace. It returns the exit code.
func (c *Child) Stop(grace time.Duration) int {
	p := c.proc()
	_ = p.Signal(syscall.SIGCONT) // sends nothing to an exited child
	p.Stop(grace)
	return p.Cmd.ProcessState.ExitCode()
}

// Restart starts the child again with the same arguments and environment
// (SIGKILLing it first if it still runs), as a kubelet restarts a container.
func (c *Child) Restart() error { return c.RestartWithEnv(nil) }

// RestartWithEnv is Restart with env in place of the environment given at
// start (nil keeps it), e.g. to drop a test hook.
func (c *Child) RestartWithEnv(env []string) error {
	c.Kill() // reaps it and closes its log, whether it ran or had exited
	c.mu.Lock()
	defer c.mu.Unlock()
	if env != nil {
		c.env = env
	}
	return c.start()
}

// Tail returns the last n lines of the child's log (every run of it).
func (c *Child) Tail(n int) string { return childproc.TailFile(c.LogPath, n) }

// Log returns the child's whole log (every run of it).
func (c *Child) Log() string {
	data, err := os.ReadFile(c.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", c.LogPath, err)
	}
	return string(data)
}

var (
	goBinMu    sync.Mutex
	goBinDir   string
	goBinBuilt = map[string]string{}
)

// GoBinary builds a main package of this module (e.g.
// "./cmd/tessera-controller") once per test binary and returns the path of
// the executable; it fails t when the build fails. RemoveGoBinaries removes
// them (Shared.Run calls it).
func GoBinary(t testing.TB, pkg string) string {
	t.Helper()
	bin, err := goBinary(pkg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return bin
}

func goBinary(pkg string) (string, error) {
	goBinMu.Lock()
	defer goBinMu.Unlock()
	if bin, ok := goBinBuilt[pkg]; ok {
		return bin, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	if goBinDir == "" {
		if goBinDir, err = os.MkdirTemp("", "tessera-testbin-"); err != nil {
			return "", fmt.Errorf("building %s: %w", pkg, err)
		}
	}
	bin := filepath.Join(goBinDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	goBinBuilt[pkg] = bin
	return bin, nil
}

// RemoveGoBinaries removes what GoBinary built; call it at the end of
// TestMain (Shared.Run does).
func RemoveGoBinaries() {
	goBinMu.Lock()
	defer goBinMu.Unlock()
	if goBinDir != "" {
		_ = os.RemoveAll(goBinDir)
	}
	goBinDir = ""
	goBinBuilt = map[string]string{}
}
