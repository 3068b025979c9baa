package kube

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// cycleIndex remembers, for one cycle, which Kubernetes objects stand behind
// the core's names, so decisions can be committed.
type cycleIndex struct {
	pods map[string]*podRef // by core pod name (namespace/name)
	// nextWindow is the next boundary of any Queue's schedule (zero:
	// none): the scheduler runs a cycle then, whatever its interval.
	nextWindow time.Time
	// nodes by name, with their Tessera GPUs.
	nodes map[string]*v1.Node
	gpus  map[string]*nodeGPUs
	// problems are pods Tessera cannot consider at all, with the reason
	// (unknown queue, bad claim); they are reported as pending.
	problems []core.PendingPod
	// jobs by core job name.
	jobs map[string]*jobRef
	// queues holds the names of the Queue objects (not the implicit ones).
	queues map[string]*schedv1.Queue
	// badQueues maps the Queues that cannot be read (queueFromObject) to
	// the reason; they and their descendants are left out.
	badQueues map[string]string
	// taintedNodes and taintedGPUs say whether any node or GPU has a
	// scheduling taint, so pods need a feasibility check at all.
	taintedNodes, taintedGPUs bool
	// preferNoSchedule says whether any node has a PreferNoSchedule taint,
	// so pods need a node preference (nodePreference) for it.
	preferNoSchedule bool
	// claims are all ResourceClaims at the cycle's start, listed once.
	claims []*resourceapi.ResourceClaim
	// allocated is what claims hold at the cycle's start, computed on
	// first use.
	allocated *structured.AllocatedState
	// adopt lists unbound pods of ours whose claims are all allocated
	// already (a scheduler died between allocating and binding): the
	// snapshot counts them as bound on their claims' node, and the commit
	// binds them there.
	adopt []adoptee
	// releasing maps Tessera devices ("pool/gpu-3") still allocated to a
	// claim whose pods are all gone to that claim ("ns/name"). The core
	// is not told of them (kube-controller-manager is deallocating them;
	// counting them made it evict for room about to free), so it may
	// place a pod there; the commit then waits for the release instead of
	// failing the bind.
	releasing map[string]string
}

type adoptee struct {
	pod  string // core pod name
	node string
}

type podRef struct {
	pod    *v1.Pod
	claims []*resourceapi.ResourceClaim
	job    string
	// dp marks a device-plugin pod (extended resources, fraction
	// annotations): its bind writes the assignment annotation first; req
	// is its request.
	dp  bool
	req core.Request
	// choices name the firstAvailable subrequest of each of the core's
	// requests for the pod (podGPURequest); nil without one.
	choices []subrequestChoice
}

type jobRef struct {
	group *schedv1.PodGroup // nil for a pod without a PodGroup
	// upstream is the job's scheduling.k8s.io PodGroup (upstream.go).
	upstream *schedulingv1beta1.PodGroup
	pods     []string
}

// groupName names the job's PodGroup of either API for people, "" for none.
func (r *jobRef) groupName() string {
	switch {
	case r.upstream != nil:
		return fmt.Sprintf("PodGroup %s/%s (scheduling.k8s.io)", r.upstream.Namespace, r.upstream.Name)
	case r.group != nil:
		return fmt.Sprintf("PodGroup %s/%s", r.group.Namespace, r.group.Name)
	}
	return ""
}

// allocatedState is what claims hold at the cycle's start, listed once per
// cycle whether feasibility checks or the commit need it first. The commit
// adds its own allocations to it as it goes.
func (idx *cycleIndex) allocatedState(s *Scheduler) *structured.AllocatedState {
	if idx.allocated == nil {
		idx.allocated = allocatedState(idx.claims)
	}
	return idx.allocated
}

// buildSnapshot turns the informers' caches into the core's snapshot, in
// named steps: queues, nodes and their GPUs, claims, pods grouped into jobs,
// then what holds capacity without a pod of the snapshot to show for it.
func (s *Scheduler) buildSnapshot(ctx context.Context, now time.Time) (*core.Snapshot, *cycleIndex, error) {
	b := &snapshotBuild{
		s:      s,
		logger: klog.FromContext(ctx),
		now:    now,
		idx: &cycleIndex{
			pods:   map[string]*podRef{},
			nodes:  map[string]*v1.Node{},
			gpus:   map[string]*nodeGPUs{},
			jobs:   map[string]*jobRef{},
			queues: map[string]*schedv1.Queue{},
		},
		snap:       &core.Snapshot{Now: now},
		children:   map[string]int{},
		poolNode:   map[string]string{},
		attributed: map[types.UID]bool{},
		assigned:   map[string]map[int]bool{},
		jobs:       map[string]*core.Job{},
	}
	b.readQueues()
	b.readTopologies()
	if err := b.readNodes(); err != nil {
		return nil, nil, err
	}
	if err := b.readClaims(); err != nil {
		return nil, nil, err
	}
	if err := b.readPods(); err != nil {
		return nil, nil, err
	}
	b.addHolders()
	return b.snap, b.idx, nil
}

// snapshotBuild is one cycle's reading of the cluster: the snapshot and
// index being built and what the steps pass on to each other.
type snapshotBuild struct {
	s *Scheduler
	// logger is the cycle's: what the reading finds wrong is logged, not
	// failed on.
	logger klog.Logger
	now    time.Time
	idx    *cycleIndex
	snap   *core.Snapshot
	// children counts the child queues of each queue: a parent queue holds
	// no workloads.
	children map[string]int
	// poolNode maps a Tessera pool to its node.
	poolNode map[string]string
	// attributed: the allocated claims whose devices a pod in the snapshot
	// accounts for; the others are added as external usage at the end.
	attributed map[types.UID]bool
	// assigned: the GPUs (by node, then index) that bound pods' assignments
	// account for; device-plugin taints on others are external usage.
	assigned map[string]map[int]bool
	// jobs by core name, in jobOrder.
	jobs     map[string]*core.Job
	jobOrder []string
	// terms are the pod (anti-)affinity and spread terms of every pod in
	// the snapshot; termsOf, each pod's own.
	terms   *podTerms
	termsOf map[types.UID]ownTerms
}

// problem leaves a pod out of the core, pending with reason.
func (b *snapshotBuild) problem(key string, pod *v1.Pod, reason string) {
	b.idx.problems = append(b.idx.problems, core.PendingPod{Pod: key, Reason: reason})
	b.idx.pods[key] = &podRef{pod: pod}
}

// addHolders adds what holds capacity without a pod of the snapshot to show
// for it, the node resources that depend on the pods, and the jobs in order.
func (b *snapshotBuild) addHolders() {
	s, idx := b.s, b.idx
	// Allocated claims that no pod above accounts for (reserved for a pod
	// that is pending with other claims still to allocate, or for nobody)
	// still hold their devices, and the commit's allocator knows it: the
	// core must not offer those GPUs either, or it would keep choosing a GPU
	// the allocator refuses.
	s.addUnattributedClaims(idx, b.attributed, b.poolNode, b.jobs, &b.jobOrder)
	addDevicePluginHeld(idx, b.assigned, b.jobs, &b.jobOrder)
	addHostPorts(b.snap, b.jobs)
	s.addAttachLimits(b.snap, b.jobs)
	b.jobOrder = holdIncompleteGangs(idx, b.jobs, b.jobOrder)
	for _, name := range b.jobOrder {
		j := b.jobs[name]
		if since, ok := s.belowSince[name]; ok {
			j.BelowMinMemberSince = since
		}
		b.snap.Jobs = append(b.snap.Jobs, *j)
	}
}

// fromUnstructured converts a dynamic informer's object to a typed one.
func fromUnstructured[T any](obj any) (*T, error) {
	u, ok := obj.(runtime.Unstructured)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), out); err != nil {
		return nil, err
	}
	return out, nil
}

// namespaceLabels returns a namespace's labels, nil when it is not known.
func (s *Scheduler) namespaceLabels(name string) map[string]string {
	ns, err := s.namespaceLister.Get(name)
	if err != nil {
		return nil
	}
	return ns.Labels
}
