package scenario

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Report is SCENARIOS.md's --json report. Field order is the contract's key
// order; maps are written with sorted keys, so the bytes are stable.
type Report struct {
	Name     string                 `json:"name"`
	Passed   bool                   `json:"passed"`
	Failures []string               `json:"failures"`
	Jobs     map[string]JobReport   `json:"jobs"`
	Pods     map[string]PodReport   `json:"pods"`
	Queues   map[string]QueueReport `json:"queues"`
	Cycles   []CycleReport          `json:"cycles"`
	// Fairness is a timed run's (SCENARIOS.md, "Fairness"); nil otherwise.
	Fairness *FairnessReport `json:"fairness,omitempty"`
	// CyclesRun counts the cycles that ran (a timed run skips those where
	// nothing can change); not in the JSON, which is the same either way.
	CyclesRun int `json:"-"`
	// File is where the scenario came from (not in the JSON).
	File string `json:"-"`
}

// JobReport counts a job's pods at the end of the run.
type JobReport struct {
	Running int `json:"running"`
	Pending int `json:"pending"`
	Evicted int `json:"evicted"`
	// Succeeded counts the pods of a timed run's job that finished.
	Succeeded int `json:"succeeded,omitempty"`
}

// PodReport is where a pod is at the end of the run. Reason, for pending
// pods, goes beyond SCENARIOS.md's example: it is the why-pending message.
type PodReport struct {
	State     string `json:"state"`
	Node      string `json:"node,omitempty"`
	GPUs      []int  `json:"gpus,omitempty"`
	GPUMemory string `json:"gpuMemory,omitempty"`
	Reason    string `json:"reason,omitempty"`

	gpuMemoryBytes int64 // what GPUMemory prints, for expect.pods
}

// QueueReport is a queue's GPU accounting in GPU units.
type QueueReport struct {
	GPUFairShare json.Number `json:"gpuFairShare"`
	GPUAllocated json.Number `json:"gpuAllocated"`
	GPUQuota     json.Number `json:"gpuQuota"`
}

// CycleReport sums up one cycle. DurationMs is 0 unless timing was asked
// for, so that reports are byte-identical across runs.
type CycleReport struct {
	// Cycle numbers the cycle in a timed run, which lists only the cycles
	// that bound or evicted something.
	Cycle      int     `json:"cycle,omitempty"`
	DurationMs float64 `json:"durationMs"`
	Bound      int     `json:"bound"`
	Evicted    int     `json:"evicted"`
}

func milliNumber(v int64) json.Number {
	if v == core.Unlimited {
		return "-1"
	}
	return json.Number(formatMilli(v))
}

func (r *runner) report() *Report {
	rep := &Report{Name: r.spec.Name, File: r.spec.File, Failures: []string{}, Jobs: map[string]JobReport{}, Pods: map[string]PodReport{}, Queues: map[string]QueueReport{}, Cycles: r.cycles, CyclesRun: r.cyclesRun}
	if r.fair != nil {
		rep.Fairness = r.fair.report()
	}
	if rep.Cycles == nil {
		rep.Cycles = []CycleReport{}
	}
	allocated := map[string]int64{}
	for _, p := range r.pods {
		jr := rep.Jobs[p.job.Name]
		pr := PodReport{State: p.state}
		switch p.state {
		case StateRunning, StateBound:
			jr.Running++
		case StateSucceeded:
			jr.Succeeded++
		case StateArriving:
		default:
			jr.Pending++
		}
		if p.state != StatePending && p.state != StateArriving && p.state != StateSucceeded {
			pr.Node = p.place.Node
			pr.GPUs = slices.Clone(p.place.GPUs)
			slices.Sort(pr.GPUs)
			var mem int64
			for _, m := range p.place.GPUMemory {
				mem += m
			}
			for _, m := range p.place.GPUMilli {
				allocated[p.job.Queue] += m
			}
			if mem > 0 {
				pr.GPUMemory = formatBytes(mem)
				pr.gpuMemoryBytes = mem
			}
		} else {
			pr.Reason = p.reason
		}
		jr.Evicted = r.evicted[p.job.Name]
		rep.Jobs[p.job.Name] = jr
		rep.Pods[p.spec.Name] = pr
	}
	// Parents hold what their children hold.
	parent := map[string]string{}
	for _, q := range r.spec.Queues {
		parent[q.Name] = q.Parent
	}
	total := map[string]int64{}
	for _, q := range r.spec.Queues {
		for at := q.Name; at != ""; at = parent[at] {
			total[at] += allocated[q.Name]
		}
	}
	for i, q := range r.spec.Queues {
		// The quota in effect at the end (a schedule's window may hold).
		qr := QueueReport{GPUAllocated: milliNumber(total[q.Name]), GPUQuota: milliNumber(r.queues[i].Resources[core.ResGPU].Quota), GPUFairShare: "0"}
		if r.last != nil {
			if st, ok := r.last.Queues[q.Name]; ok {
				qr.GPUFairShare = milliNumber(st.FairShare[core.ResGPU])
			}
		}
		rep.Queues[q.Name] = qr
	}
	rep.Failures = append(rep.Failures, r.failures...)
	rep.Failures = append(rep.Failures, check(r.spec, rep)...)
	rep.Passed = len(rep.Failures) == 0
	return rep
}

// check compares the report with the scenario's expectations.
func check(s *Spec, rep *Report) []string {
	var f []string
	for _, name := range sortedKeys(s.Expect.Jobs) {
		x, got := s.Expect.Jobs[name], rep.Jobs[name]
		for _, c := range []struct {
			what string
			want *int
			have int
		}{{"running", x.Running, got.Running}, {"pending", x.Pending, got.Pending}, {"evicted", x.Evicted, got.Evicted}} {
			if c.want != nil && *c.want != c.have {
				f = append(f, fmt.Sprintf("job %s: %s %d, expected %d", name, c.what, c.have, *c.want))
			}
		}
	}
	for _, name := range sortedKeys(s.Expect.Pods) {
		x, got := s.Expect.Pods[name], rep.Pods[name]
		if x.State != "" && x.State != got.State {
			f = append(f, fmt.Sprintf("pod %s: state %s, expected %s", name, got.State, x.State))
		}
		if x.Node != nil && *x.Node != got.Node {
			f = append(f, fmt.Sprintf("pod %s: node %s, expected %s", name, orNone(got.Node), orNone(*x.Node)))
		}
		if x.GPUs != nil && !slices.Equal(*x.GPUs, got.GPUs) {
			f = append(f, fmt.Sprintf("pod %s: gpus %s, expected %s", name, intsString(got.GPUs), intsString(*x.GPUs)))
		}
		if x.GPUMemory != nil && *x.GPUMemory != got.gpuMemoryBytes {
			f = append(f, fmt.Sprintf("pod %s: gpuMemory %s, expected %s", name, orNone(got.GPUMemory), orNone(formatBytes(*x.GPUMemory))))
		}
		if x.Reason != nil && !strings.Contains(got.Reason, *x.Reason) {
			f = append(f, fmt.Sprintf("pod %s: reason %q, expected it to contain %q", name, got.Reason, *x.Reason))
		}
	}
	for _, name := range sortedKeys(s.Expect.Queues) {
		x, got := s.Expect.Queues[name], rep.Queues[name]
		if x.GPUFairShare != nil && string(milliNumber(*x.GPUFairShare)) != string(got.GPUFairShare) {
			f = append(f, fmt.Sprintf("queue %s: gpuFairShare %s, expected %s", name, got.GPUFairShare, milliNumber(*x.GPUFairShare)))
		}
		if x.GPUQuota != nil && string(milliNumber(*x.GPUQuota)) != string(got.GPUQuota) {
			f = append(f, fmt.Sprintf("queue %s: gpuQuota %s, expected %s", name, got.GPUQuota, milliNumber(*x.GPUQuota)))
		}
		if x.GPUAllocated != nil && string(milliNumber(*x.GPUAllocated)) != string(got.GPUAllocated) {
			f = append(f, fmt.Sprintf("queue %s: gpuAllocated %s, expected %s", name, got.GPUAllocated, milliNumber(*x.GPUAllocated)))
		}
	}
	return f
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// WriteJSON writes one report as one line of JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encoding report of %s: %w", rep.Name, err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// WriteTable writes the reports for a person: one row per scenario, its
// failures under it, and a total.
func WriteTable(w io.Writer, reps []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESULT\tSCENARIO\tFILE\tCYCLES\tBOUND\tEVICTED\tPENDING")
	failed := 0
	for _, rep := range reps {
		res := "ok"
		if !rep.Passed {
			res = "FAIL"
			failed++
		}
		bound, evicted, pending := 0, 0, 0
		for _, c := range rep.Cycles {
			bound += c.Bound
			evicted += c.Evicted
		}
		for _, j := range rep.Jobs {
			pending += j.Pending
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", res, rep.Name, rep.File, len(rep.Cycles), bound, evicted, pending)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, rep := range reps {
		if rep.Passed {
			continue
		}
		fmt.Fprintf(w, "\nFAIL %s (%s):\n", rep.Name, rep.File)
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "  - %s\n", f)
		}
	}
	for _, rep := range reps {
		if err := writeFairness(w, rep); err != nil {
			return err
		}
	}
	// The plain "word: N passed, N failed" line that CI logs are read for.
	_, err := fmt.Fprintf(w, "scenarios: %d passed, %d failed\n", len(reps)-failed, failed)
	return err
}

// writeFairness writes a timed run's fairness table (SCENARIOS.md,
// "Fairness"): per leaf queue, GPU hours received and entitled and the
// largest deficit; Jain's index at the end and its lowest.
func writeFairness(w io.Writer, rep *Report) error {
	f := rep.Fairness
	if f == nil {
		return nil
	}
	fmt.Fprintf(w, "\nfairness %s (%s h; Jain's index %s at the end, lowest %s):\n", rep.Name, f.Hours, f.Jain, f.JainMin)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "QUEUE\tGPU-HOURS\tENTITLED\tLARGEST DEFICIT\tAT HOUR\t")
	for _, q := range sortedKeys(f.Queues) {
		x := f.Queues[q]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", q, x.GPUHoursReceived, x.GPUHoursEntitled, x.LargestDeficit, x.LargestDeficitAt)
	}
	return tw.Flush()
}
