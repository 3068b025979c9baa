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
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/core"
)

// readPods adds every pod the snapshot considers, grouped into jobs, and
// forgets the cached translations of pods that are gone.
func (b *snapshotBuild) readPods() error {
	s := b.s
	pods, err := s.podLister.List(everything)
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	// Required pod (anti-)affinity and spread: every term of the pods in
	// the snapshot, so each pod can be told which terms select it.
	b.terms, b.termsOf = collectTerms(pods, s.namespaceLabels)
	b.snap.PodTerms = b.terms.topologies()
	seen := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		seen[pod.UID] = true
		if considered(pod) {
			b.readPod(pod)
		}
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
	return nil
}

// readPod adds one pod to its job, or to the problems with the reason it
// cannot be considered now.
func (b *snapshotBuild) readPod(pod *v1.Pod) {
	s, idx := b.s, b.idx
	ours := pod.Spec.SchedulerName == SchedulerName
	bound := pod.Spec.NodeName != ""
	if bound && idx.nodes[pod.Spec.NodeName] == nil {
		return // its node is gone; nothing to account for
	}
	key := pod.Namespace + "/" + pod.Name
	if !bound {
		if why := s.waitingForVictims(key, pod, b.now); why != "" {
			b.problem(key, pod, why)
			return
		}
		if why := s.upstreamGroupMissing(pod, ours); why != "" {
			b.problem(key, pod, why)
			return
		}
	}
	e := s.translatePod(pod)
	nodeName := pod.Spec.NodeName
	adopted := false
	if !bound && ours {
		if node := heldNode(e.claims, b.poolNode); node != "" && idx.nodes[node] != nil {
			adopted, bound, nodeName = true, true, node
		}
	}
	if why := s.awaitingGrouper(pod, ours, bound); why != "" {
		b.problem(key, pod, why)
		return
	}
	if !bound && e.err != nil {
		b.problem(key, pod, e.err.Error())
		return
	}
	cp := core.Pod{Name: key, Request: s.withCSIVolumes(pod, e.req), NodeSelector: pod.Spec.NodeSelector, Phase: core.PodPending}
	if ours {
		cp.SubGroup = pod.Annotations[AnnotationPodSubGroup]
	}
	if err := b.podTerms(&cp, pod, ours, bound); err != nil {
		b.problem(key, pod, err.Error())
		return
	}
	if ours {
		if err := b.podChoices(&cp, pod, e, bound); err != nil {
			b.problem(key, pod, err.Error())
			return
		}
	}
	if bound {
		b.placeBound(&cp, pod, e, nodeName, adopted)
		// The queue's minimum runtimes count from the pod's start; a
		// bound pod the kubelet has not started has none (run 0).
		if st := pod.Status.StartTime; st != nil {
			cp.StartedAt = st.Time
		}
	}
	jobName, job, reason := b.jobFor(pod, ours)
	if reason != "" {
		if !bound {
			b.problem(key, pod, reason)
			return
		}
		// Running but unschedulable by the rules now (queue deleted):
		// keep accounting for it outside the queue tree.
		jobName, job = "<external>/"+key, s.externalJob(pod, key)
	}
	b.addToJob(pod, ours, jobName, job, cp)
	idx.pods[key] = &podRef{pod: pod, claims: e.claims, job: jobName, dp: e.dp, req: e.req, choices: e.choices}
}

// podTerms tells a pod which affinity and spread terms select it and gives
// it its own; an error (a term that cannot be read) keeps a pending pod out.
func (b *snapshotBuild) podTerms(cp *core.Pod, pod *v1.Pod, ours, bound bool) error {
	if b.snap.PodTerms == nil {
		return nil
	}
	own := b.termsOf[pod.UID]
	if own.err != nil && !bound {
		return own.err
	}
	// Every placed pod pulls on others, whoever scheduled it.
	cp.Matches, cp.Avoids, cp.Needs, cp.Spread, cp.Attracts = b.terms.matches(pod), own.avoids, own.needs, own.spread, own.attracts
	if ours {
		cp.Prefers = own.prefers
	}
	return nil
}

// podChoices gives one of our pods where it may go: the feasibility check
// (taints, selectors, volumes), the alternatives of a prioritized list, its
// node preferences, and whether it may be moved. An error keeps a pending
// pod out.
func (b *snapshotBuild) podChoices(cp *core.Pod, pod *v1.Pod, e *podEntry, bound bool) error {
	s, idx := b.s, b.idx
	f, err := s.feasibility(pod, e.claims, idx, "")
	switch {
	case err != nil && !bound:
		return err
	case err == nil:
		cp.Feasible = f
	}
	if !bound && e.choices != nil {
		if cp.Alternatives, err = s.alternatives(pod, e, idx); err != nil {
			return err
		}
	}
	cp.NodeScore = nodePreference(pod, idx)
	// Consolidation moves a pod by evicting it; only a pod that a
	// controller recreates can be moved.
	cp.Pinned = metav1.GetControllerOf(pod) == nil
	return nil
}

// placeBound gives a bound (or adopted) pod its phase and what it holds: its
// claims' GPUs and, for a device-plugin pod, what its node records or its
// assignment says.
func (b *snapshotBuild) placeBound(cp *core.Pod, pod *v1.Pod, e *podEntry, nodeName string, adopted bool) {
	s, idx := b.s, b.idx
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
	if pl, ok := s.boundDevicePluginPlacement(b.logger, pod, e, nodeName, idx.gpus[nodeName]); ok && !adopted {
		cp.Placement = mergePlacements(cp.Placement, pl)
		if b.assigned[nodeName] == nil {
			b.assigned[nodeName] = map[int]bool{}
		}
		for _, g := range pl.GPUs {
			b.assigned[nodeName][g] = true
		}
	}
	for _, c := range e.claims {
		b.attributed[c.UID] = true
	}
	if adopted {
		// Bound by the commit; the core sees it where its claims are.
		cp.Phase = core.PodBound
		idx.adopt = append(idx.adopt, adoptee{pod: cp.Name, node: nodeName})
	}
	holdPlacement(cp)
}

// addToJob adds a pod to its job, creating the job (and remembering its
// PodGroup for the status) with its first pod.
func (b *snapshotBuild) addToJob(pod *v1.Pod, ours bool, jobName string, job *core.Job, cp core.Pod) {
	if b.jobs[jobName] == nil {
		b.jobs[jobName] = job
		b.jobOrder = append(b.jobOrder, jobName)
		ref := &jobRef{}
		if name := upstreamGroupName(pod); name != "" && ours {
			ref.upstream, _ = b.s.getUpstreamGroup(pod, name)
		} else if name := pod.Annotations[AnnotationPodGroup]; name != "" && ours {
			ref.group, _ = b.s.getPodGroup(pod.Namespace, name)
		}
		b.idx.jobs[jobName] = ref
	}
	b.jobs[jobName].Pods = append(b.jobs[jobName].Pods, cp)
	b.idx.jobs[jobName].pods = append(b.idx.jobs[jobName].pods, cp.Name)
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
func (b *snapshotBuild) jobFor(pod *v1.Pod, ours bool) (string, *core.Job, string) {
	s := b.s
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
	// spec.schedulingGroup wins over the annotation (upstream.go).
	if name := upstreamGroupName(pod); name != "" {
		if why := s.upstreamJob(pod, name, job, b.upstreamTopology); why != "" {
			return "", nil, why
		}
	} else if name := pod.Annotations[AnnotationPodGroup]; name != "" {
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
		job.SubGroups = spec.subGroups
		job.Topology = spec.topology
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
	if why := podTopology(pod, job); why != "" {
		return "", nil, why
	}
	if ok, why := b.leaf(queue); !ok {
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

// podTopology gives a pod outside any PodGroup the constraint of its
// topology annotations; a malformed one is the pod's reason to wait. A
// group's constraint is its PodGroup's (the pod grouper copies the
// annotations there), so the annotations of its pods are not read.
func podTopology(pod *v1.Pod, job *core.Job) string {
	if upstreamGroupName(pod) != "" || pod.Annotations[AnnotationPodGroup] != "" {
		return ""
	}
	c, err := TopologyFromAnnotations(pod.Annotations)
	if err != nil {
		return fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	job.Topology = constraintOf(c)
	return ""
}

// externalJob accounts for a pod Tessera does not schedule: it holds its
// node's capacity, is never a victim and never moves.
func (s *Scheduler) externalJob(pod *v1.Pod, key string) *core.Job {
	return &core.Job{Name: "<external>/" + key, Queue: externalQueue, Priority: 1 << 30, CreatedAt: pod.CreationTimestamp.Time}
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
