package kube

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Metrics are tessera-scheduler's Prometheus figures.
type Metrics struct {
	queueFairShare *prometheus.GaugeVec
	queueAllocated *prometheus.GaugeVec
	queuePending   *prometheus.GaugeVec
	queueQuota     *prometheus.GaugeVec
	queueUsage     *prometheus.GaugeVec
	// queues are the queues of the last commit, whose series a commit
	// without them deletes (a deleted Queue must not look starved forever).
	queues       map[string]bool
	pendingPods  prometheus.Gauge
	cycle        prometheus.Histogram
	decide       prometheus.Histogram
	action       *prometheus.HistogramVec
	binds        prometheus.Counter
	evictions    *prometheus.CounterVec
	apiErrors    prometheus.Counter
	bindFailures prometheus.Counter
	// Device-plugin pods: assignments not trusted, and node records that
	// disagree with the assignment (devicePluginPlacement).
	assignmentsIgnored *prometheus.CounterVec
	nodeDisagreements  prometheus.Counter
	fenced             prometheus.Counter
	// Shadow mode (shadow.go): the last report's counts.
	shadowPods      *prometheus.GaugeVec
	shadowEvictions *prometheus.GaugeVec
	shadowQueueGPUs *prometheus.GaugeVec
}

// NewMetrics registers the scheduler's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	queueLabels := []string{"queue", "resource"}
	m := &Metrics{
		queueFairShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_queue_fair_share", Help: "Fair share of a queue per resource (GPUs, CPU cores, memory bytes)."}, queueLabels),
		queueAllocated: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_queue_allocated", Help: "What a queue's pods hold per resource."}, queueLabels),
		queuePending:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_queue_pending", Help: "What a queue's pending pods ask for per resource."}, queueLabels),
		queueQuota:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_queue_quota", Help: "Guaranteed amount of a queue per resource (-1: unlimited)."}, queueLabels),
		queueUsage: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_queue_usage",
			Help: "Recent usage of a queue per resource: decayed resource-seconds of the usage history (GPU-, core-, byte-seconds; a parent's is its subtree's)."}, queueLabels),
		pendingPods:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tessera_pending_pods", Help: "Pods waiting for tessera-scheduler."}),
		cycle:        prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tessera_cycle_duration_seconds", Help: "Duration of a whole scheduling cycle (snapshot, decide, commit, status).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		decide:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tessera_decide_duration_seconds", Help: "Duration of the scheduling core's part of a cycle.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		action:       prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tessera_action_duration_seconds", Help: "Duration of each step of the scheduling core.", Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20)}, []string{"action"}),
		binds:        prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_binds_total", Help: "Pods this replica bound (a bind that a previous leader made first is not counted)."}),
		evictions:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_evictions_total", Help: "Pods evicted, by the action that evicted them."}, []string{"reason"}),
		apiErrors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_api_errors_total", Help: "API calls of a commit that failed."}),
		bindFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_bind_failures_total", Help: "Placements the core chose that could not be committed."}),
		assignmentsIgnored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tessera_assignments_ignored_total",
			Help: "GPU assignment annotations ignored on bound pods that do not ask for what they assign (counted once per pod and value), by reason."}, []string{"reason"}),
		nodeDisagreements: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_device_plugin_disagreements_total",
			Help: "Device-plugin pods whose node records other GPUs than their assignment (the kubelet chose others); counted once per pod."}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "tessera_fenced_commits_total",
			Help: "Commits stopped before a write because the leader Lease was no longer surely ours (the replica then steps down)."}),
		shadowPods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_shadow_pods",
			Help: "Shadow mode, last cycle: pods of other schedulers by outcome (taken, running, pending, would_place, agree, moved, left_pending, would_start, still_pending)."}, []string{"outcome"}),
		shadowEvictions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_shadow_takeover_evictions",
			Help: "Shadow mode, last cycle: pods a takeover's first cycle would evict, by action (reclaim, preempt, consolidate)."}, []string{"action"}),
		shadowQueueGPUs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tessera_shadow_queue_gpus",
			Help: "Shadow mode, last cycle: a queue's GPUs by kind (fair_share, would_allocate: Tessera placing every pod; allocated: what its pods hold now)."}, []string{"queue", "kind"}),
	}
	// Every evicting action from the start, so that rate() and the
	// dashboard see zeros rather than no series before the first eviction.
	for _, a := range []core.Action{core.ActionPreempt, core.ActionReclaim, core.ActionConsolidate, core.ActionStaleGang} {
		m.evictions.WithLabelValues(string(a))
	}
	reg.MustRegister(m.queueFairShare, m.queueAllocated, m.queuePending, m.queueQuota, m.queueUsage, m.pendingPods, m.cycle, m.decide, m.action, m.binds, m.evictions, m.apiErrors, m.bindFailures,
		m.assignmentsIgnored, m.nodeDisagreements, m.fenced, m.shadowPods, m.shadowEvictions, m.shadowQueueGPUs)
	return m
}

// assignmentIgnored counts an assignment annotation that was not trusted;
// m may be nil (no metrics).
func (m *Metrics) assignmentIgnored(reason string) {
	if m != nil {
		m.assignmentsIgnored.WithLabelValues(reason).Inc()
	}
}

// nodeDisagreed counts a node record that differs from the assignment; m
// may be nil.
func (m *Metrics) nodeDisagreed() {
	if m != nil {
		m.nodeDisagreements.Inc()
	}
}

// quantity converts a core amount to the unit users read: GPUs, cores, bytes.
func quantity(r core.Resource, v int64) float64 {
	if r == core.ResMemory {
		return float64(v)
	}
	return float64(v) / 1000
}

// observeCommit records what a cycle decided and committed. It runs before
// the cycle writes statuses and events, so a reader who sees a pod's status
// finds metrics at least as new.
func (m *Metrics) observeCommit(res *core.Result, idx *cycleIndex, st *commitStats, usage map[string]core.Resources) {
	m.binds.Add(float64(st.bound))
	for a, n := range st.evictionsByWhat {
		m.evictions.WithLabelValues(string(a)).Add(float64(n))
	}
	m.apiErrors.Add(float64(st.apiErrors.Load()))
	m.bindFailures.Add(float64(len(st.failed)))
	m.pendingPods.Set(float64(len(res.Pending) + len(idx.problems) + len(st.failed) + len(st.waiting)))
	seen := make(map[string]bool, len(res.Queues))
	for name, q := range res.Queues {
		if name == externalQueue {
			continue
		}
		seen[name] = true
		for r := core.Resource(0); r < core.NumResources; r++ {
			m.queueFairShare.WithLabelValues(name, r.String()).Set(quantity(r, q.FairShare[r]))
			m.queueAllocated.WithLabelValues(name, r.String()).Set(quantity(r, q.Allocated[r]))
			m.queuePending.WithLabelValues(name, r.String()).Set(quantity(r, q.Pending[r]))
			m.queueQuota.WithLabelValues(name, r.String()).Set(limitQuantity(r, q.Quota[r]))
			if usage != nil {
				m.queueUsage.WithLabelValues(name, r.String()).Set(quantity(r, usageAmount(r, usage[name][r])))
			}
		}
	}
	for name := range m.queues {
		if !seen[name] {
			for _, v := range []*prometheus.GaugeVec{m.queueFairShare, m.queueAllocated, m.queuePending, m.queueQuota, m.queueUsage} {
				v.DeletePartialMatch(prometheus.Labels{"queue": name})
			}
		}
	}
	m.queues = seen
}

// limitQuantity is quantity for a quota or limit, keeping -1 (unlimited).
func limitQuantity(r core.Resource, v int64) float64 {
	if v < 0 {
		return -1
	}
	return quantity(r, v)
}

// observeDurations records how long the cycle and its actions took, once
// the cycle, status writes included, is over.
func (m *Metrics) observeDurations(res *core.Result, start, decided, end time.Time) {
	m.cycle.Observe(end.Sub(start).Seconds())
	m.decide.Observe(decided.Sub(start).Seconds())
	for _, t := range res.Timings {
		m.action.WithLabelValues(string(t.Action)).Observe(t.Duration.Seconds())
	}
}
