package soak

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// queueUse is what one queue's subtree holds, in GPUs.
type queueUse struct {
	all, nonPreemptible float64
	// shares counts the fractions summed: the core rounds each GPU's
	// memory fractions to milli-GPUs once, so each may be off by 1/1000.
	shares int
	pods   []string
}

// checkQueues checks every queue's GPU limit, and its quota against the
// GPUs of its non-preemptible pods. A pod holds what its allocated claims
// hold (bound or not: a claim allocated for a pod about to be bound holds
// its GPUs) and, once placed, what its assignment says; terminating pods
// still hold theirs.
func checkQueues(s *State, idx *index) []Violation {
	parent := map[string]string{}
	for _, q := range s.Queues {
		parent[q.Name] = q.Spec.Parent
	}
	use := map[string]*queueUse{}
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Spec.SchedulerName != kube.SchedulerName || podFinished(p) {
			continue
		}
		gpus, shares := podGPUs(p, idx)
		if gpus == 0 {
			continue
		}
		np := !preemptible(s, p)
		// Walk up the tree; a cycle in the parents cannot loop forever.
		for q, depth := queueOf(s, p), 0; q != "" && depth < 32; q, depth = parent[q], depth+1 {
			u := use[q]
			if u == nil {
				u = &queueUse{}
				use[q] = u
			}
			u.all += gpus
			u.shares += shares
			if np {
				u.nonPreemptible += gpus
			}
			u.pods = append(u.pods, fmt.Sprintf("pod %s/%s", p.Namespace, p.Name))
		}
	}
	var out []Violation
	for _, q := range s.Queues {
		u := use[q.Name]
		if u == nil || q.Spec.Resources.GPU == nil {
			continue
		}
		tol := float64(u.shares)/1000 + 1e-9
		objs := append([]string{"queue " + q.Name}, u.pods...)
		if lim, ok := bound(q.Spec.Resources.GPU.Limit); ok && u.all > lim+tol {
			out = append(out, Violation{InvQueueLimit, objs, fmt.Sprintf("queue %s holds %.3f GPUs, limit %v", q.Name, u.all, lim)})
		}
		quota, ok := bound(q.Spec.Resources.GPU.Quota)
		if q.Spec.Resources.GPU.Quota == nil {
			quota, ok = 0, true // DESIGN.md: the GPU quota defaults to 0
		}
		if ok && u.nonPreemptible > quota+tol {
			out = append(out, Violation{InvQueueQuota, objs, fmt.Sprintf("queue %s: non-preemptible pods hold %.3f GPUs, quota %v", q.Name, u.nonPreemptible, quota)})
		}
	}
	return out
}

// bound reads a quota or limit; false when it does not bound (-1, unset).
func bound(q *resource.Quantity) (float64, bool) {
	if q == nil || q.Sign() < 0 {
		return 0, false
	}
	return q.AsApproximateFloat64(), true
}

// podGPUs returns the GPUs a pod holds (a share counts its memory over its
// GPU's), and how many of them are shares.
func podGPUs(p *corev1.Pod, idx *index) (gpus float64, shares int) {
	add := func(key, mode string, memory int64) {
		if mode == modeExclusive {
			gpus++
			return
		}
		if d, ok := idx.devices[key]; ok && d.memory > 0 {
			gpus += float64(memory) / float64(d.memory)
			shares++
		}
	}
	for _, name := range podClaimNames(p) {
		cl := idx.claims[name]
		if cl == nil || cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			mode := claimMode(cl, r.Request)
			mem := r.ConsumedCapacity[draname.CapacityMemory]
			add(r.Pool+"/"+r.Device, mode, mem.Value())
		}
	}
	if p.Spec.NodeName == "" {
		return gpus, shares
	}
	if a, ok, err := assignment.Of(p.Annotations); ok && err == nil {
		for _, g := range a.GPUs {
			mode := modeExclusive
			if a.IsShare() {
				mode = a.Sharing
			}
			add(idx.byNode[p.Spec.NodeName][g], mode, a.MemoryBytes)
		}
	}
	return gpus, shares
}

// queueOf is a pod's leaf queue: its PodGroup's, else its label's, else
// the default queue.
func queueOf(s *State, p *corev1.Pod) string {
	if pg := podGroupOf(s, p); pg != nil && pg.Spec.Queue != "" {
		return pg.Spec.Queue
	}
	if q := p.Labels[kube.LabelQueue]; q != "" {
		return q
	}
	return kube.DefaultQueue
}

func podGroupOf(s *State, p *corev1.Pod) *schedv1.PodGroup {
	name := p.Annotations[kube.AnnotationPodGroup]
	if name == "" {
		return nil
	}
	for i := range s.PodGroups {
		if pg := &s.PodGroups[i]; pg.Namespace == p.Namespace && pg.Name == name {
			return pg
		}
	}
	return nil
}

// preemptible is whether a pod's job is preemptible, as DESIGN.md says:
// priority (the PodGroup's PriorityClass for a gang, else the pod's) below
// 100, unless the pod's annotation says otherwise.
func preemptible(s *State, p *corev1.Pod) bool {
	prio := int32(0)
	if p.Spec.Priority != nil {
		prio = *p.Spec.Priority
	}
	if pg := podGroupOf(s, p); pg != nil && pg.Spec.PriorityClassName != "" {
		for _, pc := range s.PriorityClasses {
			if pc.Name == pg.Spec.PriorityClassName {
				prio = pc.Value
			}
		}
	}
	if v, ok := p.Annotations[kube.AnnotationPreemptible]; ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return prio < 100
}
