package scenario

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestSuite runs every scenario of controller/testdata/scenarios, one subtest
// each, so `go test ./...` checks the scheduling core against its spec.
func TestSuite(t *testing.T) {
	files, err := filepath.Glob("../testdata/scenarios/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	total := 0
	for _, f := range files {
		specs, err := LoadFile(f)
		if err != nil {
			t.Fatalf("%v", err)
		}
		for _, s := range specs {
			total++
			t.Run(s.Name, func(t *testing.T) {
				var trace bytes.Buffer
				rep := Run(s, Options{Trace: &trace})
				if !rep.Passed {
					t.Errorf("%s: %s\n%s", f, strings.Join(rep.Failures, "\n"), trace.String())
				}
			})
		}
	}
	if total < 60 {
		t.Errorf("the suite has %d scenarios; it must keep at least 60", total)
	}
}
