// Package core is Tessera's scheduling core: a pure, deterministic library.
// A Snapshot of the cluster (nodes and their GPUs, queues, jobs and pods) goes
// in, one scheduling cycle runs (hierarchical fair share, then allocate →
// consolidate → reclaim → preempt on a simulate-then-commit transaction), and
// decisions come out: bind this pod to this node with these GPUs and this much
// GPU memory; evict that pod for this reason; this pod stays pending because…
//
// It imports nothing from Kubernetes so that tessera-controller (fed by
// informers) and tessera-sim (fed by files) run exactly the same code.
//
// Units are exact integers everywhere: milli-GPU, milli-CPU and bytes.
// Everything is deterministic: inputs are sorted by name on entry and every tie
// is broken by name, so the same snapshot always gives the same Result.
package core

import "time"

// Resource indexes a Resources vector.
type Resource int

const (
	// ResGPU is counted in milli-GPU: 1000 is one whole GPU, 500 half of one.
	ResGPU Resource = iota
	// ResCPU is counted in milli-CPU.
	ResCPU
	// ResMemory is host memory in bytes.
	ResMemory
	// NumResources is the length of a Resources vector.
	NumResources
)

// String names the resource as DESIGN.md does ("gpu", "cpu", "memory").
func (r Resource) String() string {
	switch r {
	case ResGPU:
		return "gpu"
	case ResCPU:
		return "cpu"
	case ResMemory:
		return "memory"
	}
	return "unknown"
}

// Resources is an amount of each resource, indexed by Resource:
// r[ResGPU] milli-GPU, r[ResCPU] milli-CPU, r[ResMemory] bytes.
type Resources [NumResources]int64

// Unlimited is the value of a quota or limit that never binds (-1 in DESIGN.md).
const Unlimited int64 = -1

// The largest amounts the core accepts, so that no sum it makes can wrap
// (DESIGN.md, "Why pending"): adapters read outside input against them.
const (
	// MaxAmount bounds each amount of a pod's request and of a node, in the
	// resource's unit (milli-CPU, bytes, milli-GPU, other units): 2^46, that
	// is 64Ti of memory or about 70 billion CPUs, so that the sum over 2^17
	// pods (more than a Kubernetes cluster holds) stays below 2^63.
	MaxAmount int64 = 1 << 46
	// MaxGPUs bounds Request.GPUs.
	MaxGPUs = 1 << 16
	// MaxQueueAmount bounds a queue's quota and limit (they are compared,
	// never summed).
	MaxQueueAmount int64 = 1 << 62
	// MaxWeight bounds a queue's OverQuotaWeight (siblings' weights are
	// summed).
	MaxWeight int64 = 1 << 32
)

// Snapshot is the whole input of one cycle. The core does not keep it or
// modify it.
type Snapshot struct {
	// Now is the cycle's time: stale-gang eviction and the time protections
	// (Queue.PreemptMinRuntime, …) read it.
	Now    time.Time
	Nodes  []Node
	Queues []Queue
	Jobs   []Job
	// PodTerms names the pod selectors of Kubernetes' required pod
	// (anti-)affinity and topology spread, each mapped to its topology: the
	// node label whose value is a domain ("kubernetes.io/hostname": each
	// node its own). A pod that Avoids a term may not run in a domain where
	// a pod that Matches it runs, nor the other way round; nodes without
	// the label are in no domain, so that term does not hold there. A pod
	// that Needs a term runs only in a domain where a pod that Matches it
	// runs — or anywhere with the label when no pod matches it yet and the
	// pod matches every term it needs itself (the first of a group). Spread
	// constraints are on Pod.Spread.
	PodTerms map[string]string
	// Usage is each leaf queue's decayed past usage per resource
	// (UsageHistory.Decayed; any unit, the same for every queue), which
	// fair share weighs when Config.UsageCoefficient is above 0. A parent's
	// is its children's sum; amounts below 0 count as 0.
	Usage map[string]Resources
	// Topologies are the network layouts gangs may ask to be placed within
	// (Job.Topology, SubGroup.Topology). A topology that is invalid itself
	// (Topology's rules) is left out with a problem, and a job naming it
	// waits with the reason.
	Topologies []Topology
}

// Topology is one layout of the cluster's network (a Kubernetes Topology
// object): an ordered list of levels, each a node label key, broadest first
// and hostname last, e.g. zone, block, rack, "kubernetes.io/hostname". A
// domain of a level is the set of nodes with the same values for that
// level's label and every broader level's (racks called r1 in two blocks are
// two racks); a node missing any of those labels is in no domain of that
// level, so it never hosts a gang that requires the level. Name is unique
// and not empty; Levels are at least one, distinct, not empty.
type Topology struct {
	Name   string
	Levels []string
}

// TopologyConstraint keeps a gang (Job.Topology) or a subgroup's pods
// (SubGroup.Topology) close on the network. Required and Preferred are
// levels of the named Topology (their label keys), "" for none; Preferred
// may not be broader than Required (it would say nothing more).
type TopologyConstraint struct {
	// Topology names one of Snapshot.Topologies.
	Topology string
	// Required: every pod of the gang placed in this cycle and its placed
	// pods lie in one domain of this level, or none is placed.
	Required string
	// Preferred: in one domain of this level when one fits, else in as few
	// as the placement finds.
	Preferred string
}

// Node is a schedulable node.
type Node struct {
	Name   string
	Labels map[string]string
	// CPU (milli-CPU) and Memory (bytes) allocatable to pods, including what
	// pods already placed here use (the core subtracts them).
	CPU    int64
	Memory int64
	GPUs   []GPU
	// Unschedulable nodes keep their pods but receive no new ones.
	Unschedulable bool
	// Other is what the node can hold of other resources pods ask for
	// (pod count, ephemeral storage, hugepages, extended resources such as
	// another vendor's device-plugin resource), allocatable amounts in each
	// resource's own units, including what pods already placed here use. A
	// pod asking for a resource the node does not list does not fit it.
	// These resources only gate placement; queues do not account them.
	Other map[string]int64
}

// GPU is one device on a node.
type GPU struct {
	Index  int
	Memory int64 // bytes
	Model  string
	// NVLinkDomain: GPUs of a node that share this string are NVLink-connected.
	// Empty means the GPU has no NVLink (a domain of its own).
	NVLinkDomain string
}

// QueueResource is a queue's policy for one resource.
type QueueResource struct {
	// Quota is the guaranteed amount (0 none, Unlimited = everything asked).
	Quota int64
	// Limit is a hard cap (Unlimited = none).
	Limit int64
	// OverQuotaWeight divides what is left over quota among siblings of equal
	// priority; 0 means the queue never gets anything over its quota.
	OverQuotaWeight int64
}

// Queue is a node of the queue tree. Only leaf queues hold jobs. Values are
// taken literally: use NewQueue for DESIGN.md's defaults.
type Queue struct {
	Name string
	// Parent is "" for a top-level queue.
	Parent   string
	Priority int32
	// Resources holds quota, limit and weight per Resource.
	Resources [NumResources]QueueResource
	// Time protections (DESIGN.md, "Time protections"). PreemptMinRuntime
	// and ReclaimMinRuntime: a placed pod of a job in this queue may not be
	// taken as a victim by preempt, or by reclaim, before it has run this
	// long (Pod.StartedAt); a consolidation move counts as preempt when the
	// job it makes room for is of the same leaf queue, else as reclaim.
	// PreemptionDelay: a job of this queue may not evict anyone (reclaim,
	// preempt, consolidate) before it is this old (Job.CreatedAt).
	// InheritDuration takes the parent's value (a top-level queue's: 0,
	// none); NewQueue sets it.
	PreemptMinRuntime, ReclaimMinRuntime, PreemptionDelay time.Duration
}

// InheritDuration, as a Queue's time protection, takes its parent's value.
// Any negative duration means the same.
const InheritDuration time.Duration = -1

// NewQueue returns a queue with DESIGN.md's defaults: GPU quota 0, CPU and
// memory quota Unlimited, no limits, over-quota weight 1, priority 100, time
// protections inherited.
func NewQueue(name, parent string) Queue {
	q := Queue{Name: name, Parent: parent, Priority: 100, PreemptMinRuntime: InheritDuration, ReclaimMinRuntime: InheritDuration, PreemptionDelay: InheritDuration}
	for r := range q.Resources {
		q.Resources[r] = QueueResource{Quota: Unlimited, Limit: Unlimited, OverQuotaWeight: 1}
	}
	q.Resources[ResGPU].Quota = 0
	return q
}

// Job is a gang of pods (a PodGroup, or a single pod as a gang of one).
type Job struct {
	Name     string
	Queue    string // a leaf queue
	Priority int32
	// Preemptible jobs may run over quota and may be reclaimed or preempted;
	// non-preemptible ones are kept within quota.
	Preemptible bool
	// NeverEvicts jobs wait for free capacity: no pod is reclaimed,
	// preempted or moved to make room for them (Kubernetes'
	// preemptionPolicy: Never). They are still ordered by priority.
	NeverEvicts bool
	// MinMember pods are placed all-or-nothing; 0 means all of Pods.
	MinMember int
	// SubGroups are parts of the gang with minimums of their own (a
	// JobSet's replicated jobs, an LWS leader and its workers, prefill and
	// decode): the gang holds only when each has at least its MinMember
	// placed, besides the job's MinMember in total. Pods name theirs in
	// Pod.SubGroup; pods that name none count for the total only. A
	// subgroup's minimum is not clamped to the pods that name it: one
	// short of pods keeps the job's pending pods waiting, with the reason.
	SubGroups []SubGroup
	// Topology, when not nil, keeps the gang's pods in one domain of a
	// level of a topology (TopologyConstraint).
	Topology *TopologyConstraint
	// Disruption says what evicting one of its placed pods takes; ""
	// (DisruptionGang) is Tessera's rule.
	Disruption Disruption
	// CreatedAt orders jobs of equal priority (older first) and victims (newer
	// first). A pod recreated after an eviction keeps its job's age.
	CreatedAt time.Time
	// BelowMinMemberSince is when the job last dropped below MinMember placed
	// pods while some were still placed; zero when it is not below (or the
	// adapter does not track it). See Result.Jobs for what the core observed.
	BelowMinMemberSince time.Time
	Pods                []Pod
}

// SubGroup is one part of a gang: see Job.SubGroups.
type SubGroup struct {
	// Name is unique in the job, not empty.
	Name string
	// MinMember (at least 1) of the pods naming it are placed together,
	// all or nothing, with the rest of the gang.
	MinMember int
	// Topology, when not nil, keeps the subgroup's pods in one domain (of a
	// level of the job's topology, inside the job's domain when the job has
	// one).
	Topology *TopologyConstraint
}

// Disruption is how a job's placed pods may be evicted (Kubernetes'
// PodGroup disruptionMode).
type Disruption string

const (
	// DisruptionGang (the default): evicting a pod that would leave the
	// gang below MinMember evicts the whole gang, and a gang below
	// MinMember too long is stale-evicted.
	DisruptionGang Disruption = ""
	// DisruptionSingle: pods are evicted one by one, and a gang left below
	// MinMember keeps running (no stale-gang eviction).
	DisruptionSingle Disruption = "single"
	// DisruptionAll: evicting any pod evicts the whole gang.
	DisruptionAll Disruption = "all"
)

// Sharing is how a fractional pod shares a GPU.
type Sharing string

const (
	// SharingMPS is the default for fractions.
	SharingMPS Sharing = "mps"
	// SharingTimeSlice is time-sliced sharing; never mixed with MPS on a GPU.
	SharingTimeSlice Sharing = "timeslice"
)

// NVLinkPolicy says how a multi-GPU pod wants its GPUs connected.
type NVLinkPolicy string

const (
	// NVLinkPreferred (the default, also spelled "") prefers one NVLink domain.
	NVLinkPreferred NVLinkPolicy = "preferred"
	// NVLinkRequired places the pod only on GPUs of one NVLink domain.
	NVLinkRequired NVLinkPolicy = "required"
)

// Request is what one pod asks for. Set at most one of GPUs, GPUMilli and
// GPUMemory.
type Request struct {
	// GPUs is a number of whole, exclusive GPUs.
	GPUs int
	// GPUMilli is a fraction of one GPU (1..999); it also takes that share of
	// the GPU's memory.
	GPUMilli int64
	// GPUMemory is a fraction of one GPU given as bytes of its memory; it
	// counts as ceil(GPUMemory*1000/GPU.Memory) milli-GPU.
	GPUMemory int64
	// Sharing applies to fractions; "" means SharingMPS.
	Sharing Sharing
	// NVLink applies to pods with more than one GPU.
	NVLink NVLinkPolicy
	CPU    int64 // milli-CPU
	Memory int64 // bytes
	// Other asks for resources of Node.Other, by name.
	Other map[string]int64
}

// IsFraction reports whether the request is a share of one GPU.
func (r Request) IsFraction() bool { return r.GPUMilli > 0 || r.GPUMemory > 0 }

// PodPhase is where a pod stands.
type PodPhase string

const (
	// PodPending pods wait for a placement.
	PodPending PodPhase = "Pending"
	// PodBound pods have a placement (possibly waiting for evictions to free
	// it) and count as allocated.
	PodBound PodPhase = "Bound"
	// PodRunning pods run on their placement.
	PodRunning PodPhase = "Running"
	// PodReleasing pods are terminating: they still hold their node's
	// capacity but no longer count for their job or queue, and are never
	// victims.
	PodReleasing PodPhase = "Releasing"
)

// Placement is where a pod sits or is to sit.
type Placement struct {
	Node string
	// GPUs are device indices on the node, ascending.
	GPUs []int
	// GPUMilli and GPUMemory give, per entry of GPUs, the compute share
	// (milli) and memory (bytes) the pod takes of that GPU. On input they may
	// be nil: the core derives them from the request and the GPUs.
	GPUMilli  []int64
	GPUMemory []int64
	// Sharing is the mode the pod uses its GPUs in ("" for whole GPUs).
	Sharing Sharing
	// Alternative says which of the pod's requests the placement holds: 0
	// for Pod.Request, i for Pod.Alternatives[i-1]. On input for placed
	// pods; on output in binds and moves.
	Alternative int
}

// Alternative is one of Pod.Alternatives.
type Alternative struct {
	// Request's GPU fields replace the pod's (see Pod.Alternatives).
	Request Request
	// Feasible is Pod.Feasible while this alternative is tried or held
	// (a DRA subrequest has device selectors of its own); nil: no check,
	// as for a pod without one.
	Feasible func(node string, gpu int) bool
}

// Pod is one pod of a job. Pod names are unique across the snapshot (the
// Kubernetes adapter uses namespace/name).
type Pod struct {
	Name    string
	Request Request
	// SubGroup names one of the job's SubGroups, or "" for none. A pending
	// pod that names one the job does not have is invalid (its job's
	// pending pods wait); a placed one counts for the job only.
	SubGroup string
	// NodeSelector labels must all match the node's labels.
	NodeSelector map[string]string
	// GPUModels, when not empty, lists the GPU models the pod may use.
	GPUModels []string
	// Feasible, when not nil, is a check the adapter cannot express as
	// labels (node taints and the pod's tolerations, DRA CEL selectors on
	// devices, unhealthy GPUs). A node is usable only if Feasible(node, -1)
	// is true, and GPU index g on it only if Feasible(node, g) is. It must
	// be deterministic and cheap: it is called while nodes are scanned, and
	// pods that set it are not cached by shape with other pods. It is not
	// consulted for the pod's existing placement. nil (the fast path)
	// allows every node and GPU.
	Feasible func(node string, gpu int) bool
	// Matches, Avoids and Needs name terms of Snapshot.PodTerms: the
	// terms whose selector the pod matches, its own anti-affinity terms and
	// its own affinity terms.
	Matches []string
	Avoids  []string
	Needs   []string
	// Spread constraints (topology spread, DoNotSchedule) must all hold.
	Spread []SpreadConstraint
	// Prefers and NodeScore are soft: among the nodes where the pod fits,
	// the one they score highest wins, and the placement policy (bin-pack
	// or spread) decides only between nodes they score alike. Prefers are
	// terms of Snapshot.PodTerms (Kubernetes' preferred pod affinity and
	// anti-affinity, and ScheduleAnyway spread): a node scores Weight for
	// each placed pod the term selects in the node's domain of the term
	// (counted as pods are placed and evicted within the cycle), so a
	// negative weight pushes the pod away. NodeScore, when not nil, adds a
	// score per node (preferred node affinity, PreferNoSchedule taints);
	// like Feasible it must be deterministic and cheap.
	Prefers   []PreferredTerm
	NodeScore func(node string) int64
	// Attracts are this pod's pull on pods yet to be placed (Kubernetes'
	// symmetry of inter-pod affinity): while it is placed, a pod that a
	// term selects scores Weight on every node in this pod's domain of the
	// term (negative: pushed away). Kubernetes gives existing pods'
	// preferred terms their weight, and their required affinity terms a
	// weight of 1; the adapter says which.
	Attracts []PreferredTerm
	// Alternatives are GPU requests the pod takes instead of Request's
	// when Request's fits no node (Kubernetes' DRA prioritized list,
	// firstAvailable), in order: allocate tries Request on every node, then
	// each alternative on every node in turn, and places the pod with the
	// first that fits (a node where an earlier one fits always wins over a
	// node where only a later one does). Only an alternative's GPU fields
	// are read (GPUs, GPUMilli, GPUMemory, Sharing, NVLink): CPU, memory and
	// Other are Request's. Request alone counts for fair-share demand, job
	// order and a queue's pending; consolidate, reclaim and preempt plan
	// for Request only. The alternative a placement holds is
	// Placement.Alternative.
	Alternatives []Alternative
	// Pinned pods are never moved by consolidation (a move evicts the pod
	// and counts on its controller to recreate it; a bare pod would be
	// lost). They may still be reclaimed or preempted.
	Pinned bool
	Phase  PodPhase
	// StartedAt is when a placed pod started running (Kubernetes' pod
	// status startTime), which its queue's minimum runtimes count from.
	// Zero for a placed pod: it has not started (it has run 0).
	StartedAt time.Time
	// Placement is set for Bound, Running and Releasing pods.
	Placement Placement
}

// PlacementPolicy chooses among nodes that fit.
type PlacementPolicy string

const (
	// BinPack (the default, also "") fills used nodes first, keeping whole
	// nodes free for big gangs.
	BinPack PlacementPolicy = "binpack"
	// Spread places on the emptiest node first.
	Spread PlacementPolicy = "spread"
)

// Config tunes the scheduler. The zero value is DESIGN.md's default.
type Config struct {
	Placement PlacementPolicy
	// DisableConsolidation turns the consolidate action off.
	DisableConsolidation bool
	// StaleGangTimeout is how long a gang may stay below MinMember before all
	// its pods are evicted; 0 means 60 s, negative means never.
	StaleGangTimeout time.Duration
	// UsageCoefficient, in thousandths (0 to MaxUsageCoefficient), weighs
	// Snapshot.Usage in the over-quota split (DESIGN.md, "Fair share with
	// history"); 0 is the split by weight alone.
	UsageCoefficient int64
}

// MaxUsageCoefficient is the largest Config.UsageCoefficient: 100.
const MaxUsageCoefficient = 100_000

// DefaultStaleGangTimeout is DESIGN.md's stale-gang timeout.
const DefaultStaleGangTimeout = 60 * time.Second

// Action names the step of the cycle that made a decision.
type Action string

const (
	ActionStaleGang   Action = "stale-gang"
	ActionAllocate    Action = "allocate"
	ActionConsolidate Action = "consolidate"
	ActionReclaim     Action = "reclaim"
	ActionPreempt     Action = "preempt"
)

// Result is everything one cycle decided.
type Result struct {
	// Binds in decision order.
	Binds []Bind
	// Evictions in decision order.
	Evictions []Eviction
	// Pending holds every pod left pending, with its reason, by job name
	// then pod order.
	Pending []PendingPod
	// Queues by name, parents included.
	Queues map[string]QueueStatus
	// Jobs by name: what the core observed (for PodGroup status and for the
	// adapter to track Job.BelowMinMemberSince).
	Jobs map[string]JobStatus
	// Timings of each step, in order.
	Timings []Timing
	// Problems are what the snapshot held that the core could not take as
	// given, and what it did instead: a queue or job left out (its pending
	// pods are in Pending with the reason), a placed pod it could not read
	// (its capacity is still counted, conservatively), a node's broken GPU.
	// One bad object never fails the cycle.
	Problems []Problem
}

// Problem is one object of the snapshot the core could not take as given.
type Problem struct {
	// Object names it: "queue q", "job j", "pod p", "node n", "term t".
	Object string
	Reason string
}

// Bind places a pending pod.
type Bind struct {
	Pod       string
	Job       string
	Placement Placement
	Action    Action
	// Pipelined binds use capacity that this cycle's evictions free: the
	// adapter binds them once the victims are gone, and gives that capacity
	// to nobody else meanwhile.
	Pipelined bool
	// Plan numbers the evicting plan (consolidate, reclaim or preempt) that
	// made the decision, 1, 2, … in the order the plans were committed; 0
	// for allocate and stale-gang evictions. A plan's binds and evictions
	// go together: the victims were taken for those pods.
	Plan int
}

// Eviction removes a placed pod.
type Eviction struct {
	Pod    string
	Job    string
	Node   string
	Action Action
	// Reason in a person's words ("reclaimed by queue team-b (job train)").
	Reason string
	// MoveTo is set when consolidation moves the pod: it is to be re-placed
	// there (a pipelined placement).
	MoveTo *Placement
	// Plan is as in Bind.
	Plan int
}

// PendingPod is a pod left pending and why.
type PendingPod struct {
	Pod    string
	Job    string
	Reason string
}

// QueueStatus is a queue's accounting for the cycle. Allocated is at the
// cycle's end (after its decisions); the others as computed at its start.
type QueueStatus struct {
	FairShare Resources
	Allocated Resources
	// Pending is the sum of the requests of pending pods (a parent's:
	// of its subtree, like Allocated).
	Pending Resources
	// Quota and Limit echo the queue's settings (Unlimited = -1).
	Quota Resources
	Limit Resources
}

// JobStatus is what the core observed of a job at the cycle's end.
type JobStatus struct {
	// Placed counts pods bound or running (after this cycle's decisions).
	Placed  int
	Pending int
	// BelowMinMember is true when some pods are placed but fewer than
	// MinMember, or fewer than some subgroup's MinMember in it.
	BelowMinMember bool
}

// Timing is how long a step of the cycle took.
type Timing struct {
	Action   Action
	Duration time.Duration
}

// PreferredTerm is a soft pod term: see Pod.Prefers and Pod.Attracts.
type PreferredTerm struct {
	Term   string
	Weight int64
}

// SpreadConstraint is a topology spread constraint: the pod runs only on a node with
// the term's label, in a domain where the pods the term selects (this pod
// too, when it matches) would exceed the fewest in any domain by at most
// MaxSkew. The domains counted are those of the nodes the pod could use
// (its node selector and Feasible); with fewer than MinDomains of them the
// fewest counts as 0.
type SpreadConstraint struct {
	Term       string
	MaxSkew    int
	MinDomains int
}
