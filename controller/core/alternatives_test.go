package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Pod.Alternatives (DRA's firstAvailable): the pod's own request is tried
// on every node, then each alternative in turn; the chosen one is what the
// placement holds.
func TestAlternatives(t *testing.T) {
	twoElseOne := Pod{Name: "p", Request: Request{GPUs: 2, CPU: 1000}, Alternatives: []Alternative{{Request: Request{GPUs: 1}}}, Phase: PodPending}
	wholeElseShare := Pod{Name: "p", Request: Request{GPUs: 1}, Alternatives: []Alternative{{Request: Request{GPUMemory: 40 * gi, Sharing: SharingMPS}}}, Phase: PodPending}
	share := func(name, node string, g int, mem int64) Pod {
		return Pod{Name: name, Request: Request{GPUMemory: mem}, Phase: PodRunning, Placement: Placement{Node: node, GPUs: []int{g}}}
	}
	whole := func(name, node string, gpus ...int) Pod {
		return Pod{Name: name, Request: Request{GPUs: len(gpus)}, Phase: PodRunning, Placement: Placement{Node: node, GPUs: gpus}}
	}
	type want struct {
		node string
		gpus []int
		alt  int
		mem  []int64
	}
	cases := []struct {
		name    string
		nodes   []Node
		queue   Queue
		running []Pod
		pod     Pod
		want    *want  // nil: pending
		reason  string // when pending
	}{
		{
			name:    "first alternative preferred over a fuller node where only the second fits",
			nodes:   []Node{node("a", 2), node("b", 2)},
			running: []Pod{whole("r", "a", 0)},
			pod:     twoElseOne,
			want:    &want{node: "b", gpus: []int{0, 1}},
		},
		{
			name:    "falls back when the first fits nowhere",
			nodes:   []Node{node("a", 2), node("b", 2)},
			running: []Pod{whole("r", "a", 0), whole("s", "b", 1)},
			pod:     twoElseOne,
			want:    &want{node: "a", gpus: []int{1}, alt: 1},
		},
		{
			name:    "fraction alternative packs onto a partly used GPU",
			nodes:   []Node{node("a", 2)},
			running: []Pod{share("r", "a", 0, 20*gi), whole("s", "a", 1)},
			pod:     wholeElseShare,
			want:    &want{node: "a", gpus: []int{0}, alt: 1, mem: []int64{40 * gi}},
		},
		{
			name:    "a whole GPU free: the first alternative, not the share",
			nodes:   []Node{node("a", 2)},
			running: []Pod{share("r", "a", 0, 20*gi)},
			pod:     wholeElseShare,
			want:    &want{node: "a", gpus: []int{1}, mem: []int64{80 * gi}},
		},
		{
			name:  "the queue's limit stops the first, not the second",
			nodes: []Node{node("a", 4)},
			queue: queue("q", "", -1, 1, 1),
			pod:   twoElseOne,
			want:  &want{node: "a", gpus: []int{0}, alt: 1},
		},
		{
			name:    "nothing fits: each request's reason, in order",
			nodes:   []Node{node("a", 1)},
			running: []Pod{whole("r", "a", 0)},
			pod:     twoElseOne,
			reason:  "needs 2 free GPUs on one node; the most free on any node is 0; else (alternative 1) needs 1 free GPU on one node; the most free on any node is 0",
		},
		{
			name:  "an alternative's own feasibility",
			nodes: []Node{node("a", 2), node("b", 2)},
			pod: Pod{Name: "p", Request: Request{GPUs: 2}, Phase: PodPending,
				Feasible: func(n string, g int) bool { return n != "b" && g != 1 },
				Alternatives: []Alternative{{Request: Request{GPUs: 1},
					Feasible: func(n string, g int) bool { return n == "b" || g < 0 }}}},
			want: &want{node: "b", gpus: []int{0}, alt: 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := c.queue
			if q.Name == "" {
				q = queue("q", "", -1, -1, 1)
			}
			snap := &Snapshot{Nodes: c.nodes, Queues: []Queue{q}}
			for _, r := range c.running {
				snap.Jobs = append(snap.Jobs, Job{Name: r.Name, Queue: "other", Priority: 100, Pods: []Pod{r}})
			}
			if len(c.running) > 0 {
				snap.Queues = append(snap.Queues, queue("other", "", -1, -1, 1))
			}
			snap.Jobs = append(snap.Jobs, Job{Name: "j", Queue: "q", Priority: 50, Preemptible: true, Pods: []Pod{c.pod}})
			var first *Result
			for range 2 { // deterministic
				res := mustSchedule(t, snap, Config{})
				if first != nil {
					assert.Equal(t, first.Binds, res.Binds)
					continue
				}
				first = res
				if c.want == nil {
					assert.Empty(t, res.Binds)
					assert.Equal(t, c.reason, pendingReason(res, "p"))
					continue
				}
				require.Len(t, res.Binds, 1, "reason: %s", pendingReason(res, "p"))
				pl := res.Binds[0].Placement
				assert.Equal(t, c.want.node, pl.Node)
				assert.Equal(t, c.want.gpus, pl.GPUs)
				assert.Equal(t, c.want.alt, pl.Alternative)
				if c.want.mem != nil {
					assert.Equal(t, c.want.mem, pl.GPUMemory)
				}
				// The queue counts what the placement holds, its demand
				// what the pod asks first.
				var milli int64
				for _, m := range pl.GPUMilli {
					milli += m
				}
				assert.Equal(t, milli, res.Queues["q"].Allocated[ResGPU])
				assert.Equal(t, int64(c.pod.Request.GPUs)*1000, res.Queues["q"].Pending[ResGPU])
			}
		})
	}
}

// A gang falls back pod by pod; when it cannot be placed whole, the
// rollback leaves every pod at its own request.
func TestAlternativesGang(t *testing.T) {
	pod := func(name string) Pod {
		return Pod{Name: name, Request: Request{GPUs: 2}, Alternatives: []Alternative{{Request: Request{GPUs: 1}}}, Phase: PodPending}
	}
	snap := &Snapshot{Nodes: []Node{node("a", 3)}, Queues: []Queue{queue("q", "", -1, -1, 1)},
		Jobs: []Job{{Name: "g", Queue: "q", Priority: 50, Preemptible: true, MinMember: 2, CreatedAt: time.Unix(1, 0), Pods: []Pod{pod("g-0"), pod("g-1")}}}}
	res := mustSchedule(t, snap, Config{})
	require.Len(t, res.Binds, 2)
	alts := map[string]int{}
	for _, b := range res.Binds {
		alts[b.Pod] = b.Placement.Alternative
	}
	assert.Equal(t, map[string]int{"g-0": 0, "g-1": 1}, alts)

	// Three pods on nodes of 2 and 1 GPUs: the first takes 2, the second
	// falls back to the node of 1, the third fits nowhere: the gang is
	// rolled back (the gang search tries the pods' own requests only), and
	// the queue's pending is the pods' own requests.
	snap.Jobs[0].MinMember = 3
	snap.Jobs[0].Pods = append(snap.Jobs[0].Pods, pod("g-2"))
	snap.Nodes = []Node{node("a", 2), node("b", 1)}
	res = mustSchedule(t, snap, Config{})
	assert.Empty(t, res.Binds)
	assert.Contains(t, pendingReason(res, "g-0"), "gang g needs 3 pods; only 2 fit (pod g-2: needs 2 free GPUs on one node")
	assert.Equal(t, int64(6000), res.Queues["q"].Pending[ResGPU])
}

// A placed pod says which alternative it holds: an MPS share held as an
// alternative keeps its GPU shared, so another share packs beside it.
func TestAlternativesPlacedInput(t *testing.T) {
	snap := &Snapshot{Nodes: []Node{node("a", 2)}, Queues: []Queue{queue("q", "", -1, -1, 1)}, Jobs: []Job{
		{Name: "held", Queue: "q", Priority: 50, Preemptible: true, Pods: []Pod{{
			Name: "held", Request: Request{GPUs: 1}, Alternatives: []Alternative{{Request: Request{GPUMemory: 40 * gi}}},
			Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{1}, Alternative: 1},
		}}},
		{Name: "new", Queue: "q", Priority: 50, Preemptible: true, CreatedAt: time.Unix(1, 0), Pods: []Pod{{
			Name: "new", Request: Request{GPUMemory: 40 * gi}, Phase: PodPending,
		}}},
	}}
	res := mustSchedule(t, snap, Config{})
	require.Len(t, res.Binds, 1)
	assert.Equal(t, []int{1}, res.Binds[0].Placement.GPUs, "packs beside the held share")
	assert.Equal(t, int64(1000), res.Queues["q"].Allocated[ResGPU])
}

func TestAlternativesInvalid(t *testing.T) {
	for _, c := range []struct {
		name string
		pod  Pod
		err  string
	}{
		{"two GPU fields", Pod{Name: "p", Request: Request{GPUs: 1}, Alternatives: []Alternative{{Request: Request{GPUs: 1, GPUMilli: 500}}}},
			`alternative 1: request: set one of GPUs (1), GPUMilli (500) and GPUMemory (0), not several`},
		{"bad sharing", Pod{Name: "p", Request: Request{GPUs: 1}, Alternatives: []Alternative{{Request: Request{GPUs: 1}}, {Request: Request{GPUMilli: 500, Sharing: "x"}}}},
			`alternative 2: request: unknown sharing mode "x" (mps or timeslice)`},
		{"placed on an alternative it does not have", Pod{Name: "p", Request: Request{GPUs: 1}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0}, Alternative: 1}},
			`placement: alternative 1, but the pod has none`},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := Schedule(&Snapshot{Nodes: []Node{node("a", 1)}, Queues: []Queue{queue("q", "", -1, -1, 1)},
				Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{c.pod}}}}, Config{})
			require.NoError(t, err, "one invalid pod must not fail the cycle")
			require.NotEmpty(t, res.Problems)
			assert.Contains(t, res.Problems[0].Reason, c.err)
		})
	}
}
