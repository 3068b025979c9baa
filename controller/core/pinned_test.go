package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pinned pod is never moved by consolidation, so an 8-GPU pod that only
// consolidation could place waits.
func TestPinnedPodsAreNotMoved(t *testing.T) {
	snap := func(pinned bool) *Snapshot {
		s := &Snapshot{Queues: []Queue{NewQueue("q", "")}}
		for _, n := range []string{"a", "b"} {
			node := Node{Name: n, CPU: 64000, Memory: 1 << 40}
			for i := 0; i < 8; i++ {
				node.GPUs = append(node.GPUs, GPU{Index: i, Memory: 80 << 30, NVLinkDomain: n})
			}
			s.Nodes = append(s.Nodes, node)
		}
		for i, n := range []string{"a", "b"} {
			s.Jobs = append(s.Jobs, Job{Name: "small-" + n, Queue: "q", Priority: 50, Preemptible: true, Pods: []Pod{{
				Name: "small-" + n, Request: Request{GPUs: 1}, Phase: PodRunning, Pinned: pinned,
				Placement: Placement{Node: n, GPUs: []int{i}},
			}}})
		}
		s.Jobs = append(s.Jobs, Job{Name: "big", Queue: "q", Priority: 50, Preemptible: true, Pods: []Pod{{Name: "big", Request: Request{GPUs: 8}, Phase: PodPending}}})
		return s
	}
	res, err := Schedule(snap(false), Config{})
	require.NoError(t, err)
	assert.Len(t, res.Evictions, 1, "unpinned: one small pod is moved")
	res, err = Schedule(snap(true), Config{})
	require.NoError(t, err)
	assert.Empty(t, res.Evictions, "pinned pods stay")
	assert.Empty(t, res.Binds)
}
