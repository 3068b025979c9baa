package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMilliRoomCountsHeldLimitRoom: a memory fraction's real share is
// checked where it lands (milliRoom), and limit room that this cycle's
// evictions freed (heldLimit) is not room yet.
func TestMilliRoomCountsHeldLimitRoom(t *testing.T) {
	j := job("f", "q", 50, 1, 0, 0)
	j.Pods[0].Request = Request{GPUMemory: 20 * gi}
	q := queue("q", "", 0, -1, 1)
	q.Resources[ResGPU] = QueueResource{Quota: 0, Limit: 1000, OverQuotaWeight: 1}
	s, err := newSession(&Snapshot{Nodes: []Node{node("n", 1)}, Queues: []Queue{q}, Jobs: []Job{j}}, Config{})
	require.NoError(t, err)
	p := s.pods[0]
	qs := s.queueByN["q"]
	tests := []struct {
		allocated, held, want int64
	}{
		{0, 0, 1000},
		{300, 0, 700},
		{300, 400, 300},
		{300, 800, 0},
	}
	for _, tc := range tests {
		qs.allocated[ResGPU], qs.heldLimit[ResGPU] = tc.allocated, tc.held
		assert.Equal(t, tc.want, milliRoom(p), "allocated %d, held %d", tc.allocated, tc.held)
	}
}
