package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/controller/kube"
)

func init() {
	register("replay", "rerun a live cluster's cycle from a snapshot; what-if; to a scenario", func(args []string) int {
		return replayCmd(args, os.Stdout, os.Stderr)
	})
}

const replayHelp = `usage: tessera-sim replay FILE [--set queue/NAME.RES.FIELD=VALUE]... [--add-nodes NODE:N]...
                          [--to-scenario OUT] [--key KEY]

Reruns the cycle a cycle snapshot (kubectl tessera snapshot) holds, through
the controller's own snapshot code and core, and prints its binds, evictions,
why each pod waits and each queue's fair share. When the file holds the
controller's decisions and nothing is changed, says whether the replay agrees.

  --set        change a Queue first: RES is gpu, cpu or memory, FIELD quota,
               limit or overQuotaWeight (queue/team-a.gpu.quota=16)
  --add-nodes  add N copies of node NODE (its GPUs too) first
  with either, prints the difference against the unchanged snapshot
  --to-scenario  also write the snapshot as a tessera-sim scenario file, and
               say what the format cannot hold
  --key        FILE is anonymised (tessera-sim anonymize, kubectl tessera
               snapshot --anonymize-key): print the decisions with the
               original names, mapped back through this key

exit 0: done (the replay agrees, where that can be checked) · 1: the replay
disagrees with the controller's decisions · 2: bad file or flag
`

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func replayCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, replayHelp) }
	var sets, adds multiFlag
	fs.Var(&sets, "set", "change a queue")
	fs.Var(&adds, "add-nodes", "add copies of a node")
	toScenario := fs.String("to-scenario", "", "write a scenario file")
	keyFile := fs.String("key", "", "map names back through this anonymize key")
	file, rest := splitFile(args)
	if err := fs.Parse(rest); err != nil {
		return 2
	}
	if file == "" || fs.NArg() > 0 {
		fmt.Fprint(stderr, replayHelp)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "tessera-sim replay: %s: %v\n", file, err)
		return 2
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fail(err)
	}
	base, err := kube.ParseDump(data)
	if err != nil {
		return fail(err)
	}
	changed, err := kube.ParseDump(data) // a second copy to change
	if err != nil {
		return fail(err)
	}
	for _, s := range sets {
		if err := setQueue(changed, s); err != nil {
			return fail(err)
		}
	}
	for _, a := range adds {
		if err := addNodes(changed, a); err != nil {
			return fail(err)
		}
	}
	if *toScenario != "" {
		if err := writeScenario(changed, file, *toScenario, stderr); err != nil {
			return fail(err)
		}
	}
	restore := func(d *kube.Decisions) *kube.Decisions { return d }
	if *keyFile != "" {
		key, err := readKey(*keyFile)
		if err != nil {
			return fail(err)
		}
		restore = key.RestoreDecisions
	}
	ctx := context.Background()
	got, err := kube.Replay(ctx, base)
	if err != nil {
		return fail(err)
	}
	if len(sets) == 0 && len(adds) == 0 {
		printDecisions(stdout, restore(got))
		if base.Decisions == nil {
			return 0
		}
		diff := diffDecisions(base.Decisions, got)
		if len(diff) == 0 {
			fmt.Fprintln(stdout, "\nagrees with the controller's decisions on this input")
			return 0
		}
		fmt.Fprintln(stdout, "\nDISAGREES with the controller's decisions (controller → replay):")
		printDiff(stdout, diff)
		return 1
	}
	whatIf, err := kube.Replay(ctx, changed)
	if err != nil {
		return fail(err)
	}
	printDecisions(stdout, restore(whatIf))
	fmt.Fprintf(stdout, "\nwhat changes with %s (unchanged → changed):\n", strings.Join(append(prefixed("--set ", sets), prefixed("--add-nodes ", adds)...), " "))
	diff := diffDecisions(restore(got), restore(whatIf))
	if len(diff) == 0 {
		fmt.Fprintln(stdout, "  nothing")
	}
	printDiff(stdout, diff)
	return 0
}

// splitFile takes the first argument that is not a flag as the file, so
// flags may come before or after it.
func splitFile(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a, append(append([]string(nil), args[:i]...), args[i+1:]...)
		}
		if !strings.Contains(a, "=") && a != "-h" && a != "--help" && a != "-help" {
			i++ // the flag's value
		}
	}
	return "", args
}

func prefixed(p string, vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = p + v
	}
	return out
}

func printDecisions(w io.Writer, d *kube.Decisions) {
	fmt.Fprintf(w, "binds (%d):\n", len(d.Binds))
	for _, b := range d.Binds {
		fmt.Fprintf(w, "  %s\n", bindWords(b))
	}
	fmt.Fprintf(w, "evictions (%d):\n", len(d.Evictions))
	for _, e := range d.Evictions {
		fmt.Fprintf(w, "  %s\n", evictionWords(e))
	}
	fmt.Fprintf(w, "pending (%d):\n", len(d.Pending))
	for _, p := range d.Pending {
		fmt.Fprintf(w, "  %s: %s\n", p.Pod, p.Reason)
	}
	fmt.Fprintln(w, "fair share (GPUs, allocated after the cycle):")
	for _, q := range sortedKeys(d.FairShare) {
		s := d.FairShare[q]
		fmt.Fprintf(w, "  %s: %s (allocated %s)\n", q, milli(s.GPUMilli), milli(s.AllocatedGPUMilli))
	}
}

func bindWords(b kube.BindDecision) string {
	s := fmt.Sprintf("%s → %s GPUs %v (%s", b.Pod, b.Node, b.GPUs, b.Action)
	if b.Sharing != "" {
		s += ", " + b.Sharing
	}
	if b.Pipelined {
		s += ", once its victims are gone"
	}
	return s + ")"
}

func evictionWords(e kube.EvictionDecision) string {
	s := fmt.Sprintf("%s on %s: %s: %s", e.Pod, e.Node, e.Action, e.Reason)
	if e.MoveTo != "" {
		s += " (moves to " + e.MoveTo + ")"
	}
	return s
}

func milli(v int64) string {
	if v%1000 == 0 {
		return fmt.Sprint(v / 1000)
	}
	return fmt.Sprintf("%.3f", float64(v)/1000)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// diffDecisions lists, per pod and queue, what differs from a to b.
func diffDecisions(a, b *kube.Decisions) []string {
	var out []string
	binds := func(d *kube.Decisions) map[string]string {
		m := map[string]string{}
		for _, x := range d.Binds {
			m[x.Pod] = bindWords(x)
		}
		return m
	}
	evictions := func(d *kube.Decisions) map[string]string {
		m := map[string]string{}
		for _, x := range d.Evictions {
			m[x.Pod] = evictionWords(x)
		}
		return m
	}
	pending := func(d *kube.Decisions) map[string]string {
		m := map[string]string{}
		for _, x := range d.Pending {
			m[x.Pod] = x.Pod + ": " + x.Reason
		}
		return m
	}
	shares := func(d *kube.Decisions) map[string]string {
		m := map[string]string{}
		for q, s := range d.FairShare {
			m[q] = fmt.Sprintf("%s: fair share %s GPUs, allocated %s", q, milli(s.GPUMilli), milli(s.AllocatedGPUMilli))
		}
		return m
	}
	for _, part := range []struct {
		what string
		of   func(*kube.Decisions) map[string]string
	}{{"bind", binds}, {"eviction", evictions}, {"pending", pending}, {"queue", shares}} {
		x, y := part.of(a), part.of(b)
		keys := map[string]bool{}
		for k := range x {
			keys[k] = true
		}
		for k := range y {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			switch {
			case x[k] == y[k]:
			case x[k] == "":
				out = append(out, fmt.Sprintf("+ %s %s", part.what, y[k]))
			case y[k] == "":
				out = append(out, fmt.Sprintf("- %s %s", part.what, x[k]))
			default:
				out = append(out, fmt.Sprintf("~ %s %s\n      → %s", part.what, x[k], y[k]))
			}
		}
	}
	return out
}

func printDiff(w io.Writer, diff []string) {
	for _, l := range diff {
		fmt.Fprintf(w, "  %s\n", l)
	}
}
