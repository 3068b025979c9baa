package scenario

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/quotaschedule"
)

// Limits of a timed run (SCENARIOS.md, "Time").
const (
	// maxSeconds bounds every duration a file gives: a bit over a year.
	maxSeconds = 400 * 24 * 3600
	// maxTimedCycles bounds a timed run's cycles: a week of 10 s cycles is
	// 60,480; most of them are skipped.
	maxTimedCycles = 1_000_000
	// maxRepeat bounds the copies one job entry makes.
	maxRepeat = 10000
	// maxSamples bounds the fairness report's samples.
	maxSamples = 10000
	// defaultSample is the fairness report's sampling when time.sample is
	// not given: hourly, or the run's length when it is shorter.
	defaultSample = 3600
)

// parseSeconds reads a duration as Go writes it ("90s", "1h30m") or a whole
// number of days ("7d"), which must be a whole number of seconds from 1 to
// maxSeconds (0 too when zero is true).
func parseSeconds(raw string, zero bool) (int64, error) {
	var d time.Duration
	if n, ok := strings.CutSuffix(raw, "d"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		days, err := strconv.ParseInt(n, 10, 64)
		if err != nil || days > maxSeconds/86400 {
			return 0, fmt.Errorf("%q is out of range (at most %d days)", raw, maxSeconds/86400)
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(raw); err != nil {
			return 0, fmt.Errorf("%q is not a duration (like 90s, 1h30m or 7d)", raw)
		}
	}
	switch {
	case d%time.Second != 0:
		return 0, fmt.Errorf("%q is not a whole number of seconds", raw)
	case d < 0 || d == 0 && !zero:
		return 0, fmt.Errorf("%q must be above 0", raw)
	case d > maxSeconds*time.Second:
		return 0, fmt.Errorf("%q is out of range (at most %d days)", raw, maxSeconds/86400)
	}
	return int64(d / time.Second), nil
}

// normalizeTime reads the time: block into s (a timed run) and checks it
// against cycles:, which it replaces.
func normalizeTime(ft *fileTime, cycles *int, s *Spec) error {
	s.CycleSeconds = 1
	if ft == nil {
		return nil
	}
	if cycles != nil {
		return ferr("cycles", "a timed run (time:) is as long as time.duration says; leave cycles out")
	}
	s.Timed = true
	s.Start = defaultStart
	var err error
	if ft.Start != "" {
		if s.Start, err = time.Parse(time.RFC3339, ft.Start); err != nil {
			return ferr("time.start", "%q is not an RFC 3339 time (like 2026-03-09T08:00:00-04:00)", ft.Start)
		}
	}
	if ft.Cycle != "" {
		if s.CycleSeconds, err = parseSeconds(ft.Cycle, false); err != nil {
			return ferr("time.cycle", "%v", err)
		}
	}
	if ft.Duration == "" {
		return ferr("time.duration", "required in a timed run")
	}
	total, err := parseSeconds(ft.Duration, false)
	if err != nil {
		return ferr("time.duration", "%v", err)
	}
	if total%s.CycleSeconds != 0 {
		return ferr("time.duration", "%s is not a whole number of %s cycles", ft.Duration, time.Duration(s.CycleSeconds)*time.Second)
	}
	if n := total / s.CycleSeconds; n > maxTimedCycles {
		return ferr("time.duration", "%s of %s cycles is %d cycles, at most %d; use longer cycles", ft.Duration, time.Duration(s.CycleSeconds)*time.Second, n, maxTimedCycles)
	}
	s.Cycles = int(total / s.CycleSeconds)
	s.SampleSeconds = min(int64(defaultSample), total)
	if ft.Sample != "" {
		if s.SampleSeconds, err = parseSeconds(ft.Sample, false); err != nil {
			return ferr("time.sample", "%v", err)
		}
		if s.SampleSeconds > total {
			return ferr("time.sample", "%s is longer than the run (%s)", ft.Sample, ft.Duration)
		}
	}
	if n := total / s.SampleSeconds; n > maxSamples {
		return ferr("time.sample", "%d samples of %s in %s, at most %d; sample less often", n, time.Duration(s.SampleSeconds)*time.Second, ft.Duration, maxSamples)
	}
	return nil
}

// normalizeJobTime reads a job's arriveAt and runFor, which only a timed run
// may give.
func normalizeJobTime(fj *fileJob, p string, timed bool, j *Job) error {
	for _, f := range []struct{ name, raw string }{{"arriveAt", fj.ArriveAt}, {"runFor", fj.RunFor}} {
		if f.raw != "" && !timed {
			return ferr(p+"."+f.name, "needs a timed run: give the scenario a time: block")
		}
	}
	if fj.Repeat != nil && !timed {
		return ferr(p+".repeat", "needs a timed run: give the scenario a time: block")
	}
	var err error
	if fj.ArriveAt != "" {
		if fj.CreatedAt != nil {
			return ferr(p+".arriveAt", "a job that arrives is created then; leave createdAt out")
		}
		if j.ArriveAt, err = parseSeconds(fj.ArriveAt, true); err != nil {
			return ferr(p+".arriveAt", "%v", err)
		}
	}
	if fj.RunFor != "" {
		if j.RunFor, err = parseSeconds(fj.RunFor, false); err != nil {
			return ferr(p+".runFor", "%v", err)
		}
	}
	return nil
}

// repeatJob expands a job's repeat: into its copies, NAME-0, NAME-1, …,
// copy k arriving k × every after the job's arriveAt, pods named after the
// copy (NAME-k-0, …). Without repeat it is the job itself.
func repeatJob(fj fileJob, p string) ([]fileJob, error) {
	if fj.Repeat == nil {
		return []fileJob{fj}, nil
	}
	rp := fj.Repeat
	if rp.Count == nil || *rp.Count < 1 || *rp.Count > maxRepeat {
		c := "not set"
		if rp.Count != nil {
			c = strconv.Itoa(*rp.Count)
		}
		return nil, ferr(p+".repeat.count", "%s; want 1 to %d", c, maxRepeat)
	}
	every, err := parseSeconds(rp.Every, false)
	if err != nil {
		if rp.Every == "" {
			return nil, ferr(p+".repeat.every", "required")
		}
		return nil, ferr(p+".repeat.every", "%v", err)
	}
	var start int64
	if fj.ArriveAt != "" {
		if start, err = parseSeconds(fj.ArriveAt, true); err != nil {
			return nil, ferr(p+".arriveAt", "%v", err)
		}
	}
	if fj.CreatedAt != nil {
		return nil, ferr(p+".repeat", "copies arrive over time; leave createdAt out")
	}
	last := start + int64(*rp.Count-1)*every
	if last > maxSeconds {
		return nil, ferr(p+".repeat", "the last copy would arrive after %d days", maxSeconds/86400)
	}
	out := make([]fileJob, *rp.Count)
	for k := range out {
		c := fj
		c.Repeat = nil
		c.Name = fmt.Sprintf("%s-%d", fj.Name, k)
		c.ArriveAt = (time.Duration(start+int64(k)*every) * time.Second).String()
		out[k] = c
	}
	return out, nil
}

func timeDuration(s int64) time.Duration { return time.Duration(s) * time.Second }

// Defaults of config.usage.
const (
	defaultHalfLife = 24 * time.Hour
	defaultWindow   = 7 * 24 * time.Hour
	defaultBucket   = time.Hour
)

// normalizeUsage reads config.usage: a timed run's usage history and the
// coefficient fair share weighs it with.
func normalizeUsage(fu *fileUsage, s *Spec) error {
	if fu == nil {
		return nil
	}
	if !s.Timed {
		return ferr("config.usage", "needs a timed run: give the scenario a time: block")
	}
	u := &Usage{Config: core.UsageConfig{HalfLife: defaultHalfLife, Window: defaultWindow, Bucket: defaultBucket}, Coefficient: 1000}
	for _, f := range []struct {
		name, raw string
		to        *time.Duration
		zero      bool
	}{{"halfLife", fu.HalfLife, &u.Config.HalfLife, true}, {"window", fu.Window, &u.Config.Window, false}, {"bucket", fu.Bucket, &u.Config.Bucket, false}} {
		if f.raw == "" {
			continue
		}
		v, err := parseSeconds(f.raw, f.zero)
		if err != nil {
			return ferr("config.usage."+f.name, "%v", err)
		}
		*f.to = timeDuration(v)
	}
	if err := u.Config.Validate(); err != nil {
		return ferr("config.usage", "%v", err)
	}
	if fu.Coefficient != nil {
		v, err := parseMilli(fu.Coefficient.raw, false)
		if err != nil || v < 0 || v > core.MaxUsageCoefficient {
			return ferr("config.usage.coefficient", "%q: want a number from 0 to %d (thousandths at most)", fu.Coefficient.raw, core.MaxUsageCoefficient/1000)
		}
		u.Coefficient = v
	}
	s.Usage = u
	return nil
}

// defaultStart is a timed run's wall-clock start when time.start is not
// given: Monday 5 January 2026, midnight UTC.
var defaultStart = time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)

// formatAmount writes a queue amount: milli as a decimal, or bytes.
func formatAmount(v int64, milli bool) string {
	if milli {
		return formatMilli(v)
	}
	return formatBytes(v)
}

// normalizeQueueTime reads a queue's time protections (any run) and its
// schedule (timed runs only).
func normalizeQueueTime(fq *fileQueue, p string, timed bool, q *Queue) error {
	for _, f := range []struct {
		name, raw string
		to        *int64
	}{{"preemptMinRuntime", fq.PreemptMinRuntime, &q.PreemptMinRuntime}, {"reclaimMinRuntime", fq.ReclaimMinRuntime, &q.ReclaimMinRuntime}, {"preemptionDelay", fq.PreemptionDelay, &q.PreemptionDelay}} {
		*f.to = -1
		if f.raw == "" {
			continue
		}
		v, err := parseSeconds(f.raw, true)
		if err != nil {
			return ferr(p+"."+f.name, "%v", err)
		}
		*f.to = v
	}
	if len(fq.Schedule) > 0 && !timed {
		return ferr(p+".schedule", "needs a timed run: give the scenario a time: block")
	}
	if len(fq.Schedule) > maxWindows {
		return ferr(p+".schedule", "%d windows, at most %d", len(fq.Schedule), maxWindows)
	}
	for i, fw := range fq.Schedule {
		wp := fmt.Sprintf("%s.schedule[%d]", p, i)
		w, err := quotaschedule.Parse(quotaschedule.Spec{Days: fw.Days, Start: fw.Start, End: fw.End, TimeZone: fw.TimeZone})
		if err != nil {
			return ferr(wp, "%v", err)
		}
		sw := Window{When: w}
		if sw.GPU, err = overrideResource(fw.GPU, wp+".gpu", true, false, q.GPU); err != nil {
			return err
		}
		if sw.CPU, err = overrideResource(fw.CPU, wp+".cpu", false, true, q.CPU); err != nil {
			return err
		}
		if sw.Memory, err = overrideResource(fw.Memory, wp+".memory", false, false, q.Memory); err != nil {
			return err
		}
		q.Schedule = append(q.Schedule, sw)
	}
	return nil
}

// maxWindows bounds a queue's schedule (each window is read every cycle).
const maxWindows = 32

// protection is a queue's time protection for the core: seconds, or -1 to
// inherit.
func protection(sec int64) time.Duration {
	if sec < 0 {
		return core.InheritDuration
	}
	return timeDuration(sec)
}

// applySchedules sets each queue's settings for the cycle at t (seconds
// from the run's start): the first window of its schedule that holds at
// the wall-clock time start + t, else its own.
func (r *runner) applySchedules(t int64) {
	wall := r.spec.Start.Add(timeDuration(t))
	for i := range r.spec.Queues {
		q := &r.spec.Queues[i]
		if len(q.Schedule) == 0 {
			continue
		}
		gpu, cpu, mem := q.At(wall)
		for res, v := range map[core.Resource]Resource{core.ResGPU: gpu, core.ResCPU: cpu, core.ResMemory: mem} {
			r.queues[i].Resources[res] = core.QueueResource{Quota: v.Quota, Limit: v.Limit, OverQuotaWeight: v.Weight}
		}
	}
}

// nextScheduleChange is the next time after t (seconds from the run's
// start) at which some queue's schedule may change its settings, or the
// run's end: the run must not skip past a window's boundary.
func (r *runner) nextScheduleChange(t int64) int64 {
	next := r.spec.Seconds()
	wall := r.spec.Start.Add(timeDuration(t))
	for i := range r.spec.Queues {
		for _, w := range r.spec.Queues[i].Schedule {
			if n := w.When.Next(wall); !n.IsZero() {
				// Boundaries are whole minutes; a start between seconds
				// rounds up.
				next = min(next, t+int64((n.Sub(wall)+time.Second-1)/time.Second))
			}
		}
	}
	return next
}

// nextProtectionEnd is the next time after t at which a time protection
// ends: a placed pod's minimum runtimes (both of its queue's: either ending
// may let an action take it) or a pending pod's job's preemption delay.
// Between them, a quiet cycle stays quiet.
func (r *runner) nextProtectionEnd(t int64, now time.Time) int64 {
	next := r.spec.Seconds()
	at := func(end time.Time) {
		if end.After(now) {
			next = min(next, t+int64((end.Sub(now)+time.Second-1)/time.Second))
		}
	}
	for ji := range r.spec.Jobs {
		j := &r.spec.Jobs[ji]
		if l := r.jobs[ji]; !l.arrived || l.finished {
			continue
		}
		pr := r.protect[j.Queue]
		for pi := range j.Pods {
			switch p := r.byName[j.Pods[pi].Name]; p.state {
			case StatePending:
				if pr.delay > 0 {
					at(r.jobCreated(ji).Add(pr.delay))
				}
			case StateRunning, StateBound:
				at(p.started.Add(pr.preempt))
				at(p.started.Add(pr.reclaim))
			}
		}
	}
	return next
}

// protections are a queue's time protections with inheritance resolved, as
// the core resolves them (only the simulator's skipping needs them).
type protections struct{ preempt, reclaim, delay time.Duration }

// resolveProtections gives each queue its own protections, or its nearest
// ancestor's that sets one, else none.
func resolveProtections(s *Spec) map[string]protections {
	byName := map[string]*Queue{}
	for i := range s.Queues {
		byName[s.Queues[i].Name] = &s.Queues[i]
	}
	get := func(q *Queue, f func(*Queue) int64) time.Duration {
		for a := q; a != nil; a = byName[a.Parent] {
			if v := f(a); v >= 0 {
				return timeDuration(v)
			}
		}
		return 0
	}
	out := map[string]protections{}
	for i := range s.Queues {
		q := &s.Queues[i]
		out[q.Name] = protections{
			preempt: get(q, func(q *Queue) int64 { return q.PreemptMinRuntime }),
			reclaim: get(q, func(q *Queue) int64 { return q.ReclaimMinRuntime }),
			delay:   get(q, func(q *Queue) int64 { return q.PreemptionDelay }),
		}
	}
	return out
}
