package framework

import (
	"testing"
	"time"
)

// Eventually polls cond every 100 ms until it holds, and fails the test
// after timeout with what it waited for and cond's last word.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
