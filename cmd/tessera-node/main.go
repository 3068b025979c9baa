// Command tessera-node is Tessera's node agent: the DRA kubelet plugin for
// gpu.tessera.dev (ResourceSlices, Prepare/Unprepare through CDI, MPS and
// time-slicing enforcement, crash-safe checkpoint) and the kubelet device
// plugins for nvidia.com/gpu and tessera.dev/gpu-share on the same ledger,
// with Prometheus metrics and health endpoints.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/internal/gpufault"
	"github.com/tessera-gpu/tessera/internal/killpoint"
	"github.com/tessera-gpu/tessera/internal/version"
	"github.com/tessera-gpu/tessera/sharing"
)

type config struct {
	nodeName          string
	kubeconfig        string
	registrarDir      string
	pluginDataDir     string
	cdiRoot           string
	driverRoot        string
	hostDriverRoot    string
	fakeGPUs          string
	mode              string
	mps               bool
	mpsRoot           string
	mpsControl        string
	mpsSupervisor     string
	httpAddr          string
	recoverCheckpoint bool
	bootIDPath        string
	devicePlugin      bool
	devicePluginDir   string
	gpuResourceName   string
	shareSlots        int
	claimCheck        time.Duration
	daemonSet         string
	fakeClique        string
	labelClique       bool
}

// env returns the environment's value for a flag: TESSERA_<FLAG> with dashes
// as underscores (--node-name ↔ TESSERA_NODE_NAME); NODE_NAME too, as the
// downward API usually sets it.
func envName(flagName string) string {
	return "TESSERA_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func main() {
	if len(os.Args) > 1 {
		// Subcommands of the same binary: the MPS supervisor (its own
		// DaemonSet), the fake-mode MPS stand-in, and the uninstall cleanup.
		switch os.Args[1] {
		case sharing.StandInCommand:
			os.Exit(sharing.RunStandIn(os.Args[2:], os.Stdin, os.Stderr))
		case supervisorCommand, cleanupCommand:
			os.Exit(runMPSCommand(os.Args[1], os.Args[2:]))
		}
	}
	klog.InitFlags(nil)
	var c config
	fs := flag.CommandLine
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node (also env NODE_NAME)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&c.registrarDir, "kubelet-registrar-dir", kubeletplugin.KubeletRegistryDir, "kubelet plugin registry directory")
	fs.StringVar(&c.pluginDataDir, "kubelet-plugin-dir", kubeletplugin.KubeletPluginsDir+"/"+driver.DriverName, "plugin data directory (DRA socket, checkpoint)")
	fs.StringVar(&c.cdiRoot, "cdi-root", cdi.DefaultRoot, "directory for CDI specs")
	fs.StringVar(&c.driverRoot, "driver-root", "/", "where this process sees the NVIDIA driver installation")
	fs.StringVar(&c.hostDriverRoot, "host-driver-root", "/", "where the container runtime sees the NVIDIA driver installation")
	fs.StringVar(&c.fakeGPUs, "fake-gpus", "", "fake GPU profile (e.g. h100-sxm-8, a100-pcie-4, l4-2, or a YAML file) instead of NVML")
	fs.StringVar(&c.fakeClique, "fake-clique", "", "with --fake-gpus: the fake GPUs' multi-node NVLink clique, <cluster UUID>.<clique ID> or a clique ID alone (gb200-nvl72 has clique 1 without it)")
	fs.BoolVar(&c.labelClique, "label-clique", true, "label the node "+draname.LabelClique+"=<cluster UUID>.<clique ID> when its GPUs are in a multi-node NVLink clique (a Topology level can name it)")
	fs.StringVar(&c.mode, "sharing-mode", "", "fix the sharing mode of every GPU: Exclusive, MPS or TimeSlicing (empty: claims choose)")
	fs.BoolVar(&c.mps, "mps", true, "offer MPS sharing (runs nvidia-cuda-mps-control per GPU)")
	fs.StringVar(&c.mpsRoot, "mps-root", sharing.DefaultMPSRoot, "parent of the per-GPU MPS pipe and log directories")
	fs.StringVar(&c.mpsControl, "mps-control", "", "MPS control program (empty: "+sharing.DefaultMPSControl+" on PATH, or with --fake-gpus the built-in stand-in)")
	fs.StringVar(&c.mpsSupervisor, "mps-supervisor", "", "Unix socket of the MPS supervisor (tessera-node mps-supervisor) that runs the MPS daemons outside this container; empty: run them as children of this process")
	fs.StringVar(&c.httpAddr, "http-address", ":8080", "address for /metrics, /healthz and /readyz (empty: off)")
	fs.BoolVar(&c.recoverCheckpoint, "recover-checkpoint", false, "move an unreadable checkpoint aside and start with no prepared claims (see driver/README.md)")
	fs.StringVar(&c.bootIDPath, "boot-id-path", driver.DefaultBootIDPath, "file holding the node's boot ID")
	fs.BoolVar(&c.devicePlugin, "device-plugin", true, "also serve the GPUs as device-plugin resources (whole GPUs and fraction slots), on the same ledger as DRA claims")
	fs.StringVar(&c.devicePluginDir, "device-plugin-dir", pluginapi.DevicePluginPath, "kubelet device-plugin directory (kubelet.sock and the plugins' sockets)")
	fs.StringVar(&c.gpuResourceName, "gpu-resource-name", assignment.DefaultResourceGPU, "extended resource of whole GPUs")
	fs.IntVar(&c.shareSlots, "share-slots", deviceplugin.DefaultShareSlots, "slots of "+assignment.ResourceShare+" per GPU (admission tokens: the GPU and memory come from the pod's assignment)")
	fs.DurationVar(&c.claimCheck, "claim-check-interval", time.Minute, "how often prepared claims are checked against the API server (claims deleted, replaced or deallocated meanwhile are unprepared); always at start, only then when 0")
	fs.StringVar(&c.daemonSet, "daemonset", "", "<namespace>/<name> of the DaemonSet running this pod: when it is deleted (helm uninstall), tessera-node removes its checkpoint, lock and plugin directory on the way out if no claim is prepared; empty: never")
	fs.Parse(os.Args[1:])
	if err := applyEnv(fs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		klog.ErrorS(err, "tessera-node failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// applyEnv sets every flag not given on the command line from its
// TESSERA_* environment variable, so the DaemonSet can use either.
func applyEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("env %s: %w", envName(f.Name), err))
			}
		}
	})
	return errors.Join(errs...)
}

func run(ctx context.Context, c config) error {
	logger := klog.FromContext(ctx)
	if c.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	restConfig, err := loadConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	inv, fake, err := openInventory(logger, c)
	if err != nil {
		return err
	}
	defer inv.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts, err := driverOptions(c, client, inv, reg)
	if err != nil {
		return err
	}
	start := time.Now()
	d, err := driver.Start(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			// Asked to stop while starting: a clean shutdown, not a failure.
			logger.Info("Stopped while starting", "reason", context.Cause(ctx))
			return nil
		}
		return err
	}
	plugins, err := startDevicePlugins(ctx, c, client, inv, d, reg)
	if err != nil {
		d.Stop()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	logger.Info("Started", "version", version.Version, "node", c.nodeName, "fakeGPUs", c.fakeGPUs, "devicePlugin", c.devicePlugin, "duration", time.Since(start))
	var owner *ownerWatch
	err = armKillPoint(logger)
	if err == nil {
		err = armGPUFaults(ctx, logger, fake)
	}
	if err == nil && c.daemonSet != "" {
		owner, err = startOwnerWatch(ctx, client, c.daemonSet)
	}
	if err != nil {
		if plugins != nil {
			plugins.Stop()
		}
		d.Stop()
		return err
	}
	srv, err := serveHTTP(logger, c.httpAddr, d.HTTPHandler(reg))
	if err != nil {
		d.Stop()
		return err
	}
	return waitAndStop(ctx, logger, d, plugins, srv, owner)
}

// openInventory opens the node's GPUs: fake ones from --fake-gpus, else
// NVML's. fake is nil for real GPUs.
func openInventory(logger klog.Logger, c config) (inv gpu.Inventory, fake *gpu.Fake, err error) {
	if c.fakeGPUs != "" {
		opts := []gpu.Option{gpu.WithLogger(logger)}
		if c.fakeClique != "" {
			opts = append(opts, gpu.WithFakeClique(c.fakeClique))
		}
		if fake, err = gpu.NewFake(c.fakeGPUs, c.nodeName, opts...); err != nil {
			return nil, nil, err
		}
		return fake, fake, nil
	}
	if c.fakeClique != "" {
		return nil, nil, errors.New("--fake-clique is for fake GPUs (--fake-gpus); real GPUs report their clique through NVML")
	}
	nv, err := gpu.NewNVML(gpu.WithLogger(logger))
	if err != nil {
		return nil, nil, fmt.Errorf("NVML (use --fake-gpus on nodes without GPUs): %w", err)
	}
	return nv, nil, nil
}

// driverOptions are the DRA driver's options from the flags.
func driverOptions(c config, client kubernetes.Interface, inv gpu.Inventory, reg *prometheus.Registry) (driver.Options, error) {
	opts := driver.Options{
		NodeName:      c.nodeName,
		KubeClient:    client,
		Inventory:     inv,
		RegistrarDir:  c.registrarDir,
		PluginDataDir: c.pluginDataDir,
		CDI: cdi.Options{
			Root:           c.cdiRoot,
			Fake:           c.fakeGPUs != "",
			DriverRoot:     c.driverRoot,
			HostDriverRoot: c.hostDriverRoot,
		},
		Mode:              v1alpha1.SharingStrategy(c.mode),
		RecoverCheckpoint: c.recoverCheckpoint,
		BootIDPath:        c.bootIDPath,
		Registerer:        reg,
		ReconcileInterval: c.claimCheck,
		LabelClique:       c.labelClique,
	}
	if c.claimCheck <= 0 {
		opts.ReconcileInterval = -1 // at start only
	}
	if c.mps {
		control, args, err := mpsControl(c.mpsControl, c.fakeGPUs != "")
		if err != nil {
			return opts, err
		}
		opts.MPS = &sharing.MPSOptions{Root: c.mpsRoot, Control: control, ControlArgs: args, Supervisor: c.mpsSupervisor}
	}
	return opts, nil
}

// startDevicePlugins starts the device plugins when --device-plugin asks
// for them (nil otherwise), the driver's ledger their record of what is
// allocated.
func startDevicePlugins(ctx context.Context, c config, client kubernetes.Interface, inv gpu.Inventory, d *driver.Driver, reg *prometheus.Registry) (*deviceplugin.Manager, error) {
	if !c.devicePlugin {
		return nil, nil
	}
	plugins, err := deviceplugin.Start(ctx, deviceplugin.Options{
		NodeName: c.nodeName, KubeClient: client, Inventory: inv, Ledger: d,
		Dir: c.devicePluginDir, GPUResource: c.gpuResourceName, ShareSlots: c.shareSlots,
	})
	if err != nil {
		return nil, err
	}
	// One gauge for both device plugins: they register together.
	reg.MustRegister(driver.PluginRegistered("deviceplugin", plugins.Registered))
	return plugins, nil
}

// serveHTTP serves metrics and health on addr; nil when addr is empty.
func serveHTTP(logger klog.Logger, addr string, h http.Handler) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP server")
		}
	}()
	logger.Info("Serving metrics and health", "address", ln.Addr().String())
	return srv, nil
}

// waitAndStop waits until ctx ends or the driver fails, then stops
// everything; it returns the driver's failure, nil when asked to stop.
func waitAndStop(ctx context.Context, logger klog.Logger, d *driver.Driver, plugins *deviceplugin.Manager, srv *http.Server, owner *ownerWatch) error {
	select {
	case <-ctx.Done():
		logger.Info("Shutting down", "reason", context.Cause(ctx))
	case <-d.Done():
	}
	failure := d.Err()
	if ctx.Err() != nil {
		failure = nil
	}
	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(shutdownCtx)
		cancel()
	}
	if plugins != nil {
		plugins.Stop()
	}
	stopDriver(logger, d, owner, ctx.Err() != nil)
	return failure
}

// stopDriver stops the DRA plugin; asked to stop while its DaemonSet is
// gone (an uninstall, not an upgrade), it also removes the node state it
// would otherwise keep for the next tessera-node.
func stopDriver(logger klog.Logger, d *driver.Driver, owner *ownerWatch, signalled bool) {
	if owner == nil || !signalled || !owner.uninstalling(logger) {
		d.Stop()
		return
	}
	if err := d.RemoveState(); err != nil {
		logger.Error(err, "Uninstalled with state left on the node: delete the pods using GPUs before uninstalling (chart/tessera/README.md)")
		return
	}
	logger.Info("DaemonSet deleted: removed the checkpoint and plugin directory")
}

// armKillPoint sets the test kill point named by killpoint.Env, if any:
// once started (so the start's own checkpoint write is not counted),
// tessera-node kills itself with SIGKILL the nth time it reaches the point,
// as a crash or an OOM kill would, leaving whatever was half-done.
func armKillPoint(logger klog.Logger) error {
	spec := os.Getenv(killpoint.Env)
	if spec == "" {
		return nil
	}
	point, nth, err := killpoint.Parse(spec)
	if err != nil {
		return err
	}
	killpoint.Set(killpoint.OnNth(point, nth, func(p string) {
		logger.Info("Test kill point reached; killing tessera-node", "point", p, "nth", nth)
		klog.Flush()
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}))
	logger.Info("Test kill point armed", "point", point, "nth", nth)
	return nil
}

// armGPUFaults starts watching the test fault file named by gpufault.Env,
// if any: the fake GPUs it lists become unhealthy until it no longer lists
// them. Refused without fake GPUs, so that it can never act on real ones.
func armGPUFaults(ctx context.Context, logger klog.Logger, fake *gpu.Fake) error {
	path := os.Getenv(gpufault.Env)
	if path == "" {
		return nil
	}
	if fake == nil {
		return fmt.Errorf("%s is set (%q) but there are no fake GPUs: it is for tests with --fake-gpus only", gpufault.Env, path)
	}
	devs, err := fake.Devices()
	if err != nil {
		return fmt.Errorf("listing fake GPUs for %s: %w", gpufault.Env, err)
	}
	go gpufault.Watch(klog.NewContext(ctx, logger), path, len(devs), fake)
	logger.Info("Test GPU fault file armed", "file", path, "gpus", len(devs))
	return nil
}

func loadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (pass --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
