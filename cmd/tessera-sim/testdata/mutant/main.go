// Command mutant runs scenario files through the scheduling core and prints
// one JSON line per scenario: its name and whether it passed. The mutation
// pass (mutation_test.go) builds it once per mutation instead of tessera-sim,
// whose other commands (replay, plots) link client-go and gonum/plot and
// make every build several times slower; it runs what `tessera-sim run
// --json` runs: scenario.LoadFile, scenario.RunContext.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/tessera-gpu/tessera/controller/scenario"
)

func main() {
	// A mutation may make a cycle loop: the test's own timeout kills us.
	ctx := context.Background()
	enc := json.NewEncoder(os.Stdout)
	for _, f := range os.Args[1:] {
		specs, err := scenario.LoadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, s := range specs {
			start := time.Now()
			rep, err := scenario.RunContext(ctx, s, scenario.Options{})
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: scenario %q: %v (after %v)\n", f, s.Name, err, time.Since(start))
				os.Exit(2)
			}
			if err := enc.Encode(struct {
				Name   string `json:"name"`
				Passed bool   `json:"passed"`
			}{rep.Name, rep.Passed}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		}
	}
}
