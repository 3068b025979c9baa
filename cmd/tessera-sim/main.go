// Command tessera-sim runs Tessera's scheduling core offline: on scenario
// files (run) and on GPU traces (openb). See SCENARIOS.md and README.md.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand. Each lives in its own file and registers itself
// from init(), so files owned by different people never edit one switch.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string) int) {
	commands[name] = command{summary: summary, run: run}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: tessera-sim COMMAND [ARGS...]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Runs Tessera's scheduling core offline. Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-6s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "'tessera-sim COMMAND --help' describes a command.")
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help", "help":
		usage(stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tessera-sim: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:])
}
