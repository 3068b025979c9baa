package ctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/debugapi"
)

// shadowOptions are the shadow command's flags.
type shadowOptions struct {
	// output is "" (a table) or "json".
	output string
	debugFlags
}

func parseShadowFlags(args []string) (*shadowOptions, error) {
	o := &shadowOptions{}
	fs := flag.NewFlagSet("shadow", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.output, "o", "", "output: a table, or json")
	fs.StringVar(&o.output, "output", "", "same as -o")
	o.register(fs, debugapi.Shadow)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("shadow: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("shadow takes no arguments, got %q", fs.Args())
	}
	if o.output != "" && o.output != "json" {
		return nil, fmt.Errorf("-o %q: shadow prints a table, or json with -o json", o.output)
	}
	if err := o.check("shadow"); err != nil {
		return nil, err
	}
	return o, nil
}

// shadow prints shadow mode's report, read from the shadow controller's
// debug server with the user's own credentials (debugserver.go).
func shadow(ctx context.Context, c Clients, args []string, out io.Writer) error {
	o, err := parseShadowFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	body, err := getDebug(ctx, c, &o.debugFlags, debugapi.Shadow)
	if err != nil {
		return fmt.Errorf("shadow: %w", err)
	}
	var rep kube.ShadowReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("reading the shadow report: %w", err)
	}
	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(&rep)
	}
	return printShadow(&rep, out)
}

// printShadow prints the report as tables.
func printShadow(rep *kube.ShadowReport, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Shadow cycle at %s: %d pods of other schedulers (%d running, %d pending)\n",
		rep.Time.UTC().Format(time.RFC3339), rep.Pods, rep.Running, rep.Pending)
	fmt.Fprintf(w, "Tessera would place %d; %d on the node they run on, %d elsewhere; would leave %d running pods pending; would start %d pending pods\n\n",
		rep.WouldPlace, rep.Agree, len(rep.Moved), len(rep.LeftPending), len(rep.WouldStart))
	fmt.Fprintln(w, "QUEUE\tFAIR SHARE\tWOULD ALLOCATE\tALLOCATED NOW\t")
	names := make([]string, 0, len(rep.Queues))
	for n := range rep.Queues {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		q := rep.Queues[n]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", n, milliGPUs(q.FairShareGPUMilli), milliGPUs(q.WouldAllocateGPUMilli), milliGPUs(q.AllocatedGPUMilli))
	}
	fmt.Fprintln(w, "\nPOD\tQUEUE\tRUNS ON\tTESSERA\t")
	for _, m := range rep.Moved {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", m.Pod, m.Queue, m.Actual, m.Tessera)
	}
	for _, m := range rep.WouldStart {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", m.Pod, m.Queue, "(pending)", m.Tessera)
	}
	for _, p := range rep.LeftPending {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", p.Pod, p.Queue, p.Actual, "pending: "+p.Reason)
	}
	for _, p := range rep.StillPending {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", p.Pod, p.Queue, "(pending)", "pending: "+p.Reason)
	}
	if len(rep.Takeover.Evictions)+len(rep.Takeover.Binds) > 0 {
		fmt.Fprintln(w, "\nTAKEOVER NOW\tPOD\tNODE\tWHY\t")
		for _, e := range rep.Takeover.Evictions {
			fmt.Fprintf(w, "evict (%s)\t%s\t%s\t%s\t\n", e.Action, e.Pod, e.Node, e.Reason)
		}
		for _, b := range rep.Takeover.Binds {
			fmt.Fprintf(w, "bind (%s)\t%s\t%s\t\t\n", b.Action, b.Pod, b.Node)
		}
	}
	return w.Flush()
}

// milliGPUs writes milli-GPUs as GPUs: "1.5".
func milliGPUs(m int64) string {
	s := fmt.Sprintf("%d.%03d", m/1000, m%1000)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
