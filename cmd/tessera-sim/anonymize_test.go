package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAnonymizeCommand: anonymize writes a file without the cluster's
// names and a private key; replay on it agrees with its decisions, and
// with --key prints the original names; bad input exits 2, naming it.
func TestAnonymizeCommand(t *testing.T) {
	dir := t.TempDir()
	out, key := filepath.Join(dir, "anon.yaml"), filepath.Join(dir, "key.yaml")
	var stdout, stderr bytes.Buffer
	if code := anonymizeCmd([]string{replayFile, "-o", out, "--key", key}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"want-b", "run-a2", "team-a", "n1"} {
		if strings.Contains(string(data), name) {
			t.Errorf("%s is still in the anonymised file", name)
		}
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file should be 0600: %v %v", fi, err)
	}
	stdout.Reset()
	if code := replayCmd([]string{out, "--key", key}, &stdout, &stderr); code != 0 {
		t.Fatalf("replay --key: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "b/want-b → n1 GPUs [2 3]") {
		t.Fatalf("replay --key does not print the original names:\n%s", stdout.String())
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{replayFile}, "usage"},
		{[]string{filepath.Join(dir, "missing.yaml"), "-o", out}, "missing.yaml"},
		{[]string{out, "-o", filepath.Join(dir, "x.yaml"), "--frob"}, "frob"},
	} {
		stderr.Reset()
		if code := anonymizeCmd(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 naming %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	stderr.Reset()
	if code := replayCmd([]string{out, "--key", out}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "anonymize key") {
		t.Errorf("replay --key with a snapshot as the key: exit %d, %q", code, stderr.String())
	}
}
