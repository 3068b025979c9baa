package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// Where `kubectl tessera shadow` reads the report by default: the /shadow
// path of the chart's metrics Service, through the API server's service
// proxy (RBAC: get on services/proxy in the controller's namespace).
const (
	DefaultControllerNamespace = "tessera-system"
	shadowService              = "tessera-controller-metrics"
	shadowPort                 = "metrics"
	shadowPath                 = "/shadow"
)

// ShadowOptions say where the report is read and how it is printed.
type ShadowOptions struct {
	// URL, when set, is the report's address (http://host:port/shadow);
	// otherwise the service proxy of Namespace's metrics Service.
	URL       string
	Namespace string
	// Output is "" (a table) or "json".
	Output string
}

// shadow prints shadow mode's report.
func shadow(ctx context.Context, c Clients, out io.Writer) error {
	o := c.Shadow
	if o.Output != "" && o.Output != "json" {
		return fmt.Errorf("-o %q: shadow prints a table, or json with -o json", o.Output)
	}
	body, err := fetchShadow(ctx, c)
	if err != nil {
		return err
	}
	var rep kube.ShadowReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("reading the shadow report: %w", err)
	}
	if o.Output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(&rep)
	}
	return printShadow(&rep, out)
}

// fetchShadow reads the report's JSON from the URL or the service proxy.
func fetchShadow(ctx context.Context, c Clients) ([]byte, error) {
	o := c.Shadow
	if o.URL != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
		if err != nil {
			return nil, fmt.Errorf("shadow report URL %q: %w", o.URL, err)
		}
		hc := &http.Client{Timeout: 30 * time.Second}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("reading the shadow report: %w", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return nil, fmt.Errorf("reading the shadow report: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("shadow report from %s: %s: %s", o.URL, resp.Status, strings.TrimSpace(string(body)))
		}
		return body, nil
	}
	ns := o.Namespace
	if ns == "" {
		ns = DefaultControllerNamespace
	}
	body, err := c.Kube.CoreV1().Services(ns).ProxyGet("http", shadowService, shadowPort, shadowPath, nil).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("shadow report from service %s/%s (is tessera-controller running with --shadow?): %w", ns, shadowService, err)
	}
	return body, nil
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
