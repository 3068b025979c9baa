// Command tessera-controller is Tessera's scheduler: it schedules every pod
// with schedulerName tessera-scheduler (ResourceClaim allocation, binding,
// eviction, queue and PodGroup status), one leader at a time behind a Lease,
// with Prometheus metrics and health endpoints. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/version"
)

type options struct {
	kubeconfig      string
	qps             float64
	burst           int
	interval        time.Duration
	placement       string
	consolidation   bool
	staleGang       time.Duration
	workers         int
	metricsAddr     string
	healthAddr      string
	leaderElect     bool
	leaseNamespace  string
	leaseName       string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	releaseOnCancel bool
	gpuResource     string
	webhookAddr     string
	webhookCertDir  string
	debugAddr       string
	debugCertDir    string
	// Client certificates at the debug server: a CA file, the cluster's.
	debugClientCAFile        string
	debugClientCAFromCluster bool
	podGrouper               bool
	// Usage history (controller/kube, usage.go).
	usageHistory   bool
	usageHalfLife  time.Duration
	usageWindow    time.Duration
	usageBucket    time.Duration
	usageCoeff     float64
	usageNamespace string
	usageConfigMap string
	// Shadow mode (controller/kube, shadow.go).
	shadow           bool
	shadowNamespaces string
	shadowSelector   string
}

// defaultNamespace is the controller's own namespace: the pod's (from the
// service-account mount) in a cluster, else tessera-system.
func defaultNamespace() string {
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
		return string(b)
	}
	return "tessera-system"
}

func bindFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; the in-cluster config when empty")
	// A scheduler's writes (claims, bindings) are its throughput: client-side
	// throttling must not be the bottleneck; API Priority and Fairness
	// protects the server.
	fs.Float64Var(&o.qps, "kube-api-qps", 500, "client-side queries per second to the API server")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "client-side burst of queries to the API server")
	fs.DurationVar(&o.interval, "interval", time.Second, "time between scheduling cycles (a relevant change starts one sooner)")
	fs.StringVar(&o.placement, "placement", string(core.BinPack), "whole-GPU placement: binpack (keep whole nodes free) or spread")
	fs.BoolVar(&o.consolidation, "consolidation", true, "move preemptible pods to make room for a pending job that fits in total free capacity but on no node")
	fs.DurationVar(&o.staleGang, "stale-gang-timeout", core.DefaultStaleGangTimeout, "evict a gang that stays below minMember this long (negative: never)")
	fs.IntVar(&o.workers, "workers", 32, "parallel API writes of a commit")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (empty: off)")
	fs.StringVar(&o.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (empty: off)")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "schedule only while holding the leader Lease (run more than one replica safely)")
	fs.StringVar(&o.leaseNamespace, "leader-elect-namespace", defaultNamespace(), "namespace of the leader Lease")
	fs.StringVar(&o.leaseName, "leader-elect-lease-name", app.DefaultLeaseName, "name of the leader Lease")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", app.DefaultLeaseDuration, "how long standby replicas wait after the last renewal before taking over")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", app.DefaultRenewDeadline, "how long the leader keeps retrying to renew before it gives up (and exits); less than the lease duration")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", app.DefaultRetryPeriod, "time between attempts to acquire or renew the Lease")
	fs.StringVar(&o.gpuResource, "gpu-resource-name", assignment.DefaultResourceGPU, "extended resource of whole GPUs that tessera-node's device plugin advertises; pods asking for it get GPUs through the device-plugin path")
	fs.StringVar(&o.webhookAddr, "webhook-addr", "", "address of the admission webhook for the fraction annotations, served over TLS by every replica (empty: off)")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/etc/tessera/webhook", "directory of the webhook's tls.crt and tls.key (read again when they change)")
	fs.StringVar(&o.debugAddr, "debug-bind-address", "", "address of the HTTPS debug server: "+app.SnapshotPath+" serves the next cycle's snapshot and, with --shadow, "+app.ShadowPath+" the shadow report, to users the API server authenticates and RBAC allows (ClusterRoles "+app.SnapshotReaderRole+", "+app.ShadowReaderRole+"); empty: off")
	fs.StringVar(&o.debugCertDir, "debug-cert-dir", "", "directory of the debug server's tls.crt and tls.key, read again when they change (empty: a self-signed pair made at start)")
	fs.StringVar(&o.debugClientCAFile, "debug-client-ca-file", "", "PEM bundle of CAs whose client certificates the debug server accepts (read again when it changes)")
	fs.BoolVar(&o.debugClientCAFromCluster, "debug-client-ca-from-cluster", true, "the debug server accepts client certificates of the cluster's client CA, read from kube-system's extension-apiserver-authentication ConfigMap (needs the Role extension-apiserver-authentication-reader there)")
	fs.BoolVar(&o.podGrouper, "pod-grouper", true, "give pods of Jobs, JobSets, Kubeflow jobs, LeaderWorkerSets and Ray clusters that name no group the gang their workload needs (controller/grouper); such pods wait for it")
	fs.BoolVar(&o.usageHistory, "usage-history", true, "keep each queue's decayed usage from what its pods held (Queue status, tessera_queue_usage), saved in a ConfigMap so a restart or failover continues it")
	fs.DurationVar(&o.usageHalfLife, "usage-half-life", 24*time.Hour, "half-life of the usage history's decay (0: none)")
	fs.DurationVar(&o.usageWindow, "usage-window", 7*24*time.Hour, "how far back the usage history reaches (a whole number of buckets, at most 2016)")
	fs.DurationVar(&o.usageBucket, "usage-bucket", 5*time.Minute, "usage history bucket: recent usage changes when one closes")
	fs.Float64Var(&o.usageCoeff, "usage-coefficient", 0, "weight of recent usage in the over-quota split of fair share, 0 to 100 (0: by weight alone, as without history; DESIGN.md, Fair share with history)")
	fs.StringVar(&o.usageNamespace, "usage-namespace", defaultNamespace(), "namespace of the usage history's ConfigMap")
	fs.StringVar(&o.usageConfigMap, "usage-configmap", kube.DefaultUsageConfigMap, "name of the usage history's ConfigMap")
	fs.BoolVar(&o.shadow, "shadow", false, "shadow mode: decide for the pods of other schedulers as if they were Tessera's and write nothing but the Lease; the report is served at "+app.ShadowPath+" of the debug server (--debug-bind-address; no pod grouper, usage history nor webhook; docs/DESIGN.md, Shadow mode)")
	fs.StringVar(&o.shadowNamespaces, "shadow-namespaces", "", "shadow mode: comma-separated namespaces whose pods are taken (empty: all)")
	fs.StringVar(&o.shadowSelector, "shadow-selector", "", "shadow mode: label selector of the pods taken (empty: all)")
	fs.BoolVar(&o.releaseOnCancel, "leader-elect-release-on-cancel", true, "give the Lease up on a clean shutdown so a standby takes over at once")
}

func (o *options) validate() error {
	switch core.PlacementPolicy(o.placement) {
	case core.BinPack, core.Spread:
	default:
		return fmt.Errorf("--placement must be binpack or spread, not %q", o.placement)
	}
	if o.interval <= 0 {
		return fmt.Errorf("--interval must be positive")
	}
	if o.gpuResource == "" || !strings.Contains(o.gpuResource, "/") {
		return fmt.Errorf("--gpu-resource-name must be an extended resource name such as %s, not %q", assignment.DefaultResourceGPU, o.gpuResource)
	}
	if o.webhookAddr != "" && o.webhookCertDir == "" {
		return fmt.Errorf("--webhook-addr needs --webhook-cert-dir")
	}
	if o.workers <= 0 {
		return fmt.Errorf("--workers must be positive")
	}
	if o.qps <= 0 || o.burst <= 0 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive")
	}
	if err := o.validateUsage(); err != nil {
		return err
	}
	if err := o.validateShadow(); err != nil {
		return err
	}
	if o.leaderElect {
		if o.leaseNamespace == "" || o.leaseName == "" {
			return fmt.Errorf("--leader-elect-namespace and --leader-elect-lease-name must be set")
		}
		if !(o.leaseDuration > o.renewDeadline && o.renewDeadline > o.retryPeriod && o.retryPeriod > 0) {
			return fmt.Errorf("leader election needs lease duration > renew deadline > retry period > 0")
		}
	}
	return nil
}

// validateUsage checks the usage-history flags.
func (o *options) validateUsage() error {
	if o.usageCoeff < 0 || o.usageCoeff > float64(core.MaxUsageCoefficient)/1000 || math.IsNaN(o.usageCoeff) {
		return fmt.Errorf("--usage-coefficient must be from 0 to %d, not %v", core.MaxUsageCoefficient/1000, o.usageCoeff)
	}
	if o.usageCoeff > 0 && !o.usageHistory {
		return fmt.Errorf("--usage-coefficient needs --usage-history")
	}
	if !o.usageHistory {
		return nil
	}
	if err := o.usageConfig().Validate(); err != nil {
		return fmt.Errorf("--usage-bucket, --usage-window, --usage-half-life: %w", err)
	}
	if o.usageNamespace == "" || o.usageConfigMap == "" {
		return fmt.Errorf("--usage-namespace and --usage-configmap must be set with --usage-history")
	}
	return nil
}

// validateShadow checks the shadow-mode flags: what writes cannot be on.
func (o *options) validateShadow() error {
	if !o.shadow {
		if o.shadowNamespaces != "" || o.shadowSelector != "" {
			return fmt.Errorf("--shadow-namespaces and --shadow-selector need --shadow")
		}
		return nil
	}
	if o.webhookAddr != "" {
		return fmt.Errorf("--shadow writes nothing, so it serves no admission webhook: leave --webhook-addr empty")
	}
	if o.usageCoeff > 0 {
		return fmt.Errorf("--shadow keeps no usage history (it would write its ConfigMap): --usage-coefficient must be 0")
	}
	_, err := o.shadowOptions()
	return err
}

// shadowOptions are the shadow flags as the scheduler takes them; nil
// without --shadow.
func (o *options) shadowOptions() (*kube.ShadowOptions, error) {
	if !o.shadow {
		return nil, nil
	}
	so := &kube.ShadowOptions{}
	for _, ns := range strings.Split(o.shadowNamespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			so.Namespaces = append(so.Namespaces, ns)
		}
	}
	if o.shadowSelector != "" {
		sel, err := labels.Parse(o.shadowSelector)
		if err != nil {
			return nil, fmt.Errorf("--shadow-selector %q: %w", o.shadowSelector, err)
		}
		so.Selector = sel
	}
	return so, nil
}

func (o *options) usageConfig() core.UsageConfig {
	return core.UsageConfig{HalfLife: o.usageHalfLife, Window: o.usageWindow, Bucket: o.usageBucket}
}

func (o *options) restConfig() (*rest.Config, error) {
	// An empty path falls back to the in-cluster config.
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	cfg.QPS = float32(o.qps)
	cfg.Burst = o.burst
	cfg.UserAgent = "tessera-controller"
	return cfg, nil
}

func (o *options) appConfig(rc *rest.Config) app.Config {
	stale := o.staleGang
	if stale == 0 {
		// The core reads 0 as its default; the flag's 0 means "at once"
		// would be surprising, so 0 here keeps the default too.
		stale = core.DefaultStaleGangTimeout
	}
	var usage *kube.UsageOptions
	if o.usageHistory && !o.shadow {
		usage = &kube.UsageOptions{Config: o.usageConfig(), Namespace: o.usageNamespace, Name: o.usageConfigMap}
	}
	shadow, _ := o.shadowOptions() // validated
	leaseName := o.leaseName
	if shadow != nil && leaseName == app.DefaultLeaseName {
		// Never the scheduling controller's Lease: both may run.
		leaseName = app.DefaultShadowLeaseName
	}
	return app.Config{
		Shadow:     shadow,
		RestConfig: rc,
		Usage:      usage,
		Interval:   o.interval,
		Core: core.Config{
			Placement:            core.PlacementPolicy(o.placement),
			DisableConsolidation: !o.consolidation,
			StaleGangTimeout:     stale,
			UsageCoefficient:     int64(math.Round(o.usageCoeff * 1000)),
		},
		Workers:                  o.workers,
		GPUResource:              o.gpuResource,
		WebhookAddr:              o.webhookAddr,
		WebhookCertDir:           o.webhookCertDir,
		DebugAddr:                o.debugAddr,
		DebugCertDir:             o.debugCertDir,
		DebugClientCAFile:        o.debugClientCAFile,
		DebugClientCAFromCluster: o.debugClientCAFromCluster,
		PodGrouper:               o.podGrouper && !o.shadow,
		LeaderElect:              o.leaderElect,
		LeaseNamespace:           o.leaseNamespace,
		LeaseName:                leaseName,
		LeaseDuration:            o.leaseDuration,
		RenewDeadline:            o.renewDeadline,
		RetryPeriod:              o.retryPeriod,
		ReleaseOnCancel:          o.releaseOnCancel,
		MetricsAddr:              o.metricsAddr,
		HealthAddr:               o.healthAddr,
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tessera-controller", flag.ContinueOnError)
	klog.InitFlags(fs)
	var o options
	bindFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.validate(); err != nil {
		return err
	}
	rc, err := o.restConfig()
	if err != nil {
		return err
	}
	cfg := o.appConfig(rc)
	if v := os.Getenv(kube.EnvTestCommitHook); v != "" {
		if cfg.CommitHook, err = testCommitHook(v); err != nil {
			return err
		}
	}
	c, err := app.New(cfg)
	if err != nil {
		return err
	}
	klog.InfoS("Starting tessera-controller", "version", version.Version, "identity", c.Identity(), "leaderElect", o.leaderElect, "shadow", o.shadow,
		"interval", o.interval, "placement", o.placement, "consolidation", o.consolidation, "qps", o.qps, "burst", o.burst)
	return c.Run(ctx)
}

// testCommitHook is the test hook kube.EnvTestCommitHook asks for: at the
// first time the commit reaches the point, exit (status 3, a crash there)
// or stop the whole process with SIGSTOP (a long pause there, until the
// test sends SIGCONT).
func testCommitHook(v string) (func(kube.HookPoint), error) {
	point, action, err := kube.ParseTestCommitHook(v)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func(p kube.HookPoint) {
		if p != point {
			return
		}
		once.Do(func() {
			klog.InfoS("Test hook: at a commit point", "point", p, "action", action)
			klog.Flush()
			if action == kube.HookExit {
				os.Exit(3)
			}
			// SIGSTOP reaches the threads a moment after kill returns: wait
			// for SIGCONT, or this goroutine could run on into its next
			// write before the process stops.
			cont := make(chan os.Signal, 1)
			signal.Notify(cont, syscall.SIGCONT)
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			<-cont
			signal.Stop(cont)
			klog.InfoS("Test hook: resumed", "point", p)
		})
	}, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var err error
	if len(os.Args) > 1 && os.Args[1] == applyCRDsCommand {
		err = runApplyCRDs(ctx, os.Args[2:])
	} else {
		err = run(ctx, os.Args[1:])
	}
	stop()
	switch {
	case err == nil:
		klog.InfoS("tessera-controller stopped")
		klog.Flush()
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, app.ErrLeadershipLost):
		// Exit so a stale leader never keeps writing; the pod restarts
		// and stands by.
		klog.ErrorS(err, "Leadership lost; exiting")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	default:
		klog.ErrorS(err, "tessera-controller failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}
