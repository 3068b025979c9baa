package scenario

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"slices"
	"strconv"

	"github.com/tessera-gpu/tessera/controller/core"
)

// fairness keeps a timed run's GPU accounting: what each queue received over
// time, sampled every SampleSeconds, against what it was entitled to
// (SCENARIOS.md, "Fairness").
type fairness struct {
	spec     *Spec
	leaves   []string         // leaf queues, file order
	children map[string][]int // queue name ("" for the root) → indices into spec.Queues, by name
	// received is each leaf's GPU time so far, in milli-GPU-seconds.
	received map[string]int64
	// jobGPU is each job's own GPU request (milli-GPU; a fraction given as
	// memory is priced on the largest GPU).
	jobGPU   []int64
	capacity int64 // milli-GPU
	next     int64 // the next sample's time
	samples  []FairnessSample
	worst    map[string]deficit
	// held is each queue's GPU settings integrated over the run so far (by
	// index in spec.Queues): quota, limit and weight in effect × seconds,
	// what entitlement divides by (Unlimited once unlimited for a while).
	held []settingsTime
}

// settingsTime is a queue's GPU quota, limit and over-quota weight summed
// over time: value × seconds for each stretch it was in effect; Unlimited
// (-1) when the quota or limit was unlimited in any stretch.
type settingsTime struct{ quota, limit, weight int64 }

// add adds settings r held for d seconds.
func (st settingsTime) add(r core.QueueResource, d int64) settingsTime {
	sum := func(acc, v int64) int64 {
		if acc == core.Unlimited || v == core.Unlimited {
			return core.Unlimited
		}
		return min(acc+satMul(v, d), 1<<62)
	}
	return settingsTime{quota: sum(st.quota, r.Quota), limit: sum(st.limit, r.Limit), weight: sum(st.weight, r.OverQuotaWeight)}
}

type deficit struct{ amount, at int64 } // milli-GPU-seconds, seconds

func newFairness(s *Spec) *fairness {
	f := &fairness{spec: s, children: map[string][]int{}, received: map[string]int64{}, worst: map[string]deficit{}, next: s.SampleSeconds,
		held: make([]settingsTime, len(s.Queues))}
	var maxMem int64
	for _, n := range s.Nodes {
		f.capacity += int64(n.GPUs) * 1000
		if n.GPUs > 0 {
			maxMem = max(maxMem, n.GPUMemory)
		}
	}
	for i, q := range s.Queues {
		f.children[q.Parent] = append(f.children[q.Parent], i)
		if q.Leaf {
			f.leaves = append(f.leaves, q.Name)
		}
	}
	for k := range f.children {
		slices.SortFunc(f.children[k], func(a, b int) int { return cmpString(s.Queues[a].Name, s.Queues[b].Name) })
	}
	for _, j := range s.Jobs {
		var g int64
		for _, p := range j.Pods {
			if p.GPUMemory > 0 && maxMem > 0 {
				g += ceilDiv(p.GPUMemory*1000, maxMem)
			} else {
				g += p.GPUMilli
			}
		}
		f.jobGPU = append(f.jobGPU, g)
	}
	return f
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// account adds what each leaf queue held after the cycle at t until the
// next cycle that runs, at t2, and takes the samples due in (t, t2].
func (f *fairness) account(r *runner, t, t2 int64) {
	alloc := map[string]int64{}
	for _, p := range r.pods {
		if p.state == StateRunning || p.state == StateBound {
			for _, m := range p.place.GPUMilli {
				alloc[p.job.Queue] += m
			}
		}
	}
	// The settings the cycle at t ran with hold until t2: windows switch
	// only at cycles (the run never skips past a boundary).
	settingsFor := func(d int64) []settingsTime {
		out := make([]settingsTime, len(f.held))
		for i := range f.held {
			out[i] = f.held[i].add(r.queues[i].Resources[core.ResGPU], d)
		}
		return out
	}
	for ; f.next <= t2; f.next += f.spec.SampleSeconds {
		s := f.next
		got := map[string]int64{}
		for _, q := range f.leaves {
			got[q] = f.received[q] + alloc[q]*(s-t)
		}
		f.sample(r, s, alloc, got, settingsFor(s-t))
	}
	for _, q := range f.leaves {
		f.received[q] += alloc[q] * (t2 - t)
	}
	f.held = settingsFor(t2 - t)
}

// FairnessReport is a timed run's fairness (SCENARIOS.md, "Fairness"): GPU
// hours each leaf queue received against those it was entitled to, its
// largest deficit, and Jain's index over the queues, over time.
type FairnessReport struct {
	Hours   json.Number              `json:"hours"`
	Jain    json.Number              `json:"jain"`
	JainMin json.Number              `json:"jainMin"`
	Queues  map[string]FairnessQueue `json:"queues"`
	Samples []FairnessSample         `json:"samples"`
}

// FairnessQueue is one leaf queue's GPU hours at the end of the run, and its
// largest deficit (entitled − received, at a sample) and when it was.
type FairnessQueue struct {
	GPUHoursReceived json.Number `json:"gpuHoursReceived"`
	GPUHoursEntitled json.Number `json:"gpuHoursEntitled"`
	LargestDeficit   json.Number `json:"largestDeficitGpuHours"`
	LargestDeficitAt json.Number `json:"largestDeficitAtHour"`
}

// FairnessSample is the state at one sample time: each leaf queue's GPU
// allocation and fair share (GPUs) as the last cycle left them, GPU hours
// received and entitled so far, and Jain's index of received ÷ entitled.
type FairnessSample struct {
	Hour   json.Number                    `json:"hour"`
	Jain   json.Number                    `json:"jain"`
	Queues map[string]FairnessSampleQueue `json:"queues"`
}

// FairnessSampleQueue is one queue in a sample.
type FairnessSampleQueue struct {
	GPUAllocated     json.Number `json:"gpuAllocated"`
	GPUFairShare     json.Number `json:"gpuFairShare"`
	GPUHoursReceived json.Number `json:"gpuHoursReceived"`
	GPUHoursEntitled json.Number `json:"gpuHoursEntitled"`
	// GPUQuota is the queue's GPU quota in effect (-1: unlimited), and
	// Scheduled says a schedule window holds: its GPU quota, limit or
	// weight differ from the queue's own (the plot shades these).
	GPUQuota  json.Number `json:"gpuQuota"`
	Scheduled bool        `json:"scheduled,omitempty"`

	received, entitled int64 // milli-GPU-seconds
}

func (f *fairness) sample(r *runner, s int64, alloc, got map[string]int64, held []settingsTime) {
	ent := f.entitled(s, got, held)
	fs := FairnessSample{Hour: hoursNumber(s * 1000), Queues: map[string]FairnessSampleQueue{}}
	var x []float64
	for _, q := range f.leaves {
		sq := FairnessSampleQueue{GPUAllocated: milliNumber(alloc[q]), GPUFairShare: "0", received: got[q], entitled: ent[q],
			GPUHoursReceived: hoursNumber(got[q]), GPUHoursEntitled: hoursNumber(ent[q])}
		if r.last != nil {
			sq.GPUFairShare = milliNumber(r.last.Queues[q].FairShare[core.ResGPU])
		}
		sq.GPUQuota, sq.Scheduled = f.quotaAt(r, q)
		fs.Queues[q] = sq
		if d := ent[q] - got[q]; d > f.worst[q].amount {
			f.worst[q] = deficit{amount: d, at: s}
		}
		if ent[q] > 0 {
			x = append(x, float64(got[q])/float64(ent[q]))
		}
	}
	fs.Jain = ratioNumber(jain(x))
	f.samples = append(f.samples, fs)
}

// quotaAt is queue q's GPU quota as the run has it now, and whether its
// GPU settings differ from the file's (a schedule window holds).
func (f *fairness) quotaAt(r *runner, q string) (json.Number, bool) {
	for i, sq := range f.spec.Queues {
		if sq.Name != q || i >= len(r.queues) {
			continue
		}
		now := r.queues[i].Resources[core.ResGPU]
		own := core.QueueResource{Quota: sq.GPU.Quota, Limit: sq.GPU.Limit, OverQuotaWeight: sq.GPU.Weight}
		return milliNumber(now.Quota), now != own
	}
	return "0", false
}

// jain is Jain's fairness index (Σx)² / (n·Σx²): 1 when every queue got the
// same fraction of its entitlement, 1/n when one got everything.
func jain(x []float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(x)) * sq)
}

// entitled divides the GPU time all queues received by s among the leaf
// queues by DESIGN.md's fair-share rule, applied to totals over [0, s): a
// queue's demand is the GPU time its jobs asked for since they arrived
// (each job's GPUs × min(runFor, time since it arrived)); its quota, limit
// and weight are those in effect summed over time (held: the quota in
// effect × the seconds it was, over the stretches of its schedule's
// windows and its own settings). So a queue that waited while others ran
// is entitled to catch up, which today's rule, from each moment's demand
// alone, does not give it, and a window's quota counts for as long as it
// held.
func (f *fairness) entitled(s int64, got map[string]int64, held []settingsTime) map[string]int64 {
	demand := map[string]int64{}
	for ji, j := range f.spec.Jobs {
		if j.ArriveAt >= s {
			continue
		}
		d := s - j.ArriveAt
		if j.RunFor > 0 {
			d = min(d, j.RunFor)
		}
		demand[j.Queue] += f.jobGPU[ji] * d
	}
	var total int64
	for _, v := range got {
		total += v
	}
	out := map[string]int64{}
	f.sumDemand("", demand, held)
	f.divide("", total, demand, held, out)
	return out
}

// sumDemand fills demand for parent queues (children's sum), each capped at
// the queue's limit over time.
func (f *fairness) sumDemand(q string, demand map[string]int64, held []settingsTime) {
	for _, i := range f.children[q] {
		c := &f.spec.Queues[i]
		if !c.Leaf {
			f.sumDemand(c.Name, demand, held)
		}
		if l := held[i].limit; l != core.Unlimited {
			demand[c.Name] = min(demand[c.Name], l)
		}
		demand[q] += demand[c.Name]
	}
}

// divide hands share to q's children: guarantees min(quota over time,
// demand), scaled down in proportion when they exceed it, then the rest by
// priority and over-quota weight over time, water-filled up to demand.
func (f *fairness) divide(q string, share int64, demand map[string]int64, held []settingsTime, out map[string]int64) {
	kids := f.children[q]
	if len(kids) == 0 {
		out[q] = share
		return
	}
	got := make([]int64, len(kids))
	var sum int64
	for k, i := range kids {
		c := &f.spec.Queues[i]
		got[k] = demand[c.Name]
		if qu := held[i].quota; qu != core.Unlimited {
			got[k] = min(got[k], qu)
		}
		sum += got[k]
	}
	rest := share - sum
	if sum > share {
		for k := range got {
			got[k] = mulDiv(got[k], share, sum)
		}
		rest = 0
	}
	prios := map[int]bool{}
	for _, i := range kids {
		prios[f.spec.Queues[i].Priority] = true
	}
	for _, p := range sortedDesc(prios) {
		for rest > 0 {
			var w int64
			for k, i := range kids {
				if c := &f.spec.Queues[i]; c.Priority == p && got[k] < demand[c.Name] {
					w = min(w+held[i].weight, 1<<62)
				}
			}
			if w == 0 {
				break
			}
			given := int64(0)
			for k, i := range kids {
				if c := &f.spec.Queues[i]; c.Priority == p && got[k] < demand[c.Name] {
					g := min(mulDiv(rest, held[i].weight, w), demand[c.Name]-got[k])
					got[k] += g
					given += g
				}
			}
			rest -= given
			if given == 0 {
				break // what is left is below one unit per queue
			}
		}
	}
	for k, i := range kids {
		f.divide(f.spec.Queues[i].Name, got[k], demand, held, out)
	}
}

func sortedDesc(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// satMul is a × b for non-negative a and b, saturating instead of wrapping.
func satMul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<62 {
		return 1 << 62
	}
	return int64(lo)
}

// mulDiv is floor(a × b / c) for non-negative a, b and positive c, with
// a ≤ c or b ≤ c so the quotient fits.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// report sums the samples up.
func (f *fairness) report() *FairnessReport {
	rep := &FairnessReport{Hours: hoursNumber(f.spec.Seconds() * 1000), Queues: map[string]FairnessQueue{}, Samples: f.samples, Jain: "1", JainMin: "1"}
	if rep.Samples == nil {
		rep.Samples = []FairnessSample{}
	}
	minJ := 1.0
	for _, s := range f.samples {
		v, _ := strconv.ParseFloat(string(s.Jain), 64)
		minJ = min(minJ, v)
	}
	rep.JainMin = ratioNumber(minJ)
	if n := len(f.samples); n > 0 {
		last := f.samples[n-1]
		rep.Jain = last.Jain
		for _, q := range f.leaves {
			sq := last.Queues[q]
			w := f.worst[q]
			rep.Queues[q] = FairnessQueue{GPUHoursReceived: sq.GPUHoursReceived, GPUHoursEntitled: sq.GPUHoursEntitled,
				LargestDeficit: hoursNumber(w.amount), LargestDeficitAt: hoursNumber(w.at * 1000)}
		}
	}
	return rep
}

// hoursNumber writes milli-unit-seconds as unit-hours to three decimals.
func hoursNumber(v int64) json.Number {
	return json.Number(strconv.FormatFloat(float64(v)/3.6e6, 'f', 3, 64))
}

func ratioNumber(v float64) json.Number {
	return json.Number(strconv.FormatFloat(v, 'f', 4, 64))
}

// hours writes seconds for the trace ("36h", "1h30m").
func hours(s int64) string {
	return fmt.Sprint(timeDuration(s))
}
