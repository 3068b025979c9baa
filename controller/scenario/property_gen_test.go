package scenario

// The random scenario generator of the property test (property_test.go).
// It keeps its own model of what it wrote (pgScenario): the checks read
// queues, jobs and pods from that model, not from the Spec the loader made,
// so a loader that misread a field shows up as a broken invariant too.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

const pgGi = int64(1) << 30

// Resource indexes of pgRes arrays: the core's order (gpu, cpu, memory).
const (
	pgGPU = 0
	pgCPU = 1
	pgMem = 2
)

var pgResNames = [3]string{"gpu", "cpu", "memory"}

type pgNode struct {
	name   string
	gpus   int
	gpuMem int64  // bytes per GPU
	nvlink string // all | pairs | none
	cpu    int64  // milli
	mem    int64  // bytes
	// grp is the node's entry in the file (nodeYAML).
	grp int
	// zone and rack are its labels ("": none); the topology dc is zone,
	// rack, kubernetes.io/hostname.
	zone, rack string
}

// domainAt is the node's domain of a level of dc ("zone" or "rack"): its
// zone, or zone/rack; "" when a label is missing (in no domain).
func (n *pgNode) domainAt(level string) string {
	switch {
	case n.zone == "":
		return ""
	case level == "zone":
		return n.zone
	case n.rack == "":
		return ""
	}
	return n.zone + "/" + n.rack
}

// domain is GPU g's NVLink domain as SCENARIOS.md defines it ("" = none).
func (n *pgNode) domain(g int) string {
	switch n.nvlink {
	case "all":
		return "all"
	case "pairs":
		return "pair" + strconv.Itoa(g/2)
	}
	return ""
}

// pgRes is one queue resource in the core's units; -1 is unlimited/none.
type pgRes struct{ quota, limit, weight int64 }

type pgQueue struct {
	name   string
	parent *pgQueue
	kids   []*pgQueue
	prio   int
	res    [3]pgRes
	line   string
	// prot is the queue's preemptMinRuntime, reclaimMinRuntime and
	// preemptionDelay in seconds, -1 where it inherits (genTime).
	prot [3]int64
	// wins is its schedule (timed runs only), in order.
	wins []pgWin
}

func (q *pgQueue) leaf() bool { return len(q.kids) == 0 }

// chain is the queue and its ancestors, leaf first.
func (q *pgQueue) chain() []*pgQueue {
	var out []*pgQueue
	for at := q; at != nil; at = at.parent {
		out = append(out, at)
	}
	return out
}

type pgPod struct {
	name    string
	job     *pgJob
	whole   int   // whole GPUs
	milli   int64 // a fraction given as a share (250, 500)
	gmem    int64 // a fraction given as GPU memory (bytes)
	sharing string
	nvreq   bool
	cpu     int64 // milli
	mem     int64 // bytes
	// Where the file says the pod already runs ("": pending).
	runNode string
	runGPUs []int
	// alts are the pod's alternatives (Pod.Alternatives), in order; only
	// their GPU fields (whole, milli, gmem, sharing, nvreq) are set.
	alts []pgPod
	// sub is the subgroup the pod names ("": none).
	sub string
}

// as is the pod while it holds request alt (core.Placement's Alternative):
// 0 its own, i its alts[i-1], whose GPU fields replace the pod's. ok is
// false when it has no such alternative.
func (p *pgPod) as(alt int) (q *pgPod, ok bool) {
	if alt == 0 {
		return p, true
	}
	if alt < 0 || alt > len(p.alts) {
		return p, false
	}
	a := &p.alts[alt-1]
	c := *p
	c.whole, c.milli, c.gmem, c.sharing, c.nvreq = a.whole, a.milli, a.gmem, a.sharing, a.nvreq
	c.alts = nil
	return &c, true
}

func (p *pgPod) fraction() bool { return p.milli > 0 || p.gmem > 0 }

// gpuCount is how many GPU indices the pod's placement must list.
func (p *pgPod) gpuCount() int {
	if p.fraction() {
		return 1
	}
	return p.whole
}

type pgJob struct {
	name      string
	queue     *pgQueue
	prio      int
	preempt   bool
	never     bool // preemptionPolicy: Never
	minMember int
	createdAt int64
	pods      []*pgPod
	// subs are the job's subgroups (Job.SubGroups), in order.
	subs []pgSub
	// required is the level of dc the job requires ("zone", "rack" or
	// ""); subRequired the one each of its subgroups requires.
	required, subRequired string
	// runFor and arriveAt are the job's timed-run fields in seconds (0:
	// none); createdAt is then the loader's, from arriveAt.
	runFor, arriveAt int64
}

type pgSub struct {
	name string
	min  int
}

// holds says whether the job's gang holds with the pods placed says are
// placed: minMember in all and every subgroup at its minimum (or none
// placed at all, which the gang rule allows too).
func (j *pgJob) holds(placed func(p *pgPod) bool) (bool, string) {
	n := 0
	per := map[string]int{}
	for _, p := range j.pods {
		if placed(p) {
			n++
			per[p.sub]++
		}
	}
	if n == 0 {
		return true, ""
	}
	if n < j.minMember {
		return false, fmt.Sprintf("%d pod(s) placed, below its minMember %d", n, j.minMember)
	}
	for _, s := range j.subs {
		if per[s.name] < s.min {
			return false, fmt.Sprintf("%d pod(s) of subgroup %s placed, below its minMember %d", per[s.name], s.name, s.min)
		}
	}
	return true, ""
}

type pgScenario struct {
	seed          uint64
	name          string
	cycles        int
	consolidation bool
	spread        bool
	nodes         []*pgNode
	queues        []*pgQueue // file order (parents before children)
	jobs          []*pgJob
	yaml          string
	// topology: the file has the topology dc (genTopology).
	topology bool
	// timed: a timed run of 1 s cycles, sc.cycles of them, starting at
	// start on the wall clock; usage its config.usage (nil: none). All
	// from genTime.
	timed bool
	start time.Time
	usage *pgUsage
}

// pgGPUUse is a GPU's use by the running pods placed so far.
type pgGPUUse struct {
	pods  int
	whole bool
	milli int64 // shares asked as milli
	memb  int64 // bytes asked as memory
	mode  string
}

type pgGen struct {
	r *rand.Rand
	// alt draws the pods' alternatives, from its own stream, so that the
	// main stream (r), and with it everything else a seed generates, is
	// what it was before alternatives were generated. sub draws subgroups
	// the same way.
	alt *rand.Rand
	sub *rand.Rand
	// topo draws node labels and topology constraints, from its own
	// stream in the same way.
	topo *rand.Rand
	// tm draws time: protections, a timed run's schedules, usage history,
	// run durations and arrivals (genTime), from its own stream too.
	tm       *rand.Rand
	sc       *pgScenario
	use      map[string][]pgGPUUse
	cpuUsed  map[string]int64
	memUsed  map[string]int64
	maxGPUs  int
	maxGPUMe int64
	nodeYAML []string
	jobYAML  []string
	// reclaimy biases the draws towards reclaim (TESSERA_PROPERTY_MODE=
	// reclaim): more top-level queues, preemptible jobs running more often.
	// The default draws, and so the default seeds' scenarios, do not change.
	reclaimy bool
}

func (g *pgGen) pick(xs ...int) int        { return xs[g.r.IntN(len(xs))] }
func (g *pgGen) pick64(xs ...int64) int64  { return xs[g.r.IntN(len(xs))] }
func (g *pgGen) pickS(xs ...string) string { return xs[g.r.IntN(len(xs))] }
func (g *pgGen) chance(p float64) bool     { return g.r.Float64() < p }
func (g *pgGen) between(lo, hi int) int    { return lo + g.r.IntN(hi-lo+1) }
func (g *pgGen) shuffledNodes() []*pgNode {
	out := slices.Clone(g.sc.nodes)
	g.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// generateProperty builds the scenario of one seed: its model and its YAML.
func generateProperty(seed uint64) *pgScenario {
	g := &pgGen{r: rand.New(rand.NewPCG(seed, 0x7e55e7a)), alt: rand.New(rand.NewPCG(seed, 0xa17e5)), sub: rand.New(rand.NewPCG(seed, 0x5b9)), topo: rand.New(rand.NewPCG(seed, 0x7090)), tm: rand.New(rand.NewPCG(seed, 0x71e)), use: map[string][]pgGPUUse{}, cpuUsed: map[string]int64{}, memUsed: map[string]int64{}}
	sc := &pgScenario{seed: seed, name: fmt.Sprintf("property-%d", seed)}
	if os.Getenv("TESSERA_PROPERTY_MODE") == "reclaim" {
		g.reclaimy = true
		sc.name = fmt.Sprintf("property-reclaim-%d", seed)
	}
	g.sc = sc
	// Half the scenarios run long enough for the settling check.
	if g.chance(0.5) {
		sc.cycles = g.between(20, 24)
	} else {
		sc.cycles = g.between(1, 8)
	}
	sc.consolidation = !g.chance(0.25)
	sc.spread = g.chance(0.2)
	g.genNodes()
	g.genQueues()
	g.genJobs()
	g.genTopology()
	g.genTime()
	sc.yaml = g.render()
	return sc
}

func (g *pgGen) genNodes() {
	sc := g.sc
	groups := g.between(1, 4)
	for gi := 0; gi < groups && len(sc.nodes) < 6; gi++ {
		gpus := g.pick(1, 2, 2, 4, 4, 4, 8, 8, 3, 6)
		if gi > 0 && g.chance(0.08) {
			gpus = 0 // a CPU-only node now and then
		}
		n := pgNode{
			gpus:   gpus,
			gpuMem: g.pick64(24, 40, 80, 80) * pgGi,
			nvlink: g.pickS("all", "pairs", "none"),
			cpu:    g.pick64(4, 8, 16, 32, 64) * 1000,
			mem:    g.pick64(32, 64, 128, 512) * pgGi,
		}
		count := 1
		if g.chance(0.3) {
			count = g.between(2, 3)
		}
		count = min(count, 6-len(sc.nodes))
		withCount := count > 1 || g.chance(0.1)
		base := fmt.Sprintf("n%d", gi)
		if g.chance(0.3) {
			base = fmt.Sprintf("node-%c", 'a'+gi)
		}
		var line strings.Builder
		fmt.Fprintf(&line, "- {name: %s", base)
		if withCount {
			fmt.Fprintf(&line, ", count: %d", count)
		}
		fmt.Fprintf(&line, ", gpus: %d", n.gpus)
		if n.gpuMem != 80*pgGi || g.chance(0.5) {
			fmt.Fprintf(&line, ", gpuMemory: %s", pgBytes(n.gpuMem))
		}
		if n.nvlink != "all" || g.chance(0.5) {
			fmt.Fprintf(&line, ", nvlink: %s", n.nvlink)
		}
		fmt.Fprintf(&line, ", cpu: %s, memory: %s}", pgCores(n.cpu), pgBytes(n.mem))
		g.nodeYAML = append(g.nodeYAML, line.String())
		for k := 0; k < count; k++ {
			nn := n
			nn.name = base
			nn.grp = gi
			if withCount {
				nn.name = fmt.Sprintf("%s-%d", base, k)
			}
			sc.nodes = append(sc.nodes, &nn)
		}
	}
	if slices.IndexFunc(sc.nodes, func(n *pgNode) bool { return n.gpus > 0 }) < 0 {
		panic("unreachable: the first node group always has GPUs")
	}
	for _, n := range sc.nodes {
		g.use[n.name] = make([]pgGPUUse, n.gpus)
		g.maxGPUs = max(g.maxGPUs, n.gpus)
		if n.gpus > 0 {
			g.maxGPUMe = max(g.maxGPUMe, n.gpuMem)
		}
	}
}

// genQueues builds a tree of up to three levels. Only the fields a queue
// sets are written, so the loader's defaults are exercised; the model holds
// DESIGN.md's defaults for the rest (gpu quota 0, cpu and memory quota -1,
// no limits, weight 1, priority 100).
func (g *pgGen) genQueues() {
	var add func(parent *pgQueue, name string, depth int)
	add = func(parent *pgQueue, name string, depth int) {
		q := &pgQueue{name: name, parent: parent, prio: 100}
		q.res[pgGPU] = pgRes{quota: 0, limit: -1, weight: 1}
		q.res[pgCPU] = pgRes{quota: -1, limit: -1, weight: 1}
		q.res[pgMem] = pgRes{quota: -1, limit: -1, weight: 1}
		var parts []string
		parts = append(parts, "name: "+name)
		if parent != nil {
			parts = append(parts, "parent: "+parent.name)
		}
		if g.chance(0.3) {
			q.prio = g.pick(50, 100, 150)
			parts = append(parts, fmt.Sprintf("priority: %d", q.prio))
		}
		// GPU: usually set.
		if g.chance(0.85) {
			parts = append(parts, "gpu: "+g.genRes(&q.res[pgGPU], pgGPU))
		}
		if g.chance(0.25) {
			parts = append(parts, "cpu: "+g.genRes(&q.res[pgCPU], pgCPU))
		}
		if g.chance(0.2) {
			parts = append(parts, "memory: "+g.genRes(&q.res[pgMem], pgMem))
		}
		q.line = "- {" + strings.Join(parts, ", ") + "}"
		if parent != nil {
			parent.kids = append(parent.kids, q)
		}
		g.sc.queues = append(g.sc.queues, q)
		if depth < 3 && g.chance([4]float64{0, 0.45, 0.25, 0}[depth]) {
			for k := 0; k < g.between(1, 3); k++ {
				add(q, fmt.Sprintf("%s%c", name, 'a'+k), depth+1)
			}
		}
	}
	lo := 1
	if g.reclaimy {
		lo = 2
	}
	for k := 0; k < g.between(lo, 3); k++ {
		add(nil, fmt.Sprintf("q%d", k), 1)
	}
}

// genRes draws one resource's settings, writes them to r and returns the
// YAML mapping.
func (g *pgGen) genRes(r *pgRes, res int) string {
	var parts []string
	unit := func(v int64) string {
		switch res {
		case pgGPU:
			return pgMilli(v)
		case pgCPU:
			return pgCores(v)
		}
		return pgBytes(v)
	}
	if g.chance(0.9) {
		switch res {
		case pgGPU:
			r.quota = g.pick64(0, 500, 1000, 1000, 2000, 2000, 3000, 4000, 8000, -1)
		case pgCPU:
			r.quota = g.pick64(0, 2000, 4000, 8000, 16000, -1)
		default:
			r.quota = g.pick64(0, 16*pgGi, 64*pgGi, 256*pgGi, -1)
		}
		if r.quota == -1 {
			parts = append(parts, "quota: -1")
		} else {
			parts = append(parts, "quota: "+unit(r.quota))
		}
	}
	if r.quota != -1 && g.chance(0.3) {
		var step int64
		switch res {
		case pgGPU:
			step = g.pick64(0, 500, 1000, 2000, 4000)
		case pgCPU:
			step = g.pick64(0, 2000, 8000)
		default:
			step = g.pick64(0, 32*pgGi)
		}
		r.limit = max(r.quota, 0) + step
		if r.limit == 0 {
			r.limit = map[int]int64{pgGPU: 1000, pgCPU: 1000, pgMem: 8 * pgGi}[res]
		}
		parts = append(parts, "limit: "+unit(r.limit))
	}
	if g.chance(0.3) {
		r.weight = g.pick64(0, 1, 2, 3)
		parts = append(parts, fmt.Sprintf("overQuotaWeight: %d", r.weight))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func (g *pgGen) leaves() []*pgQueue {
	var out []*pgQueue
	for _, q := range g.sc.queues {
		if q.leaf() {
			out = append(out, q)
		}
	}
	return out
}

// pgGroup is one entry of a job's pods list before expansion.
type pgGroup struct {
	count int
	proto pgPod
	yaml  string // the fields of the entry, without count and running
}

func (g *pgGen) genGroup() pgGroup {
	var p pgPod
	var parts []string
	count := 1
	kind := g.pickS("whole", "whole", "whole", "share", "memory", "cpu")
	switch kind {
	case "whole":
		var sizes []int
		for _, s := range []int{1, 1, 1, 2, 2, 4, 8} {
			if s <= g.maxGPUs {
				sizes = append(sizes, s)
			}
		}
		p.whole = sizes[g.r.IntN(len(sizes))]
		parts = append(parts, fmt.Sprintf("gpu: %d", p.whole))
		if p.whole >= 2 && g.chance(0.3) {
			p.nvreq = true
			parts = append(parts, "nvlink: required")
		} else if p.whole >= 2 && g.chance(0.1) {
			parts = append(parts, "nvlink: preferred")
		}
		if p.whole <= 2 {
			count = g.between(1, 4)
		} else {
			count = g.between(1, 2)
		}
	case "share":
		p.milli = g.pick64(250, 250, 500, 500, 750)
		parts = append(parts, "gpu: "+pgMilli(p.milli))
		count = g.between(1, 6)
	case "memory":
		var sizes []int64
		for _, s := range []int64{8, 10, 12, 20, 40} {
			if s*pgGi <= g.maxGPUMe {
				sizes = append(sizes, s*pgGi)
			}
		}
		p.gmem = sizes[g.r.IntN(len(sizes))]
		parts = append(parts, "gpuMemory: "+pgBytes(p.gmem))
		count = g.between(1, 6)
	case "cpu":
		count = g.between(1, 4)
	}
	if p.fraction() {
		p.sharing = "mps"
		switch {
		case g.chance(0.4):
			p.sharing = "timeslice"
			parts = append(parts, "sharing: timeslice")
		case g.chance(0.2):
			parts = append(parts, "sharing: mps")
		}
	}
	if kind == "cpu" || g.chance(0.35) {
		p.cpu = g.pick64(500, 1000, 2000, 4000, 8000)
		parts = append(parts, "cpu: "+pgCores(p.cpu))
	}
	if kind == "cpu" && g.chance(0.6) || g.chance(0.25) {
		p.mem = g.pick64(4, 16, 32, 64) * pgGi
		parts = append(parts, "memory: "+pgBytes(p.mem))
	}
	if kind != "cpu" && g.alt.Float64() < 0.15 {
		var alts []string
		for k := 0; k < 1+g.alt.IntN(2); k++ {
			a, y := g.genAlternative(&p)
			p.alts = append(p.alts, a)
			alts = append(alts, "{"+y+"}")
		}
		parts = append(parts, "alternatives: ["+strings.Join(alts, ", ")+"]")
	}
	return pgGroup{count: count, proto: p, yaml: strings.Join(parts, ", ")}
}

// genAlternative draws one alternative for p, from g.alt only: fewer whole
// GPUs (NVLink required now and then when several), a fraction given as a
// share or as GPU memory in either sharing mode, or, for a fraction, one
// whole GPU. It returns the model and the YAML fields.
func (g *pgGen) genAlternative(p *pgPod) (pgPod, string) {
	r := g.alt
	var a pgPod
	var parts []string
	var kinds []string
	if p.whole > 1 {
		kinds = append(kinds, "whole", "whole")
	}
	if p.fraction() {
		kinds = append(kinds, "whole")
	}
	kinds = append(kinds, "share", "memory")
	switch kinds[r.IntN(len(kinds))] {
	case "whole":
		var sizes []int
		for _, s := range []int{1, 1, 2, 4} {
			if p.fraction() && s == 1 || s < p.whole && s <= g.maxGPUs {
				sizes = append(sizes, s)
			}
		}
		a.whole = sizes[r.IntN(len(sizes))]
		parts = append(parts, fmt.Sprintf("gpu: %d", a.whole))
		if a.whole >= 2 && r.Float64() < 0.5 {
			a.nvreq = true
			parts = append(parts, "nvlink: required")
		}
	case "share":
		a.milli = []int64{250, 500, 750}[r.IntN(3)]
		parts = append(parts, "gpu: "+pgMilli(a.milli))
	default:
		var sizes []int64
		for _, s := range []int64{8, 10, 20, 40} {
			if s*pgGi <= g.maxGPUMe {
				sizes = append(sizes, s*pgGi)
			}
		}
		a.gmem = sizes[r.IntN(len(sizes))]
		parts = append(parts, "gpuMemory: "+pgBytes(a.gmem))
	}
	if a.fraction() {
		a.sharing = "mps"
		switch x := r.Float64(); {
		case x < 0.4:
			a.sharing = "timeslice"
			parts = append(parts, "sharing: timeslice")
		case x < 0.5:
			parts = append(parts, "sharing: mps")
		}
	}
	return a, strings.Join(parts, ", ")
}

func (g *pgGen) genJobs() {
	leaves := g.leaves()
	nj := g.between(2, 9)
	for ji := 0; ji < nj; ji++ {
		j := &pgJob{name: fmt.Sprintf("j%d", ji), queue: leaves[g.r.IntN(len(leaves))], prio: 100}
		var head []string
		head = append(head, "name: "+j.name, "queue: "+j.queue.name)
		if g.chance(0.9) {
			j.prio = g.pick(50, 80, 90, 99, 100, 100, 100, 110, 125)
			head = append(head, fmt.Sprintf("priority: %d", j.prio))
		}
		j.preempt = j.prio < 100
		if g.chance(0.15) {
			j.preempt = g.chance(0.5)
			head = append(head, fmt.Sprintf("preemptible: %t", j.preempt))
		}
		if g.chance(0.06) {
			j.never = true
			head = append(head, "preemptionPolicy: Never")
		}
		j.createdAt = int64(ji) // SCENARIOS.md: default file order
		if g.chance(0.5) {
			j.createdAt = int64(g.r.IntN(6))
			head = append(head, fmt.Sprintf("createdAt: %d", j.createdAt))
		}
		groups := []pgGroup{g.genGroup()}
		if g.chance(0.25) {
			groups = append(groups, g.genGroup())
		}
		for _, gr := range groups {
			for k := 0; k < gr.count; k++ {
				p := gr.proto
				p.job = j
				p.name = fmt.Sprintf("%s-%d", j.name, len(j.pods))
				j.pods = append(j.pods, &p)
			}
		}
		j.minMember = len(j.pods)
		if len(j.pods) > 1 && g.chance(0.4) {
			j.minMember = g.between(1, len(j.pods)-1)
			head = append(head, fmt.Sprintf("minMember: %d", j.minMember))
		} else if g.chance(0.1) {
			head = append(head, fmt.Sprintf("minMember: %d", j.minMember))
		}
		if sg := g.genSubGroups(j); sg != "" {
			head = append(head, sg)
		}
		g.sc.jobs = append(g.sc.jobs, j)
		// Preemptible jobs start running more often, so that reclaim,
		// preempt and consolidate have victims.
		pRun := map[bool]float64{true: 0.65, false: 0.35}[j.preempt]
		if g.reclaimy {
			pRun = map[bool]float64{true: 0.9, false: 0.2}[j.preempt]
		}
		running := g.chance(pRun) && g.placeRunning(j)

		var b strings.Builder
		fmt.Fprintf(&b, "- %s\n  pods:\n", strings.Join(head, "\n  "))
		if !running && j.subs == nil {
			for _, gr := range groups {
				fields := gr.yaml
				if gr.count > 1 || g.chance(0.2) {
					fields = fmt.Sprintf("count: %d, %s", gr.count, fields)
				}
				fmt.Fprintf(&b, "  - {%s}\n", fields)
			}
		} else if !running {
			// Runs of pods of one entry and one subgroup.
			i := 0
			for _, gr := range groups {
				for k := 0; k < gr.count; {
					sub, n := j.pods[i].sub, 0
					for k < gr.count && j.pods[i].sub == sub {
						k, i, n = k+1, i+1, n+1
					}
					fmt.Fprintf(&b, "  - {count: %d, %s%s}\n", n, gr.yaml, subField(sub))
				}
			}
		} else {
			// One entry per pod, so each can say where it runs.
			i := 0
			for _, gr := range groups {
				for k := 0; k < gr.count; k++ {
					p := j.pods[i]
					i++
					fields := gr.yaml + subField(p.sub)
					if p.runNode != "" {
						run := fmt.Sprintf("running: {node: %s", p.runNode)
						if len(p.runGPUs) > 0 {
							run += ", gpus: " + pgInts(p.runGPUs)
						}
						fields += ", " + run + "}"
					}
					fmt.Fprintf(&b, "  - {%s}\n", fields)
				}
			}
		}
		g.jobYAML = append(g.jobYAML, b.String())
	}
}

// placeRunning puts some of j's pods on the cluster as already running, in
// a state the contract calls valid: within every GPU's and node's capacity,
// one sharing mode per GPU, NVLink-required pods in one domain, the gang at
// or above minMember, every queue within its limits and non-preemptible
// allocations within quota. It returns false (and places nothing) when it
// cannot.
func (g *pgGen) placeRunning(j *pgJob) bool {
	type undo struct {
		node  string
		gpus  []int
		pod   *pgPod
		saved []pgGPUUse
	}
	var done []undo
	rollback := func() {
		for i := len(done) - 1; i >= 0; i-- {
			d := done[i]
			copy(g.use[d.node], d.saved)
			g.cpuUsed[d.node] -= d.pod.cpu
			g.memUsed[d.node] -= d.pod.mem
			d.pod.runNode, d.pod.runGPUs = "", nil
		}
	}
	want := len(j.pods)
	if j.minMember < want && g.chance(0.5) {
		want = g.between(j.minMember, len(j.pods))
	}
	for _, p := range j.pods[:want] {
		placed := false
		for _, n := range g.shuffledNodes() {
			if g.cpuUsed[n.name]+p.cpu > n.cpu || g.memUsed[n.name]+p.mem > n.mem {
				continue
			}
			gpus := g.pickGPUs(p, n)
			if gpus == nil && p.gpuCount() > 0 {
				continue
			}
			done = append(done, undo{node: n.name, gpus: gpus, pod: p, saved: slices.Clone(g.use[n.name])})
			u := g.use[n.name]
			for _, x := range gpus {
				u[x].pods++
				switch {
				case !p.fraction():
					u[x].whole = true
				case p.milli > 0:
					u[x].milli += p.milli
					u[x].mode = p.sharing
				default:
					u[x].memb += p.gmem
					u[x].mode = p.sharing
				}
			}
			g.cpuUsed[n.name] += p.cpu
			g.memUsed[n.name] += p.mem
			p.runNode, p.runGPUs = n.name, gpus
			placed = true
			break
		}
		if !placed {
			break
		}
	}
	if held, _ := j.holds(func(p *pgPod) bool { return p.runNode != "" }); !held || len(done) < j.minMember || !g.queuesValid() {
		rollback()
		return false
	}
	return len(done) > 0
}

// pickGPUs chooses GPUs of n for p (random free ones, to leave the cluster
// in shapes the scheduler would not make itself), or nil.
func (g *pgGen) pickGPUs(p *pgPod, n *pgNode) []int {
	u := g.use[n.name]
	order := g.r.Perm(n.gpus)
	if p.fraction() {
		for _, x := range order {
			if u[x].whole || (u[x].mode != "" && u[x].mode != p.sharing) {
				continue
			}
			milli, memb := u[x].milli+p.milli, u[x].memb+p.gmem
			// The exact share (milli asked plus memory asked as a part of
			// the GPU) within one GPU, and the memory within its size.
			if milli*n.gpuMem+memb*1000 > 1000*n.gpuMem || milli*n.gpuMem/1000+memb > n.gpuMem {
				continue
			}
			return []int{x}
		}
		return nil
	}
	byDomain := map[string][]int{}
	var free []int
	for _, x := range order {
		if u[x].pods > 0 {
			continue
		}
		free = append(free, x)
		if d := n.domain(x); d != "" {
			byDomain[d] = append(byDomain[d], x)
		}
	}
	pool := free
	if p.nvreq {
		pool = nil
		for _, x := range order { // a random domain with room
			if d := n.domain(x); d != "" && len(byDomain[d]) >= p.whole {
				pool = byDomain[d]
				break
			}
		}
	}
	if len(pool) < p.whole {
		return nil
	}
	out := slices.Clone(pool[:p.whole])
	slices.Sort(out)
	return out
}

// queuesValid says whether the running pods placed so far keep every queue
// within its limits and every non-preemptible allocation within quota, on
// every resource. A memory fraction counts its share rounded up (as the
// sim counts a pod it starts running), so the start is valid however the
// core rounds.
func (g *pgGen) queuesValid() bool {
	alloc := map[*pgQueue]*[3]int64{}
	np := map[*pgQueue]*[3]int64{}
	for _, q := range g.sc.queues {
		alloc[q], np[q] = &[3]int64{}, &[3]int64{}
	}
	nodes := map[string]*pgNode{}
	for _, n := range g.sc.nodes {
		nodes[n.name] = n
	}
	for _, j := range g.sc.jobs {
		for _, p := range j.pods {
			if p.runNode == "" {
				continue
			}
			var v [3]int64
			switch {
			case p.milli > 0:
				v[pgGPU] = p.milli
			case p.gmem > 0:
				gm := nodes[p.runNode].gpuMem
				v[pgGPU] = (p.gmem*1000 + gm - 1) / gm
			default:
				v[pgGPU] = int64(p.whole) * 1000
			}
			v[pgCPU], v[pgMem] = p.cpu, p.mem
			for _, q := range j.queue.chain() {
				for r := range v {
					alloc[q][r] += v[r]
					if !j.preempt {
						np[q][r] += v[r]
					}
				}
			}
		}
	}
	for _, q := range g.sc.queues {
		for r := 0; r < 3; r++ {
			if l := q.res[r].limit; l != -1 && alloc[q][r] > l {
				return false
			}
			if qu := q.res[r].quota; qu != -1 && np[q][r] > qu {
				return false
			}
		}
	}
	return true
}

func (g *pgGen) render() string {
	sc := g.sc
	var b strings.Builder
	fmt.Fprintf(&b, "# property test scenario, seed %d\n", sc.seed)
	fmt.Fprintf(&b, "name: %s\n", sc.name)
	if sc.timed {
		fmt.Fprintf(&b, "time: {cycle: 1s, duration: %ds, start: %q}\n", sc.cycles, sc.start.Format(time.RFC3339))
	} else {
		fmt.Fprintf(&b, "cycles: %d\n", sc.cycles)
	}
	var cfg []string
	if !sc.consolidation || g.chance(0.2) {
		cfg = append(cfg, fmt.Sprintf("consolidation: %t", sc.consolidation))
	}
	if sc.spread {
		cfg = append(cfg, "placement: spread")
	} else if g.chance(0.1) {
		cfg = append(cfg, "placement: binpack")
	}
	if u := sc.usage; u != nil {
		cfg = append(cfg, fmt.Sprintf("usage: {halfLife: %ds, window: %ds, bucket: %ds, coefficient: %s}", u.halfLife, u.window, u.bucket, pgMilli(u.coef)))
	}
	if len(cfg) > 0 {
		fmt.Fprintf(&b, "config: {%s}\n", strings.Join(cfg, ", "))
	}
	b.WriteString("nodes:\n")
	for _, l := range g.nodeYAML {
		b.WriteString(l + "\n")
	}
	if sc.topology {
		b.WriteString("topologies:\n- {name: dc, levels: [zone, rack, kubernetes.io/hostname]}\n")
	}
	b.WriteString("queues:\n")
	for _, q := range sc.queues {
		b.WriteString(q.line + "\n")
	}
	b.WriteString("jobs:\n")
	for _, l := range g.jobYAML {
		b.WriteString(l)
	}
	return b.String()
}

// pgMilli writes thousandths of a unit: 2500 → "2.5", -1 → "-1".
func pgMilli(v int64) string {
	if v == -1 {
		return "-1"
	}
	return strconv.FormatFloat(float64(v)/1000, 'f', -1, 64)
}

// pgCPU writes milli-CPU as cores, or "500m" for part of one.
func pgCores(v int64) string {
	if v == -1 {
		return "-1"
	}
	if v%1000 == 0 {
		return strconv.FormatInt(v/1000, 10)
	}
	return strconv.FormatInt(v, 10) + "m"
}

// pgBytes writes bytes in Gi (every size the generator draws is whole Gi).
func pgBytes(v int64) string {
	if v == -1 {
		return "-1"
	}
	if v%pgGi == 0 {
		return strconv.FormatInt(v/pgGi, 10) + "Gi"
	}
	return strconv.FormatInt(v, 10)
}

func pgInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// genSubGroups gives some jobs of two pods or more subgroups, from their
// own stream (g.sub): the pods split in order into 2 or 3 runs, each a
// subgroup with a minimum from 1 to its pods; the job's minMember stays
// what it was (the two minimums add up). It returns the job's subGroups
// line, or "".
func (g *pgGen) genSubGroups(j *pgJob) string {
	if len(j.pods) < 2 || g.sub.Float64() >= 0.3 {
		return ""
	}
	k := 2 + g.sub.IntN(min(2, len(j.pods)-1))
	// k-1 distinct cut points in 1..len-1, ascending.
	cuts := g.sub.Perm(len(j.pods) - 1)[:k-1]
	slices.Sort(cuts)
	var parts []string
	start := 0
	for i := 0; i < k; i++ {
		end := len(j.pods)
		if i < k-1 {
			end = cuts[i] + 1
		}
		s := pgSub{name: fmt.Sprintf("s%d", i), min: 1 + g.sub.IntN(end-start)}
		for _, p := range j.pods[start:end] {
			p.sub = s.name
		}
		j.subs = append(j.subs, s)
		parts = append(parts, fmt.Sprintf("{name: %s, minMember: %d}", s.name, s.min))
		start = end
	}
	return "subGroups: [" + strings.Join(parts, ", ") + "]"
}

// subField is a pod entry's subGroup field, or "" for none.
func subField(sub string) string {
	if sub == "" {
		return ""
	}
	return ", subGroup: " + sub
}

var pgSubEntry = regexp.MustCompile(`\{name: (s\d), minMember: (\d+)\}`)

// genTopology gives about a third of the scenarios the topology dc (zone,
// rack, hostname), from its own stream (g.topo), so that every seed makes
// the scenario it made before, plus this: each node entry a zone of two
// and a rack of two (now and then no rack label, or none at all), and
// about half the jobs whose pods all wait a constraint: a required rack
// or zone, a preferred rack, or a required zone and a preferred rack; a
// job with subgroups and a required zone sometimes a required rack per
// subgroup. Running pods never get one: their start is valid as it is.
func (g *pgGen) genTopology() {
	if g.topo.Float64() >= 0.35 {
		return
	}
	g.sc.topology = true
	for gi := range g.nodeYAML {
		zone, rack := fmt.Sprintf("z%d", g.topo.IntN(2)), fmt.Sprintf("r%d", g.topo.IntN(2))
		switch x := g.topo.Float64(); {
		case x < 0.05:
			zone, rack = "", ""
		case x < 0.15:
			rack = ""
		}
		var labels []string
		if zone != "" {
			labels = append(labels, "zone: "+zone)
		}
		if rack != "" {
			labels = append(labels, "rack: "+rack)
		}
		for _, n := range g.sc.nodes {
			if n.grp == gi {
				n.zone, n.rack = zone, rack
			}
		}
		if len(labels) > 0 {
			l := g.nodeYAML[gi]
			g.nodeYAML[gi] = l[:len(l)-1] + ", labels: {" + strings.Join(labels, ", ") + "}}"
		}
	}
	for ji, j := range g.sc.jobs {
		if slices.ContainsFunc(j.pods, func(p *pgPod) bool { return p.runNode != "" }) || g.topo.Float64() >= 0.5 {
			continue
		}
		var c string
		switch g.topo.IntN(4) {
		case 0:
			j.required, c = "rack", "required: rack"
		case 1:
			j.required, c = "zone", "required: zone"
		case 2:
			c = "preferred: rack"
		default:
			j.required, c = "zone", "required: zone, preferred: rack"
		}
		y := strings.Replace(g.jobYAML[ji], "\n  pods:\n", "\n  topology: {name: dc, "+c+"}\n  pods:\n", 1)
		if j.subs != nil && j.required == "zone" && g.topo.Float64() < 0.5 {
			j.subRequired = "rack"
			y = pgSubEntry.ReplaceAllString(y, "{name: $1, minMember: $2, topology: {name: dc, required: rack}}")
		}
		g.jobYAML[ji] = y
	}
}
