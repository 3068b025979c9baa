package driver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node agent's Prometheus metrics.
type metrics struct {
	preparedClaims  prometheus.Gauge
	prepareLatency  *prometheus.HistogramVec
	prepareErrors   prometheus.Counter
	memoryAllocated *prometheus.GaugeVec
	gpuHealthy      *prometheus.GaugeVec
	mpsDaemons      prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, mpsDaemons func() float64) *metrics {
	m := &metrics{
		preparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "prepared_claims",
			Help: "ResourceClaims currently prepared on this node.",
		}),
		prepareLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "tessera", Subsystem: "node", Name: "prepare_duration_seconds",
			Help:    "Time to prepare (operation=prepare) or unprepare (operation=unprepare) one ResourceClaim.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"operation"}),
		prepareErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "prepare_errors_total",
			Help: "ResourceClaims whose preparation failed.",
		}),
		memoryAllocated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "gpu_memory_allocated_bytes",
			Help: "GPU memory held by prepared (or preparing) claims, per GPU.",
		}, []string{"gpu", "uuid"}),
		gpuHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "gpu_healthy",
			Help: "1 when the GPU is healthy, 0 when it is tainted.",
		}, []string{"gpu", "uuid"}),
		mpsDaemons: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "mps_daemons",
			Help: "MPS control daemons running on this node.",
		}, mpsDaemons),
	}
	if reg != nil {
		reg.MustRegister(m.preparedClaims, m.prepareLatency, m.prepareErrors, m.memoryAllocated, m.gpuHealthy, m.mpsDaemons)
	}
	return m
}
