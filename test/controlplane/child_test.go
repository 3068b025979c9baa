package controlplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestChild checks the control a test has over a child: pause and resume
// (seen in /proc), SIGKILL (exit code -1), exit codes, restart with the log
// kept and the environment replaced. It needs no control-plane binaries.
func TestChild(t *testing.T) {
	cp := &ControlPlane{Dir: t.TempDir()}
	// One deadline for every wait of the test: generous, because a loaded
	// 2-core CI machine once took the whole 30 s it used to allow.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	script := `echo "run $RUN"; trap 'exit 7' TERM; while :; do sleep 0.05; done`
	c := cp.StartChild(t, ChildOptions{Name: "looper", Bin: "/bin/sh", Args: []string{"-c", script}, Env: []string{"RUN=one"}})
	waitLog(t, c, "run one")

	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPaused(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	for c.Paused() {
		if ctx.Err() != nil {
			t.Fatal("still paused after Resume")
		}
		time.Sleep(10 * time.Millisecond)
	}

	c.Kill()
	if done, code := c.Exited(); !done || code != -1 {
		t.Fatalf("after Kill: exited %v code %d, want true -1", done, code)
	}
	if err := c.RestartWithEnv([]string{"RUN=two"}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, c, "run two")
	if !strings.Contains(c.Log(), "run one") {
		t.Fatalf("the restart lost the first run's log:\n%s", c.Log())
	}
	// A paused child still stops cleanly: Stop resumes it for SIGTERM.
	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitPaused(ctx); err != nil {
		t.Fatal(err)
	}
	if code := c.Stop(5 * time.Second); code != 7 {
		t.Fatalf("Stop: exit code %d, want 7 (the TERM trap)", code)
	}
	if code, err := c.Wait(ctx); err != nil || code != 7 {
		t.Fatalf("Wait: %d %v", code, err)
	}
}

// TestChildNamesUnique: two children of one name would share a log.
func TestChildNamesUnique(t *testing.T) {
	cp := &ControlPlane{Dir: t.TempDir()}
	cp.StartChild(t, ChildOptions{Name: "x", Bin: "/bin/sleep", Args: []string{"30"}})
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		cp.StartChild(ft, ChildOptions{Name: "x", Bin: "/bin/sleep", Args: []string{"30"}})
	}()
	if !strings.Contains(ft.msg, `"x" runs already`) {
		t.Fatalf("second child named x: %q", ft.msg)
	}
}

type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}

func waitLog(t *testing.T, c *Child, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.Log(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%q not in the log:\n%s", want, c.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
