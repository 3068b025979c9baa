package scenario

// Time in the property test: the generator's time protections, timed runs
// with quota schedules, usage history, run durations and arrivals (genTime,
// from its own random stream), and the invariants about them, checked
// after every cycle by code that shares nothing with the core: the
// protections (checkProtections) and fair share's floor at the quota in
// effect (checkFairShare, quotaFloor).

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Time protections, indexes of pgQueue.prot.
const (
	pgPreempt = 0
	pgReclaim = 1
	pgDelay   = 2
)

var pgProtNames = [3]string{"preemptMinRuntime", "reclaimMinRuntime", "preemptionDelay"}

// pgWin is one window of a queue's schedule: days (nil: every day), start
// and end in minutes of the local day (end 1440 is 24:00; end ≤ start
// crosses midnight), the zone as a fixed offset from UTC (only zones
// without daylight saving are drawn), and the GPU settings it gives.
type pgWin struct {
	days       []time.Weekday
	start, end int
	off        int // seconds east of UTC
	gpu        pgRes
}

// holds says whether w holds at wall, by SCENARIOS.md's reading: from its
// start (inclusive) to its end (exclusive) on one of its days, a window
// crossing midnight from its start on one of its days to its end the next.
func (w *pgWin) holds(wall time.Time) bool {
	l := wall.UTC().Add(time.Duration(w.off) * time.Second)
	m := l.Hour()*60 + l.Minute()
	day := func(d time.Weekday) bool { return w.days == nil || slices.Contains(w.days, d) }
	if w.start < w.end {
		return day(l.Weekday()) && m >= w.start && m < w.end
	}
	return day(l.Weekday()) && m >= w.start || day((l.Weekday()+6)%7) && m < w.end
}

// resAt is q's settings at wall: its first window that holds gives the GPU.
func (q *pgQueue) resAt(wall time.Time) [3]pgRes {
	res := q.res
	for i := range q.wins {
		if q.wins[i].holds(wall) {
			res[pgGPU] = q.wins[i].gpu
			break
		}
	}
	return res
}

// protection is q's time protection i with inheritance resolved (DESIGN.md:
// its own, else its nearest ancestor's, else 0), in seconds.
func (q *pgQueue) protection(i int) int64 {
	for _, a := range q.chain() {
		if a.prot[i] >= 0 {
			return a.prot[i]
		}
	}
	return 0
}

// pgUsage is config.usage: seconds, and the coefficient in thousandths.
type pgUsage struct{ halfLife, window, bucket, coef int64 }

// genTime draws, from g.tm only (so every seed's cluster, queues and jobs
// are what they were before): time protections for some queues (some set
// on a parent and inherited); and for some scenarios a timed run of 1 s
// cycles starting seconds before a window boundary, with schedules that
// switch during the run, usage history with a coefficient (its buckets of
// seconds, so what pods held in the run's first seconds is the prior usage
// of the later ones), jobs that finish (runFor) and jobs that arrive.
func (g *pgGen) genTime() {
	r, sc := g.tm, g.sc
	for _, q := range sc.queues {
		q.prot = [3]int64{-1, -1, -1}
	}
	if r.Float64() < 0.45 {
		for _, q := range sc.queues {
			for i, name := range pgProtNames {
				if r.Float64() < 0.35 {
					q.prot[i] = []int64{0, 1, 2, 3, 5, 8}[r.IntN(6)]
					q.addField(fmt.Sprintf("%s: %ds", name, q.prot[i]))
				}
			}
		}
	}
	if r.Float64() >= 0.45 {
		return
	}
	sc.timed = true
	// A boundary (09:00 Monday, or midnight into Monday) k seconds in.
	k := 1 + r.IntN(max(1, sc.cycles-1))
	monday := r.IntN(2) == 0
	sc.start = time.Date(2026, 1, 4, 23, 59, 60-k, 0, time.UTC)
	if monday {
		sc.start = time.Date(2026, 1, 5, 8, 59, 60-k, 0, time.UTC)
	}
	for _, q := range sc.queues {
		if r.Float64() < 0.4 {
			for n := 1 + r.IntN(2); n > 0; n-- {
				g.genWindow(q, monday)
			}
		}
	}
	if r.Float64() < 0.6 {
		b := int64(1 + r.IntN(3))
		sc.usage = &pgUsage{bucket: b, window: b * []int64{1, 3, 8}[r.IntN(3)], halfLife: []int64{0, 1, 2, 5}[r.IntN(4)],
			coef: []int64{0, 500, 1000, 2500, 100000}[r.IntN(5)]}
	}
	for ji, j := range sc.jobs {
		var extra []string
		if r.Float64() < 0.3 {
			j.runFor = 1 + int64(r.IntN(max(2, sc.cycles)))
			extra = append(extra, fmt.Sprintf("runFor: %ds", j.runFor))
		}
		running := slices.ContainsFunc(j.pods, func(p *pgPod) bool { return p.runNode != "" })
		if !running && !strings.Contains(g.jobYAML[ji], "createdAt:") && sc.cycles > 1 && r.Float64() < 0.25 {
			j.arriveAt = 1 + int64(r.IntN(sc.cycles-1))
			extra = append(extra, fmt.Sprintf("arriveAt: %ds", j.arriveAt))
		}
		if len(extra) > 0 {
			g.jobYAML[ji] = strings.Replace(g.jobYAML[ji], "\n  pods:\n", "\n  "+strings.Join(extra, "\n  ")+"\n  pods:\n", 1)
		}
	}
	// A job that arrives is created then, after the newest present from
	// the start (SCENARIOS.md, Time).
	var base int64
	for _, j := range sc.jobs {
		if j.arriveAt == 0 {
			base = max(base, j.createdAt)
		}
	}
	for _, j := range sc.jobs {
		if j.arriveAt > 0 {
			j.createdAt = base + j.arriveAt
		}
	}
}

// addField adds a field to the queue's line.
func (q *pgQueue) addField(f string) { q.line = q.line[:len(q.line)-1] + ", " + f + "}" }

// genWindow adds one window to q: one that starts or ends at the boundary
// the run crosses (09:00 Monday, or midnight into Monday), holds all along
// or never, in UTC or Asia/Tokyo (UTC+9, no daylight saving), with GPU
// settings of its own.
func (g *pgGen) genWindow(q *pgQueue, monday bool) {
	r := g.tm
	type kind struct {
		days       string
		start, end string
		tokyo      bool
	}
	kinds := []kind{{"", "00:00", "24:00", false}, {"[Mon]", "00:00", "24:00", false}}
	if monday {
		kinds = append(kinds, kind{"", "09:00", "17:00", false}, kind{"", "08:00", "09:00", false}, kind{"[Mon-Fri]", "09:00", "24:00", false},
			kind{"", "18:00", "19:00", true}, kind{"[Tue]", "09:00", "17:00", false}, kind{"[Sun]", "08:00", "09:00", false})
	} else {
		kinds = append(kinds, kind{"", "23:59", "00:00", false}, kind{"[Sun]", "22:00", "01:00", false}, kind{"[Mon]", "09:00", "10:00", true},
			kind{"[Sat-Sun]", "12:00", "24:00", false}, kind{"[Mon-Tue]", "00:00", "08:00", false})
	}
	k := kinds[r.IntN(len(kinds))]
	w := pgWin{start: pgMinutes(k.start), end: pgMinutes(k.end), gpu: q.res[pgGPU]}
	parts := []string{fmt.Sprintf("start: %q, end: %q", k.start, k.end)}
	if k.days != "" {
		parts = append(parts, "days: "+k.days)
		w.days = pgDays(k.days)
	}
	if k.tokyo {
		w.off = 9 * 3600
		parts = append(parts, "timeZone: Asia/Tokyo")
	} else if r.IntN(3) == 0 {
		parts = append(parts, "timeZone: UTC")
	}
	var gpu []string
	base := q.res[pgGPU]
	if r.Float64() < 0.8 {
		w.gpu.quota = []int64{0, 500, 1000, 2000, 4000, -1}[r.IntN(6)]
		gpu = append(gpu, "quota: "+pgMilli(w.gpu.quota))
	}
	switch {
	case w.gpu.quota != -1 && r.Float64() < 0.35:
		w.gpu.limit = max(w.gpu.quota, 0) + []int64{0, 1000, 2000}[r.IntN(3)]
		if w.gpu.limit == 0 {
			w.gpu.limit = 1000
		}
		gpu = append(gpu, "limit: "+pgMilli(w.gpu.limit))
	case base.limit != -1 && (w.gpu.quota == -1 || w.gpu.quota > base.limit):
		// The queue's own limit would be below the window's quota.
		w.gpu.limit = -1
		gpu = append(gpu, "limit: -1")
	}
	if r.Float64() < 0.4 {
		w.gpu.weight = []int64{0, 1, 3}[r.IntN(3)]
		gpu = append(gpu, fmt.Sprintf("overQuotaWeight: %d", w.gpu.weight))
	}
	parts = append(parts, "gpu: {"+strings.Join(gpu, ", ")+"}")
	q.wins = append(q.wins, w)
	if len(q.wins) == 1 {
		q.addField("schedule: []")
	}
	// The schedule's list, filled in place.
	i := strings.LastIndex(q.line, "]")
	sep := ", "
	if strings.HasSuffix(q.line[:i], "[") {
		sep = ""
	}
	q.line = q.line[:i] + sep + "{" + strings.Join(parts, ", ") + "}" + q.line[i:]
}

func pgMinutes(hhmm string) int {
	var h, m int
	fmt.Sscanf(hhmm, "%d:%d", &h, &m)
	return h*60 + m
}

// pgDays reads "[Mon]", "[Mon-Fri]", "[Sat-Sun]".
func pgDays(s string) []time.Weekday {
	names := map[string]time.Weekday{"Sun": time.Sunday, "Mon": time.Monday, "Tue": time.Tuesday, "Wed": time.Wednesday, "Thu": time.Thursday, "Fri": time.Friday, "Sat": time.Saturday}
	from, to, ok := strings.Cut(strings.Trim(s, "[]"), "-")
	if !ok {
		to = from
	}
	var out []time.Weekday
	for d := names[from]; ; d = (d + 1) % 7 {
		out = append(out, d)
		if d == names[to] {
			return out
		}
	}
}

// timeFeatures says whether the scenario has anything genTime draws.
func (sc *pgScenario) timeFeatures() bool {
	if sc.timed {
		return true
	}
	for _, q := range sc.queues {
		if q.prot != [3]int64{-1, -1, -1} {
			return true
		}
	}
	return false
}

// noteStarts keeps when each placed pod started (SCENARIOS.md: a pod given
// running when the run starts, one second before cycle 1 untimed; a pod the
// run binds or moves in the cycle that does so), after a cycle at now.
func (ck *propChecker) noteStarts(res *core.Result, now time.Time) {
	for _, b := range res.Binds {
		ck.started[b.Pod] = now
	}
	for _, e := range res.Evictions {
		if e.MoveTo != nil {
			ck.started[e.Pod] = now
		} else {
			delete(ck.started, e.Pod)
		}
	}
}

// checkProtections: no pod taken by preempt, reclaim or a consolidation
// move before it has run its queue's minimum runtime for that action (a move
// counts as preempt when it makes room for a job of the pod's own leaf
// queue, else as reclaim), and no eviction made for a job younger than its
// queue's preemption delay. The job an eviction is for is the one its plan
// binds (or, failing that, the one its reason names).
func (ck *propChecker) checkProtections(res *core.Result, now time.Time) {
	planJob := map[int]*pgJob{}
	for _, b := range res.Binds {
		if j := ck.jobs[b.Job]; b.Plan > 0 && j != nil {
			planJob[b.Plan] = j
		}
	}
	for _, e := range res.Evictions {
		p := ck.pods[e.Pod]
		if p == nil || e.Action == core.ActionStaleGang {
			continue // reported elsewhere; stale gangs are exempt
		}
		X := planJob[e.Plan]
		if m := reasonJob.FindStringSubmatch(e.Reason); X == nil && m != nil {
			X = ck.jobs[m[1]]
		}
		kind := pgReclaim
		switch {
		case e.Action == core.ActionPreempt:
			kind = pgPreempt
		case e.Action == core.ActionConsolidate && X != nil && X.queue == p.job.queue:
			kind = pgPreempt
		case e.Action == core.ActionConsolidate && X == nil:
			ck.bad("protection", "consolidation moved pod %s for no job this cycle placed (%q)", e.Pod, e.Reason)
			continue
		}
		if need := p.job.queue.protection(kind); need > 0 {
			ck.seen["protection runtime"]++
			started, ok := ck.started[e.Pod]
			if !ok {
				ck.bad("protection", "pod %s evicted by %s, but it was never placed", e.Pod, e.Action)
			} else if ran := now.Sub(started); ran < time.Duration(need)*time.Second {
				ck.bad("protection", "pod %s of queue %s taken by %s after running %v, below its %s of %ds (%q)",
					e.Pod, p.job.queue.name, e.Action, ran, pgProtNames[kind], need, e.Reason)
			}
		}
		if X == nil {
			continue
		}
		if d := X.queue.protection(pgDelay); d > 0 {
			ck.seen["protection delay"]++
			if age := now.Sub(simEpoch.Add(time.Duration(X.createdAt) * time.Second)); age < time.Duration(d)*time.Second {
				ck.bad("protection", "job %s (queue %s, %v old) evicted pod %s by %s, before its preemptionDelay of %ds", X.name, X.queue.name, age, e.Pod, e.Action, d)
			}
		}
	}
}
