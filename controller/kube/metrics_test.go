package kube

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tessera-gpu/tessera/controller/core"
)

// TestQueueMetrics: a commit exports each queue's quota (-1 kept for
// unlimited) beside its allocation, and a queue gone from the next commit
// loses its series, so a deleted queue cannot keep an alert on "starved
// below quota" firing.
func TestQueueMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	q := func(gpuQuota, gpuAlloc int64) core.QueueStatus {
		return core.QueueStatus{Quota: core.Resources{gpuQuota, core.Unlimited, core.Unlimited}, Allocated: core.Resources{gpuAlloc, 0, 0}}
	}
	commit := func(queues map[string]core.QueueStatus) {
		m.observeCommit(&core.Result{Queues: queues}, &cycleIndex{}, &commitStats{}, nil)
	}
	commit(map[string]core.QueueStatus{"team-a": q(4000, 1000), "team-b": q(2000, 0), externalQueue: q(0, 3000)})

	steps := []struct {
		queue, resource string
		quota, alloc    float64
	}{
		{"team-a", "gpu", 4, 1},
		{"team-a", "cpu", -1, 0},
		{"team-b", "gpu", 2, 0},
		{"team-b", "memory", -1, 0},
	}
	for _, s := range steps {
		require.Equal(t, s.quota, testutil.ToFloat64(m.queueQuota.WithLabelValues(s.queue, s.resource)), "%s %s quota", s.queue, s.resource)
		require.Equal(t, s.alloc, testutil.ToFloat64(m.queueAllocated.WithLabelValues(s.queue, s.resource)), "%s %s allocated", s.queue, s.resource)
	}
	require.Equal(t, 6, testutil.CollectAndCount(m.queueQuota), "two queues × three resources; the external queue is not exported")

	commit(map[string]core.QueueStatus{"team-a": q(4000, 2000)})
	for _, v := range []*prometheus.GaugeVec{m.queueFairShare, m.queueAllocated, m.queuePending, m.queueQuota} {
		require.Equal(t, 3, testutil.CollectAndCount(v), "team-b's series are gone")
	}
	require.Equal(t, 2.0, testutil.ToFloat64(m.queueAllocated.WithLabelValues("team-a", "gpu")))
}
