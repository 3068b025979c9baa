package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlanNumbers: a plan's binds and evictions share its number, plans are
// numbered in commit order, and allocate's binds are plan 0.
func TestPlanNumbers(t *testing.T) {
	ns := []Node{node("a", 6), node("b", 1)}
	// q1 holds all of node a, over its fair share of 2; q2 and q3 each
	// reclaim two GPUs of it, in two plans; allocate gives node b to free.
	hog := fillNodes(job("hog", "q1", 50, 6, 1, 0), ns[:1])
	hog.MinMember = 1
	r2 := job("r2", "q2", 50, 2, 1, 1)
	r3 := job("r3", "q3", 50, 2, 1, 2)
	free := job("free", "q4", 50, 1, 1, 3)
	snap := &Snapshot{Nodes: ns,
		Queues: []Queue{queue("q1", "", 1, -1, 1), queue("q2", "", 2, -1, 1), queue("q3", "", 2, -1, 1), queue("q4", "", 1, -1, 1)},
		Jobs:   []Job{hog, r2, r3, free}}
	r := mustSchedule(t, snap, Config{})

	plans := map[string]int{}
	for _, b := range r.Binds {
		plans[b.Job] = b.Plan
		if b.Action == ActionAllocate {
			assert.Zero(t, b.Plan, "allocate bind %s", b.Pod)
		}
	}
	require.Len(t, r.Evictions, 4, "hog down to its fair share of 2")
	for _, e := range r.Evictions {
		assert.Equal(t, ActionReclaim, e.Action)
		assert.Contains(t, []int{plans["r2"], plans["r3"]}, e.Plan, "eviction %s (%s)", e.Pod, e.Reason)
		if plans["r2"] > 0 && e.Plan == plans["r2"] {
			assert.Contains(t, e.Reason, "job r2")
		}
	}
	assert.Equal(t, 0, plans["free"])
	assert.Equal(t, 1, plans["r2"], "r2 reclaims first (created first)")
	assert.Equal(t, 2, plans["r3"])
}
