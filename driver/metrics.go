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
	// mpsRestarts is tessera_node_mps_daemon_restarts_total: MPS daemons
	// found dead and started again (every MPS client of the GPU died with
	// the daemon). The chart's alert rules alert on its increase: keep the
	// name in step with them.
	mpsRestarts prometheus.CounterFunc
	// orphansUnprepared counts claims unprepared because the API server no
	// longer has them for this node, by reason (reconcile.go).
	orphansUnprepared *prometheus.CounterVec

	// Device-plugin path (deviceplugin package), on the same ledger.
	devicePluginPods        *prometheus.GaugeVec
	devicePluginAllocations *prometheus.CounterVec
	devicePluginRefusals    *prometheus.CounterVec
	devicePluginReleases    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, mpsDaemons, mpsRestarts func() float64) *metrics {
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
		mpsRestarts: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "mps_daemon_restarts_total",
			Help: "MPS control daemons found dead and started again since tessera-node started (their MPS clients died with them).",
		}, mpsRestarts),
		orphansUnprepared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "orphaned_claims_unprepared_total",
			Help: "Prepared claims unprepared because the API server no longer has them for this node, per reason (gone, replaced, deallocated).",
		}, []string{"reason"}),
		devicePluginPods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tessera", Subsystem: "node", Name: "deviceplugin_pods",
			Help: "Pods holding GPUs through the device plugin, per extended resource.",
		}, []string{"resource"}),
		devicePluginAllocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "deviceplugin_allocations_total",
			Help: "Device-plugin Allocate calls that succeeded, per extended resource.",
		}, []string{"resource"}),
		devicePluginRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "deviceplugin_refusals_total",
			Help: "Device-plugin Allocate calls refused, per extended resource and reason (no_pod, bad_annotation, conflict, gpu_mismatch, gpu_unhealthy, error).",
		}, []string{"resource", "reason"}),
		devicePluginReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tessera", Subsystem: "node", Name: "deviceplugin_releases_total",
			Help: "Device-plugin allocations released (pod deleted or finished), per extended resource.",
		}, []string{"resource"}),
	}
	if reg != nil {
		reg.MustRegister(m.preparedClaims, m.prepareLatency, m.prepareErrors, m.memoryAllocated, m.gpuHealthy, m.mpsDaemons, m.mpsRestarts, m.orphansUnprepared,
			m.devicePluginPods, m.devicePluginAllocations, m.devicePluginRefusals, m.devicePluginReleases)
	}
	return m
}

// initLabels makes the series of every known label value, at 0, so that
// rate() and the chart's dashboard see them before the first event.
func (m *metrics) initLabels() {
	for _, r := range []string{OrphanGone, OrphanReplaced, OrphanDeallocated} {
		m.orphansUnprepared.WithLabelValues(r)
	}
}

// Names of metrics registered outside newMetrics, kept in this file with
// the others.
const (
	pluginRegisteredName = "tessera_node_plugin_registered"
	pluginRegisteredHelp = "1 while the kubelet has this plugin registered (plugin: dra, or deviceplugin for both device plugins), else 0."
)

// PluginRegistered is the gauge of a plugin's registration with the kubelet
// (plugin "dra", or "deviceplugin").
func PluginRegistered(plugin string, registered func() bool) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: pluginRegisteredName, Help: pluginRegisteredHelp, ConstLabels: prometheus.Labels{"plugin": plugin},
	}, func() float64 {
		if registered() {
			return 1
		}
		return 0
	})
}
