package kube

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
)

// otherPod is replayPod for another scheduler, its claim made from a
// template (owned by the pod, named in its status).
func otherPod(ns, name, queue string, gpus int64, node string, first int) (v1.Pod, resourceapi.ResourceClaim) {
	p, c := replayPod(ns, name, queue, gpus, node, first)
	p.Spec.SchedulerName = v1.DefaultSchedulerName
	// The claim is made from a template: the pod's status names it.
	p.Spec.ResourceClaims[0] = v1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}
	p.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(c.Name)}}
	if queue == "" {
		delete(p.Labels, LabelQueue)
	}
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
	return p, c
}

// shadowDumpOf is kube-scheduler's placement of a mixed workload on two
// nodes of four GPUs: namespace team-a (no Queue: a queue of its own) runs
// big (3 GPUs, pinned to n1 by its selector) on n1 and small (1) on n2,
// where kube-scheduler spread it, and waits with wide (2: one GPU free on
// each node); team-b, a Queue limited to 1 GPU, runs t1 and t2 on n2. A
// DaemonSet's pod and one of Tessera's own are not taken.
func shadowDumpOf() *Dump {
	d := replayDump()
	o := &d.Objects
	o.Pods, o.ResourceClaims = nil, nil
	o.Queues = []map[string]any{{"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue", "metadata": map[string]any{"name": "team-b"},
		"spec": map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "1", "limit": "1"}}}}}
	o.Namespaces = []v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "team-b", Labels: map[string]string{LabelQueue: "team-b"}}}}
	add := func(p v1.Pod, c resourceapi.ResourceClaim) {
		o.Pods, o.ResourceClaims = append(o.Pods, p), append(o.ResourceClaims, c)
	}
	p, c := otherPod("team-a", "big", "", 3, "n1", 0)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "n1"}
	add(p, c)
	add(otherPod("team-a", "small", "", 1, "n2", 0))
	add(otherPod("team-a", "wide", "", 2, "", 0))
	add(otherPod("team-b", "t1", "", 1, "n2", 1))
	add(otherPod("team-b", "t2", "", 1, "n2", 2))
	ds := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "agent", UID: "uid-agent",
		OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent", UID: "ds", Controller: ptr.To(true)}}},
		Spec: v1.PodSpec{NodeName: "n1", SchedulerName: v1.DefaultSchedulerName, Containers: []v1.Container{{Name: "c"}}}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	o.Pods = append(o.Pods, ds)
	o.DeviceClasses = []resourceapi.DeviceClass{*class("gpu.tessera.dev", gpuconfig.Exclusive)}
	return d
}

func TestShadowDecide(t *testing.T) {
	d := shadowDumpOf()
	before, err := MarshalDump(d)
	require.NoError(t, err)
	rep, takeover, err := ShadowDecide(context.Background(), d, &ShadowOptions{})
	require.NoError(t, err)
	after, err := MarshalDump(d)
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after), "the live dump is not changed")

	assert.Equal(t, 5, rep.Pods, "the DaemonSet's pod is not taken")
	assert.Equal(t, 4, rep.Running)
	assert.Equal(t, 1, rep.Pending)
	// From the start, Tessera gives team-b (furthest below its fair share)
	// its GPU first, packed on n1 beside big; small and wide go to n2; t2
	// is kept out by team-b's limit.
	assert.Equal(t, 4, rep.WouldPlace)
	assert.Equal(t, 2, rep.Agree, "big on n1, small on n2")
	assert.Equal(t, []ShadowMove{{Pod: "team-b/t1", Queue: "team-b", Actual: "n2", Tessera: "n1"}}, rep.Moved)
	require.Len(t, rep.LeftPending, 1)
	assert.Equal(t, "team-b/t2", rep.LeftPending[0].Pod)
	assert.Equal(t, "n2", rep.LeftPending[0].Actual)
	assert.Contains(t, rep.LeftPending[0].Reason, "limit")
	assert.Equal(t, []ShadowMove{{Pod: "team-a/wide", Queue: "team-a", Tessera: "n2"}}, rep.WouldStart)
	assert.Empty(t, rep.StillPending)

	assert.Equal(t, ShadowQueue{FairShareGPUMilli: 6000, WouldAllocateGPUMilli: 6000, AllocatedGPUMilli: 4000},
		gpuOnly(rep.Queues["team-a"]), "team-a: its demand; holds 4 now")
	assert.Equal(t, ShadowQueue{FairShareGPUMilli: 1000, WouldAllocateGPUMilli: 1000, AllocatedGPUMilli: 2000},
		gpuOnly(rep.Queues["team-b"]), "team-b: its limit; holds 2 now")

	// A takeover reclaims one of team-b's GPUs on n2 for wide.
	require.Len(t, rep.Takeover.Evictions, 1)
	assert.Equal(t, "reclaim", string(rep.Takeover.Evictions[0].Action))
	assert.Contains(t, []string{"team-b/t1", "team-b/t2"}, rep.Takeover.Evictions[0].Pod)
	require.Len(t, rep.Takeover.Binds, 1)
	assert.Equal(t, "team-a/wide", rep.Takeover.Binds[0].Pod)
	assert.Equal(t, "n2", rep.Takeover.Binds[0].Node)

	// The takeover's dump replays to its decisions (tessera-sim replay).
	again, err := Replay(context.Background(), takeover)
	require.NoError(t, err)
	assert.Equal(t, takeover.Decisions, again)
}

func gpuOnly(q ShadowQueue) ShadowQueue {
	return ShadowQueue{FairShareGPUMilli: q.FairShareGPUMilli, WouldAllocateGPUMilli: q.WouldAllocateGPUMilli, AllocatedGPUMilli: q.AllocatedGPUMilli}
}

func TestShadowed(t *testing.T) {
	pod := func(mut func(*v1.Pod)) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "p", Labels: map[string]string{"app": "train"}},
			Spec: v1.PodSpec{SchedulerName: v1.DefaultSchedulerName}}
		if mut != nil {
			mut(p)
		}
		return p
	}
	sel, err := labels.Parse("app=train")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		opts ShadowOptions
		pod  *v1.Pod
		want bool
	}{
		{"another scheduler's", ShadowOptions{}, pod(nil), true},
		{"ours", ShadowOptions{}, pod(func(p *v1.Pod) { p.Spec.SchedulerName = SchedulerName }), false},
		{"finished", ShadowOptions{}, pod(func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }), false},
		{"failed", ShadowOptions{}, pod(func(p *v1.Pod) { p.Status.Phase = v1.PodFailed }), false},
		{"static", ShadowOptions{}, pod(func(p *v1.Pod) { p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "x"} }), false},
		{"a DaemonSet's", ShadowOptions{}, pod(func(p *v1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "d", Controller: ptr.To(true)}}
		}), false},
		{"a ReplicaSet's", ShadowOptions{}, pod(func(p *v1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "r", Controller: ptr.To(true)}}
		}), true},
		{"namespace listed", ShadowOptions{Namespaces: []string{"x", "ml"}}, pod(nil), true},
		{"namespace not listed", ShadowOptions{Namespaces: []string{"x"}}, pod(nil), false},
		{"selector matches", ShadowOptions{Selector: sel}, pod(nil), true},
		{"selector does not match", ShadowOptions{Selector: sel}, pod(func(p *v1.Pod) { p.Labels = nil }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.opts.Shadowed(tc.pod))
		})
	}
}

// BenchmarkShadowDecide: a shadow cycle's decisions on 100 nodes of four
// GPUs with 400 pods of another scheduler (300 running on one GPU each, 100
// pending), in 10 namespace queues.
func BenchmarkShadowDecide(b *testing.B) {
	d := replayDump()
	o := &d.Objects
	o.Nodes, o.ResourceSlices, o.Pods, o.ResourceClaims, o.Queues = nil, nil, nil, nil, nil
	for i := 0; i < 100; i++ {
		n, sl := replayNode(fmt.Sprintf("n%03d", i))
		o.Nodes, o.ResourceSlices = append(o.Nodes, n), append(o.ResourceSlices, sl)
	}
	for i := 0; i < 400; i++ {
		node, first := "", 0
		if i < 300 {
			node, first = fmt.Sprintf("n%03d", i/3), i%3
		}
		p, c := otherPod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), "", 1, node, first)
		o.Pods, o.ResourceClaims = append(o.Pods, p), append(o.ResourceClaims, c)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := ShadowDecide(context.Background(), d, &ShadowOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
