package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// podKind is how a pod asks for GPUs.
type podKind struct {
	name string
	// template is the pod's ResourceClaimTemplate (DRA), or "".
	template string
	// wholeGPUs asks nvidia.com/gpu (device plugin).
	wholeGPUs int64
	// annotations ask a device-plugin share.
	annotations map[string]string
}

// podKinds: whole GPUs and MPS and time-sliced shares, each through DRA
// claims and through the device plugin; a share by memory or by fraction.
var podKinds = []podKind{
	{name: "dra-whole-1", template: "whole-1"},
	{name: "dra-whole-2", template: "whole-2"},
	{name: "dra-mps-10Gi", template: "mps-10"},
	{name: "dra-mps-20Gi", template: "mps-20"},
	{name: "dra-ts-10Gi", template: "ts-10"},
	{name: "dra-ts-20Gi", template: "ts-20"},
	{name: "dp-whole-1", wholeGPUs: 1},
	{name: "dp-whole-2", wholeGPUs: 2},
	{name: "dp-mps-20Gi", annotations: map[string]string{assignment.AnnotationGPUMemory: "20Gi", assignment.AnnotationGPUSharing: "mps"}},
	{name: "dp-ts-10Gi", annotations: map[string]string{assignment.AnnotationGPUMemory: "10Gi", assignment.AnnotationGPUSharing: "timeslice"}},
	{name: "dp-mps-0.25", annotations: map[string]string{assignment.AnnotationGPUFraction: "0.25", assignment.AnnotationGPUSharing: "mps"}},
	{name: "dp-ts-0.5", annotations: map[string]string{assignment.AnnotationGPUFraction: "0.5", assignment.AnnotationGPUSharing: "timeslice"}},
}

// gangKinds are the kinds a gang's pods take (all of one kind).
var gangKinds = []string{"dra-whole-1", "dp-whole-1", "dra-mps-20Gi", "dp-mps-20Gi", "dra-ts-10Gi"}

func kindNamed(name string) podKind {
	for _, k := range podKinds {
		if k.name == name {
			return k
		}
	}
	panic("no pod kind " + name)
}

// weighted picks a priority class: mostly preemptible training.
func pickPriority(rng *rand.Rand) string {
	switch r := rng.IntN(100); {
	case r < 65:
		return "tessera-train"
	case r < 85:
		return "tessera-build"
	default:
		return "tessera-inference"
	}
}

// gang is a PodGroup the soak created and the pods it gave it.
type gang struct {
	name string
	pods []string
}

// workload is what the soak created and has not deleted, in creation
// order. Its choices read only its own records, never the cluster, so a
// seed gives the same sequence of operations on every run.
type workload struct {
	seq   int
	pods  []string // standalone pods
	gangs []*gang
}

// maxLivePods bounds the soak's pods (about twice what the GPUs hold), so
// the cluster stays contended without growing without end.
const maxLivePods = 60

func (w *workload) live() int {
	n := len(w.pods)
	for _, g := range w.gangs {
		n += len(g.pods)
	}
	return n
}

func (w *workload) next(prefix string) string {
	w.seq++
	return fmt.Sprintf("%s-%04d", prefix, w.seq)
}

// podSpec builds a pod of kind for queue at priority class.
func podSpec(ns, name string, k podKind, queue, priorityClass, group string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{kube.LabelQueue: queue, "soak/kind": k.name},
			Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			SchedulerName:                 kube.SchedulerName,
			PriorityClassName:             priorityClass,
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers:                    []corev1.Container{{Name: "main", Image: "busybox"}},
			Tolerations:                   []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists}},
		},
	}
	if group != "" {
		p.Annotations[kube.AnnotationPodGroup] = group
	}
	switch {
	case k.template != "":
		tmpl := k.template
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	case k.wholeGPUs > 0:
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{assignment.DefaultResourceGPU: *resource.NewQuantity(k.wholeGPUs, resource.DecimalSI)}
	default:
		for key, v := range k.annotations {
			p.Annotations[key] = v
		}
		// What the webhook adds (it is not installed here).
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}
	}
	return p
}

// createPod creates one standalone pod of a random kind, queue and class.
func (s *soak) createPod(ctx context.Context) string {
	k := podKinds[s.rng.IntN(len(podKinds))]
	q := leafQueues[s.rng.IntN(len(leafQueues))]
	pc := pickPriority(s.rng)
	name := s.work.next("p")
	s.work.pods = append(s.work.pods, name)
	desc := fmt.Sprintf("create pod %s (%s, queue %s, %s)", name, k.name, q, pc)
	if _, err := s.c.client.CoreV1().Pods(s.c.ns).Create(ctx, podSpec(s.c.ns, name, k, q, pc, ""), metav1.CreateOptions{}); err != nil {
		return s.failed(desc, err)
	}
	s.stats.podsCreated++
	return desc
}

// createGang creates a PodGroup of minMember 2 or 3 and that many pods, or
// one more, all of one kind.
func (s *soak) createGang(ctx context.Context) string {
	k := kindNamed(gangKinds[s.rng.IntN(len(gangKinds))])
	q := leafQueues[s.rng.IntN(len(leafQueues))]
	pc := pickPriority(s.rng)
	minMember := 2 + s.rng.IntN(2)
	size := minMember + s.rng.IntN(2)
	g := &gang{name: s.work.next("g")}
	for i := range size {
		g.pods = append(g.pods, fmt.Sprintf("%s-%d", g.name, i))
	}
	s.work.gangs = append(s.work.gangs, g)
	desc := fmt.Sprintf("create gang %s (minMember %d, %d pods %s, queue %s, %s)", g.name, minMember, size, k.name, q, pc)
	// Pods first, then their PodGroup: until it exists the pods wait
	// ("PodGroup does not exist"), so the controller sees the whole gang
	// at once rather than the pods as they are created.
	for _, name := range g.pods {
		if _, err := s.c.client.CoreV1().Pods(s.c.ns).Create(ctx, podSpec(s.c.ns, name, k, q, pc, g.name), metav1.CreateOptions{}); err != nil {
			return s.failed(desc, err)
		}
		s.stats.podsCreated++
	}
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": g.name, "namespace": s.c.ns},
		"spec":     map[string]any{"minMember": int64(minMember), "queue": q, "priorityClassName": pc},
	}}
	if _, err := s.c.dyn.Resource(kube.PodGroupGVR).Namespace(s.c.ns).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		return s.failed(desc, err)
	}
	s.stats.gangsCreated++
	return desc
}

// deletePod deletes a random standalone pod.
func (s *soak) deletePod(ctx context.Context) string {
	if len(s.work.pods) == 0 {
		return s.createPod(ctx)
	}
	i := s.rng.IntN(len(s.work.pods))
	name := s.work.pods[i]
	s.work.pods = slices.Delete(s.work.pods, i, i+1)
	return s.deletePods(ctx, "delete pod "+name, name)
}

// deleteGangMember deletes one pod of a random gang (the gang may drop
// below minMember: the stale-gang eviction must then take the rest).
func (s *soak) deleteGangMember(ctx context.Context) string {
	if len(s.work.gangs) == 0 {
		return s.createGang(ctx)
	}
	g := s.work.gangs[s.rng.IntN(len(s.work.gangs))]
	if len(g.pods) == 0 {
		return s.deleteGang(ctx)
	}
	i := s.rng.IntN(len(g.pods))
	name := g.pods[i]
	g.pods = slices.Delete(g.pods, i, i+1)
	return s.deletePods(ctx, "delete gang member "+name, name)
}

// deleteGang deletes a random gang: its pods, then its PodGroup.
func (s *soak) deleteGang(ctx context.Context) string {
	if len(s.work.gangs) == 0 {
		return s.createGang(ctx)
	}
	i := s.rng.IntN(len(s.work.gangs))
	g := s.work.gangs[i]
	s.work.gangs = slices.Delete(s.work.gangs, i, i+1)
	desc := s.deletePods(ctx, fmt.Sprintf("delete gang %s (%s)", g.name, strings.Join(g.pods, " ")), g.pods...)
	err := s.c.dyn.Resource(kube.PodGroupGVR).Namespace(s.c.ns).Delete(ctx, g.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return s.failed(desc, err)
	}
	s.stats.gangsDeleted++
	return desc
}

// deletePods deletes pods by name; one already gone (evicted) is fine.
func (s *soak) deletePods(ctx context.Context, desc string, names ...string) string {
	for _, name := range names {
		err := s.c.client.CoreV1().Pods(s.c.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		switch {
		case apierrors.IsNotFound(err):
			s.stats.podsGone++
			desc += " (" + name + " already gone)"
		case err != nil:
			return s.failed(desc, err)
		default:
			s.stats.podsDeleted++
		}
	}
	return desc
}

// failed records an API error of an event: not an invariant, but counted
// and shown in the event log.
func (s *soak) failed(desc string, err error) string {
	s.stats.apiErrors++
	return fmt.Sprintf("%s: FAILED: %v", desc, err)
}

// pause is the time between events.
func (s *soak) pause() time.Duration {
	return time.Duration(200+s.rng.IntN(500)) * time.Millisecond
}
