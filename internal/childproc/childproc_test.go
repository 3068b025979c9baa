package childproc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStartStopTail(t *testing.T) {
	dir := t.TempDir()
	// The child ignores SIGTERM, so Stop must fall back to SIGKILL.
	p, err := Start(dir, "stubborn", "/bin/sh", []string{"-c", `trap "" TERM; echo one; echo two; sleep 60`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Tail(1) != "two" { // the command line itself says "echo two"
		if time.Now().After(deadline) {
			t.Fatalf("log: %q", p.Tail(5))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if done, _ := p.Exited(); done {
		t.Fatal("exited early")
	}
	p.Stop(200 * time.Millisecond)
	if done, _ := p.Exited(); !done {
		t.Fatal("still running after Stop")
	}
	if got := p.Tail(2); got != "one\ntwo" {
		t.Fatalf("Tail(2) = %q", got)
	}
	if !strings.HasPrefix(TailFile(p.LogPath, 10), "# /bin/sh -c") {
		t.Fatalf("log does not start with the command line: %q", TailFile(p.LogPath, 10))
	}
}

// grandchild starts a leader shell that puts `sleep 600` in the background
// (in the leader's group) and prints its pid, then runs tail; it returns the
// process and the grandchild's pid and start time (to tell it from a later
// process given the same pid). A tail may wait for goAhead with untilGo.
const untilGo = `until [ -e go ]; do sleep 0.01; done; `

// goAhead lets a leader waiting with untilGo go on.
func goAhead(t *testing.T, p *Process) {
	if err := os.WriteFile(filepath.Join(filepath.Dir(p.LogPath), "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
func grandchild(t *testing.T, tail string) (*Process, int, string) {
	t.Helper()
	p, err := Start(t.TempDir(), "leader", "/bin/sh", []string{"-c", `sleep 600 & echo "grandchild $!"; ` + tail}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(time.Second) })
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(p.Tail(1), "grandchild ") {
		if time.Now().After(deadline) {
			t.Fatalf("no grandchild pid in the log: %q", p.Tail(5))
		}
		time.Sleep(10 * time.Millisecond)
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(p.Tail(1), "grandchild "))
	if err != nil {
		t.Fatal(err)
	}
	start, alive := procStart(pid)
	if !alive {
		t.Fatalf("grandchild %d is not running", pid)
	}
	return p, pid, start
}

// procStart is process pid's start time (field 22 of /proc/<pid>/stat) and
// whether it is alive (neither gone nor a zombie).
func procStart(pid int) (string, bool) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", false
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from the 3rd (state) on
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// waitDead waits up to 10 s for process pid, started at start, to die.
func waitDead(pid int, start string) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, alive := procStart(pid); !alive || st != start {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestStopKillsGrandchildren: Stop kills what the child started in its group.
func TestStopKillsGrandchildren(t *testing.T) {
	p, pid, start := grandchild(t, `trap "" TERM; sleep 600`)
	p.Stop(100 * time.Millisecond)
	if !waitDead(pid, start) {
		t.Fatalf("grandchild %d still runs after Stop", pid)
	}
}

// TestLeaderExitKillsGroupBeforeReap: a leader that exits on its own while
// a grandchild keeps its group has that grandchild killed before it is
// reaped — so nothing has to signal the group later, when its id may be
// another process's. The old code killed it only at Stop, after the reap.
func TestLeaderExitKillsGroupBeforeReap(t *testing.T) {
	p, pid, start := grandchild(t, untilGo+`exit 3`)
	goAhead(t, p)
	deadline := time.Now().Add(10 * time.Second)
	for done, _ := p.Exited(); !done; done, _ = p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("the leader did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !waitDead(pid, start) {
		t.Fatalf("grandchild %d still runs after its leader was reaped", pid)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrReaped) {
		t.Fatalf("Signal after the reap: %v, want ErrReaped", err)
	}
	p.Stop(time.Second)
	if code := p.Cmd.ProcessState.ExitCode(); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
}

// TestGroupSignalsOnlyBeforeReap watches every group signal: at each, the
// leader must still be unreaped (waitid with WNOWAIT|WNOHANG finds it), or
// the group id could have been reused.
func TestGroupSignalsOnlyBeforeReap(t *testing.T) {
	var mu sync.Mutex
	var problems []string
	signals := 0
	orig := killGroup
	killGroup = func(pgid int, sig syscall.Signal) error {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pgid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
			mu.Lock()
			problems = append(problems, fmt.Sprintf("%v to group %d after its leader was reaped (waitid: %v)", sig, pgid, err))
			mu.Unlock()
		}
		mu.Lock()
		signals++
		mu.Unlock()
		return orig(pgid, sig)
	}
	t.Cleanup(func() { killGroup = orig })
	for _, tc := range []struct {
		name, tail string
		stop       func(*testing.T, *Process)
	}{
		{"stop a running leader", `sleep 600`, func(_ *testing.T, p *Process) { p.Stop(time.Second) }},
		{"stop one ignoring SIGTERM", `trap "" TERM; sleep 600`, func(_ *testing.T, p *Process) { p.Stop(50 * time.Millisecond) }},
		{"kill", `sleep 600`, func(_ *testing.T, p *Process) { p.Kill() }},
		{"stop after the leader exited", untilGo + `exit 0`, func(t *testing.T, p *Process) {
			goAhead(t, p)
			for done, _ := p.Exited(); !done; done, _ = p.Exited() {
				time.Sleep(10 * time.Millisecond)
			}
			p.Stop(time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, pid, start := grandchild(t, tc.tail)
			tc.stop(t, p)
			_ = p.Signal(syscall.SIGCONT) // after the reap: must send nothing
			if !waitDead(pid, start) {
				t.Fatalf("grandchild %d still runs", pid)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if signals == 0 {
		t.Fatal("no group signal was seen: the hook is not in use")
	}
	for _, p := range problems {
		t.Error(p)
	}
}
