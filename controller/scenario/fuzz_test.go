package scenario

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzWork is the most work (Spec.Work) a fuzzed scenario is run with:
// a few hundred pod-cycles, about a millisecond, so that fuzzing keeps
// thousands of executions a second. Larger accepted files are only loaded.
const fuzzWork = 300_000

// slowInput is far above what any input should take, even on a loaded
// machine: an input slower than this is a bound missing.
const slowInput = 10 * time.Second

// FuzzParse feeds the loader what tessera-sim run reads. A file is either
// refused with an *Error that names the file and says why, or every
// scenario in it stays within MaxWork and, when small, runs through the
// core without a cycle error (an invalid snapshot, capacity handed out
// twice, a pending pod without a reason) and gives the same report twice.
func FuzzParse(f *testing.F) {
	for _, glob := range []string{"scenarios", "invalid", "failing", "mutations"} {
		files, err := filepath.Glob(filepath.Join("..", "testdata", glob, "*.yaml"))
		if err != nil || len(files) == 0 {
			f.Fatalf("no seeds in testdata/%s: %v", glob, err)
		}
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		defer func() {
			if d := time.Since(start); d > slowInput {
				t.Fatalf("took %v (more than %v): %q", d, slowInput, data)
			}
		}()
		specs, err := Parse("f.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" || e.Why == "" || !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("error does not name the file and why: %#v", err)
			}
			if e.Scenario != "" && e.Field == "" && !strings.Contains(e.Why, "YAML") && !strings.Contains(e.Why, "json: ") {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		for _, s := range specs {
			if s.Work() > s.maxWork() {
				t.Fatalf("scenario %q accepted with work %d above %d", s.Name, s.Work(), s.maxWork())
			}
			if s.Work() > fuzzWork {
				continue
			}
			var a, b bytes.Buffer
			rep := Run(s, Options{})
			for _, fl := range rep.Failures {
				if strings.HasPrefix(fl, "cycle ") {
					t.Fatalf("scenario %q: %s", s.Name, fl)
				}
			}
			if err := WriteJSON(&a, rep); err != nil {
				t.Fatalf("report: %v", err)
			}
			if err := WriteJSON(&b, Run(s, Options{})); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatalf("two runs of %q gave different reports:\n%s\n%s", s.Name, a.Bytes(), b.Bytes())
			}
		}
	})
}

// FuzzQuantity: a value the scenario quantity parsers accept prints back
// (as the report prints it) to the same value.
func FuzzQuantity(f *testing.F) {
	for _, s := range []string{"80Gi", "1.5Gi", "2G", "1000", "0.25", "500m", "-1", "1e3", ".5", "1e1000000", "1/4", "0x1p-2", "9223372036854775807", "9223372036854775808", " 7 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := parseBytes(s); err == nil && v >= 0 {
			if back, err := parseBytes(formatBytes(v)); err != nil || back != v {
				t.Fatalf("parseBytes(%q) = %d, printed %q, read back %d, %v", s, v, formatBytes(v), back, err)
			}
		}
		for _, allowM := range []bool{false, true} {
			v, err := parseMilli(s, allowM)
			if err != nil {
				continue
			}
			if back, err := parseMilli(formatMilli(v), false); err != nil || back != v {
				t.Fatalf("parseMilli(%q, %v) = %d, printed %q, read back %d, %v", s, allowM, v, formatMilli(v), back, err)
			}
		}
		if v, err := parseMilliRounded(s); err == nil {
			if back, err := parseMilli(formatMilli(v), false); err != nil || back != v {
				t.Fatalf("parseMilliRounded(%q) = %d, printed %q, read back %d, %v", s, v, formatMilli(v), back, err)
			}
		}
	})
}

// FuzzParseSeconds: a duration is refused with a reason, or read as whole
// seconds within range that read back the same from Go's own writing.
func FuzzParseSeconds(f *testing.F) {
	for _, s := range []string{"10s", "1h30m", "7d", "0s", "400d", "401d", "1.5s", "-1h", "", "d", "1e9h", "99999999999999999999d"} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, raw string, zero bool) {
		v, err := parseSeconds(raw, zero)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(raw)) && !strings.Contains(err.Error(), raw) {
				t.Fatalf("error %q does not name the input %q", err, raw)
			}
			return
		}
		if v < 0 || v > maxSeconds || v == 0 && !zero {
			t.Fatalf("%q read as %d seconds, out of range", raw, v)
		}
		back, err := parseSeconds(timeDuration(v).String(), zero)
		if err != nil || back != v {
			t.Fatalf("%q read as %d; written back %q reads as %d, %v", raw, v, timeDuration(v), back, err)
		}
	})
}
