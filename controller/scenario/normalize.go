package scenario

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/controller/core"
)

type fieldError struct{ field, why string }

func (e *fieldError) Error() string { return e.field + ": " + e.why }

func ferr(field, format string, args ...any) error {
	return &fieldError{field: field, why: fmt.Sprintf(format, args...)}
}

// Defaults from SCENARIOS.md.
const (
	defaultCycles    = 3
	defaultGPUMemory = 80 << 30
	defaultCPUMilli  = 64 * 1000
	defaultMemory    = 512 << 30
	defaultPriority  = 100
	maxCycles        = 10000
	maxCount         = 100000
	// Totals, so that counts that are each in range cannot multiply into a
	// run that exhausts memory or takes hours.
	maxNodes     = 20000
	maxGPUsTotal = 200000
	maxPods      = 200000
	maxPodCycles = 20000000 // pods × cycles
	// MaxWork bounds a run's work (Spec.Work): at the 40 to 180 ns a unit
	// took on a 2-core machine, the largest run allowed takes one to three
	// minutes. 4,000 nodes and 40,000 pods for 3 cycles are 6·10⁸ units
	// (24 s); counts alone allowed runs of hours.
	MaxWork = 1_000_000_000
	// maxCreatedAt keeps job ages within time.Duration (about 292 years).
	maxCreatedAt = 1 << 32
)

func listElem(list string, name string, i int) string {
	if name != "" {
		return fmt.Sprintf("%s[%s]", list, name)
	}
	return fmt.Sprintf("%s[%d]", list, i)
}

// normalize applies the defaults and checks everything the file says.
func normalize(fs *fileScenario) (*Spec, error) {
	s := &Spec{Name: fs.Name, Cycles: defaultCycles, Consolidation: true, Placement: "binpack"}
	if err := normalizeTime(fs.Time, fs.Cycles, s); err != nil {
		return nil, err
	}
	if fs.Cycles != nil {
		if *fs.Cycles < 1 || *fs.Cycles > maxCycles {
			return nil, ferr("cycles", "%d is out of range (1 to %d)", *fs.Cycles, maxCycles)
		}
		s.Cycles = *fs.Cycles
	}
	if c := fs.Config; c != nil {
		if c.Consolidation != nil {
			s.Consolidation = *c.Consolidation
		}
		switch c.Placement {
		case "":
		case "binpack", "spread":
			s.Placement = c.Placement
		default:
			return nil, ferr("config.placement", "%q is not one of binpack, spread", c.Placement)
		}
		if err := normalizeUsage(c.Usage, s); err != nil {
			return nil, err
		}
	}
	nodes, err := normalizeNodes(fs.Nodes)
	if err != nil {
		return nil, err
	}
	s.Nodes = nodes
	if s.Topologies, err = normalizeTopologies(fs.Topologies); err != nil {
		return nil, err
	}
	if s.Queues, err = normalizeQueues(fs.Queues, s.Timed); err != nil {
		return nil, err
	}
	if s.Jobs, err = normalizeJobs(fs.Jobs, s.Queues, s.Nodes, s.Timed); err != nil {
		return nil, err
	}
	if err := checkConstraints(s); err != nil {
		return nil, err
	}
	arrivals(s)
	pods := 0
	for _, j := range s.Jobs {
		pods += len(j.Pods)
	}
	field := "cycles"
	if s.Timed {
		field = "time.duration"
	}
	if pods*s.RunCycles() > maxPodCycles {
		return nil, ferr(field, "%d cycles of %d pods is too long a run (at most %d pod-cycles); use fewer cycles or pods", s.RunCycles(), pods, maxPodCycles)
	}
	if w := s.Work(); w > s.maxWork() {
		return nil, ferr(field, "%d cycles of %d pods on %d nodes is too much work: %d units (pod-cycles × (nodes + %d)), at most %d; use fewer cycles, pods or nodes",
			s.RunCycles(), pods, len(s.Nodes), w, podOverhead, s.maxWork())
	}
	if err := assignRunning(s); err != nil {
		return nil, err
	}
	if s.Expect, err = normalizeExpect(fs.Expect, s); err != nil {
		return nil, err
	}
	return s, nil
}

func normalizeNodes(in []fileNode) ([]Node, error) {
	if len(in) == 0 {
		return nil, ferr("nodes", "at least one node is needed")
	}
	var out []Node
	where := map[string]string{}
	gpus := 0
	for i, fn := range in {
		p := listElem("nodes", fn.Name, i)
		if fn.Name == "" {
			return nil, ferr(p+".name", "required")
		}
		n := Node{GPUMemory: defaultGPUMemory, GPUModel: fn.GPUModel, NVLink: "all", CPUMilli: defaultCPUMilli, Memory: defaultMemory, Labels: fn.Labels}
		if fn.GPUs == nil {
			return nil, ferr(p+".gpus", "required (0 for a node without GPUs)")
		}
		if *fn.GPUs < 0 || *fn.GPUs > 1024 {
			return nil, ferr(p+".gpus", "%d is out of range (0 to 1024)", *fn.GPUs)
		}
		n.GPUs = *fn.GPUs
		var err error
		if fn.GPUMemory != nil {
			if n.GPUMemory, err = parseBytes(fn.GPUMemory.raw); err != nil {
				return nil, ferr(p+".gpuMemory", "%v", err)
			}
			if n.GPUMemory <= 0 {
				return nil, ferr(p+".gpuMemory", "must be positive, got %s", fn.GPUMemory.raw)
			}
			if err := checkMax(n.GPUMemory, fn.GPUMemory.raw); err != nil {
				return nil, ferr(p+".gpuMemory", "%v", err)
			}
		}
		switch fn.NVLink {
		case "":
		case "all", "pairs", "none":
			n.NVLink = fn.NVLink
		default:
			return nil, ferr(p+".nvlink", "%q is not one of all, pairs, none", fn.NVLink)
		}
		if fn.CPU != nil {
			if n.CPUMilli, err = parseMilli(fn.CPU.raw, true); err != nil {
				return nil, ferr(p+".cpu", "%v", err)
			}
			if n.CPUMilli < 0 {
				return nil, ferr(p+".cpu", "must not be negative")
			}
			if err := checkMax(n.CPUMilli, ""); err != nil {
				return nil, ferr(p+".cpu", "%v", err)
			}
		}
		if fn.Memory != nil {
			if n.Memory, err = parseBytes(fn.Memory.raw); err != nil {
				return nil, ferr(p+".memory", "%v", err)
			}
			if n.Memory < 0 {
				return nil, ferr(p+".memory", "must not be negative")
			}
			if err := checkMax(n.Memory, ""); err != nil {
				return nil, ferr(p+".memory", "%v", err)
			}
		}
		count := 1
		if fn.Count != nil {
			if *fn.Count < 1 || *fn.Count > maxCount {
				return nil, ferr(p+".count", "%d is out of range (1 to %d)", *fn.Count, maxCount)
			}
			count = *fn.Count
		}
		if len(out)+count > maxNodes {
			return nil, ferr(p+".count", "brings the nodes to %d; a scenario may have at most %d", len(out)+count, maxNodes)
		}
		if gpus += count * n.GPUs; gpus > maxGPUsTotal {
			return nil, ferr(p+".count", "brings the GPUs to %d; a scenario may have at most %d", gpus, maxGPUsTotal)
		}
		for k := 0; k < count; k++ {
			nn := n
			nn.Name = fn.Name
			if fn.Count != nil {
				nn.Name = fn.Name + "-" + strconv.Itoa(k)
			}
			if prev, dup := where[nn.Name]; dup {
				return nil, ferr(p+".name", "node %s is defined twice (also by %s)", nn.Name, prev)
			}
			nn.Labels = withHostname(fn.Labels, nn.Name)
			where[nn.Name] = p
			out = append(out, nn)
		}
	}
	return out, nil
}

func normalizeResource(fr *fileResource, p string, isGPU, isCPU bool) (Resource, error) {
	r := Resource{Quota: -1, Limit: -1, Weight: 1}
	if isGPU {
		r.Quota = 0
	}
	return overrideResource(fr, p, isGPU, isCPU, r)
}

// overrideResource is r with what fr sets: a queue's settings over the
// defaults, or a schedule window's over the queue's.
func overrideResource(fr *fileResource, p string, isGPU, isCPU bool, r Resource) (Resource, error) {
	if fr == nil {
		return r, nil
	}
	parse := func(q *Quantity, field string) (int64, error) {
		var v int64
		var err error
		switch {
		case isGPU:
			v, err = parseMilli(q.raw, false)
		case isCPU:
			v, err = parseMilli(q.raw, true)
		default:
			v, err = parseBytes(q.raw)
		}
		if err != nil {
			return 0, ferr(p+"."+field, "%v", err)
		}
		if v < 0 {
			if v == -1000 && (isGPU || isCPU) || v == -1 && !isGPU && !isCPU {
				return -1, nil
			}
			return 0, ferr(p+"."+field, "%s is negative (only -1, meaning unlimited, is allowed)", q.raw)
		}
		if v > core.MaxQueueAmount {
			return 0, ferr(p+"."+field, "%s is above the most the core accepts (%d in its unit)", q.raw, core.MaxQueueAmount)
		}
		return v, nil
	}
	var err error
	if fr.Quota != nil {
		if r.Quota, err = parse(fr.Quota, "quota"); err != nil {
			return r, err
		}
	}
	if fr.Limit != nil {
		if r.Limit, err = parse(fr.Limit, "limit"); err != nil {
			return r, err
		}
	}
	if r.Limit >= 0 && r.Quota > r.Limit {
		if fr.Limit == nil || fr.Quota == nil {
			return r, ferr(p, "limit %s is below quota %s", formatAmount(r.Limit, isGPU || isCPU), formatAmount(r.Quota, isGPU || isCPU))
		}
		return r, ferr(p+".limit", "%s is below the quota %s", fr.Limit.raw, fr.Quota.raw)
	}
	if fr.OverQuotaWeight != nil {
		w, err := strconv.ParseInt(strings.TrimSpace(fr.OverQuotaWeight.raw), 10, 64)
		if err != nil || w < 0 {
			return r, ferr(p+".overQuotaWeight", "%q is not a whole number ≥ 0", fr.OverQuotaWeight.raw)
		}
		if w > core.MaxWeight {
			return r, ferr(p+".overQuotaWeight", "%d is above the most the core accepts (%d)", w, core.MaxWeight)
		}
		r.Weight = w
	}
	return r, nil
}

func normalizeQueues(in []fileQueue, timed bool) ([]Queue, error) {
	if len(in) == 0 {
		return []Queue{{Name: "default", Priority: defaultPriority, GPU: Resource{-1, -1, 1}, CPU: Resource{-1, -1, 1}, Memory: Resource{-1, -1, 1}, Leaf: true,
			PreemptMinRuntime: -1, ReclaimMinRuntime: -1, PreemptionDelay: -1}}, nil
	}
	var out []Queue
	index := map[string]int{}
	for i, fq := range in {
		p := listElem("queues", fq.Name, i)
		if fq.Name == "" {
			return nil, ferr(p+".name", "required")
		}
		if _, dup := index[fq.Name]; dup {
			return nil, ferr(p+".name", "queue %s is defined twice", fq.Name)
		}
		q := Queue{Name: fq.Name, Parent: fq.Parent, Priority: defaultPriority, Leaf: true}
		if fq.Priority != nil {
			q.Priority = *fq.Priority
		}
		var err error
		if q.GPU, err = normalizeResource(fq.GPU, p+".gpu", true, false); err != nil {
			return nil, err
		}
		if q.CPU, err = normalizeResource(fq.CPU, p+".cpu", false, true); err != nil {
			return nil, err
		}
		if q.Memory, err = normalizeResource(fq.Memory, p+".memory", false, false); err != nil {
			return nil, err
		}
		if err := normalizeQueueTime(&fq, p, timed, &q); err != nil {
			return nil, err
		}
		index[fq.Name] = len(out)
		out = append(out, q)
	}
	for i := range out {
		q := &out[i]
		if q.Parent == "" {
			continue
		}
		pi, ok := index[q.Parent]
		if !ok {
			return nil, ferr(listElem("queues", q.Name, i)+".parent", "queue %s is not defined", q.Parent)
		}
		out[pi].Leaf = false
		// Walk up to catch cycles (a → b → a), which would make the tree a loop.
		seen := map[string]bool{q.Name: true}
		for at := q.Parent; at != ""; at = out[index[at]].Parent {
			if seen[at] {
				return nil, ferr(listElem("queues", q.Name, i)+".parent", "queues form a loop through %s", at)
			}
			seen[at] = true
			if _, ok := index[at]; !ok {
				break
			}
		}
	}
	return out, nil
}

// arrivals dates a timed run's arriving jobs: the run starts when the
// newest job present from the start was created, and a job arriving at a is
// created a seconds after that.
func arrivals(s *Spec) {
	var base int64
	for _, j := range s.Jobs {
		if j.ArriveAt == 0 {
			base = max(base, j.CreatedAt)
		}
	}
	for i := range s.Jobs {
		if j := &s.Jobs[i]; j.ArriveAt > 0 {
			j.CreatedAt = base + j.ArriveAt
		}
	}
}

func normalizeJobs(in []fileJob, queues []Queue, nodes []Node, timed bool) ([]Job, error) {
	jn := newJobNormalizer(queues, nodes, timed)
	expanded, err := expandRepeats(in, timed)
	if err != nil {
		return nil, err
	}
	var out []Job
	for i, fj := range expanded {
		j, err := jn.job(i, fj)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, nil
}

// jobNormalizer carries what normalizing one job needs from the others and
// from the nodes: names taken, pods counted, the largest GPU request a node
// can hold.
type jobNormalizer struct {
	qidx      map[string]*Queue
	maxGPUs   int
	maxMem    int64
	timed     bool
	totalPods int
	jobNames  map[string]bool
	podNames  map[string]string
}

func newJobNormalizer(queues []Queue, nodes []Node, timed bool) *jobNormalizer {
	jn := &jobNormalizer{qidx: map[string]*Queue{}, timed: timed, jobNames: map[string]bool{}, podNames: map[string]string{}}
	for i := range queues {
		jn.qidx[queues[i].Name] = &queues[i]
	}
	for _, n := range nodes {
		jn.maxGPUs = max(jn.maxGPUs, n.GPUs)
		if n.GPUs > 0 {
			jn.maxMem = max(jn.maxMem, n.GPUMemory)
		}
	}
	return jn
}

// expandRepeats replaces each job that repeats (timed runs only) with its
// copies, within the scenario's limit on jobs.
func expandRepeats(in []fileJob, timed bool) ([]fileJob, error) {
	var expanded []fileJob
	for i, fj := range in {
		p := listElem("jobs", fj.Name, i)
		if fj.Repeat != nil && !timed {
			return nil, ferr(p+".repeat", "needs a timed run: give the scenario a time: block")
		}
		copies, err := repeatJob(fj, p)
		if err != nil {
			return nil, err
		}
		if len(expanded)+len(copies) > maxPods {
			return nil, ferr(p+".repeat.count", "brings the jobs to %d; a scenario may have at most %d", len(expanded)+len(copies), maxPods)
		}
		expanded = append(expanded, copies...)
	}
	return expanded, nil
}

// job normalizes the i-th job (after repeats are expanded).
func (jn *jobNormalizer) job(i int, fj fileJob) (Job, error) {
	p := listElem("jobs", fj.Name, i)
	j, err := jn.jobSettings(i, &fj, p)
	if err != nil {
		return Job{}, err
	}
	if err := normalizeJobTime(&fj, p, jn.timed, &j); err != nil {
		return Job{}, err
	}
	if len(fj.Pods) == 0 {
		return Job{}, ferr(p+".pods", "a job needs at least one pod")
	}
	for k, fp := range fj.Pods {
		if err := jn.pods(&j, &fp, k, fmt.Sprintf("%s.pods[%d]", p, k)); err != nil {
			return Job{}, err
		}
	}
	if j.ArriveAt > 0 && slices.ContainsFunc(j.Pods, func(p Pod) bool { return p.Running != nil }) {
		return Job{}, ferr(p+".arriveAt", "a job that arrives later has no running pods at the start")
	}
	j.MinMember = len(j.Pods)
	if fj.MinMember != nil {
		if *fj.MinMember < 1 || *fj.MinMember > len(j.Pods) {
			return Job{}, ferr(p+".minMember", "%d is out of range (1 to the job's %d pods)", *fj.MinMember, len(j.Pods))
		}
		j.MinMember = *fj.MinMember
	}
	if err := normalizeSubGroups(&j, fj, p); err != nil {
		return Job{}, err
	}
	j.Topology = constraint(fj.Topology)
	return j, nil
}

// jobSettings reads a job's name, queue, priority, preemption and
// disruption settings and creation time.
func (jn *jobNormalizer) jobSettings(i int, fj *fileJob, p string) (Job, error) {
	if fj.Name == "" {
		return Job{}, ferr(p+".name", "required")
	}
	if jn.jobNames[fj.Name] {
		return Job{}, ferr(p+".name", "job %s is defined twice", fj.Name)
	}
	jn.jobNames[fj.Name] = true
	j := Job{Name: fj.Name, Queue: fj.Queue, Priority: defaultPriority, CreatedAt: int64(i)}
	if j.Queue == "" {
		j.Queue = "default"
	}
	q, ok := jn.qidx[j.Queue]
	if !ok {
		if fj.Queue == "" {
			return Job{}, ferr(p+".queue", "not set, and there is no queue named default")
		}
		return Job{}, ferr(p+".queue", "queue %s is not defined", j.Queue)
	}
	if !q.Leaf {
		return Job{}, ferr(p+".queue", "queue %s is a parent queue; only leaf queues hold jobs", j.Queue)
	}
	if fj.Priority != nil {
		j.Priority = *fj.Priority
	}
	j.Preemptible = j.Priority < 100
	if fj.Preemptible != nil {
		j.Preemptible = *fj.Preemptible
	}
	switch fj.PreemptionPolicy {
	case "", "PreemptLowerPriority":
	case "Never":
		j.NeverEvicts = true
	default:
		return Job{}, ferr(p+".preemptionPolicy", "%q is not PreemptLowerPriority or Never", fj.PreemptionPolicy)
	}
	switch d := core.Disruption(fj.Disruption); d {
	case core.DisruptionGang, core.DisruptionSingle, core.DisruptionAll:
		j.Disruption = string(d)
	default:
		return Job{}, ferr(p+".disruption", "%q is not single or all", fj.Disruption)
	}
	if fj.CreatedAt != nil {
		v, err := parseDecimal(fj.CreatedAt.raw)
		if err != nil || !v.IsInt() || v.Sign() < 0 || !v.Num().IsInt64() {
			return Job{}, ferr(p+".createdAt", "%q is not a whole number of seconds ≥ 0", fj.CreatedAt.raw)
		}
		j.CreatedAt = v.Num().Int64()
		if j.CreatedAt > maxCreatedAt {
			return Job{}, ferr(p+".createdAt", "%s seconds is out of range (0 to %d)", fj.CreatedAt.raw, int64(maxCreatedAt))
		}
	}
	return j, nil
}

// pods adds the pods of the job's k-th pod entry (count copies) to j,
// named after the job and their index in it.
func (jn *jobNormalizer) pods(j *Job, fp *filePod, k int, pp string) error {
	pod, count, err := normalizePod(fp, pp, jn.maxGPUs, jn.maxMem)
	if err != nil {
		return err
	}
	if jn.totalPods += count; jn.totalPods > maxPods {
		return ferr(pp+".count", "brings the pods to %d; a scenario may have at most %d", jn.totalPods, maxPods)
	}
	for c := 0; c < count; c++ {
		pc := pod
		pc.Index = len(j.Pods)
		pc.FileIndex = k
		pc.SubGroup = fp.SubGroup
		pc.Name = j.Name + "-" + strconv.Itoa(pc.Index)
		if other, dup := jn.podNames[pc.Name]; dup {
			return ferr(pp, "pod name %s is taken by job %s; rename one of the jobs", pc.Name, other)
		}
		jn.podNames[pc.Name] = j.Name
		if fp.Running != nil {
			pl := &Placement{Node: fp.Running.Node}
			if fp.Running.GPUs != nil {
				g, err := runningGPUs(&pc, fp.Running.GPUs, c, count, pp+".running.gpus")
				if err != nil {
					return err
				}
				pl.GPUs = g
			}
			pc.Running = pl
		}
		j.Pods = append(j.Pods, pc)
	}
	return nil
}

// maxAlternatives is Kubernetes' limit on a DRA request's firstAvailable
// list.
const maxAlternatives = 8

func normalizePod(fp *filePod, pp string, maxGPUs int, maxMem int64) (Pod, int, error) {
	count := 1
	if fp.Count != nil {
		if *fp.Count < 1 || *fp.Count > maxCount {
			return Pod{}, 0, ferr(pp+".count", "%d is out of range (1 to %d)", *fp.Count, maxCount)
		}
		count = *fp.Count
	}
	pod, err := normalizeGPU(&fp.fileGPU, pp, maxGPUs, maxMem)
	if err != nil {
		return pod, 0, err
	}
	if len(fp.Alternatives) > 0 {
		if pod.GPUMilli == 0 && pod.GPUMemory == 0 {
			return pod, 0, ferr(pp+".alternatives", "the pod asks for no GPU; alternatives replace a GPU request")
		}
		if len(fp.Alternatives) > maxAlternatives {
			return pod, 0, ferr(pp+".alternatives", "lists %d; at most %d (Kubernetes' limit on firstAvailable)", len(fp.Alternatives), maxAlternatives)
		}
	}
	for i := range fp.Alternatives {
		ap := fmt.Sprintf("%s.alternatives[%d]", pp, i)
		alt, err := normalizeGPU(&fp.Alternatives[i], ap, maxGPUs, maxMem)
		if err != nil {
			return pod, 0, err
		}
		if alt.GPUMilli == 0 && alt.GPUMemory == 0 {
			return pod, 0, ferr(ap, "asks for no GPU; an alternative replaces the pod's GPU request (give gpu or gpuMemory)")
		}
		pod.Alternatives = append(pod.Alternatives, alt)
	}
	if fp.CPU != nil {
		if pod.CPUMilli, err = parseMilli(fp.CPU.raw, true); err != nil {
			return pod, 0, ferr(pp+".cpu", "%v", err)
		}
		if pod.CPUMilli < 0 {
			return pod, 0, ferr(pp+".cpu", "must not be negative")
		}
		if err := checkMax(pod.CPUMilli, ""); err != nil {
			return pod, 0, ferr(pp+".cpu", "%v", err)
		}
	}
	if fp.Memory != nil {
		if pod.Memory, err = parseBytes(fp.Memory.raw); err != nil {
			return pod, 0, ferr(pp+".memory", "%v", err)
		}
		if pod.Memory < 0 {
			return pod, 0, ferr(pp+".memory", "must not be negative")
		}
		if err := checkMax(pod.Memory, ""); err != nil {
			return pod, 0, ferr(pp+".memory", "%v", err)
		}
	}
	if fp.Running != nil && fp.Running.Node == "" {
		return pod, 0, ferr(pp+".running.node", "required")
	}
	return pod, count, nil
}

// normalizeGPU reads the GPU fields of a pod set (gpu, gpuMemory, sharing,
// nvlink) at path pp: the pod's own request or one of its alternatives,
// which are checked alike.
func normalizeGPU(fp *fileGPU, pp string, maxGPUs int, maxMem int64) (Pod, error) {
	pod := Pod{}
	var err error
	if fp.GPU != nil {
		if pod.GPUMilli, err = parseMilli(fp.GPU.raw, false); err != nil {
			return pod, ferr(pp+".gpu", "%v", err)
		}
		switch {
		case pod.GPUMilli < 0:
			return pod, ferr(pp+".gpu", "must not be negative")
		case pod.GPUMilli > 1000 && pod.GPUMilli%1000 != 0:
			return pod, ferr(pp+".gpu", "%s: more than one GPU must be a whole number of GPUs", fp.GPU.raw)
		case pod.GPUMilli >= 1000 && int(pod.GPUMilli/1000) > maxGPUs:
			return pod, ferr(pp+".gpu", "asks for %s GPUs but the largest node has %d", fp.GPU.raw, maxGPUs)
		}
		if pod.GPUMilli > 0 && maxGPUs == 0 {
			return pod, ferr(pp+".gpu", "asks for a GPU but no node has one")
		}
	}
	if fp.GPUMemory != nil {
		mem, err := parseBytes(fp.GPUMemory.raw)
		if err != nil {
			return pod, ferr(pp+".gpuMemory", "%v", err)
		}
		if mem <= 0 {
			return pod, ferr(pp+".gpuMemory", "must be positive")
		}
		if mem > maxMem {
			return pod, ferr(pp+".gpuMemory", "asks for %s of GPU memory but the largest GPU has %s", fp.GPUMemory.raw, formatBytes(maxMem))
		}
		switch {
		case fp.GPU == nil:
			pod.GPUMemory = mem
		case pod.WholeGPUs() > 0:
			// With whole GPUs (SCENARIOS.md's own example gives both),
			// gpuMemory is what each of them must hold at least.
			pod.MinGPUMemory = mem
		default:
			return pod, ferr(pp+".gpuMemory", "give a fraction as gpu or as gpuMemory, not both")
		}
	}
	switch fp.Sharing {
	case "":
		if pod.Fractional() {
			pod.Sharing = "mps"
		}
	case "mps", "timeslice":
		// On whole GPUs the mode changes nothing (a whole GPU is not
		// shared), so it is accepted and left out.
		if pod.Fractional() {
			pod.Sharing = fp.Sharing
		}
	default:
		return pod, ferr(pp+".sharing", "%q is not one of mps, timeslice", fp.Sharing)
	}
	switch fp.NVLink {
	case "", "preferred":
	case "required":
		pod.NVLinkReq = true
	default:
		return pod, ferr(pp+".nvlink", "%q is not one of required, preferred", fp.NVLink)
	}
	return pod, nil
}

// runningGPUs picks pod c's GPUs out of running.gpus: whole-GPU pods take
// consecutive slices of the list (count × gpu indices in all, or just gpu
// indices when count is 1); fraction pods take one index each, or share the
// single index given. A list of one pod's GPUs with count > 1 (as in
// SCENARIOS.md's example) is the first pod's; the others get the lowest
// free GPUs (nil).
func runningGPUs(pod *Pod, list []int, c, count int, field string) ([]int, error) {
	per := pod.WholeGPUs()
	if pod.Fractional() {
		per = 1
	}
	if per == 0 {
		return nil, ferr(field, "the pod asks for no GPU")
	}
	switch {
	case len(list) == per*count:
		return append([]int(nil), list[c*per:(c+1)*per]...), nil
	case pod.Fractional() && len(list) == 1:
		return []int{list[0]}, nil
	case len(list) == per && c == 0:
		return append([]int(nil), list...), nil
	case len(list) == per:
		return nil, nil
	}
	return nil, ferr(field, "lists %d GPUs; %d pod(s) of %d GPU(s) each need %d", len(list), count, per, per*count)
}

// assignRunning checks that the pods already running fit where the file puts
// them, and picks GPUs (lowest free indices) for those that name none.
func assignRunning(s *Spec) error {
	ru := newRunningUse(s.Nodes)
	// Pods with explicit GPUs first, so automatic picks go around them.
	for pass := 0; pass < 2; pass++ {
		for ji := range s.Jobs {
			j := &s.Jobs[ji]
			for pi := range j.Pods {
				pod := &j.Pods[pi]
				if pod.Running == nil || (pass == 0) != (pod.Running.GPUs != nil) {
					continue
				}
				if err := ru.place(j, pod); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// gpuUse is what the running pods placed so far hold of one GPU.
type gpuUse struct {
	exclusive bool
	mem       int64
	sharing   string
	by        string
}

// runningUse is what the running pods placed so far hold, per node.
type runningUse struct {
	nodeIdx map[string]*Node
	use     map[string][]gpuUse
	cpu     map[string]int64
	mem     map[string]int64
}

func newRunningUse(nodes []Node) *runningUse {
	ru := &runningUse{nodeIdx: map[string]*Node{}, use: map[string][]gpuUse{}, cpu: map[string]int64{}, mem: map[string]int64{}}
	for i := range nodes {
		ru.nodeIdx[nodes[i].Name] = &nodes[i]
	}
	for _, n := range nodes {
		ru.use[n.Name] = make([]gpuUse, n.GPUs)
	}
	return ru
}

// place checks that a running pod fits where the file puts it (picking its
// GPUs when it names none) and records what it holds.
func (ru *runningUse) place(j *Job, pod *Pod) error {
	field := fmt.Sprintf("jobs[%s].pods[%d].running", j.Name, pod.FileIndex)
	n, ok := ru.nodeIdx[pod.Running.Node]
	if !ok {
		return ferr(field+".node", "node %s is not defined", pod.Running.Node)
	}
	u := ru.use[n.Name]
	podMem := pod.GPUMemory
	if pod.Fractional() && podMem == 0 {
		podMem = n.GPUMemory * pod.GPUMilli / 1000
	}
	conflict := func(g int) string { return gpuConflict(n, u[g], g, pod, podMem) }
	if pod.Running.GPUs == nil {
		picked, ok := pickRunningGPUs(n, pod, func(g int) bool { return conflict(g) == "" })
		if !ok {
			if pod.Fractional() && podMem > n.GPUMemory {
				return ferr(field, "%s", conflict(0))
			}
			return ferr(field, "pod %s does not fit on node %s next to the pods already running there", pod.Name, n.Name)
		}
		pod.Running.GPUs = picked
	}
	seen := map[int]bool{}
	for _, g := range pod.Running.GPUs {
		if g < 0 || g >= n.GPUs {
			return ferr(field+".gpus", "node %s has no GPU %d (it has %d)", n.Name, g, n.GPUs)
		}
		if seen[g] {
			return ferr(field+".gpus", "GPU %d is listed twice", g)
		}
		seen[g] = true
		if why := conflict(g); why != "" {
			return ferr(field+".gpus", "%s", why)
		}
		if pod.Fractional() {
			u[g].mem += podMem
			u[g].sharing = pod.Sharing
		} else {
			u[g].exclusive = true
		}
		u[g].by = pod.Name
	}
	if pod.NVLinkReq && len(pod.Running.GPUs) > 1 {
		d := n.NVLinkDomain(pod.Running.GPUs[0])
		for _, g := range pod.Running.GPUs[1:] {
			if d == "" || n.NVLinkDomain(g) != d {
				return ferr(field+".gpus", "GPUs %v of node %s are not all in one NVLink domain (nvlink: %s), and the pod requires NVLink", pod.Running.GPUs, n.Name, n.NVLink)
			}
		}
	}
	ru.cpu[n.Name] += pod.CPUMilli
	ru.mem[n.Name] += pod.Memory
	if ru.cpu[n.Name] > n.CPUMilli {
		return ferr(field, "the pods running on node %s ask for more CPU than it has (%s)", n.Name, formatMilli(n.CPUMilli))
	}
	if ru.mem[n.Name] > n.Memory {
		return ferr(field, "the pods running on node %s ask for more memory than it has (%s)", n.Name, formatBytes(n.Memory))
	}
	return nil
}

// gpuConflict says why GPU g of node n, of which the pods placed so far
// hold u, cannot take the pod asking for podMem of its memory ("" when it
// can).
func gpuConflict(n *Node, u gpuUse, g int, pod *Pod, podMem int64) string {
	switch {
	case u.exclusive:
		return fmt.Sprintf("GPU %d of node %s is already used whole by pod %s", g, n.Name, u.by)
	case !pod.Fractional() && u.mem > 0:
		return fmt.Sprintf("GPU %d of node %s already holds fractions (pod %s)", g, n.Name, u.by)
	case pod.Fractional() && u.sharing != "" && u.sharing != pod.Sharing:
		return fmt.Sprintf("GPU %d of node %s is shared in %s mode (pod %s); pod %s asks for %s", g, n.Name, u.sharing, u.by, pod.Name, pod.Sharing)
	case pod.Fractional() && u.mem+podMem > n.GPUMemory:
		if podMem > n.GPUMemory {
			return fmt.Sprintf("pod %s asks for %s of GPU memory; the GPUs of node %s have %s", pod.Name, formatBytes(podMem), n.Name, formatBytes(n.GPUMemory))
		}
		left := "no memory"
		if n.GPUMemory > u.mem {
			left = formatBytes(n.GPUMemory-u.mem) + " of memory"
		}
		return fmt.Sprintf("GPU %d of node %s has %s left; pod %s asks for %s", g, n.Name, left, pod.Name, formatBytes(podMem))
	}
	return ""
}

// pickRunningGPUs picks the lowest GPUs of node n that fit the pod (for a
// pod that requires NVLink, the lowest of the first NVLink domain that has
// enough of them); ok is false when too few fit.
func pickRunningGPUs(n *Node, pod *Pod, fits func(int) bool) (picked []int, ok bool) {
	want := pod.WholeGPUs()
	if pod.Fractional() {
		want = 1
	}
	for g := 0; g < n.GPUs && len(picked) < want; g++ {
		if fits(g) {
			picked = append(picked, g)
		}
	}
	if pod.NVLinkReq && want > 1 {
		// The lowest free GPUs of the first NVLink domain
		// that has enough of them.
		byDomain := map[string][]int{}
		picked = nil
		for g := 0; g < n.GPUs && picked == nil; g++ {
			d := n.NVLinkDomain(g)
			if d == "" || !fits(g) {
				continue
			}
			byDomain[d] = append(byDomain[d], g)
			if len(byDomain[d]) == want {
				picked = byDomain[d]
			}
		}
	}
	return picked, len(picked) >= want
}

func normalizeExpect(fe *fileExpect, s *Spec) (Expect, error) {
	e := Expect{}
	if fe == nil {
		return e, nil
	}
	var err error
	if e.Jobs, err = normalizeExpectJobs(fe.Jobs, s); err != nil {
		return e, err
	}
	if e.Pods, err = normalizeExpectPods(fe.Pods, s); err != nil {
		return e, err
	}
	if e.Queues, err = normalizeExpectQueues(fe.Queues, s); err != nil {
		return e, err
	}
	return e, nil
}

// normalizeExpectJobs checks expect.jobs; nil when it is empty.
func normalizeExpectJobs(in map[string]fileExpectJob, s *Spec) (map[string]ExpectJob, error) {
	jobs := map[string]*Job{}
	for i := range s.Jobs {
		jobs[s.Jobs[i].Name] = &s.Jobs[i]
	}
	var out map[string]ExpectJob
	if len(in) > 0 {
		out = map[string]ExpectJob{}
	}
	for _, name := range sortedKeys(in) {
		if jobs[name] == nil {
			return out, ferr("expect.jobs."+name, "no job is named %s", name)
		}
		x := in[name]
		for _, f := range []struct {
			name string
			v    *int
		}{{"running", x.Running}, {"pending", x.Pending}, {"evicted", x.Evicted}} {
			if f.v != nil && *f.v < 0 {
				return out, ferr("expect.jobs."+name+"."+f.name, "must not be negative")
			}
		}
		out[name] = ExpectJob{Running: x.Running, Pending: x.Pending, Evicted: x.Evicted}
	}
	return out, nil
}

// normalizeExpectPods checks expect.pods; nil when it is empty.
func normalizeExpectPods(in map[string]fileExpectPod, s *Spec) (map[string]ExpectPod, error) {
	pods := map[string]bool{}
	for i := range s.Jobs {
		for _, p := range s.Jobs[i].Pods {
			pods[p.Name] = true
		}
	}
	nodes := map[string]*Node{}
	for i := range s.Nodes {
		nodes[s.Nodes[i].Name] = &s.Nodes[i]
	}
	var out map[string]ExpectPod
	if len(in) > 0 {
		out = map[string]ExpectPod{}
	}
	for _, name := range sortedKeys(in) {
		if !pods[name] {
			return out, ferr("expect.pods."+name, "no pod is named %s (pods are JOB-0, JOB-1, ...)", name)
		}
		x := in[name]
		switch x.State {
		case "", "Running", "Bound", "Pending", "Nominated":
		case StateArriving, StateSucceeded:
			if !s.Timed {
				return out, ferr("expect.pods."+name+".state", "%q is a state of timed runs only (time:)", x.State)
			}
		default:
			return out, ferr("expect.pods."+name+".state", "%q is not one of Running, Bound, Nominated, Pending, Arriving, Succeeded", x.State)
		}
		if x.Node != nil && *x.Node != "" && nodes[*x.Node] == nil {
			return out, ferr("expect.pods."+name+".node", "node %s is not defined", *x.Node)
		}
		if x.GPUs != nil {
			g := append([]int(nil), (*x.GPUs)...)
			sort.Ints(g)
			x.GPUs = &g
		}
		ep := ExpectPod{Node: x.Node, GPUs: x.GPUs, State: x.State, Reason: x.Reason}
		if x.GPUMemory != nil {
			v, err := parseBytes(x.GPUMemory.raw)
			if err != nil {
				return out, ferr("expect.pods."+name+".gpuMemory", "%v", err)
			}
			ep.GPUMemory = &v
		}
		out[name] = ep
	}
	return out, nil
}

// normalizeExpectQueues checks expect.queues; nil when it is empty.
func normalizeExpectQueues(in map[string]fileExpectQueue, s *Spec) (map[string]ExpectQueue, error) {
	queues := map[string]bool{}
	for _, q := range s.Queues {
		queues[q.Name] = true
	}
	var out map[string]ExpectQueue
	if len(in) > 0 {
		out = map[string]ExpectQueue{}
	}
	for _, name := range sortedKeys(in) {
		if !queues[name] {
			return out, ferr("expect.queues."+name, "no queue is named %s", name)
		}
		x := in[name]
		var eq ExpectQueue
		for _, f := range []struct {
			q    *Quantity
			dst  **int64
			name string
		}{{x.GPUFairShare, &eq.GPUFairShare, "gpuFairShare"}, {x.GPUAllocated, &eq.GPUAllocated, "gpuAllocated"}} {
			if f.q == nil {
				continue
			}
			v, err := parseMilliRounded(f.q.raw)
			if err != nil {
				return out, ferr("expect.queues."+name+"."+f.name, "%v", err)
			}
			*f.dst = &v
		}
		if x.GPUQuota != nil {
			v, err := parseMilli(x.GPUQuota.raw, false)
			switch {
			case err != nil:
				return out, ferr("expect.queues."+name+".gpuQuota", "%v", err)
			case v == -1000:
				v = core.Unlimited
			case v < 0:
				return out, ferr("expect.queues."+name+".gpuQuota", "%s is negative (only -1, meaning unlimited, is a quota)", x.GPUQuota.raw)
			}
			eq.GPUQuota = &v
		}
		out[name] = eq
	}
	return out, nil
}

// checkMax refuses an amount above core.MaxAmount (in the core's unit):
// the core would leave such a pod or node out, and a file it would run
// differently from what it says is refused here instead.
func checkMax(v int64, raw string) error {
	if v > core.MaxAmount {
		if raw == "" {
			return fmt.Errorf("is above the most the core accepts (%d in its unit)", core.MaxAmount)
		}
		return fmt.Errorf("%s is above the most the core accepts (%d in its unit)", raw, core.MaxAmount)
	}
	return nil
}

// dnsLabel is what a subgroup's name must be (the CRD's rule).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// normalizeSubGroups reads a job's subGroups and checks its pods' subGroup
// against them: each name a DNS label, unique; every pod's subGroup one of
// them; each minMember from 1 to the pods that name it (a file shows what
// the scheduler does with pods that exist, as minMember is bounded by the
// job's pods).
func normalizeSubGroups(j *Job, fj fileJob, p string) error {
	defined := map[string]bool{}
	for i, fg := range fj.SubGroups {
		gp := listElem(p+".subGroups", fg.Name, i)
		switch {
		case fg.Name == "":
			return ferr(gp+".name", "required")
		case len(fg.Name) > 63 || !dnsLabel.MatchString(fg.Name):
			return ferr(gp+".name", "%q is not a DNS label (lower-case letters, digits and '-', at most 63)", fg.Name)
		case defined[fg.Name]:
			return ferr(gp+".name", "subgroup %s is defined twice", fg.Name)
		}
		defined[fg.Name] = true
	}
	for k, fp := range fj.Pods {
		if fp.SubGroup != "" && !defined[fp.SubGroup] {
			return ferr(fmt.Sprintf("%s.pods[%d].subGroup", p, k), "subgroup %s is not defined in the job's subGroups", fp.SubGroup)
		}
	}
	count := map[string]int{}
	for _, pod := range j.Pods {
		count[pod.SubGroup]++
	}
	for i, fg := range fj.SubGroups {
		gp := listElem(p+".subGroups", fg.Name, i)
		switch {
		case fg.MinMember == nil:
			return ferr(gp+".minMember", "required")
		case *fg.MinMember < 1 || *fg.MinMember > count[fg.Name]:
			return ferr(gp+".minMember", "%d is out of range (1 to the %d pods that name subgroup %s)", *fg.MinMember, count[fg.Name], fg.Name)
		}
		j.SubGroups = append(j.SubGroups, SubGroup{Name: fg.Name, MinMember: *fg.MinMember, Topology: constraint(fg.Topology)})
	}
	return nil
}

// hostnameLabel is the label Kubernetes gives every node: its name.
const hostnameLabel = "kubernetes.io/hostname"

// withHostname is a node's labels with kubernetes.io/hostname set to its
// name, as Kubernetes sets it, unless the file sets it.
func withHostname(labels map[string]string, name string) map[string]string {
	if _, ok := labels[hostnameLabel]; ok {
		return labels
	}
	out := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		out[k] = v
	}
	out[hostnameLabel] = name
	return out
}

// normalizeTopologies reads topologies: each a unique name and its levels
// (node label keys, broadest first), checked as the core checks them.
func normalizeTopologies(in []fileTopology) ([]core.Topology, error) {
	var out []core.Topology
	seen := map[string]bool{}
	for i, ft := range in {
		p := listElem("topologies", ft.Name, i)
		t := core.Topology{Name: ft.Name, Levels: ft.Levels}
		switch err := core.ValidateTopology(t); {
		case ft.Name == "":
			return nil, ferr(p+".name", "required")
		case seen[ft.Name]:
			return nil, ferr(p+".name", "topology %s is defined twice", ft.Name)
		case err != nil:
			return nil, ferr(p+".levels", "%v", err)
		}
		seen[ft.Name] = true
		out = append(out, t)
	}
	return out, nil
}

// constraint is a topology: field for the core (nil: none).
func constraint(fc *fileTopologyConstraint) *core.TopologyConstraint {
	if fc == nil {
		return nil
	}
	return &core.TopologyConstraint{Topology: fc.Name, Required: fc.Required, Preferred: fc.Preferred}
}

// checkConstraints checks every job's and subgroup's topology: against
// the file's topologies, with the core's words.
func checkConstraints(s *Spec) error {
	for ji, j := range s.Jobs {
		p := listElem("jobs", j.Name, ji)
		if j.Topology != nil {
			if err := core.ValidateTopologyConstraint(*j.Topology, s.Topologies); err != nil {
				return ferr(p+".topology", "%v", err)
			}
		}
		for gi, g := range j.SubGroups {
			if g.Topology == nil {
				continue
			}
			gp := listElem(p+".subGroups", g.Name, gi) + ".topology"
			if j.Topology != nil && g.Topology.Topology != j.Topology.Topology {
				return ferr(gp+".name", "%s is not the job's topology %s", g.Topology.Topology, j.Topology.Topology)
			}
			if err := core.ValidateTopologyConstraint(*g.Topology, s.Topologies); err != nil {
				return ferr(gp, "%v", err)
			}
		}
	}
	return nil
}
