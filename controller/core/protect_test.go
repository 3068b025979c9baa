package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// protectSnap is one 8-GPU node that queue a's preemptible job fills, and
// queue b's job that reclaim would give 4 by fair share. Queues come from
// NewQueue, so their time protections inherit unless set.
func protectSnap(now, started time.Time, edit func(a, b *Queue)) *Snapshot {
	parent, a, b := NewQueue("team", ""), NewQueue("a", "team"), NewQueue("b", "")
	edit(&a, &parent)
	s := &Snapshot{Now: now, Queues: []Queue{parent, a, b}}
	node := Node{Name: "n", CPU: 64000, Memory: 1 << 40}
	for i := 0; i < 8; i++ {
		node.GPUs = append(node.GPUs, GPU{Index: i, Memory: 80 << 30, NVLinkDomain: "n"})
	}
	s.Nodes = []Node{node}
	ja := Job{Name: "a-train", Queue: "a", Priority: 50, Preemptible: true, MinMember: 1, CreatedAt: now.Add(-2 * time.Hour)}
	for i := 0; i < 8; i++ {
		ja.Pods = append(ja.Pods, Pod{Name: "a-" + string(rune('0'+i)), Request: Request{GPUs: 1}, Phase: PodRunning,
			Placement: Placement{Node: "n", GPUs: []int{i}}, StartedAt: started})
	}
	jb := Job{Name: "b-train", Queue: "b", Priority: 50, Preemptible: true, MinMember: 1, CreatedAt: now.Add(-time.Minute)}
	for i := 0; i < 4; i++ {
		jb.Pods = append(jb.Pods, Pod{Name: "b-" + string(rune('0'+i)), Request: Request{GPUs: 1}, Phase: PodPending})
	}
	s.Jobs = []Job{ja, jb}
	return s
}

// TestReclaimMinRuntime: the adapter's pod start time against the victim's
// queue's reclaim minimum runtime (inherited from its parent), a placed pod
// without a start time counting as not started, and the evicting queue's
// preemption delay from the job's creation.
func TestReclaimMinRuntime(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		started time.Time
		edit    func(a, parent *Queue)
		evicted int
	}{
		{"no protection", now.Add(-time.Minute), func(a, p *Queue) {}, 4},
		{"ran less than the minimum", now.Add(-29 * time.Minute), func(a, p *Queue) { a.ReclaimMinRuntime = 30 * time.Minute }, 0},
		{"ran the minimum", now.Add(-30 * time.Minute), func(a, p *Queue) { a.ReclaimMinRuntime = 30 * time.Minute }, 4},
		{"inherited from the parent", now.Add(-29 * time.Minute), func(a, p *Queue) { p.ReclaimMinRuntime = 30 * time.Minute }, 0},
		{"own 0 wins over the parent's", now.Add(-29 * time.Minute), func(a, p *Queue) { p.ReclaimMinRuntime = time.Hour; a.ReclaimMinRuntime = 0 }, 4},
		{"preempt's minimum is not reclaim's", now.Add(-time.Minute), func(a, p *Queue) { a.PreemptMinRuntime = time.Hour }, 4},
		{"no start time: not started", time.Time{}, func(a, p *Queue) { a.ReclaimMinRuntime = time.Second }, 0},
		{"no start time, no protection", time.Time{}, func(a, p *Queue) {}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Schedule(protectSnap(now, tc.started, tc.edit), Config{})
			require.NoError(t, err)
			require.Empty(t, res.Problems)
			assert.Len(t, res.Evictions, tc.evicted)
		})
	}
}

func TestPreemptionDelay(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		delay   time.Duration
		evicted int
	}{{0, 4}, {59 * time.Second, 4}, {time.Minute, 4}, {61 * time.Second, 0}, {time.Hour, 0}} {
		snap := protectSnap(now, now.Add(-time.Hour), func(a, p *Queue) {})
		snap.Queues[2].PreemptionDelay = tc.delay // b, created a minute ago
		res, err := Schedule(snap, Config{})
		require.NoError(t, err)
		assert.Len(t, res.Evictions, tc.evicted, "delay %s", tc.delay)
		if tc.evicted == 0 {
			require.NotEmpty(t, res.Pending)
			assert.Contains(t, res.Pending[0].Reason, "may not evict others before")
		}
	}
}
