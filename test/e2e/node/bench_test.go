package node

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/driver/drivertest"
)

// BenchmarkNodePrepareResources prepares 100 claims (one
// NodePrepareResources call each, as the kubelet does per pod) over the
// plugin's socket, then unprepares them, and reports the p50 and p99 of a
// prepare call. Claims are time-sliced 4 GiB shares spread over 8 GPUs.
func BenchmarkNodePrepareResources(b *testing.B) {
	c := cluster(b)
	client := c.Client(b)
	e := newNodeEnv(b, "bench-h100", "h100-sxm-8")
	c.AddKwokNode(b, e.name, nil)
	ns := "bench"
	c.CreateNamespace(b, ns)
	d := e.start(b, prometheus.NewRegistry())
	defer d.Stop()
	k := register(b, e.registrar)

	const n = 100
	claims := make([]*resourceapi.ResourceClaim, n)
	for i := range claims {
		claims[i] = createAllocatedClaim(b, client, drivertest.Claim(ns, fmt.Sprintf("c%03d", i), "", []resourceapi.DeviceRequestAllocationResult{
			drivertest.Result("gpu", e.name, fmt.Sprintf("gpu-%d", i%8), "4Gi"),
		}, drivertest.Strategy("TimeSlicing")))
	}
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for _, cl := range claims {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := k.prepare(ctx, cl)
			cancel()
			lat = append(lat, time.Since(start))
			require.NoError(b, err)
			require.Empty(b, res[string(cl.UID)].Error)
		}
		b.StopTimer()
		k.mustUnprepare(b, claims...)
		b.StartTimer()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms/prepare")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms/prepare")
}

// BenchmarkStartToPublished measures the time from driver.Start to its
// ResourceSlice being visible in the API server, for a fresh node.
func BenchmarkStartToPublished(b *testing.B) {
	c := cluster(b)
	client := c.Client(b)
	var total time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		e := newNodeEnv(b, fmt.Sprintf("pub-%d", i), "h100-sxm-8")
		i++
		c.AddKwokNode(b, e.name, nil)
		b.StartTimer()
		start := time.Now()
		d := e.start(b, prometheus.NewRegistry())
		waitSlices(b, client, e.name, time.Minute, func(s []resourceapi.ResourceSlice) bool { return len(sliceDevices(s)) == 8 })
		total += time.Since(start)
		b.StopTimer()
		d.Stop()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(i), "ms/start-to-published")
}
