package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Resources besides CPU, memory and GPUs (pod count, extended resources)
// gate placement as kube-scheduler's NodeResourcesFit does: a pod goes only
// where the node holds what it asks, counting the pods already there and
// those placed earlier in the same cycle.
func TestOtherResources(t *testing.T) {
	const widget = "example.com/widget"
	withOther := func(n Node, other map[string]int64) Node { n.Other = other; return n }
	pod := func(name string, gpus int, other map[string]int64) Pod {
		return Pod{Name: name, Request: Request{GPUs: gpus, Other: other}, Phase: PodPending}
	}
	cases := []placeCase{
		{
			name:    "only the node that has the resource",
			nodes:   []Node{node("a", 8), withOther(node("b", 8), map[string]int64{widget: 1})},
			pending: []Pod{pod("p", 1, map[string]int64{widget: 1})},
			want:    map[string]string{"p": "b"},
		},
		{
			name:    "counted within one cycle",
			nodes:   []Node{withOther(node("a", 8), map[string]int64{widget: 1}), withOther(node("b", 8), map[string]int64{widget: 1})},
			pending: []Pod{pod("p", 1, map[string]int64{widget: 1}), pod("q", 1, map[string]int64{widget: 1}), pod("r", 1, map[string]int64{widget: 1})},
			want:    map[string]string{"p": "a", "q": "b", "r": ""},
			reason:  map[string]string{"r": "needs 1 example.com/widget; the most free on any node is 0"},
		},
		{
			name:  "pods already there count",
			nodes: []Node{withOther(node("a", 8), map[string]int64{"pods": 2}), withOther(node("b", 8), map[string]int64{"pods": 110})},
			running: []Pod{
				{Name: "x", Request: Request{GPUs: 1, Other: map[string]int64{"pods": 1}}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0}}},
				{Name: "y", Request: Request{Other: map[string]int64{"pods": 1}}, Phase: PodRunning, Placement: Placement{Node: "a"}},
			},
			// Bin-packing would pick a (fuller); its pod slots are used up.
			pending: []Pod{pod("p", 1, map[string]int64{"pods": 1})},
			want:    map[string]string{"p": "b"},
		},
		{
			name:    "a resource no node has",
			nodes:   []Node{withOther(node("a", 8), map[string]int64{"pods": 110})},
			pending: []Pod{pod("p", 0, map[string]int64{"pods": 1, widget: 2})},
			want:    map[string]string{"p": ""},
			reason:  map[string]string{"p": "needs 2 example.com/widget; the most free on any node is 0"},
		},
		{
			name:    "no node has all of it",
			nodes:   []Node{withOther(node("a", 8), map[string]int64{widget: 1}), withOther(node("b", 8), map[string]int64{"example.com/gadget": 1})},
			pending: []Pod{pod("p", 0, map[string]int64{widget: 1, "example.com/gadget": 1})},
			want:    map[string]string{"p": ""},
			reason:  map[string]string{"p": "needs 1 example.com/gadget and 1 example.com/widget; no node has all of it free"},
		},
		{
			name:    "pods that ask nothing else ignore it",
			nodes:   []Node{withOther(node("a", 2), map[string]int64{widget: 0})},
			pending: []Pod{pod("p", 1, nil)},
			want:    map[string]string{"p": "a"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

// A negative amount is a broken snapshot, not a request to fit.
func TestOtherResourcesNegative(t *testing.T) {
	snap := &Snapshot{Nodes: []Node{node("a", 1)}, Queues: []Queue{NewQueue("q", "")},
		Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{{Name: "p", Request: Request{Other: map[string]int64{"pods": -1}}}}}}}
	assert.Contains(t, invalidReason(t, snap, "p"), "pods -1 is negative")
}

// A preemptor that needs the victim's pod slot waits for the victim to go:
// its bind is pipelined, as it is for GPUs, CPU and memory. (The victim
// holds no GPU, so only the pod slot can make it so.)
func TestOtherResourcesPreemptPipelined(t *testing.T) {
	n := node("a", 8)
	n.Other = map[string]int64{"pods": 1}
	snap := &Snapshot{Nodes: []Node{n}, Queues: []Queue{queue("q", "", -1, -1, 1)}}
	snap.Jobs = []Job{
		{Name: "low", Queue: "q", Priority: 10, Preemptible: true, Pods: []Pod{{Name: "low", Request: Request{CPU: 1000, Other: map[string]int64{"pods": 1}},
			Phase: PodRunning, Placement: Placement{Node: "a"}}}},
		{Name: "high", Queue: "q", Priority: 90, Preemptible: true, Pods: []Pod{{Name: "high", Request: Request{GPUs: 1, Other: map[string]int64{"pods": 1}}, Phase: PodPending}}},
	}
	res := mustSchedule(t, snap, Config{})
	require.Len(t, res.Evictions, 1)
	assert.Equal(t, "low", res.Evictions[0].Pod)
	require.Len(t, res.Binds, 1)
	assert.True(t, res.Binds[0].Pipelined, "the only pod slot frees when the victim is gone")
}

// TestRollbackRestoresPendingShare: a memory fraction counts its share of
// the largest GPU while pending; a placement on a smaller GPU that is rolled
// back must not leave the bigger share behind (it would inflate the job's
// request in the gates and the queue's demand for the rest of the cycle).
func TestRollbackRestoresPendingShare(t *testing.T) {
	small, big := node("small", 1), node("big", 1)
	small.GPUs[0].Memory = 24 * gi
	j := Job{Name: "j", Queue: "q", Priority: 50, Preemptible: true,
		Pods: []Pod{{Name: "j-0", Phase: PodPending, Request: Request{GPUMemory: 12 * gi, Sharing: SharingMPS}}}}
	s, err := newSession(&Snapshot{Nodes: []Node{small, big}, Queues: []Queue{queue("q", "", 0, -1, 1)}, Jobs: []Job{j}}, Config{})
	require.NoError(t, err)
	p := s.pods[0]
	pending := p.res
	require.Equal(t, int64(150), pending[ResGPU], "12Gi of the largest GPU (80Gi)")
	n := s.nodeByN["small"]
	cp := s.checkpoint()
	s.attach(p, &plan{node: n, gpus: []int{0}, milli: []int64{500}, mem: []int64{12 * gi}, sharing: SharingMPS}, ActionAllocate, "")
	require.Equal(t, int64(500), p.res[ResGPU])
	s.rollback(cp)
	assert.Equal(t, pending, p.res)
}
