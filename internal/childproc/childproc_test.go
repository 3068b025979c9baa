package childproc

import (
	"strings"
	"testing"
	"time"
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
