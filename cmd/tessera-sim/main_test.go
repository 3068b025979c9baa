package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// eachWantFile runs check on every file of the glob, each starting with
// "# PREFIXWANT", as a subtest.
func eachWantFile(t *testing.T, glob, prefix string, check func(t *testing.T, file, want string)) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no files match %s: %v", glob, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(string(data), "\n")
			want, ok := strings.CutPrefix(first, prefix)
			if !ok {
				t.Fatalf("%s does not start with %q", f, prefix)
			}
			check(t, f, want)
		})
	}
}

// Each file in testdata/invalid starts with "# want: MESSAGE": the run must
// exit 2 and print exactly that message after the file name.
func TestInvalidFilesExit2(t *testing.T) {
	eachWantFile(t, "../../controller/testdata/invalid/*.yaml", "# want: ", func(t *testing.T, f, want string) {
		var stdout, stderr bytes.Buffer
		rc := runScenarios([]string{f}, &stdout, &stderr)
		if rc != 2 {
			t.Errorf("exit %d, want 2", rc)
		}
		if got, exp := stderr.String(), "tessera-sim run: "+f+": "+want+"\n"; got != exp {
			t.Errorf("message\n got: %q\nwant: %q", got, exp)
		}
		if stdout.Len() != 0 {
			t.Errorf("nothing should be printed on stdout, got %q", stdout.String())
		}
	})
}

// Each file in testdata/failing starts with "# want failure: LINE": the
// file is valid, but an expectation fails (one that could never hold, too:
// a count above the job's pods, a GPU index no node has), so the run exits
// 1 and lists that failure.
func TestFailingExpectationsExit1(t *testing.T) {
	eachWantFile(t, "../../controller/testdata/failing/*.yaml", "# want failure: ", func(t *testing.T, f, want string) {
		var stdout, stderr bytes.Buffer
		if rc := runScenarios([]string{f}, &stdout, &stderr); rc != 1 {
			t.Errorf("exit %d, want 1; stderr %q", rc, stderr.String())
		}
		if !strings.Contains(stdout.String(), "  - "+want+"\n") {
			t.Errorf("failures do not list %q:\n%s", want, stdout.String())
		}
	})
}

func TestMissingFileExit2(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if rc := runScenarios([]string{"no/such/file.yaml"}, &stdout, &stderr); rc != 2 {
		t.Errorf("exit %d, want 2", rc)
	}
	if want := "tessera-sim run: no/such/file.yaml: cannot read: no such file or directory\n"; stderr.String() != want {
		t.Errorf("got %q, want %q", stderr.String(), want)
	}
}

// An invalid file anywhere in the list stops the run before anything runs.
func TestInvalidAfterValidExit2(t *testing.T) {
	var stdout, stderr bytes.Buffer
	valid, _ := filepath.Glob("../../controller/testdata/scenarios/*.yaml")
	args := append(valid[:min(1, len(valid))], "../../controller/testdata/invalid/gpu-too-big.yaml", "--json")
	if rc := runScenarios(args, &stdout, &stderr); rc != 2 {
		t.Errorf("exit %d, want 2", rc)
	}
	if stdout.Len() != 0 {
		t.Errorf("nothing should run, got %q", stdout.String())
	}
}

func TestUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if rc := runScenarios([]string{"--help"}, &stdout, &stderr); rc != 0 || !strings.Contains(stdout.String(), "usage: tessera-sim run FILE...") {
		t.Errorf("--help: exit %d, output %q", rc, stdout.String())
	}
	stdout.Reset()
	if rc := runScenarios(nil, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), "no scenario file given") {
		t.Errorf("no files: exit %d, stderr %q", rc, stderr.String())
	}
	stderr.Reset()
	if rc := dispatch([]string{"frobnicate"}, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, stderr %q", rc, stderr.String())
	}
	stderr.Reset()
	if rc := runScenarios([]string{"--bogus", "x.yaml"}, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), "flag provided but not defined: -bogus") {
		t.Errorf("bad flag: exit %d, stderr %q", rc, stderr.String())
	}
}

// Same input, same output: two runs of the whole suite give byte-identical
// --json reports, one valid JSON object per line, keys in the contract's order.
func TestJSONByteIdentical(t *testing.T) {
	files, _ := filepath.Glob("../../controller/testdata/scenarios/*.yaml")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	run := func() []byte {
		var stdout, stderr bytes.Buffer
		rc := runScenarios(append([]string{"--json"}, files...), &stdout, &stderr)
		if rc == 2 {
			t.Fatalf("exit 2: %s", stderr.String())
		}
		return stdout.Bytes()
	}
	a, b := run(), run()
	if !bytes.Equal(a, b) {
		t.Fatal("two runs gave different --json output")
	}
	sc := bufio.NewScanner(bytes.NewReader(a))
	sc.Buffer(nil, 1<<24)
	lines := 0
	for sc.Scan() {
		lines++
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", lines, err)
		}
		keys := []string{`"name"`, `"passed"`, `"failures"`, `"jobs"`, `"pods"`, `"queues"`, `"cycles"`}
		last := -1
		for _, k := range keys {
			i := bytes.Index(sc.Bytes(), []byte(k+":"))
			if i <= last {
				t.Fatalf("line %d: key %s out of order", lines, k)
			}
			last = i
		}
	}
	if lines == 0 {
		t.Fatal("no reports")
	}
}
