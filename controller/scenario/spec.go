package scenario

import (
	"strconv"
	"time"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/quotaschedule"
)

// Spec is one scenario after defaults and validation: every count expanded,
// every quantity in the core's integer units (milli-GPU, milli-CPU, bytes).
type Spec struct {
	File   string
	Name   string
	Cycles int
	// Timed runs (a time: block) have a cycle length and skip the cycles
	// where nothing can change; untimed runs step one second a cycle.
	Timed         bool
	CycleSeconds  int64 // simulated seconds per cycle (1 when untimed)
	SampleSeconds int64 // the fairness report's sampling (timed runs)
	// Start is the wall-clock time at which a timed run starts (time.start),
	// which quota schedules read.
	Start         time.Time
	Consolidation bool
	Placement     string // "binpack" | "spread"
	// Usage, when set, is fair share with history (config.usage).
	Usage *Usage
	Nodes []Node
	// Topologies are topologies:, in file order.
	Topologies []core.Topology
	Queues     []Queue // file order; "default" added when the file lists none
	Jobs       []Job
	Expect     Expect
}

// podOverhead is what one pod costs the core in a cycle besides trying it
// on each node (preemption and reclaim plans, its pending reason), in
// node-tries: measured, a pending pod on 10 nodes cost about 100 µs per cycle,
// one try of a pod on a node 40 to 180 ns.
const podOverhead = 1000

// Work estimates what running the scenario costs the core: every pod is
// tried on every node in every cycle, plus a fixed overhead per pod and
// cycle. normalize refuses a scenario above MaxWork.
func (s *Spec) Work() int64 {
	pods := 0
	for _, j := range s.Jobs {
		pods += len(j.Pods)
	}
	return int64(pods) * int64(s.RunCycles()) * (int64(len(s.Nodes)) + podOverhead)
}

// eventCycles is how many cycles a timed run is counted for per job in
// Work: it arrives, starts, finishes, and a few cycles of reclaim and
// preemption around each; the cycles between, where nothing can change,
// are skipped.
const eventCycles = 8

// RunCycles bounds the cycles a run goes through: all of them untimed; for
// a timed run, at most eventCycles per job plus one per fairness sample,
// since a cycle after which nothing changed is skipped to the next event.
func (s *Spec) RunCycles() int {
	if !s.Timed {
		return s.Cycles
	}
	n := int64(eventCycles*len(s.Jobs)) + s.Seconds()/s.SampleSeconds + 1
	return int(min(n, int64(s.Cycles)))
}

// MaxTimedWork bounds a timed run's Work, which counts every pod in every
// cycle that may run; but a pod is in the snapshot only between its job's
// arrival and its end, so the count is far above what runs (a week of 100
// nodes, 5,330 pods: 10^10 units, 20 to 40 s).
const MaxTimedWork = 100 * MaxWork

func (s *Spec) maxWork() int64 {
	if s.Timed {
		return MaxTimedWork
	}
	return MaxWork
}

// Seconds is how long the run lasts in simulated time.
func (s *Spec) Seconds() int64 { return int64(s.Cycles) * s.CycleSeconds }

// Usage is config.usage: how the run keeps its usage history and how much
// fair share weighs it.
type Usage struct {
	Config      core.UsageConfig
	Coefficient int64 // thousandths (core.Config.UsageCoefficient)
}

// Node is one expanded node.
type Node struct {
	Name      string
	GPUs      int
	GPUMemory int64 // bytes per GPU
	GPUModel  string
	NVLink    string // "all" | "pairs" | "none"
	CPUMilli  int64
	Memory    int64
	Labels    map[string]string
}

// NVLinkDomain names the NVLink domain of GPU i on this node; "" means the
// GPU has no NVLink (the core's convention).
func (n *Node) NVLinkDomain(i int) string {
	switch n.NVLink {
	case "all":
		return "nvlink"
	case "pairs":
		return "nvlink-" + strconv.Itoa(i/2)
	}
	return ""
}

// Resource is one queue's settings for one resource, in the core's units;
// -1 means unlimited (quota) or none (limit).
type Resource struct {
	Quota  int64
	Limit  int64
	Weight int64
}

// Queue is one queue of the tree.
type Queue struct {
	Name     string
	Parent   string // "" for a top-level queue
	Priority int
	GPU      Resource
	CPU      Resource
	Memory   Resource
	Leaf     bool
	// PreemptMinRuntime, ReclaimMinRuntime and PreemptionDelay are the
	// time protections in seconds (core.Queue); -1 inherits the parent's.
	PreemptMinRuntime, ReclaimMinRuntime, PreemptionDelay int64
	// Schedule lists the windows that override GPU, CPU and Memory while
	// they hold (timed runs); the first that holds wins.
	Schedule []Window
}

// Window is one window of a queue's schedule with the settings it gives:
// the queue's own, overridden by what the window sets.
type Window struct {
	When             quotaschedule.Window
	GPU, CPU, Memory Resource
}

// At is the queue's GPU, CPU and memory settings at wall-clock time t: the
// first window of its schedule that holds, else its own.
func (q *Queue) At(t time.Time) (gpu, cpu, memory Resource) {
	for _, w := range q.Schedule {
		if w.When.Holds(t) {
			return w.GPU, w.CPU, w.Memory
		}
	}
	return q.GPU, q.CPU, q.Memory
}

// Job is a gang: a PodGroup, or a single pod.
type Job struct {
	Name        string
	Queue       string
	Priority    int
	Preemptible bool
	NeverEvicts bool   // preemptionPolicy: Never
	Disruption  string // core.Disruption: "", single or all
	MinMember   int
	// SubGroups are the gang's parts with minimums of their own, in file
	// order; pods name theirs in Pod.SubGroup.
	SubGroups []SubGroup
	// Topology is the job's topology: constraint; nil for none.
	Topology  *core.TopologyConstraint
	CreatedAt int64 // seconds
	// ArriveAt is when a timed run's job appears, in seconds from the
	// run's start (0: from the start); RunFor how long its gang runs
	// before the job finishes and its pods leave (0: never).
	ArriveAt int64
	RunFor   int64
	Pods     []Pod
}

// SubGroup is one part of a gang (core.SubGroup).
type SubGroup struct {
	Name      string
	MinMember int
	Topology  *core.TopologyConstraint // nil for none
}

// Below says whether a job with placed pods (placed says which) is below
// its gang: fewer than MinMember, or a subgroup below its own minimum.
func (j *Job) Below(placed func(p *Pod) bool) bool {
	n := 0
	per := map[string]int{}
	for i := range j.Pods {
		if placed(&j.Pods[i]) {
			n++
			per[j.Pods[i].SubGroup]++
		}
	}
	if n == 0 {
		return false
	}
	if n < j.MinMember {
		return true
	}
	for _, g := range j.SubGroups {
		if per[g.Name] < g.MinMember {
			return true
		}
	}
	return false
}

// Pod is one pod of a job, named JOB-i.
type Pod struct {
	Name      string
	SubGroup  string // one of its job's SubGroups, or ""
	Index     int
	FileIndex int   // which entry of the job's pods: list it came from
	GPUMilli  int64 // whole GPUs × 1000, or a fraction below 1000; 0 with GPUMemory set or for CPU-only pods
	GPUMemory int64 // a fraction given as memory (bytes); 0 otherwise
	// MinGPUMemory: with whole GPUs, the least memory each must have
	// (gpuMemory given beside a whole gpu); 0: any.
	MinGPUMemory int64
	Sharing      string
	NVLinkReq    bool
	CPUMilli     int64
	Memory       int64
	Running      *Placement
	// Alternatives are the GPU requests the pod takes, in order, when its
	// own fits no node (core.Pod.Alternatives); only their GPU fields
	// (GPUMilli, GPUMemory, MinGPUMemory, Sharing, NVLinkReq) are set.
	// Running pods hold their own request.
	Alternatives []Pod
}

// As is the pod as it is while it holds request alt (core.Placement's
// Alternative): 0 its own, i its Alternatives[i-1], whose GPU fields replace
// the pod's. ok is false when the pod has no such alternative.
func (p *Pod) As(alt int) (q *Pod, ok bool) {
	if alt == 0 {
		return p, true
	}
	if alt < 0 || alt > len(p.Alternatives) {
		return p, false
	}
	a := &p.Alternatives[alt-1]
	c := *p
	c.GPUMilli, c.GPUMemory, c.MinGPUMemory, c.Sharing, c.NVLinkReq = a.GPUMilli, a.GPUMemory, a.MinGPUMemory, a.Sharing, a.NVLinkReq
	c.Alternatives = nil
	return &c, true
}

// WholeGPUs is the number of whole GPUs the pod asks for (0 for fractions).
func (p *Pod) WholeGPUs() int {
	if p.GPUMemory > 0 || p.GPUMilli%1000 != 0 {
		return 0
	}
	return int(p.GPUMilli / 1000)
}

// Fractional reports whether the pod shares one GPU.
func (p *Pod) Fractional() bool {
	return p.GPUMemory > 0 || (p.GPUMilli > 0 && p.GPUMilli < 1000)
}

// Placement is where a pod is: node and GPU indices.
type Placement struct {
	Node string
	GPUs []int // nil: the loader assigns them
}

// Expect holds the checks of a scenario; nil fields are not checked.
type Expect struct {
	Jobs   map[string]ExpectJob
	Pods   map[string]ExpectPod
	Queues map[string]ExpectQueue
}

// ExpectJob counts a job's pods at the end of the run.
type ExpectJob struct {
	Running, Pending, Evicted *int
}

// ExpectPod pins where a pod is.
type ExpectPod struct {
	Node      *string
	GPUs      *[]int
	State     string
	Reason    *string
	GPUMemory *int64 // bytes
}

// ExpectQueue checks a queue's GPU fair share and allocation (milli-GPU).
type ExpectQueue struct {
	GPUFairShare, GPUAllocated *int64
	GPUQuota                   *int64 // core.Unlimited for -1
}
