// Package app runs tessera-controller: the scheduler behind a Lease-based
// leader election, with Prometheus metrics and health endpoints. The command
// is a thin flag layer over it, so tests run the very same controller
// in-process.
package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/grouper"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/controller/webhook"
)

// Defaults of the leader election (those of kube-scheduler and most
// controllers).
const (
	DefaultLeaseName = "tessera-controller"
	// DefaultShadowLeaseName is shadow mode's Lease: a shadow controller
	// never contends with a scheduling one.
	DefaultShadowLeaseName = "tessera-shadow"
	DefaultLeaseDuration   = 15 * time.Second
	DefaultRenewDeadline   = 10 * time.Second
	DefaultRetryPeriod     = 2 * time.Second
)

// ErrLeadershipLost is returned by Run when this replica stopped being the
// leader while it was running: the process must exit so that a stale leader
// never keeps writing.
var ErrLeadershipLost = errors.New("leader election lost")

// Config configures a Controller.
type Config struct {
	// RestConfig reaches the API server; its QPS and Burst are used as set.
	RestConfig *rest.Config
	// Interval, Core and Workers are passed to the scheduler (kube.Options).
	Interval time.Duration
	Core     core.Config
	Workers  int
	// GPUResource is the extended resource of whole GPUs of tessera-node's
	// device plugin (kube.Options.GPUResource; default nvidia.com/gpu).
	GPUResource string
	// PodGrouper runs the pod grouper (controller/grouper) beside the
	// scheduler: pods of Jobs, JobSets, training jobs, LWS and Ray get the
	// gang their workload needs, and wait for it.
	PodGrouper bool
	// Usage, when set, keeps the usage history (kube.Options.Usage).
	Usage *kube.UsageOptions
	// Shadow, when set, runs in shadow mode (kube.Options.Shadow): no pod
	// grouper, usage history nor webhook (they write), and the report at
	// ShadowPath of the debug server (DebugAddr; not served without it).
	Shadow *kube.ShadowOptions

	// LeaderElect runs the scheduler only while holding the Lease
	// LeaseNamespace/LeaseName. Without it the scheduler runs at once.
	LeaderElect    bool
	LeaseNamespace string
	LeaseName      string // default DefaultLeaseName
	// Identity of this replica in the Lease (default hostname_uuid).
	Identity      string
	LeaseDuration time.Duration // default DefaultLeaseDuration
	RenewDeadline time.Duration // default DefaultRenewDeadline
	RetryPeriod   time.Duration // default DefaultRetryPeriod
	// ReleaseOnCancel gives the Lease up when Run's context ends (after the
	// scheduler has stopped), so a replacement takes over at once instead
	// of after LeaseDuration.
	ReleaseOnCancel bool

	// MetricsAddr serves /metrics and HealthAddr /healthz and /readyz
	// ("" = not served; "0" port picks a free one; both may be equal).
	MetricsAddr string
	HealthAddr  string

	// WebhookAddr serves the admission webhook for the fraction annotations
	// (controller/webhook) over TLS with tls.crt and tls.key of
	// WebhookCertDir; "" = not served. Every replica serves it, leader or
	// not: admission must not wait for a failover.
	WebhookAddr    string
	WebhookCertDir string

	// DebugAddr serves the cycle snapshot (SnapshotPath) and, in shadow
	// mode, the shadow report (ShadowPath) over HTTPS to callers the API
	// server authenticates and authorises (debug.go);
	// "" = not served. DebugCertDir holds its tls.crt and tls.key (read again
	// when they change); empty: a self-signed pair made at start.
	DebugAddr    string
	DebugCertDir string
	// DebugClientCAFile (a PEM bundle, read again when it changes) and
	// DebugClientCAFromCluster (the API server's client CA, from
	// kube-system's extension-apiserver-authentication ConfigMap, watched)
	// let users in with client certificates besides bearer tokens; neither:
	// tokens only.
	DebugClientCAFile        string
	DebugClientCAFromCluster bool

	// OnLeading, when set, is told each time this replica starts (true) or
	// stops (false) leading; tests use it.
	OnLeading func(leading bool)
	// CommitHook, when set, is called at the commit's hook points
	// (kube.Options.Hook); tests only.
	CommitHook func(kube.HookPoint)
}

// Controller is one tessera-controller replica.
type Controller struct {
	cfg       Config
	registry  *prometheus.Registry
	scheduler *kube.Scheduler
	client    kubernetes.Interface
	leader    atomic.Bool
	electing  atomic.Bool
	leaderG   prometheus.Gauge
	watchdog  *leaderelection.HealthzAdaptor
	// fence checks, before each write of a commit, that the Lease is ours
	// and fresh (fence.go); nil without leader election.
	fence     *leaseFence
	servers   []*httpServer
	debug     *debugServer
	webhook   *webhook.Server
	grouper   *grouper.Grouper
	startOnce sync.Once
}

// New builds a Controller and binds its HTTP listeners (so their addresses
// are known before Run).
func New(cfg Config) (*Controller, error) {
	if cfg.RestConfig == nil {
		return nil, fmt.Errorf("app: RestConfig is required")
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = DefaultLeaseName
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if cfg.Shadow != nil && (cfg.PodGrouper || cfg.Usage != nil || cfg.WebhookAddr != "" || cfg.CommitHook != nil) {
		return nil, fmt.Errorf("app: shadow mode writes nothing: no pod grouper, usage history, webhook or commit hook")
	}
	if cfg.LeaderElect && cfg.LeaseNamespace == "" {
		return nil, fmt.Errorf("app: LeaseNamespace is required with leader election")
	}
	if cfg.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("app: hostname for the leader-election identity: %w", err)
		}
		// The uuid keeps two processes on one host (or a restarted pod
		// reusing its name) from posing as each other.
		cfg.Identity = host + "_" + string(uuid.NewUUID())
	}

	client, err := kubernetes.NewForConfig(cfg.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("app: clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("app: dynamic client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c := &Controller{
		cfg:      cfg,
		registry: reg,
		client:   client,
		leaderG:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tessera_leader", Help: "1 while this replica holds the leader Lease and schedules, else 0."}),
		// Healthz fails when the leader has not renewed for LeaseDuration
		// plus this slack: a wedged leader gets restarted by its kubelet.
		watchdog: leaderelection.NewLeaderHealthzAdaptor(20 * time.Second),
	}
	reg.MustRegister(c.leaderG)
	metrics := kube.NewMetrics(reg)
	opts := kube.Options{
		Client: client, Dynamic: dyn,
		Interval: cfg.Interval, Core: cfg.Core, Workers: cfg.Workers,
		Metrics: metrics, GPUResource: cfg.GPUResource, Hook: cfg.CommitHook, Usage: cfg.Usage,
		Shadow: cfg.Shadow,
	}
	if cfg.PodGrouper {
		if c.grouper, err = grouper.New(grouper.Options{Client: client, Dynamic: dyn}); err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		opts.AwaitGrouper = c.grouper.Waiting
	}
	if cfg.LeaderElect {
		c.fence = newLeaseFence(cfg.Identity, cfg.RenewDeadline)
		opts.Fence = c.fence.Check
	}
	c.scheduler, err = kube.New(opts)
	if err != nil {
		return nil, fmt.Errorf("app: scheduler: %w", err)
	}
	if cfg.WebhookAddr != "" {
		if c.webhook, err = webhook.New(webhook.Options{Addr: cfg.WebhookAddr, CertDir: cfg.WebhookCertDir}); err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
	}
	if cfg.DebugAddr != "" {
		if c.debug, err = c.newDebugServer(); err != nil {
			return nil, err
		}
	}
	if err := c.listen(); err != nil {
		if c.debug != nil {
			_ = c.debug.ln.Close()
		}
		return nil, err
	}
	return c, nil
}

// Registry is the controller's Prometheus registry.
func (c *Controller) Registry() *prometheus.Registry { return c.registry }

// IsLeader says whether this replica schedules now.
func (c *Controller) IsLeader() bool { return c.leader.Load() }

// Identity is this replica's name in the Lease.
func (c *Controller) Identity() string { return c.cfg.Identity }

// Scheduler is the scheduler this controller runs while leading.
func (c *Controller) Scheduler() *kube.Scheduler { return c.scheduler }

// Ready is /readyz: a leader once its caches are synced; a replica standing
// by (it would fail over) at once.
func (c *Controller) Ready() error {
	if c.leader.Load() {
		if !c.scheduler.Synced() {
			return errors.New("informer caches not synced yet")
		}
		return nil
	}
	if c.cfg.LeaderElect && c.electing.Load() {
		return nil
	}
	return errors.New("not running")
}

// Run serves HTTP and schedules — behind the leader election when enabled —
// until ctx ends (nil) or leadership is lost (ErrLeadershipLost). A
// Controller runs once.
func (c *Controller) Run(ctx context.Context) error {
	ran := false
	c.startOnce.Do(func() { ran = true })
	if !ran {
		return errors.New("app: a Controller runs only once")
	}
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	for _, s := range c.servers {
		go s.serve(httpCtx)
	}
	if c.debug != nil {
		go c.debug.serve(httpCtx)
		go c.debug.checkClientCA(httpCtx, c.client)
	}
	if c.webhook != nil {
		go func() {
			if err := c.webhook.Run(httpCtx); err != nil {
				klog.FromContext(ctx).Error(err, "Admission webhook failed")
			}
		}()
	}
	if !c.cfg.LeaderElect {
		c.setLeading(true)
		defer c.setLeading(false)
		return c.runScheduler(ctx)
	}
	return c.runElected(ctx)
}

func (c *Controller) setLeading(on bool) {
	c.leader.Store(on)
	if on {
		c.leaderG.Set(1)
	} else {
		c.leaderG.Set(0)
	}
	if c.cfg.OnLeading != nil {
		c.cfg.OnLeading(on)
	}
}

// runScheduler schedules, and groups pods beside it: both only while
// leading (the scheduler waits for the grouper; one writer of each).
func (c *Controller) runScheduler(ctx context.Context) error {
	var wg sync.WaitGroup
	if c.grouper != nil {
		gctx, stop := context.WithCancel(ctx)
		defer func() { stop(); wg.Wait() }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.grouper.Run(gctx); err != nil {
				klog.FromContext(ctx).Error(err, "Pod grouper failed")
			}
		}()
	}
	if err := c.scheduler.Run(ctx); err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

func (c *Controller) runElected(ctx context.Context) error {
	lock := fencedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metaFor(c.cfg.LeaseNamespace, c.cfg.LeaseName),
		Client:     c.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}, fence: c.fence}
	// The elector gets its own context, ended only after the scheduler has
	// stopped: with ReleaseOnCancel the Lease must not be given up while a
	// commit of ours may still be in flight, or the next leader could start
	// from a picture that misses our last writes.
	elCtx, stopElector := context.WithCancel(context.Background())
	defer stopElector()
	schedCtx, stopSched := context.WithCancel(ctx)
	defer stopSched()

	var (
		mu       sync.Mutex
		schedErr error
	)
	schedDone := make(chan struct{})
	started := atomic.Bool{}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            c.cfg.LeaseName,
		LeaseDuration:   c.cfg.LeaseDuration,
		RenewDeadline:   c.cfg.RenewDeadline,
		RetryPeriod:     c.cfg.RetryPeriod,
		ReleaseOnCancel: c.cfg.ReleaseOnCancel,
		WatchDog:        c.watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leCtx context.Context) {
				started.Store(true)
				err := c.scheduleWhileLeading(schedCtx, leCtx)
				mu.Lock()
				schedErr = err
				mu.Unlock()
				close(schedDone)
				// The scheduler failing (informers never synced) ends our
				// leadership too, so another replica can try.
				if err != nil {
					stopElector()
				}
			},
			OnStoppedLeading: func() {
				klog.FromContext(ctx).Info("Stopped leading", "identity", c.cfg.Identity)
			},
			OnNewLeader: func(id string) {
				if id != c.cfg.Identity {
					klog.FromContext(ctx).Info("Standing by; another replica leads", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("app: leader election: %w", err)
	}
	c.watchdog.SetLeaderElection(le)

	// When ctx ends: stop the scheduler, wait for it, then end the elector.
	go func() {
		select {
		case <-ctx.Done():
		case <-elCtx.Done():
			return
		}
		stopSched()
		if started.Load() {
			<-schedDone
		}
		stopElector()
	}()

	c.electing.Store(true)
	le.Run(elCtx) // returns once leadership is lost or elCtx ends
	c.electing.Store(false)
	stopSched()
	if started.Load() {
		<-schedDone
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case errors.Is(schedErr, kube.ErrFenced):
		// Fenced: stepped down like a lost election, and exits the same way.
		return fmt.Errorf("%w: %w", ErrLeadershipLost, schedErr)
	case schedErr != nil:
		return schedErr
	case ctx.Err() != nil:
		return nil
	}
	return ErrLeadershipLost
}

// scheduleWhileLeading runs the scheduler until ctx ends or the Lease is
// lost (leCtx ends), with the readiness of a leader meanwhile.
func (c *Controller) scheduleWhileLeading(ctx, leCtx context.Context) error {
	klog.FromContext(ctx).Info("Became the leader; scheduling", "identity", c.cfg.Identity, "lease", klog.KRef(c.cfg.LeaseNamespace, c.cfg.LeaseName))
	c.setLeading(true)
	defer c.setLeading(false)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-leCtx.Done():
		case <-runCtx.Done():
		}
		cancel()
	}()
	return c.runScheduler(runCtx)
}

// Handler returns the HTTP handler of one of the controller's endpoints
// sets: metrics, health, or both.
func (c *Controller) handler(metrics, health bool) http.Handler {
	mux := http.NewServeMux()
	if metrics {
		mux.Handle("/metrics", metricsHandler(c.registry))
	}
	if health {
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			check(w, c.watchdog.Check(r))
		})
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			check(w, c.Ready())
		})
	}
	return mux
}
