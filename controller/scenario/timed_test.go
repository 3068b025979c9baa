package scenario

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// burstyWeek is a timed scenario of three teams on nodes×8 GPUs for the
// given duration: team a runs big gangs back to back, b bursts every 12 h,
// c sends a stream of small jobs, so jobs arrive, finish, reclaim and
// preempt all along.
func burstyWeek(nodes int, duration string, cycle string) string {
	gpus := nodes * 8
	return fmt.Sprintf(`name: bursty
time: {cycle: %s, duration: %s}
nodes:
- {name: dgx, count: %d, gpus: 8}
queues:
- {name: a, gpu: {quota: %d}}
- {name: b, gpu: {quota: %d}}
- {name: c, gpu: {quota: %d, overQuotaWeight: 2}}
jobs:
- {name: a-big, queue: a, priority: 50, runFor: 5h, repeat: {count: 40, every: 4h}, pods: [{count: %d, gpu: 8}]}
- {name: b-burst, queue: b, priority: 50, minMember: 1, runFor: 3h, arriveAt: 2h, repeat: {count: 14, every: 12h}, pods: [{count: %d, gpu: 2}]}
- {name: c-small, queue: c, priority: 50, runFor: 50m, arriveAt: 30m, repeat: {count: 150, every: 67m}, pods: [{count: 3, gpu: 1}]}
- {name: c-serve, queue: c, priority: 100, pods: [{count: %d, gpu: 1}]}
`, cycle, duration, nodes, gpus/8, gpus/8, gpus/8, max(1, nodes/4), max(1, gpus/8), max(1, gpus/10))
}

func loadOne(t testing.TB, yaml string) *Spec {
	t.Helper()
	specs, err := Parse("t.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return specs[0]
}

// TestTimedSkipIsStep: skipping the cycles where nothing can change gives
// the report that running every cycle gives, byte for byte, with far fewer
// cycles run.
func TestTimedSkipIsStep(t *testing.T) {
	specs := []*Spec{loadOne(t, burstyWeek(4, "2d", "30s"))}
	for _, f := range []string{"time.yaml", "history.yaml", "schedules.yaml", "protections.yaml"} {
		more, err := LoadFile("../testdata/scenarios/" + f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range more {
			if s.Timed {
				specs = append(specs, s)
			}
		}
	}
	for _, s := range specs {
		t.Run(s.Name, func(t *testing.T) {
			skip, step := Run(s, Options{}), Run(s, Options{Step: true})
			var a, b bytes.Buffer
			if err := WriteJSON(&a, skip); err != nil {
				t.Fatal(err)
			}
			if err := WriteJSON(&b, step); err != nil {
				t.Fatal(err)
			}
			if a.String() != b.String() {
				t.Fatalf("skipping changed the report:\nskip: %s\nstep: %s", a.String(), b.String())
			}
			if step.CyclesRun != s.Cycles || skip.CyclesRun*4 > s.Cycles {
				t.Errorf("ran %d cycles skipping, %d stepping, of %d: want all stepping and under a quarter skipping", skip.CyclesRun, step.CyclesRun, s.Cycles)
			}
			if len(skip.Failures) > 0 {
				t.Errorf("failures: %v", skip.Failures)
			}
		})
	}
}

// TestFairnessHandWorked checks the fairness report on a case worked by
// hand: 8 GPUs, queue a alone for an hour, then b arrives and reclaims half.
func TestFairnessHandWorked(t *testing.T) {
	s := loadOne(t, `name: hand
time: {cycle: 60s, duration: 2h}
nodes: [{name: dgx, gpus: 8}]
queues: [{name: a}, {name: b}]
jobs:
- {name: a-train, queue: a, priority: 50, minMember: 1, pods: [{count: 8, gpu: 1}]}
- {name: b-train, queue: b, priority: 50, minMember: 1, arriveAt: 1h, runFor: 1h, pods: [{count: 8, gpu: 1}]}
`)
	rep := Run(s, Options{})
	if !rep.Passed {
		t.Fatal(rep.Failures)
	}
	f := rep.Fairness
	// At 1 h: a had 8 GPUs for the hour and asked for no more; b nothing.
	// At 2 h: b's job arrived at 1 h, reclaim evicted 4 of a's pods in that
	// cycle and b's 4 pods were bound in the next (60 s later): a received
	// 8 + 4 = 12 GPU-hours, b 4 × 59/60 = 3.933. Demand: a 8 GPUs × 2 h =
	// 16, b 8 × 1 h = 8; the 15.933 received split by weight 1:1 within
	// those: 7.967 each (the odd unit to a, name order… of a millisecond).
	// Jain: x = 1.5063 and 0.4937 → 4 / (2 × 2.5126) = 0.7960.
	want := map[string][3]string{"a": {"12.000", "7.967", "0.000"}, "b": {"3.933", "7.967", "4.033"}}
	for q, w := range want {
		got := f.Queues[q]
		if string(got.GPUHoursReceived) != w[0] || string(got.GPUHoursEntitled) != w[1] || string(got.LargestDeficit) != w[2] {
			t.Errorf("queue %s: received %s entitled %s deficit %s, want %v", q, got.GPUHoursReceived, got.GPUHoursEntitled, got.LargestDeficit, w)
		}
	}
	if f.Jain != "0.7960" || f.JainMin != "0.7960" || len(f.Samples) != 2 || f.Samples[0].Jain != "1.0000" {
		b, _ := json.Marshal(f)
		t.Errorf("jain %s min %s, want 0.7960 at the end and 1 after the first hour: %s", f.Jain, f.JainMin, b)
	}
	if got := f.Samples[1].Queues["b"]; got.GPUAllocated != "4" || got.GPUFairShare != "4" {
		t.Errorf("sample at 2 h, queue b: allocated %s fair share %s, want 4 and 4", got.GPUAllocated, got.GPUFairShare)
	}
}

// TestTimedJobsAreNotSeenEarlyOrLate: a job's pods are out of the snapshot
// before it arrives and after it finished; no GPU-time is counted for them.
func TestTimedJobsAreNotSeenEarlyOrLate(t *testing.T) {
	s := loadOne(t, `name: life
time: {cycle: 10s, duration: 1h}
nodes: [{name: dgx, gpus: 8}]
queues: [{name: a}]
jobs:
- {name: j, queue: a, priority: 50, arriveAt: 20m, runFor: 30m, pods: [{count: 2, gpu: 1}]}
`)
	var trace strings.Builder
	rep := Run(s, Options{Trace: &trace})
	if got := rep.Fairness.Queues["a"].GPUHoursReceived; got != "1.000" {
		t.Errorf("received %s GPU-hours, want 2 GPUs × 30 min = 1.000\n%s", got, trace.String())
	}
	for _, w := range []string{"at 20m0s: job j arrives", "at 50m0s: job j finished (ran 30m0s)"} {
		if !strings.Contains(trace.String(), w) {
			t.Errorf("trace lacks %q:\n%s", w, trace.String())
		}
	}
}

// BenchmarkTimedWeek runs a simulated week of a 100-node (800-GPU) cluster
// with 60 s cycles (10,080 of them), skipping the cycles where nothing can
// change, and once stepping every cycle in the same run: step/skip is how
// much skipping saves.
//
//	go test -run x -bench TimedWeek -benchtime 1x ./controller/scenario
func BenchmarkTimedWeek(b *testing.B) {
	s := loadOne(b, burstyWeek(100, "7d", "60s"))
	var skipTime time.Duration
	var rep *Report
	for b.Loop() {
		start := time.Now()
		rep = Run(s, Options{})
		skipTime += time.Since(start)
	}
	start := time.Now()
	step := Run(s, Options{Step: true})
	stepTime := time.Since(start)
	if len(rep.Failures) > 0 || len(step.Failures) > 0 {
		b.Fatal(rep.Failures, step.Failures)
	}
	per := skipTime / time.Duration(b.N)
	b.ReportMetric(per.Seconds(), "s-skip/week")
	b.ReportMetric(stepTime.Seconds(), "s-step/week")
	b.ReportMetric(stepTime.Seconds()/per.Seconds(), "step/skip")
	b.ReportMetric(float64(rep.CyclesRun), "cycles-run")
	b.ReportMetric(float64(s.Cycles), "cycles")
}

// TestHistoryBringsBurstyTeamToEntitlement runs the committed example
// (controller/testdata/timed/bursty-week.yaml): the same week with fair share
// by weight alone and with history. With history the bursty team's GPU hours
// come closer to its entitlement and Jain's index rises; by weight alone the
// steady team, always pending, takes half of every burst.
func TestHistoryBringsBurstyTeamToEntitlement(t *testing.T) {
	specs, err := LoadFile("../testdata/timed/bursty-week.yaml")
	if err != nil || len(specs) != 2 {
		t.Fatalf("want two scenarios: %v", err)
	}
	plain, hist := Run(specs[0], Options{}), Run(specs[1], Options{})
	num := func(n json.Number) float64 { v, _ := n.Float64(); return v }
	gap := func(r *Report, q string) float64 {
		f := r.Fairness.Queues[q]
		return num(f.GPUHoursEntitled) - num(f.GPUHoursReceived)
	}
	if !(num(hist.Fairness.Jain) > num(plain.Fairness.Jain)) || !(gap(hist, "bursty") < gap(plain, "bursty")/2) {
		t.Errorf("with history Jain %s, bursty short by %.1f GPU-hours; by weight alone Jain %s, short by %.1f: want history higher and under half",
			hist.Fairness.Jain, gap(hist, "bursty"), plain.Fairness.Jain, gap(plain, "bursty"))
	}
}

// TestFairnessEntitlementFollowsWindows: the fairness report's entitlement
// counts a window's quota and weight for as long as it holds. Queues a and
// b each want the 4 GPUs of the node (4 one-GPU pods, preemptible) for the
// whole run of 4 one-hour cycles; from 00:00 to 01:00 a's window gives it
// quota 4 and weight 3, otherwise both have quota 0 and weight 1.
//
// By hand, with the window for an hour: cycle 1 (fair share a 4, b 0)
// binds a 3 and b 1 (allocate takes free GPUs in job order); cycle 2 (2 and
// 2) has b reclaim one of a's, whose GPU is idle until cycle 3 binds b's
// pod: received a 3+2+2+2 = 9, b 1+1+2+2 = 6, 15 in all. Entitled: a's
// quota over the run is 4 GPU × 1 h = 4 GPU hours, b's 0; the other 11 go
// by weight over time, a 3 × 1 h + 1 × 3 h = 6, b 1 × 4 h = 4: a 4 + 6.6 =
// 10.6, b 4.4. (Reading each queue's own settings, as before, gave 7.5
// each.) Without the window the node splits 2 and 2 from the start, 8 and 8
// entitled 8 and 8; with it all along, a reclaims one of b's pods in cycle
// 2: a 3+3+4+4 = 14, b 1, and a's guarantee of 4 × 4 h = 16 exceeds the 15
// received, so a is entitled to all 15.
func TestFairnessEntitlementFollowsWindows(t *testing.T) {
	const base = `time: {cycle: 1h, duration: 4h, sample: 4h, start: "2026-01-05T00:00:00Z"}
nodes:
- {name: dgx, gpus: 4}
queues:
- name: a
%s- {name: b}
jobs:
- {name: a-job, queue: a, priority: 50, minMember: 1, pods: [{count: 4, gpu: 1}]}
- {name: b-job, queue: b, priority: 50, minMember: 1, pods: [{count: 4, gpu: 1}]}
`
	for _, tc := range []struct {
		name, window string
		// received and entitled GPU hours of a and b.
		want [4]string
	}{
		{"window for an hour", `  schedule: [{start: "00:00", end: "01:00", gpu: {quota: 4, overQuotaWeight: 3}}]` + "\n", [4]string{"9.000", "6.000", "10.600", "4.400"}},
		{"no window", "", [4]string{"8.000", "8.000", "8.000", "8.000"}},
		{"window all along", `  schedule: [{start: "00:00", end: "24:00", gpu: {quota: 4, overQuotaWeight: 3}}]` + "\n", [4]string{"14.000", "1.000", "15.000", "0.000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Run(loadOne(t, "name: w\n"+fmt.Sprintf(base, tc.window)), Options{})
			if rep.Fairness == nil {
				t.Fatal("no fairness report")
			}
			a, b := rep.Fairness.Queues["a"], rep.Fairness.Queues["b"]
			got := [4]string{string(a.GPUHoursReceived), string(b.GPUHoursReceived), string(a.GPUHoursEntitled), string(b.GPUHoursEntitled)}
			if got != tc.want {
				t.Errorf("received a %s, b %s; entitled a %s, b %s; want %v", got[0], got[1], got[2], got[3], tc.want)
			}
		})
	}
}
