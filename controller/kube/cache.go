package kube

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// cycleIndex remembers, for one cycle, which Kubernetes objects stand behind
// the core's names, so decisions can be committed.
type cycleIndex struct {
	pods map[string]*podRef // by core pod name (namespace/name)
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
	pods  []string
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

// podEntry caches a pod's translation; it is reused while the pod and its
// claims are unchanged, so a cycle does not re-translate a large cluster.
type podEntry struct {
	podRV    string
	claimRVs string
	claims   []*resourceapi.ResourceClaim
	req      core.Request
	alts     []core.Request
	choices  []subrequestChoice
	err      error
	tessera  bool
	// dp: the pod asks for GPUs through the device plugin (assign.go).
	dp bool
}

func (s *Scheduler) translatePod(pod *v1.Pod) *podEntry {
	claims, err := podClaims(pod, s.getClaim)
	var rvs strings.Builder
	for _, c := range claims {
		rvs.WriteString(c.ResourceVersion)
		rvs.WriteByte(',')
	}
	if e, ok := s.podCache[pod.UID]; ok && e.podRV == pod.ResourceVersion && e.claimRVs == rvs.String() && err == nil && e.err == nil {
		return e
	}
	e := &podEntry{podRV: pod.ResourceVersion, claimRVs: rvs.String(), claims: claims, err: err}
	if err == nil {
		gr, gerr := podGPURequest(claims, s.getClass)
		e.req, e.err, e.tessera, e.alts, e.choices = gr.req, gerr, gr.tessera, gr.alts, gr.choices
		var rerr error
		e.req.CPU, e.req.Memory, e.req.Other, rerr = podResources(pod)
		if e.err == nil {
			e.err = rerr
		}
		if e.err == nil {
			// The device-plugin path: extended resources and the fraction
			// annotations. Other keeps the extended resources, so the
			// node must also advertise them (tessera-node's device plugin).
			dreq, dp, derr := devicePluginRequest(pod.Annotations, e.req.Other, s.opts.GPUResource, gr.tessera)
			if dp {
				e.dp, e.err = true, derr
				e.req.GPUs, e.req.GPUMilli, e.req.GPUMemory, e.req.Sharing = dreq.GPUs, dreq.GPUMilli, dreq.GPUMemory, dreq.Sharing
			}
		}
	}
	s.podCache[pod.UID] = e
	return e
}

// buildSnapshot turns the informers' caches into the core's snapshot.
func (s *Scheduler) buildSnapshot(now time.Time) (*core.Snapshot, *cycleIndex, error) {
	idx := &cycleIndex{
		pods:   map[string]*podRef{},
		nodes:  map[string]*v1.Node{},
		gpus:   map[string]*nodeGPUs{},
		jobs:   map[string]*jobRef{},
		queues: map[string]*schedv1.Queue{},
	}
	snap := &core.Snapshot{Now: now}

	// Queues: the objects, an implicit default, and the external queue.
	queueObjs, badQueues := s.listQueues()
	idx.badQueues = badQueues
	children := map[string]int{}
	converted := map[string]core.Queue{}
	for _, q := range queueObjs {
		idx.queues[q.Name] = q
		children[q.Spec.Parent]++
		cq, err := queueFromObject(q)
		if err != nil && idx.badQueues[q.Name] == "" {
			idx.badQueues[q.Name] = err.Error()
		}
		converted[q.Name] = cq
	}
	for _, q := range queueObjs {
		if q.Spec.Parent != "" && idx.queues[q.Spec.Parent] == nil || idx.queueProblem(q.Name) != "" {
			// The CRD cannot check this; the core would leave the orphan
			// or the invalid queue out with a less telling reason, so it
			// is left out here and its pods wait with the adapter's.
			continue
		}
		snap.Queues = append(snap.Queues, converted[q.Name])
	}
	if idx.queues[DefaultQueue] == nil {
		snap.Queues = append(snap.Queues, core.NewQueue(DefaultQueue, ""))
	}
	ext := core.NewQueue(externalQueue, "")
	for r := range ext.Resources {
		ext.Resources[r] = core.QueueResource{Quota: core.Unlimited, Limit: core.Unlimited}
	}
	snap.Queues = append(snap.Queues, ext)
	leaf := func(name string) (bool, string) {
		if name == DefaultQueue && idx.queues[name] == nil {
			return true, ""
		}
		q := idx.queues[name]
		if q == nil {
			return false, fmt.Sprintf("queue %s does not exist", name)
		}
		if q.Spec.Parent != "" && idx.queues[q.Spec.Parent] == nil {
			return false, fmt.Sprintf("queue %s has parent %s, which does not exist", name, q.Spec.Parent)
		}
		if why := idx.queueProblem(name); why != "" {
			return false, fmt.Sprintf("queue %s cannot be used: %s", name, why)
		}
		if children[name] > 0 {
			return false, fmt.Sprintf("queue %s is a parent queue; only leaf queues hold workloads", name)
		}
		return true, ""
	}

	// Nodes and their GPUs.
	nodes, err := s.nodeLister.List(everything)
	if err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	s.refreshGPUs()
	for _, n := range nodes {
		idx.nodes[n.Name] = n
		g := s.gpuCache[n.Name]
		idx.gpus[n.Name] = g
		cn := core.Node{
			Name:          n.Name,
			Labels:        n.Labels,
			CPU:           nodeAmount(n.Status.Allocatable, v1.ResourceCPU),
			Memory:        nodeAmount(n.Status.Allocatable, v1.ResourceMemory),
			Unschedulable: n.Spec.Unschedulable || !nodeReady(n),
			Other:         nodeOther(n),
		}
		if g != nil {
			cn.GPUs = g.gpus
			idx.taintedGPUs = idx.taintedGPUs || len(g.tainted) > 0
		}
		for _, t := range n.Spec.Taints {
			switch t.Effect {
			case v1.TaintEffectNoSchedule, v1.TaintEffectNoExecute:
				idx.taintedNodes = true
			case v1.TaintEffectPreferNoSchedule:
				idx.preferNoSchedule = true
			}
		}
		snap.Nodes = append(snap.Nodes, cn)
	}

	if idx.claims, err = s.claimLister.List(everything); err != nil {
		return nil, nil, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	poolNode := map[string]string{}
	for name, g := range idx.gpus {
		if g != nil {
			poolNode[g.pool] = name
		}
	}
	// attributed: the allocated claims whose devices a pod in the snapshot
	// accounts for; the others are added as external usage at the end.
	attributed := map[types.UID]bool{}
	// assigned: the GPUs (by node, then index) that bound pods' assignments
	// account for; device-plugin taints on others are external usage.
	assigned := map[string]map[int]bool{}

	// Pods, grouped into jobs.
	pods, err := s.podLister.List(everything)
	if err != nil {
		return nil, nil, fmt.Errorf("listing pods: %w", err)
	}
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	// Required pod (anti-)affinity and spread: every term of the pods in
	// the snapshot, so each pod can be told which terms select it.
	terms, termsOf := collectTerms(pods, s.namespaceLabels)
	snap.PodTerms = terms.topologies()
	jobs := map[string]*core.Job{}
	var jobOrder []string
	seen := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		seen[pod.UID] = true
		if !considered(pod) {
			continue
		}
		ours := pod.Spec.SchedulerName == SchedulerName
		bound := pod.Spec.NodeName != ""
		if bound && idx.nodes[pod.Spec.NodeName] == nil {
			continue // its node is gone; nothing to account for
		}
		key := pod.Namespace + "/" + pod.Name
		if !bound {
			if why := s.waitingForVictims(key, pod, now); why != "" {
				idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: why})
				idx.pods[key] = &podRef{pod: pod}
				continue
			}
		}
		e := s.translatePod(pod)
		nodeName := pod.Spec.NodeName
		adopted := false
		if !bound && ours {
			if node := heldNode(e.claims, poolNode); node != "" && idx.nodes[node] != nil {
				adopted, bound, nodeName = true, true, node
			}
		}
		if !bound && e.err != nil {
			idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: e.err.Error()})
			idx.pods[key] = &podRef{pod: pod}
			continue
		}
		cp := core.Pod{Name: key, Request: s.withCSIVolumes(pod, e.req), NodeSelector: pod.Spec.NodeSelector, Phase: core.PodPending}
		if snap.PodTerms != nil {
			own := termsOf[pod.UID]
			if own.err != nil && !bound {
				idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: own.err.Error()})
				idx.pods[key] = &podRef{pod: pod}
				continue
			}
			// Every placed pod pulls on others, whoever scheduled it.
			cp.Matches, cp.Avoids, cp.Needs, cp.Spread, cp.Attracts = terms.matches(pod), own.avoids, own.needs, own.spread, own.attracts
			if ours {
				cp.Prefers = own.prefers
			}
		}
		if ours {
			f, err := s.feasibility(pod, e.claims, idx, "")
			switch {
			case err != nil && !bound:
				idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: err.Error()})
				idx.pods[key] = &podRef{pod: pod}
				continue
			case err == nil:
				cp.Feasible = f
			}
			if !bound && e.choices != nil {
				if cp.Alternatives, err = s.alternatives(pod, e, idx); err != nil {
					idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: err.Error()})
					idx.pods[key] = &podRef{pod: pod}
					continue
				}
			}
			cp.NodeScore = nodePreference(pod, idx)
			// Consolidation moves a pod by evicting it; only a pod that a
			// controller recreates can be moved.
			cp.Pinned = metav1.GetControllerOf(pod) == nil
		}
		if bound {
			cp.Phase = core.PodBound
			if pod.Status.Phase == v1.PodRunning {
				cp.Phase = core.PodRunning
			}
			if pod.DeletionTimestamp != nil {
				cp.Phase = core.PodReleasing
			}
			cp.Placement = allocatedPlacement(nodeName, e.claims, idx.gpus[nodeName])
			// A device-plugin pod holds what its node records, else what
			// its (trusted) assignment says.
			if pl, ok := s.boundDevicePluginPlacement(pod, e, nodeName, idx.gpus[nodeName]); ok && !adopted {
				cp.Placement = mergePlacements(cp.Placement, pl)
				if assigned[nodeName] == nil {
					assigned[nodeName] = map[int]bool{}
				}
				for _, g := range pl.GPUs {
					assigned[nodeName][g] = true
				}
			}
			for _, c := range e.claims {
				attributed[c.UID] = true
			}
			if adopted {
				// Bound by the commit; the core sees it where its claims are.
				cp.Phase = core.PodBound
				idx.adopt = append(idx.adopt, adoptee{pod: key, node: nodeName})
			}
			holdPlacement(&cp)
		}
		jobName, job, reason := s.jobFor(pod, ours, leaf)
		if reason != "" {
			if bound {
				// Running but unschedulable by the rules now (queue deleted):
				// keep accounting for it outside the queue tree.
				jobName, job, reason = "<external>/"+key, s.externalJob(pod, key), ""
			} else {
				idx.problems = append(idx.problems, core.PendingPod{Pod: key, Reason: reason})
				idx.pods[key] = &podRef{pod: pod}
				continue
			}
		}
		if jobs[jobName] == nil {
			jobs[jobName] = job
			jobOrder = append(jobOrder, jobName)
			ref := &jobRef{}
			if name := pod.Annotations[AnnotationPodGroup]; name != "" && ours {
				ref.group, _ = s.getPodGroup(pod.Namespace, name)
			}
			idx.jobs[jobName] = ref
		}
		jobs[jobName].Pods = append(jobs[jobName].Pods, cp)
		idx.jobs[jobName].pods = append(idx.jobs[jobName].pods, key)
		idx.pods[key] = &podRef{pod: pod, claims: e.claims, job: jobName, dp: e.dp, req: e.req, choices: e.choices}
	}
	for uid := range s.podCache {
		if !seen[uid] {
			delete(s.podCache, uid)
		}
	}
	for uid := range s.malformed {
		if !seen[uid] {
			delete(s.malformed, uid)
		}
	}
	// Allocated claims that no pod above accounts for (reserved for a pod
	// that is pending with other claims still to allocate, or for nobody)
	// still hold their devices, and the commit's allocator knows it: the
	// core must not offer those GPUs either, or it would keep choosing a GPU
	// the allocator refuses.
	s.addUnattributedClaims(idx, attributed, poolNode, jobs, &jobOrder)
	addDevicePluginHeld(idx, assigned, jobs, &jobOrder)
	addHostPorts(snap, jobs)
	s.addAttachLimits(snap, jobs)
	jobOrder = holdIncompleteGangs(idx, jobs, jobOrder)
	for _, name := range jobOrder {
		j := jobs[name]
		if since, ok := s.belowSince[name]; ok {
			j.BelowMinMemberSince = since
		}
		snap.Jobs = append(snap.Jobs, *j)
	}
	return snap, idx, nil
}

// alternatives are the core's Pod.Alternatives of a pod whose claims ask
// for GPUs with a prioritized list: each subrequest after the first, with
// the feasibility check of its own selectors.
func (s *Scheduler) alternatives(pod *v1.Pod, e *podEntry, idx *cycleIndex) ([]core.Alternative, error) {
	var out []core.Alternative
	for i, r := range e.alts {
		ch := e.choices[i+1]
		f, err := s.feasibility(pod, e.claims, idx, ch.subrequest)
		if err != nil {
			return nil, fmt.Errorf("claim %s request %q subrequest %q: %w", ch.claim, ch.request, ch.subrequest, err)
		}
		out = append(out, core.Alternative{Request: r, Feasible: f})
	}
	return out, nil
}

// waitingForVictims says why a nominated pod is left out of this cycle ("" if
// it is not): some of the pods evicted to make room for it still hold their
// capacity. Victims that are gone, a deadline passed, or a recreated pod end
// the nomination.
func (s *Scheduler) waitingForVictims(key string, pod *v1.Pod, now time.Time) string {
	n, ok := s.nominated[key]
	if !ok {
		return ""
	}
	if n.uid != pod.UID || now.After(n.until) {
		delete(s.nominated, key)
		return ""
	}
	left := 0
	for _, v := range n.victims {
		ns, name, _ := strings.Cut(v, "/")
		if p, err := s.podLister.Pods(ns).Get(name); err == nil && p.Spec.NodeName == n.node && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			left++
		}
	}
	if left == 0 {
		delete(s.nominated, key)
		return ""
	}
	return fmt.Sprintf("nominated to node %s; waiting for %d evicted pod(s) to terminate", n.node, left)
}

// jobFor works out a pod's job: its PodGroup's, or a gang of one. reason is
// set when the pod cannot be scheduled by the rules (unknown queue, a parent
// queue, a missing PodGroup).
func (s *Scheduler) jobFor(pod *v1.Pod, ours bool, leaf func(string) (bool, string)) (string, *core.Job, string) {
	key := pod.Namespace + "/" + pod.Name
	if !ours {
		return "<external>/" + key, s.externalJob(pod, key), ""
	}
	queue := pod.Labels[LabelQueue]
	if queue == "" {
		queue = DefaultQueue
	}
	prio := int32(0)
	if pod.Spec.Priority != nil {
		prio = *pod.Spec.Priority
	}
	job := &core.Job{Name: key, Queue: queue, Priority: prio, CreatedAt: pod.CreationTimestamp.Time,
		// Admission copies the PriorityClass's preemptionPolicy to the pod.
		NeverEvicts: pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever}
	if name := pod.Annotations[AnnotationPodGroup]; name != "" {
		pg, err := s.getPodGroup(pod.Namespace, name)
		switch {
		case err != nil:
			return "", nil, err.Error()
		case pg == nil:
			return "", nil, fmt.Sprintf("PodGroup %s/%s does not exist", pod.Namespace, name)
		}
		spec, err := podGroupSpec(pg)
		if err != nil {
			return "", nil, err.Error()
		}
		job.Name = pod.Namespace + "/" + name
		job.MinMember = spec.minMember
		job.CreatedAt = pg.CreationTimestamp.Time
		if spec.queue != "" {
			queue = spec.queue
			job.Queue = queue
		}
		if pg.Spec.PriorityClassName != "" {
			pc, err := s.priorityLister.Get(pg.Spec.PriorityClassName)
			if err != nil {
				return "", nil, fmt.Sprintf("PodGroup %s/%s: PriorityClass %s not found", pod.Namespace, name, pg.Spec.PriorityClassName)
			}
			job.Priority = pc.Value
			job.NeverEvicts = pc.PreemptionPolicy != nil && *pc.PreemptionPolicy == v1.PreemptNever
		}
	}
	if ok, why := leaf(queue); !ok {
		return "", nil, why
	}
	job.Preemptible = job.Priority < 100
	if v, ok := pod.Annotations[AnnotationPreemptible]; ok {
		if b, err := strconv.ParseBool(v); err == nil {
			job.Preemptible = b
		}
	}
	if s.pdbBlocked[key] {
		// A PodDisruptionBudget refused its eviction recently: pick others.
		job.Preemptible = false
	}
	return job.Name, job, ""
}

// externalJob accounts for a pod Tessera does not schedule: it holds its
// node's capacity, is never a victim and never moves.
func (s *Scheduler) externalJob(pod *v1.Pod, key string) *core.Job {
	return &core.Job{Name: "<external>/" + key, Queue: externalQueue, Priority: 1 << 30, CreatedAt: pod.CreationTimestamp.Time}
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
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

// stillHeld says whether an allocated claim keeps its devices: it is
// reserved for a pod that exists and has not ended, or for nobody (an
// allocated claim that was never reserved stays allocated; nothing
// deallocates it). A claim reserved only for pods that are gone (victims of
// an eviction, say) is about to be deallocated by kube-controller-manager,
// which deallocates on the last consumer's removal: counting it as held
// would make the core evict more for room that is coming anyway.
func stillHeld(c *resourceapi.ResourceClaim, pods corelisters.PodLister) bool {
	if len(c.Status.ReservedFor) == 0 {
		return true
	}
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		p, err := pods.Pods(c.Namespace).Get(r.Name)
		if err == nil && p.UID == r.UID && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			return true
		}
	}
	return false
}

// holdPlacement makes a placed pod's GPU request what its claims hold,
// whatever the pod asked: one fraction, or whole GPUs.
func holdPlacement(cp *core.Pod) {
	cp.Request.GPUs, cp.Request.GPUMemory, cp.Request.GPUMilli = 0, 0, 0
	if cp.Placement.Sharing != "" && len(cp.Placement.GPUs) == 1 {
		cp.Request.GPUMemory = cp.Placement.GPUMemory[0]
		cp.Request.Sharing = cp.Placement.Sharing
	} else {
		cp.Request.GPUs = len(cp.Placement.GPUs)
		cp.Placement.Sharing = ""
	}
}

// heldNode is the node on which all of a pod's claims are allocated, when
// they all are (and at least one holds a Tessera GPU); "" otherwise.
func heldNode(claims []*resourceapi.ResourceClaim, poolNode map[string]string) string {
	node := ""
	for _, c := range claims {
		a := c.Status.Allocation
		if a == nil {
			return ""
		}
		for _, r := range a.Devices.Results {
			if r.Driver != DriverName {
				continue
			}
			n := poolNode[r.Pool]
			if n == "" || (node != "" && n != node) {
				return ""
			}
			node = n
		}
	}
	return node
}

// addUnattributedClaims adds, for each allocated claim that still holds
// Tessera GPUs (stillHeld) and that no pod of the snapshot accounts for, a
// bound pod of the external queue holding those GPUs.
func (s *Scheduler) addUnattributedClaims(idx *cycleIndex, attributed map[types.UID]bool, poolNode map[string]string, jobs map[string]*core.Job, jobOrder *[]string) {
	var held []*resourceapi.ResourceClaim
	for _, c := range idx.claims {
		if c.Status.Allocation == nil || attributed[c.UID] {
			continue
		}
		if stillHeld(c, s.podLister) {
			held = append(held, c)
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == DriverName {
				if idx.releasing == nil {
					idx.releasing = map[string]string{}
				}
				idx.releasing[r.Pool+"/"+r.Device] = c.Namespace + "/" + c.Name
			}
		}
	}
	// Few, usually none: sorted for a deterministic job order.
	sort.Slice(held, func(i, j int) bool {
		if held[i].Namespace != held[j].Namespace {
			return held[i].Namespace < held[j].Namespace
		}
		return held[i].Name < held[j].Name
	})
	for _, c := range held {
		node := heldNode([]*resourceapi.ResourceClaim{c}, poolNode)
		if node == "" {
			continue
		}
		pl := allocatedPlacement(node, []*resourceapi.ResourceClaim{c}, idx.gpus[node])
		if len(pl.GPUs) == 0 {
			continue
		}
		addExternalHolder(idx, jobs, jobOrder, "<claim>/"+c.Namespace+"/"+c.Name, pl, c.CreationTimestamp.Time)
	}
}

// addExternalHolder adds a bound, pinned pod named key of the external
// queue, holding pl: capacity that something Tessera does not schedule holds.
func addExternalHolder(idx *cycleIndex, jobs map[string]*core.Job, jobOrder *[]string, key string, pl core.Placement, created time.Time) {
	cp := core.Pod{Name: key, Phase: core.PodBound, Placement: pl, Pinned: true}
	holdPlacement(&cp)
	name := "<external>/" + key
	jobs[name] = &core.Job{Name: name, Queue: externalQueue, Priority: 1 << 30, CreatedAt: created, Pods: []core.Pod{cp}}
	*jobOrder = append(*jobOrder, name)
	idx.jobs[name] = &jobRef{pods: []string{key}}
}

// addDevicePluginHeld adds, for each node whose slice taints GPUs as held by
// the device plugin (draname.TaintDevicePlugin) that no bound pod's assignment
// accounts for, a bound pod of the external queue holding those GPUs whole.
// Such a GPU is held by a pod another scheduler bound with nvidia.com/gpu
// (it has no assignment), or by a pod gone from the cache whose release
// the node has not published yet. A "shared" GPU without a known holder is
// counted whole too: its holder's sharing mode and memory are unknown, and
// a share always has an assignment, so this lasts only until the node
// publishes the release (or the controller sees the pod).
func addDevicePluginHeld(idx *cycleIndex, assigned map[string]map[int]bool, jobs map[string]*core.Job, jobOrder *[]string) {
	nodes := make([]string, 0, len(idx.gpus))
	for name, g := range idx.gpus {
		if g != nil && len(g.dpHeld) > 0 {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		g := idx.gpus[node]
		pl := core.Placement{Node: node}
		for _, gp := range g.gpus {
			dev := draname.DeviceName(gp.Index)
			if _, held := g.dpHeld[dev]; !held || assigned[node][gp.Index] {
				continue
			}
			pl.GPUs = append(pl.GPUs, gp.Index)
			pl.GPUMemory = append(pl.GPUMemory, gp.Memory)
			pl.GPUMilli = append(pl.GPUMilli, 1000)
		}
		if len(pl.GPUs) == 0 {
			continue
		}
		addExternalHolder(idx, jobs, jobOrder, "<device-plugin>/"+node, pl, time.Time{})
	}
}

// addHostPorts gives every node one of each host port a pod asks for (see
// hostPortPrefix).
func addHostPorts(snap *core.Snapshot, jobs map[string]*core.Job) {
	ports := map[string]bool{}
	for _, j := range jobs {
		for i := range j.Pods {
			for name := range j.Pods[i].Request.Other {
				if strings.HasPrefix(name, hostPortPrefix) {
					ports[name] = true
				}
			}
		}
	}
	for i := range snap.Nodes {
		for port := range ports {
			if snap.Nodes[i].Other == nil {
				snap.Nodes[i].Other = map[string]int64{}
			}
			snap.Nodes[i].Other[port] = 1
		}
	}
}

// namespaceLabels returns a namespace's labels, nil when it is not known.
func (s *Scheduler) namespaceLabels(name string) map[string]string {
	ns, err := s.namespaceLister.Get(name)
	if err != nil {
		return nil
	}
	return ns.Labels
}

// considered says whether a pod goes into the snapshot: not finished, and
// either bound somewhere or ours and waiting. A pod with scheduling gates
// waits for whoever set them (Kueue, for one) and is not ours to place yet:
// the API server marks it SchedulingGated and would refuse its binding, so
// allocating its claims would only hold devices for nothing.
func considered(pod *v1.Pod) bool {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return false
	}
	return pod.Spec.NodeName != "" || pod.Spec.SchedulerName == SchedulerName && pod.DeletionTimestamp == nil && len(pod.Spec.SchedulingGates) == 0
}
