package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tessera-gpu/tessera/controller/scenario"
)

func init() {
	register("run", "run scenario files and check their expectations", func(args []string) int {
		return runScenarios(args, os.Stdout, os.Stderr)
	})
}

const runHelp = `usage: tessera-sim run FILE... [--json] [--trace] [--timing] [--step] [--timeout 5m] [--plot OUT.svg]

Runs every scenario of every FILE (YAML documents split by ---) through the
scheduling core and checks its expectations.

  --json     one JSON report per scenario, one per line, instead of a table
  --trace    also print every decision, cycle by cycle (to stderr with --json)
  --timing   record each cycle's wall time in durationMs (otherwise 0, so that
             the same input always gives byte-identical reports)
  --step     run every cycle of a timed run (time:), also those after which
             nothing can change, which are skipped otherwise; same report
  --timeout  stop when the whole run has taken this long (default 5m; 0: no
             limit), naming the scenario and cycle it reached
  --plot     draw each timed run's queues over time to this .svg or .png
             file (several timed scenarios: OUT-<scenario>.svg each):
             allocation stacked and per queue, fair share, quota, schedule
             windows shaded; the paths written go to stderr

exit 0: every expectation held · 1: some expectation failed ·
2: a file could not be read or is invalid (the message names the file, the
scenario, the field and why), or the run took longer than --timeout
`

// defaultTimeout bounds a run: the work limit (scenario.MaxWork) keeps a
// valid file to a few minutes, and this stops one that runs longer anyway.
const defaultTimeout = 5 * time.Minute

// runScenarios is the run command; it returns the exit code.
func runScenarios(args []string, stdout, stderr io.Writer) int {
	rf, code, ok := parseRunArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	// Every file is read and checked before anything runs: an invalid file
	// is exit 2 even when it comes after valid ones.
	var specs []*scenario.Spec
	for _, f := range rf.files {
		s, err := scenario.LoadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
			return 2
		}
		specs = append(specs, s...)
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	reps, failed, ok := rf.runAll(specs, out, stderr)
	if !ok {
		return 2
	}
	if !rf.json {
		if err := scenario.WriteTable(out, reps); err != nil {
			fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
			return 2
		}
	}
	if rf.plot != "" {
		paths, err := writePlots(rf.plot, specs, reps)
		if err != nil {
			fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
			return 2
		}
		for _, p := range paths {
			fmt.Fprintf(stderr, "tessera-sim run: wrote %s\n", p)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// runFlags are the run command's flags and files.
type runFlags struct {
	json, trace, timing, step bool
	timeout                   time.Duration
	plot                      string
	files                     []string
}

// parseRunArgs reads the run command's arguments; when ok is false the
// command ends with code (help printed, or a message on stderr).
func parseRunArgs(args []string, stdout, stderr io.Writer) (rf runFlags, code int, ok bool) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // help is printed below, to stdout when asked for
	fs.BoolVar(&rf.json, "json", false, "")
	fs.BoolVar(&rf.trace, "trace", false, "")
	fs.BoolVar(&rf.timing, "timing", false, "")
	fs.BoolVar(&rf.step, "step", false, "")
	fs.DurationVar(&rf.timeout, "timeout", defaultTimeout, "")
	fs.StringVar(&rf.plot, "plot", "", "")
	// Flags may come before or after the files.
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				fmt.Fprint(stdout, runHelp)
				return rf, 0, false
			}
			fmt.Fprint(stderr, "\n"+runHelp)
			return rf, 2, false
		}
		args = fs.Args()
		if len(args) > 0 {
			rf.files = append(rf.files, args[0])
			args = args[1:]
		}
	}
	if len(rf.files) == 0 {
		fmt.Fprint(stderr, "tessera-sim run: no scenario file given\n\n"+runHelp)
		return rf, 2, false
	}
	if rf.timeout < 0 {
		fmt.Fprintf(stderr, "tessera-sim run: --timeout %v is negative (0 means no limit)\n", rf.timeout)
		return rf, 2, false
	}
	return rf, 0, true
}

// runAll runs the scenarios in order within the timeout, writing each JSON
// report (--json) as it comes; ok is false when one did not finish or a
// report could not be written (the message is on stderr).
func (rf *runFlags) runAll(specs []*scenario.Spec, out, stderr io.Writer) (reps []*scenario.Report, failed, ok bool) {
	// The trace goes through a gate that a timeout closes: a scenario given
	// up on keeps running until its next cycle and must not write then.
	traceOut := &gate{w: out}
	opts := scenario.Options{Timing: rf.timing, Step: rf.step}
	if rf.trace {
		opts.Trace = traceOut
		if rf.json {
			opts.Trace = &gate{w: stderr}
		}
	}
	ctx := context.Background()
	if rf.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rf.timeout)
		defer cancel()
	}
	for _, s := range specs {
		rep, err := runOne(ctx, s, opts, rf.timeout)
		if err != nil {
			traceOut.close()
			if g, ok := opts.Trace.(*gate); ok {
				g.close()
			}
			fmt.Fprintf(stderr, "tessera-sim run: %s: %v; use fewer cycles, pods or nodes, or a longer --timeout\n", s.File, err)
			return nil, false, false
		}
		failed = failed || !rep.Passed
		if rf.json {
			if err := scenario.WriteJSON(out, rep); err != nil {
				fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
				return nil, false, false
			}
		}
		reps = append(reps, rep)
	}
	return reps, failed, true
}

// runOne runs one scenario until it ends or ctx does; then the error names
// the scenario, the limit and the cycle reached. The core cannot be stopped
// inside a cycle, so this returns at once and the scenario stops at the
// cycle's end.
func runOne(ctx context.Context, s *scenario.Spec, opts scenario.Options, timeout time.Duration) (*scenario.Report, error) {
	var cycle atomic.Int64
	opts.OnCycle = func(c int) { cycle.Store(int64(c)) }
	type result struct {
		rep *scenario.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := scenario.RunContext(ctx, s, opts)
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			return r.rep, nil
		}
	case <-ctx.Done():
	}
	return nil, fmt.Errorf("scenario %q: did not finish within --timeout %v (in cycle %d of %d)", s.Name, timeout, max(cycle.Load(), 1), s.Cycles)
}

// gate is a writer that drops everything once closed.
type gate struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
