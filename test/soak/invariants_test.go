package soak

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

const gi = int64(1) << 30

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// gpuSlice is tessera-node's slice of node with n GPUs of memGi each.
func gpuSlice(node string, n int, memGi int64) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver.DriverName, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name:       driver.DeviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{driver.AttrIndex: {IntValue: ptr.To(int64(i))}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{driver.CapacityMemory: {Value: *resource.NewQuantity(memGi*gi, resource.BinarySI)}},
		})
	}
	return s
}

// claimOn is a claim of class allocated on node's GPUs (memGi > 0: a share
// of that much), reserved for the pod of uid (none when empty).
func claimOn(name, class, node string, memGi int64, uid string, gpus ...int) resourceapi.ResourceClaim {
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}
	a := &resourceapi.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	for _, g := range gpus {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver.DriverName, Pool: node, Device: driver.DeviceName(g)}
		mem := memGi
		if mem == 0 {
			mem = 80 // an exclusive claim consumes the whole GPU by default
		}
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{driver.CapacityMemory: *resource.NewQuantity(mem*gi, resource.BinarySI)}
		a.Devices.Results = append(a.Devices.Results, r)
	}
	c.Status.Allocation = a
	if uid != "" {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: uid, UID: types.UID(uid)}}
	}
	return c
}

// podOpt changes a test pod.
type podOpt func(*corev1.Pod)

// testPod is a pod of tessera-scheduler in namespace ns, created at t0.
func testPod(name string, opts ...podOpt) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name),
		CreationTimestamp: metav1.NewTime(t0), Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:   corev1.PodSpec{SchedulerName: kube.SchedulerName, Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func on(node string) podOpt {
	return func(p *corev1.Pod) { p.Spec.NodeName, p.Status.Phase = node, corev1.PodRunning }
}

func withClaim(claim string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("t")})
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: "gpu", ResourceClaimName: ptr.To(claim)})
	}
}

// assigned gives a device-plugin pod its request and assignment (sharing
// "" for whole GPUs).
func assigned(sharing string, memGi int64, gpus ...int) podOpt {
	return func(p *corev1.Pod) {
		a := assignment.Assignment{GPUs: gpus}
		res := corev1.ResourceName(assignment.DefaultResourceGPU)
		q := *resource.NewQuantity(int64(len(gpus)), resource.DecimalSI)
		if sharing != "" {
			a.Sharing, a.MemoryBytes, a.ComputeMilli = sharing, memGi*gi, 250
			res, q = assignment.ResourceShare, resource.MustParse("1")
		}
		p.Annotations[assignment.Annotation] = a.String()
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: q}
	}
}

func annotated(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }
func inQueue(q string) podOpt      { return annotatedLabel(kube.LabelQueue, q) }
func annotatedLabel(k, v string) podOpt {
	return func(p *corev1.Pod) { p.Labels[k] = v }
}
func priority(v int32) podOpt { return func(p *corev1.Pod) { p.Spec.Priority = ptr.To(v) } }
func member(group string) podOpt {
	return annotated(kube.AnnotationPodGroup, group)
}
func reason(msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: msg})
	}
}
func terminating(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.NewTime(t0)) }

func podGroup(name string, minMember int32, queue, pc string) schedv1.PodGroup {
	return schedv1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: schedv1.PodGroupSpec{MinMember: minMember, Queue: queue, PriorityClassName: pc}}
}

// queue is a Queue with a GPU quota and limit ("" leaves one unset).
func queue(name, parent, quota, limit string) schedv1.Queue {
	q := schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: schedv1.QueueSpec{Parent: parent}}
	g := &schedv1.ResourceQuota{}
	if quota != "" {
		g.Quota = ptr.To(resource.MustParse(quota))
	}
	if limit != "" {
		g.Limit = ptr.To(resource.MustParse(limit))
	}
	q.Spec.Resources.GPU = g
	return q
}

// base is the cluster every case starts from: two nodes of 4 × 80Gi GPUs,
// the shipped priority classes, and queue "open" without limit or quota.
func base() *State {
	return &State{At: t0.Add(time.Minute),
		Slices:          []resourceapi.ResourceSlice{gpuSlice("n1", 4, 80), gpuSlice("n2", 4, 80)},
		Queues:          []schedv1.Queue{queue("open", "", "-1", "-1")},
		PriorityClasses: []schedulingv1.PriorityClass{{ObjectMeta: metav1.ObjectMeta{Name: "train"}, Value: 50}, {ObjectMeta: metav1.ObjectMeta{Name: "infer"}, Value: 125}},
	}
}

// TestCheckerCatchesEachViolation builds, for each invariant, an object set
// that breaks it and one just inside it, and checks that the checker names
// exactly the broken invariants.
func TestCheckerCatchesEachViolation(t *testing.T) {
	const mps, ts = assignment.SharingMPS, assignment.SharingTimeSlicing
	tests := []struct {
		name    string
		pods    []corev1.Pod
		claims  []resourceapi.ResourceClaim
		groups  []schedv1.PodGroup
		queues  []schedv1.Queue
		noSlice bool // drop n1's slice (tessera-node restarting)
		want    []string
		objects []string // must appear in the violation
	}{
		{name: "whole GPUs by claim and device plugin, on different GPUs",
			pods:   []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), assigned("", 0, 1, 2))},
			claims: []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.Exclusive, "n1", 0, "a", 0)}},
		{name: "two exclusive claims on one GPU",
			pods:    []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), withClaim("cb"))},
			claims:  []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.Exclusive, "n1", 0, "a", 0), claimOn("cb", deviceclasses.Exclusive, "n1", 0, "b", 0)},
			want:    []string{InvDoubleAllocation, InvOverCapacity},
			objects: []string{"gpu n1/gpu-0", "claim ns/ca", "claim ns/cb"}},
		{name: "device-plugin whole GPU over an MPS claim's share",
			pods:    []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), assigned("", 0, 3))},
			claims:  []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.MPS, "n1", 10, "a", 3)},
			want:    []string{InvDoubleAllocation, InvOverCapacity},
			objects: []string{"gpu n1/gpu-3", "claim ns/ca", "pod ns/b"}},
		{name: "an allocated claim of a pod not bound yet still holds its GPU",
			pods:    []corev1.Pod{testPod("a", withClaim("ca"), reason("binding")), testPod("b", on("n2"), assigned("", 0, 0))},
			claims:  []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.Exclusive, "n2", 0, "", 0)},
			want:    []string{InvDoubleAllocation, InvOverCapacity},
			objects: []string{"gpu n2/gpu-0"}},
		{name: "shares filling a GPU exactly, by claim and device plugin",
			pods: []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), assigned(mps, 40, 2)), testPod("c", on("n1"), withClaim("cc"))},
			claims: []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.MPS, "n1", 20, "a", 2),
				claimOn("cc", deviceclasses.MPS, "n1", 20, "c", 2)}},
		{name: "shares over a GPU's memory",
			pods:    []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), assigned(mps, 60, 2))},
			claims:  []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.MPS, "n1", 30, "a", 2)},
			want:    []string{InvOverCapacity},
			objects: []string{"gpu n1/gpu-2", "claim ns/ca", "pod ns/b"}},
		{name: "over capacity measured on the last known slice while tessera-node restarts",
			pods:    []corev1.Pod{testPod("a", on("n1"), assigned(ts, 50, 1)), testPod("b", on("n1"), assigned(ts, 50, 1))},
			noSlice: true,
			want:    []string{InvOverCapacity}},
		{name: "MPS and time-sliced shares on one GPU",
			pods:    []corev1.Pod{testPod("a", on("n1"), withClaim("ca")), testPod("b", on("n1"), assigned(ts, 10, 0))},
			claims:  []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.MPS, "n1", 10, "a", 0)},
			want:    []string{InvMixedSharing},
			objects: []string{"gpu n1/gpu-0", "claim ns/ca", "pod ns/b"}},
		{name: "terminating and finished pods",
			pods: []corev1.Pod{testPod("a", on("n1"), assigned("", 0, 0), terminating), testPod("b", on("n1"), assigned("", 0, 0)),
				testPod("c", on("n1"), assigned("", 0, 1), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), testPod("d", on("n1"), assigned("", 0, 1))},
			want:    []string{InvDoubleAllocation, InvOverCapacity},
			objects: []string{"gpu n1/gpu-0", "pod ns/a", "pod ns/b"}},
		{name: "bound pod whose claim is not allocated",
			pods:    []corev1.Pod{testPod("a", on("n1"), withClaim("ca"))},
			claims:  []resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"}}},
			want:    []string{InvUnbacked},
			objects: []string{"pod ns/a", "claim ns/ca"}},
		{name: "bound pod whose claim is reserved for another",
			pods:   []corev1.Pod{testPod("a", on("n1"), withClaim("ca"))},
			claims: []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.Exclusive, "n1", 0, "x", 0)},
			want:   []string{InvUnbacked}},
		{name: "bound pod whose claim is allocated on another node",
			pods:   []corev1.Pod{testPod("a", on("n2"), withClaim("ca"))},
			claims: []resourceapi.ResourceClaim{claimOn("ca", deviceclasses.Exclusive, "n1", 0, "a", 0)},
			want:   []string{InvUnbacked}},
		{name: "bound pod whose claim is gone",
			pods: []corev1.Pod{testPod("a", on("n2"), withClaim("ca"))},
			want: []string{InvUnbacked}},
		{name: "bound device-plugin pod without an assignment",
			pods: []corev1.Pod{testPod("a", on("n1"), assigned("", 0, 0), func(p *corev1.Pod) { delete(p.Annotations, assignment.Annotation) })},
			want: []string{InvUnbacked}},
		{name: "malformed assignment, and one naming a GPU the node lacks",
			pods: []corev1.Pod{testPod("a", on("n1"), assigned("", 0, 0), annotated(assignment.Annotation, "x")), testPod("b", on("n1"), assigned("", 0, 7))},
			want: []string{InvUnbacked, InvUnbacked}},
		{name: "gang with minMember bound",
			pods:   []corev1.Pod{testPod("g0", on("n1"), member("g"), assigned("", 0, 0)), testPod("g1", on("n1"), member("g"), assigned("", 0, 1)), testPod("g2", member("g"), reason("waits"))},
			groups: []schedv1.PodGroup{podGroup("g", 2, "", "")}},
		{name: "gang half-bound beyond the window",
			pods:    []corev1.Pod{testPod("g0", on("n1"), member("g"), assigned("", 0, 0)), testPod("g1", member("g"), reason("waits"))},
			groups:  []schedv1.PodGroup{podGroup("g", 2, "", "")},
			want:    []string{InvHalfBoundGang},
			objects: []string{"podgroup ns/g", "pod ns/g0"}},
		{name: "gang half-bound: a terminating member does not count",
			pods:   []corev1.Pod{testPod("g0", on("n1"), member("g"), assigned("", 0, 0)), testPod("g1", on("n1"), member("g"), assigned("", 0, 1), terminating)},
			groups: []schedv1.PodGroup{podGroup("g", 2, "", "")},
			want:   []string{InvHalfBoundGang}},
		{name: "pending pod without a reason",
			pods:    []corev1.Pod{testPod("a"), testPod("b", reason("needs 1 free GPU")), testPod("c", func(p *corev1.Pod) { p.Spec.SchedulerName = "default-scheduler" })},
			want:    []string{InvNoReason},
			objects: []string{"pod ns/a"}},
		{name: "queue over its limit, counted up the tree",
			pods:    []corev1.Pod{testPod("a", on("n1"), inQueue("leaf"), assigned("", 0, 0, 1)), testPod("b", on("n2"), inQueue("leaf2"), withClaim("cb"))},
			claims:  []resourceapi.ResourceClaim{claimOn("cb", deviceclasses.MPS, "n2", 40, "b", 0)},
			queues:  []schedv1.Queue{queue("parent", "", "-1", "2"), queue("leaf", "parent", "-1", "2"), queue("leaf2", "parent", "-1", "-1")},
			want:    []string{InvQueueLimit},
			objects: []string{"queue parent", "pod ns/a", "pod ns/b"}},
		{name: "queue at its limit with shares",
			pods:   []corev1.Pod{testPod("a", on("n1"), inQueue("q"), assigned(mps, 20, 0)), testPod("b", on("n1"), inQueue("q"), withClaim("cb"))},
			claims: []resourceapi.ResourceClaim{claimOn("cb", deviceclasses.MPS, "n1", 60, "b", 0)},
			queues: []schedv1.Queue{queue("q", "", "-1", "1")}},
		{name: "gang's queue is its PodGroup's",
			pods:   []corev1.Pod{testPod("g0", on("n1"), inQueue("open"), member("g"), assigned("", 0, 0, 1))},
			groups: []schedv1.PodGroup{podGroup("g", 1, "q", "")},
			queues: []schedv1.Queue{queue("q", "", "-1", "1")},
			want:   []string{InvQueueLimit}},
		{name: "non-preemptible pods over quota; preemptible ones may be",
			pods: []corev1.Pod{testPod("a", on("n1"), inQueue("q"), priority(125), assigned("", 0, 0, 1)),
				testPod("b", on("n1"), inQueue("q"), priority(50), assigned("", 0, 2, 3))},
			queues:  []schedv1.Queue{queue("q", "", "1", "-1")},
			want:    []string{InvQueueQuota},
			objects: []string{"queue q", "pod ns/a"}},
		{name: "the preemptible annotation and the PodGroup's class decide",
			pods: []corev1.Pod{testPod("a", on("n1"), inQueue("q"), priority(125), annotated(kube.AnnotationPreemptible, "true"), assigned("", 0, 0, 1)),
				testPod("g0", on("n1"), member("g"), priority(10), assigned("", 0, 2))},
			groups: []schedv1.PodGroup{podGroup("g", 1, "q", "infer")},
			queues: []schedv1.Queue{queue("q", "", "0.5", "-1")},
			want:   []string{InvQueueQuota}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(30*time.Second, 40*time.Second)
			s := base()
			c.Check(s, time.Time{}) // learn the slices, as the soak's first check does
			if tc.noSlice {
				s.Slices = s.Slices[1:]
			}
			s.Pods, s.Claims, s.PodGroups = tc.pods, tc.claims, tc.groups
			s.Queues = append(s.Queues, tc.queues...)
			// Two checks, 41 s apart: the gang window has passed.
			c.Check(s, time.Time{})
			s.At = s.At.Add(41 * time.Second)
			got := c.Check(s, time.Time{})
			var names []string
			for _, v := range got {
				names = append(names, v.Invariant)
			}
			slices.Sort(names)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Fatalf("violations %q, want %q:\n%s", names, want, describe(got))
			}
			for _, o := range tc.objects {
				if !strings.Contains(describe(got), o) {
					t.Errorf("no violation names %q:\n%s", o, describe(got))
				}
			}
		})
	}
}

func describe(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintln(&b, v)
	}
	return b.String()
}

// TestCheckerWindows checks the time rules: a gang may be half-bound and a
// pod pending without a reason for a while, counted from the later of when
// it started and the last disruption, and a gang that recovers resets its
// clock.
func TestCheckerWindows(t *testing.T) {
	half := []corev1.Pod{testPod("g0", on("n1"), member("g"), assigned("", 0, 0)), testPod("g1", member("g"), reason("waits"))}
	whole := []corev1.Pod{testPod("g0", on("n1"), member("g"), assigned("", 0, 0)), testPod("g1", on("n1"), member("g"), assigned("", 0, 1))}
	groups := []schedv1.PodGroup{podGroup("g", 2, "", "")}
	steps := []struct {
		after      time.Duration // since t0
		pods       []corev1.Pod
		disruption time.Duration // since t0; 0: none
		want       []string
	}{
		{after: 0, pods: half},
		{after: 40 * time.Second, pods: half},
		{after: 41 * time.Second, pods: half, want: []string{InvHalfBoundGang}},
		{after: 42 * time.Second, pods: whole},
		{after: 50 * time.Second, pods: half},
		{after: 80 * time.Second, pods: half},
		{after: 91 * time.Second, pods: half, want: []string{InvHalfBoundGang}},
		{after: 92 * time.Second, pods: half, disruption: 70 * time.Second},
		{after: 111 * time.Second, pods: half, disruption: 70 * time.Second, want: []string{InvHalfBoundGang}},
		// A pod without a reason: created at t0, grace 30 s.
		{after: 200 * time.Second, pods: []corev1.Pod{testPod("p", func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t0.Add(180 * time.Second)) })}},
		{after: 211 * time.Second, pods: []corev1.Pod{testPod("p", func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t0.Add(180 * time.Second)) })}, want: []string{InvNoReason}},
		{after: 211 * time.Second, disruption: 190 * time.Second, pods: []corev1.Pod{testPod("p", func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t0.Add(180 * time.Second)) })}},
	}
	c := NewChecker(30*time.Second, 40*time.Second)
	for i, st := range steps {
		s := base()
		s.At, s.Pods, s.PodGroups = t0.Add(st.after), st.pods, groups
		var disruption time.Time
		if st.disruption > 0 {
			disruption = t0.Add(st.disruption)
		}
		var names []string
		got := c.Check(s, disruption)
		for _, v := range got {
			names = append(names, v.Invariant)
		}
		if !slices.Equal(names, st.want) {
			t.Errorf("step %d (%v): violations %q, want %q:\n%s", i, st.after, names, st.want, describe(got))
		}
	}
}
