package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/controller/scenario"
)

func init() {
	register("run", "run scenario files and check their expectations", func(args []string) int {
		return runScenarios(args, os.Stdout, os.Stderr)
	})
}

const runHelp = `usage: tessera-sim run FILE... [--json] [--trace] [--timing]

Runs every scenario of every FILE (YAML documents split by ---) through the
scheduling core and checks its expectations.

  --json     one JSON report per scenario, one per line, instead of a table
  --trace    also print every decision, cycle by cycle (to stderr with --json)
  --timing   record each cycle's wall time in durationMs (otherwise 0, so that
             the same input always gives byte-identical reports)

exit 0: every expectation held · 1: some expectation failed ·
2: a file could not be read or is invalid (the message names the file, the
scenario, the field and why)
`

// runScenarios is the run command; it returns the exit code.
func runScenarios(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // help is printed below, to stdout when asked for
	jsonOut := fs.Bool("json", false, "")
	trace := fs.Bool("trace", false, "")
	timing := fs.Bool("timing", false, "")
	// Flags may come before or after the files.
	var files []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				fmt.Fprint(stdout, runHelp)
				return 0
			}
			fmt.Fprint(stderr, "\n"+runHelp)
			return 2
		}
		args = fs.Args()
		if len(args) > 0 {
			files = append(files, args[0])
			args = args[1:]
		}
	}
	if len(files) == 0 {
		fmt.Fprint(stderr, "tessera-sim run: no scenario file given\n\n"+runHelp)
		return 2
	}
	// Every file is read and checked before anything runs: an invalid file
	// is exit 2 even when it comes after valid ones.
	var specs []*scenario.Spec
	for _, f := range files {
		s, err := scenario.LoadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
			return 2
		}
		specs = append(specs, s...)
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	opts := scenario.Options{Timing: *timing}
	if *trace {
		opts.Trace = out
		if *jsonOut {
			opts.Trace = stderr
		}
	}
	var reps []*scenario.Report
	failed := false
	for _, s := range specs {
		rep := scenario.Run(s, opts)
		failed = failed || !rep.Passed
		if *jsonOut {
			if err := scenario.WriteJSON(out, rep); err != nil {
				fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
				return 2
			}
		}
		reps = append(reps, rep)
	}
	if !*jsonOut {
		if err := scenario.WriteTable(out, reps); err != nil {
			fmt.Fprintf(stderr, "tessera-sim run: %v\n", err)
			return 2
		}
	}
	if failed {
		return 1
	}
	return 0
}
