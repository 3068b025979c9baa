// Package driver is Tessera's DRA kubelet plugin for gpu.tessera.dev: it
// publishes the node's GPUs as ResourceSlice devices, and prepares and
// unprepares ResourceClaims for containers (sharing setup through the
// sharing package, one CDI spec per claim through the cdi package), keeping
// a crash-safe checkpoint of what it prepared.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/internal/killpoint"
	"github.com/tessera-gpu/tessera/sharing"
)

// DriverName is the DRA driver name (internal/draname; DESIGN.md, Names).
const DriverName = draname.Driver

// DefaultBootIDPath is where Linux exposes the boot ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// Options configure the plugin.
type Options struct {
	NodeName   string
	KubeClient kubernetes.Interface
	Inventory  gpu.Inventory

	// RegistrarDir is the kubelet's plugin registry directory
	// (kubeletplugin.KubeletRegistryDir when empty).
	RegistrarDir string
	// PluginDataDir holds the DRA socket and the checkpoint
	// (<kubeletplugin.KubeletPluginsDir>/gpu.tessera.dev when empty).
	PluginDataDir string
	// CDI configures the CDI spec writer (root, fake mode, driver roots).
	CDI cdi.Options
	// MPS configures MPS daemons; nil disables MPS on this node.
	MPS *sharing.MPSOptions
	// Mode, when set, fixes the sharing mode of every GPU of the node: it is
	// published as the mode attribute and claims in another mode are refused.
	Mode v1alpha1.SharingStrategy

	// CheckpointPath overrides <PluginDataDir>/checkpoint.json.
	CheckpointPath string
	// BootIDPath overrides DefaultBootIDPath.
	BootIDPath string
	// RecoverCheckpoint moves an unreadable (corrupt or newer-version)
	// checkpoint aside instead of refusing to start; see README.md.
	RecoverCheckpoint bool

	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer

	// ReconcileInterval is how often the prepared claims are checked
	// against the API server (see reconcileClaims); 1m when 0, never after
	// the one at start when negative.
	ReconcileInterval time.Duration

	// LabelClique writes the GPUs' multi-node NVLink clique as the node
	// label draname.LabelClique (clique.go).
	LabelClique bool
}

// Driver is a running plugin.
type Driver struct {
	opts    Options
	store   checkpointStore
	lock    *os.File // the plugin directory's lock (lockDir)
	bootID  string
	cdi     *cdi.Writer
	sharing *sharing.Manager
	metrics *metrics
	helper  *kubeletplugin.Helper

	// devices by device name and by UUID; fixed for the process' life.
	devices map[string]gpu.Device
	byUUID  map[string]gpu.Device
	sorted  []gpu.Device

	// mu guards the checkpoint and what is derived from it.
	mu   sync.Mutex
	ckpt *Checkpoint

	healthMu sync.Mutex
	health   Health

	// changed is closed and replaced at each change of the ledger or of
	// health (DeviceState).
	changedMu sync.Mutex
	changed   chan struct{}

	ready     atomic.Bool
	published atomic.Bool
	ctx       context.Context
	cancel    context.CancelCauseFunc
	wg        sync.WaitGroup

	// registered is the kubelet's last NotifyRegistrationStatus verdict on
	// the DRA plugin (false until it calls).
	registered atomic.Bool
}

var _ kubeletplugin.DRAPlugin = &Driver{}

// Start restores the checkpoint, starts the kubelet plugin sockets and
// publishes the node's GPUs. Stop (or cancelling ctx) stops it.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)

	d := &Driver{opts: opts, store: checkpointStore{path: opts.CheckpointPath}, health: Health{}, changed: make(chan struct{})}
	var err error
	if d.bootID, err = ReadBootID(opts.BootIDPath); err != nil {
		return nil, err
	}
	if d.lock, err = lockDir(ctx, filepath.Dir(opts.CheckpointPath)); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			d.lock.Close()
		}
	}()

	devs, err := opts.Inventory.Devices()
	if err != nil {
		return nil, fmt.Errorf("listing GPUs: %w", err)
	}
	d.sorted = devs
	d.devices = make(map[string]gpu.Device, len(devs))
	d.byUUID = make(map[string]gpu.Device, len(devs))
	for _, g := range devs {
		d.devices[DeviceName(g.Index)] = g
		d.byUUID[g.UUID] = g
	}
	mps, err := d.newSharing(logger)
	if err != nil {
		return nil, err
	}

	d.ctx, d.cancel = context.WithCancelCause(ctx)
	if err := d.restore(d.ctx); err != nil {
		d.cancel(err)
		return nil, err
	}
	// Claims deleted or replaced while tessera-node was down are unprepared
	// before the kubelet can call; an unreachable API server keeps them all.
	d.reconcileClaims(d.ctx)
	if mps != nil {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); mps.Supervise(d.ctx) }()
	}

	d.metrics.initLabels()
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(PluginRegistered("dra", d.registered.Load))
	}
	d.helper, err = kubeletplugin.Start(d.ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(opts.KubeClient),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDataDir),
		kubeletplugin.GRPCInterceptor(d.watchRegistration),
	)
	if err != nil {
		d.cancel(err)
		d.wg.Wait()
		return nil, fmt.Errorf("starting kubelet plugin: %w", err)
	}

	// Subscribe before the first publish so no health change is missed.
	events := opts.Inventory.Health(d.ctx)
	if err := d.publish(d.ctx); err != nil {
		d.Stop()
		return nil, err
	}
	d.startLoops(logger, events)
	started = true
	d.ready.Store(true)
	logger.Info("Tessera DRA plugin started", "node", opts.NodeName, "gpus", len(devs), "checkpoint", opts.CheckpointPath, "preparedClaims", len(d.ckpt.Claims))
	return d, nil
}

// complete checks the options, fills in the defaults and creates the
// kubelet plugin directories.
func (opts *Options) complete() error {
	if opts.NodeName == "" {
		return errors.New("node name is required")
	}
	if opts.Inventory == nil {
		return errors.New("GPU inventory is required")
	}
	if opts.KubeClient == nil {
		return errors.New("Kubernetes client is required")
	}
	if opts.Mode != "" && !oneOfStrategies(opts.Mode) {
		return fmt.Errorf("sharing mode %q: want one of Exclusive, MPS, TimeSlicing", opts.Mode)
	}
	if opts.RegistrarDir == "" {
		opts.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if opts.PluginDataDir == "" {
		opts.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, DriverName)
	}
	if opts.CheckpointPath == "" {
		opts.CheckpointPath = filepath.Join(opts.PluginDataDir, CheckpointFile)
	}
	if opts.BootIDPath == "" {
		opts.BootIDPath = DefaultBootIDPath
	}
	for _, dir := range []string{opts.RegistrarDir, opts.PluginDataDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if opts.ReconcileInterval == 0 {
		opts.ReconcileInterval = time.Minute
	}
	return nil
}

// newSharing sets up CDI, the sharing manager (with MPS when configured)
// and the metrics that read them.
func (d *Driver) newSharing(logger klog.Logger) (*sharing.MPSManager, error) {
	opts := d.opts
	if opts.CDI.Logger.GetSink() == nil {
		opts.CDI.Logger = logger
	}
	var err error
	if d.cdi, err = cdi.New(opts.CDI); err != nil {
		return nil, fmt.Errorf("CDI: %w", err)
	}
	var mps *sharing.MPSManager
	if opts.MPS != nil {
		// A root too long for the daemons' sockets fails here, at start, and
		// not at the first MPS claim.
		if err := sharing.CheckRoot(opts.MPS.Root); err != nil {
			return nil, err
		}
		mps = sharing.NewMPSManager(opts.Inventory, *opts.MPS)
	}
	d.sharing = sharing.NewManager(opts.Inventory, mps)
	d.metrics = newMetrics(opts.Registerer, func() float64 { return float64(d.sharing.MPSDaemons()) }, func() float64 {
		if mps == nil {
			return 0
		}
		return float64(mps.Restarts())
	})
	for _, g := range d.sorted {
		d.metrics.gpuHealthy.WithLabelValues(DeviceName(g.Index), g.UUID).Set(1)
	}
	return mps, nil
}

// startLoops starts what runs beside the plugin: the health watch, the
// clique label and the periodic reconcile.
func (d *Driver) startLoops(logger klog.Logger, events <-chan gpu.HealthEvent) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.watchHealth(d.ctx, events)
	}()
	if clique := nodeClique(logger, d.sorted); d.opts.LabelClique && clique != "" {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.labelClique(d.ctx, clique)
		}()
	}
	if d.opts.ReconcileInterval > 0 {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.reconcileEvery(d.ctx, d.opts.ReconcileInterval)
		}()
	}
}

// watchRegistration records the kubelet's registration verdict for the
// metrics: the helper's own RegistrationStatus is read without a lock.
func (d *Driver) watchRegistration(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		d.registered.Store(st.PluginRegistered)
		if !st.PluginRegistered {
			klog.FromContext(ctx).Error(nil, "The kubelet did not register the DRA plugin", "error", st.Error)
		}
	}
	return handler(ctx, req)
}

func oneOfStrategies(s v1alpha1.SharingStrategy) bool {
	for _, v := range v1alpha1.Strategies {
		if v == s {
			return true
		}
	}
	return false
}

// Stop stops the plugin's sockets, publishing and health watch. Prepared
// claims, their CDI specs and MPS daemons stay: they outlive a restart.
func (d *Driver) Stop() {
	d.stopPlugin("tessera-node stopping")
	d.lock.Close()
}

// stopPlugin stops the sockets and background work; the lock stays held.
func (d *Driver) stopPlugin(why string) {
	d.ready.Store(false)
	d.cancel(errors.New(why))
	d.helper.Stop()
	d.wg.Wait()
}

// Done is closed when the plugin stopped, on Stop or a fatal error.
func (d *Driver) Done() <-chan struct{} { return d.ctx.Done() }

// Err is why the plugin stopped.
func (d *Driver) Err() error { return context.Cause(d.ctx) }

// HandleError implements kubeletplugin.DRAPlugin: recoverable background
// errors are logged, others stop the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

// publish sends the current devices to the ResourceSlice controller.
func (d *Driver) publish(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.publishLocked(ctx)
}

// publishLocked is publish for callers holding d.mu: the device-plugin
// taints come from the ledger, and holding d.mu orders the publications as
// the ledger changes, so a stale set never overwrites a newer one.
func (d *Driver) publishLocked(ctx context.Context) error {
	if d.helper == nil {
		return nil // unit tests: no API server
	}
	d.healthMu.Lock()
	devices := BuildDevicesHeld(d.sorted, d.health, d.devicePluginHeld(), string(d.opts.Mode))
	d.healthMu.Unlock()
	if err := d.helper.PublishResources(ctx, Resources(d.opts.NodeName, devices)); err != nil {
		return fmt.Errorf("publishing ResourceSlices: %w", err)
	}
	d.published.Store(true)
	return nil
}

// republish publishes after a device-plugin allocation or release changed
// the taints. Callers hold d.mu. A failure is logged, not returned: the
// allocation stands (the ledger is what protects the GPU), and the next
// change or health event publishes again.
func (d *Driver) republish(ctx context.Context) {
	if err := d.publishLocked(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Republishing the device-plugin taints")
	}
}

// devicePluginHeld lists the GPUs of device-plugin entries (any state: a
// "preparing" entry holds its capacity too); whole wins over shared, and a
// GPU held whole names its pod: the ledger records the devices the kubelet
// gave, which is what the controller must count. Callers hold d.mu.
func (d *Driver) devicePluginHeld() DevicePluginHeld {
	out := DevicePluginHeld{}
	for uid, p := range d.ckpt.DevicePlugin {
		for _, dev := range p.Devices {
			if dev.Strategy == string(v1alpha1.Exclusive) {
				out[dev.GPUUUID] = DevicePluginMark{Taint: TaintValueWhole, Pod: uid}
			} else if out[dev.GPUUUID].Taint == "" {
				out[dev.GPUUUID] = DevicePluginMark{Taint: TaintValueShared}
			}
		}
	}
	return out
}

func (d *Driver) watchHealth(ctx context.Context, events <-chan gpu.HealthEvent) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			g, known := d.byUUID[ev.UUID]
			if !known {
				continue
			}
			d.healthMu.Lock()
			old, had := d.health[ev.UUID]
			changed := (had && old.Healthy != ev.Healthy) || (!had && !ev.Healthy) || (had && !ev.Healthy && old.XID != ev.XID)
			if ev.Healthy {
				delete(d.health, ev.UUID)
			} else {
				d.health[ev.UUID] = ev
			}
			d.healthMu.Unlock()
			if !changed {
				continue
			}
			healthy := 0.0
			if ev.Healthy {
				healthy = 1
			}
			d.metrics.gpuHealthy.WithLabelValues(DeviceName(g.Index), g.UUID).Set(healthy)
			logger.Info("GPU health changed", "gpu", DeviceName(g.Index), "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
			d.notify()
			if err := d.publish(ctx); err != nil {
				logger.Error(err, "Republishing after a health change")
			}
		}
	}
}

// Ready reports whether the plugin serves and has published its devices.
func (d *Driver) Ready() bool { return d.ready.Load() && d.published.Load() && d.ctx.Err() == nil }

// HTTPHandler serves /metrics (from gatherer, when not nil), /healthz and
// /readyz.
func (d *Driver) HTTPHandler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	if gatherer != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.ctx.Err(); err != nil {
			http.Error(w, "stopped: "+context.Cause(d.ctx).Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// restore loads the checkpoint and brings the node back in line with it:
// sharing state (MPS daemons are adopted or restarted) and CDI specs of
// prepared claims, removal of CDI specs of claims it does not know.
func (d *Driver) restore(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.removeTemps(ctx)
	ckpt, err := d.store.Load(d.bootID)
	if err != nil {
		if !d.opts.RecoverCheckpoint {
			return fmt.Errorf("%w; to start over, run with --recover-checkpoint (env TESSERA_RECOVER_CHECKPOINT=true), "+
				"which moves the file aside and forgets the claims it recorded (see driver/README.md, \"Checkpoint recovery\")", err)
		}
		moved, merr := d.store.MoveAside(time.Now())
		if merr != nil {
			return errors.Join(err, merr)
		}
		logger.Error(err, "Unreadable checkpoint moved aside; starting with no prepared claims", "movedTo", moved)
		ckpt = NewCheckpoint(d.bootID)
	}
	rebooted := ckpt.BootID != "" && ckpt.BootID != d.bootID
	if rebooted {
		logger.Info("Node rebooted since the checkpoint was written; recreating CDI specs and MPS daemons", "checkpointBootID", ckpt.BootID, "bootID", d.bootID)
	}
	ckpt.BootID = d.bootID
	d.ckpt = ckpt

	for _, cl := range ckpt.SortedClaims() {
		if cl.State != StatePrepared {
			// Half-done: it keeps its GPU memory; the kubelet's retry
			// completes it, or its unprepare cleans it up.
			logger.Info("Claim was being prepared when tessera-node stopped", "claim", klog.KRef(cl.Namespace, cl.Name), "uid", cl.UID)
			continue
		}
		if _, err := d.apply(ctx, cl); err != nil {
			// Not fatal: the claim stays recorded, and the kubelet's next
			// prepare retries.
			logger.Error(err, "Restoring prepared claim", "claim", klog.KRef(cl.Namespace, cl.Name), "uid", cl.UID)
			cl.State = StatePreparing
		}
	}
	for _, p := range ckpt.SortedPods() {
		if p.State != StatePrepared {
			// Half-done: it keeps its capacity until the pod is released
			// (the device plugin reconciles against the pods that exist).
			logger.Info("Device-plugin pod was being allocated when tessera-node stopped", "pod", klog.KRef(p.Namespace, p.Name), "uid", p.UID)
			continue
		}
		if _, err := d.apply(ctx, p.asClaim()); err != nil {
			logger.Error(err, "Restoring device-plugin allocation", "pod", klog.KRef(p.Namespace, p.Name), "uid", p.UID)
			p.State = StatePreparing
		}
	}
	if uids, err := d.cdi.List(); err != nil {
		logger.Error(err, "Listing CDI specs")
	} else {
		for _, uid := range uids {
			_, isPod := ckpt.DevicePlugin[uid]
			if _, ok := ckpt.Claims[uid]; !ok && !isPod {
				logger.Info("Removing CDI spec of an unknown claim", "uid", uid)
				if err := d.cdi.Remove(uid); err != nil {
					logger.Error(err, "Removing stale CDI spec", "uid", uid)
				}
			}
		}
	}
	if err := d.store.Save(ckpt); err != nil {
		return err
	}
	d.ledgerChanged()
	return nil
}

// removeTemps deletes the temp files of checkpoint and CDI spec writes a
// killed tessera-node left. This process holds the directory's lock and
// d.mu, so none of them belongs to a write in flight. A failure is logged:
// a leftover temp file wastes a few bytes, it never changes what is read.
func (d *Driver) removeTemps(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if names, err := d.store.RemoveTemps(); err != nil {
		logger.Error(err, "Removing checkpoint temp files", "removed", names)
	} else if len(names) > 0 {
		logger.Info("Removed checkpoint temp files left by an interrupted write", "files", names)
	}
	if names, err := d.cdi.RemoveTemps(); err != nil {
		logger.Error(err, "Removing CDI spec temp files", "removed", names)
	} else if len(names) > 0 {
		logger.Info("Removed CDI spec temp files left by an interrupted write", "files", names)
	}
}

// ledgerChanged follows every change of the ledger: it recomputes the
// gauges derived from it and wakes those waiting on DeviceState's channel.
// Callers hold d.mu (or are single-threaded at start).
func (d *Driver) ledgerChanged() {
	d.updateMetrics()
	d.notify()
}

// DeviceState is what the device plugin reports of each GPU: the unhealthy
// ones, and those a ResourceClaim or a device-plugin share holds in any
// state (a "preparing" entry holds its capacity too), which it must not
// offer as whole GPUs: otherwise the kubelet could pick one for a pod that
// another scheduler bound with nvidia.com/gpu, and the ledger would refuse
// the allocation, failing the pod. The channel is closed at the next change
// of either; it is taken before the state is read, so no change is missed.
func (d *Driver) DeviceState() (unhealthy, held map[string]bool, changed <-chan struct{}) {
	d.changedMu.Lock()
	changed = d.changed
	d.changedMu.Unlock()
	d.healthMu.Lock()
	unhealthy = make(map[string]bool, len(d.health))
	for u := range d.health {
		unhealthy[u] = true
	}
	d.healthMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	held = map[string]bool{}
	for _, h := range d.holders() {
		for _, dev := range h.devices {
			if dev.AdminAccess || (h.devicePlugin && dev.Strategy == string(v1alpha1.Exclusive)) {
				continue
			}
			held[dev.GPUUUID] = true
		}
	}
	return unhealthy, held, changed
}

// notify closes and replaces the DeviceState channel.
func (d *Driver) notify() {
	d.changedMu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.changedMu.Unlock()
}

// updateMetrics recomputes the gauges derived from the checkpoint. Callers
// hold d.mu (or are single-threaded at start).
func (d *Driver) updateMetrics() {
	prepared := 0
	used := map[string]uint64{}
	for _, cl := range d.ckpt.Claims {
		if cl.State == StatePrepared {
			prepared++
		}
	}
	for _, h := range d.holders() {
		for _, dev := range h.devices {
			if !dev.AdminAccess {
				used[dev.GPUUUID] += ledgerMemory(dev, d.byUUID[dev.GPUUUID])
			}
		}
	}
	d.metrics.preparedClaims.Set(float64(prepared))
	pods := map[string]int{}
	for _, p := range d.ckpt.DevicePlugin {
		pods[p.Resource]++
	}
	d.metrics.devicePluginPods.Reset()
	for res, n := range pods {
		d.metrics.devicePluginPods.WithLabelValues(res).Set(float64(n))
	}
	for _, g := range d.sorted {
		d.metrics.memoryAllocated.WithLabelValues(DeviceName(g.Index), g.UUID).Set(float64(used[g.UUID]))
	}
}

// ledgerMemory is the memory a device entry holds: an exclusive claim holds
// the whole GPU whatever it asked for, since nobody may share it.
func ledgerMemory(dev DeviceCheckpoint, g gpu.Device) uint64 {
	if dev.Strategy == string(v1alpha1.Exclusive) && g.MemoryBytes > 0 {
		return g.MemoryBytes
	}
	return dev.MemoryBytes
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
//
// For the whole batch: plan and check every claim, write the checkpoint
// with the new claims "preparing", set up sharing and write CDI specs, then
// write the checkpoint with them "prepared". Two checkpoint writes per
// batch, not per claim, keep a pod with many claims fast.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()

	start := time.Now()
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var pending []*ClaimCheckpoint
	for _, claim := range claims {
		uid := string(claim.UID)
		if cl, ok := d.ckpt.Claims[uid]; ok && cl.State == StatePrepared {
			// Idempotent: the kubelet asks again after its own restart.
			result[claim.UID] = kubeletplugin.PrepareResult{Devices: resultDevices(cl)}
			continue
		}
		cl, err := d.plan(claim)
		if err == nil {
			err = d.checkLedger(cl.UID, "claim "+cl.Namespace+"/"+cl.Name, cl.Devices)
		}
		if err != nil {
			logger.Error(err, "Refusing claim", "claim", klog.KObj(claim))
			d.metrics.prepareErrors.Inc()
			result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		// Entered now so the next claims of the batch see its memory.
		d.ckpt.Claims[uid] = cl
		pending = append(pending, cl)
	}
	if len(pending) == 0 {
		return result, nil
	}

	killpoint.Reach(killpoint.BeforePreparingSave)
	if err := d.store.Save(d.ckpt); err != nil {
		for _, cl := range pending {
			delete(d.ckpt.Claims, cl.UID)
		}
		return nil, fmt.Errorf("checkpoint before preparing: %w", err)
	}
	killpoint.Reach(killpoint.AfterPreparingSave)

	for _, cl := range pending {
		if _, err := d.apply(ctx, cl); err != nil {
			logger.Error(err, "Preparing claim failed; rolling back", "claim", klog.KRef(cl.Namespace, cl.Name))
			if uerr := d.undo(ctx, cl); uerr != nil {
				// Keep the record ("preparing"), so unprepare or a retry
				// cleans up what could not be undone now.
				logger.Error(uerr, "Rolling back claim", "claim", klog.KRef(cl.Namespace, cl.Name))
			} else {
				delete(d.ckpt.Claims, cl.UID)
			}
			d.metrics.prepareErrors.Inc()
			result[types.UID(cl.UID)] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		cl.State = StatePrepared
		cl.Time = time.Now().UTC()
		result[types.UID(cl.UID)] = kubeletplugin.PrepareResult{Devices: resultDevices(cl)}
	}
	killpoint.Reach(killpoint.BeforePreparedSave)
	if err := d.store.Save(d.ckpt); err != nil {
		// The work is done but not recorded as such: report failure, the
		// kubelet retries, and the retry finds "preparing" and redoes it
		// idempotently.
		for _, cl := range pending {
			cl.State = StatePreparing
		}
		return nil, fmt.Errorf("checkpoint after preparing: %w", err)
	}
	killpoint.Reach(killpoint.AfterPreparedSave)
	d.ledgerChanged()
	per := time.Since(start).Seconds() / float64(len(pending))
	for range pending {
		d.metrics.prepareLatency.WithLabelValues("prepare").Observe(per)
	}
	return result, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	result := make(map[types.UID]error, len(claims))
	removed := 0
	for _, c := range claims {
		result[c.UID] = nil
		cl, ok := d.ckpt.Claims[string(c.UID)]
		if !ok {
			continue // idempotent: never prepared, or already unprepared
		}
		if err := d.undo(ctx, cl); err != nil {
			result[c.UID] = err
			continue
		}
		delete(d.ckpt.Claims, string(c.UID))
		removed++
	}
	if removed == 0 {
		return result, nil
	}
	killpoint.Reach(killpoint.UnprepareBeforeSave)
	if err := d.store.Save(d.ckpt); err != nil {
		return nil, fmt.Errorf("checkpoint after unpreparing: %w", err)
	}
	killpoint.Reach(killpoint.AfterUnprepareSave)
	d.ledgerChanged()
	per := time.Since(start).Seconds() / float64(removed)
	for range removed {
		d.metrics.prepareLatency.WithLabelValues("unprepare").Observe(per)
	}
	return result, nil
}

// plan turns an allocated claim into its checkpoint record (state
// preparing): which GPUs, how much memory, which sharing config.
func (d *Driver) plan(claim *resourceapi.ResourceClaim) (*ClaimCheckpoint, error) {
	ref := claim.Namespace + "/" + claim.Name
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, fmt.Errorf("claim %s is not allocated", ref)
	}
	cl := &ClaimCheckpoint{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name, State: StatePreparing, Time: time.Now().UTC()}
	for _, r := range alloc.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("claim %s request %q: device %s is from pool %q, this node is %q", ref, r.Request, r.Device, r.Pool, d.opts.NodeName)
		}
		g, ok := d.devices[r.Device]
		if !ok {
			return nil, fmt.Errorf("claim %s request %q: this node has no device %q", ref, r.Request, r.Device)
		}
		cfg, err := v1alpha1.ConfigForRequest(DriverName, alloc.Devices.Config, r.Request)
		if err != nil {
			return nil, fmt.Errorf("claim %s: invalid %s opaque config: %w", ref, v1alpha1.Kind, err)
		}
		strategy := cfg.Strategy()
		if d.opts.Mode != "" && strategy != d.opts.Mode {
			return nil, fmt.Errorf("claim %s request %q: sharing mode %s, but the GPUs of node %s are fixed to %s by the admin", ref, r.Request, strategy, d.opts.NodeName, d.opts.Mode)
		}
		mem := g.MemoryBytes
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			if q.Sign() <= 0 {
				return nil, fmt.Errorf("claim %s request %q: consumed memory %s is not positive", ref, r.Request, q.String())
			}
			mem = uint64(q.Value())
		}
		if mem > g.MemoryBytes {
			return nil, fmt.Errorf("claim %s request %q: consumed memory %d bytes exceeds %s's %d bytes", ref, r.Request, mem, r.Device, g.MemoryBytes)
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			return nil, fmt.Errorf("claim %s: encoding config: %w", ref, err)
		}
		dev := DeviceCheckpoint{
			Request: r.Request, Pool: r.Pool, Device: r.Device, GPUUUID: g.UUID,
			MemoryBytes: mem, Strategy: string(strategy), Config: raw,
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		}
		if r.ShareID != nil {
			dev.ShareID = string(*r.ShareID)
		}
		cl.Devices = append(cl.Devices, dev)
	}
	return cl, nil
}

// holder is one entry of the ledger: a ResourceClaim or a device-plugin pod.
type holder struct {
	uid string
	// desc names it in refusals: "ResourceClaim ns/c" or "pod ns/p (device plugin)".
	desc    string
	devices []DeviceCheckpoint
	// devicePlugin marks a device-plugin pod: the whole GPUs (Exclusive)
	// of one are what the kubelet already accounts as allocated.
	devicePlugin bool
}

// holders lists every ledger entry of both paths. Callers hold d.mu.
func (d *Driver) holders() []holder {
	out := make([]holder, 0, len(d.ckpt.Claims)+len(d.ckpt.DevicePlugin))
	for _, cl := range d.ckpt.Claims {
		out = append(out, holder{uid: cl.UID, desc: "ResourceClaim " + cl.Namespace + "/" + cl.Name, devices: cl.Devices})
	}
	for _, p := range d.ckpt.DevicePlugin {
		out = append(out, holder{uid: p.UID, desc: "pod " + p.Namespace + "/" + p.Name + " (device plugin)", devices: p.Devices, devicePlugin: true})
	}
	return out
}

// checkLedger is the one over-commit check of the node, for claims and
// device-plugin pods alike (who names the requester, "claim ns/c" or "pod
// ns/p"): a GPU held whole (Exclusive) by anyone cannot be used by anyone
// else; a GPU holds one sharing mode at a time; and the memory of its holders
// must fit it. Refusals name what holds the capacity.
func (d *Driver) checkLedger(uid, who string, devices []DeviceCheckpoint) error {
	type want struct {
		mem      uint64
		strategy v1alpha1.SharingStrategy
	}
	wants := map[string]*want{}
	var order []string
	for _, dev := range devices {
		if dev.AdminAccess {
			continue
		}
		w, ok := wants[dev.GPUUUID]
		if !ok {
			w = &want{strategy: v1alpha1.SharingStrategy(dev.Strategy)}
			wants[dev.GPUUUID] = w
			order = append(order, dev.GPUUUID)
		} else if w.strategy != v1alpha1.SharingStrategy(dev.Strategy) {
			return fmt.Errorf("%s asks for GPU %s in two sharing modes (%s and %s); one sharing mode per GPU at a time", who, dev.GPUUUID, w.strategy, dev.Strategy)
		}
		w.mem += ledgerMemory(dev, d.byUUID[dev.GPUUUID])
	}
	all := d.holders()
	for _, uuid := range order {
		w := wants[uuid]
		g := d.byUUID[uuid]
		var used uint64
		var mode v1alpha1.SharingStrategy
		var names, whole []string
		for _, other := range all {
			if other.uid == uid {
				continue
			}
			held := false
			for _, dev := range other.devices {
				if dev.GPUUUID != uuid || dev.AdminAccess {
					continue
				}
				used += ledgerMemory(dev, g)
				mode = v1alpha1.SharingStrategy(dev.Strategy)
				held = true
			}
			if held {
				names = append(names, other.desc)
				if mode == v1alpha1.Exclusive {
					whole = append(whole, other.desc)
				}
			}
		}
		sort.Strings(names)
		sort.Strings(whole)
		if len(whole) > 0 {
			return fmt.Errorf("%s refused on %s (%s): the GPU is held whole by %s (sharing mode Exclusive); it would be over-committed",
				who, DeviceName(g.Index), uuid, strings.Join(whole, ", "))
		}
		if err := sharing.CheckMode(uuid, mode, w.strategy, len(names)); err != nil {
			return fmt.Errorf("%s refused on %s: %w (held by %s)", who, DeviceName(g.Index), err, strings.Join(names, ", "))
		}
		if used+w.mem > g.MemoryBytes {
			return fmt.Errorf("%s refused on %s (%s): it needs %d bytes of GPU memory, but %d of %d bytes are already held by %s; the GPU would be over-committed",
				who, DeviceName(g.Index), uuid, w.mem, used, g.MemoryBytes, strings.Join(names, ", "))
		}
	}
	return nil
}

// apply sets up sharing for every GPU of a claim and writes its CDI spec.
// It is idempotent, so it serves first preparation, retries and restore.
func (d *Driver) apply(ctx context.Context, cl *ClaimCheckpoint) ([]string, error) {
	if len(cl.Devices) == 0 {
		return nil, nil
	}
	claim := cdi.Claim{UID: cl.UID, Namespace: cl.Namespace, Name: cl.Name}
	for _, dev := range cl.Devices {
		cfg, err := decodeStored(dev.Config)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", cl.Namespace, cl.Name, err)
		}
		g := d.byUUID[dev.GPUUUID]
		if g.UUID == "" {
			return nil, fmt.Errorf("claim %s/%s: GPU %s is no longer on this node", cl.Namespace, cl.Name, dev.GPUUUID)
		}
		p, err := d.sharing.Prepare(ctx, cl.UID, dev.GPUUUID, cfg)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s on %s: %w", cl.Namespace, cl.Name, dev.Device, err)
		}
		mem := dev.MemoryBytes
		if cfg.Strategy() == v1alpha1.Exclusive {
			mem = 0 // whole GPU
		}
		claim.Devices = append(claim.Devices, cdi.Device{Request: dev.Request, GPU: g, MemoryBytes: mem, Config: cfg, MPSPipeDir: p.MPSPipeDir})
	}
	ids, err := d.cdi.Write(claim)
	if err != nil {
		return nil, err
	}
	for i := range cl.Devices {
		cl.Devices[i].CDIDeviceID = ids[i]
	}
	return ids, nil
}

// undo releases sharing and removes the CDI spec of a claim.
func (d *Driver) undo(ctx context.Context, cl *ClaimCheckpoint) error {
	var errs []error
	for _, dev := range cl.Devices {
		if cl.State == StatePreparing && dev.Strategy == string(v1alpha1.MPS) && d.sharing.MPS() != nil {
			// A claim left half-prepared by an earlier process may have
			// started its GPU's daemon; adopt it first so the release below
			// stops it when this was the last claim.
			if mode, _ := d.sharing.Mode(dev.GPUUUID); mode == "" {
				if _, err := os.Stat(filepath.Join(d.sharing.MPS().PipeDir(dev.GPUUUID), sharing.PIDFile)); err == nil {
					if cfg, err := decodeStored(dev.Config); err == nil {
						_, _ = d.sharing.Prepare(ctx, cl.UID, dev.GPUUUID, cfg)
					}
				}
			}
		}
		if err := d.sharing.Unprepare(ctx, cl.UID, dev.GPUUUID); err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s on %s: %w", cl.Namespace, cl.Name, dev.Device, err))
		}
	}
	if err := d.cdi.Remove(cl.UID); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func decodeStored(raw json.RawMessage) (*v1alpha1.GpuConfig, error) {
	if len(raw) == 0 {
		return v1alpha1.DefaultGpuConfig(), nil
	}
	cfg, err := v1alpha1.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("checkpointed config: %w", err)
	}
	cfg.Default()
	return cfg, nil
}

func resultDevices(cl *ClaimCheckpoint) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(cl.Devices))
	for _, dev := range cl.Devices {
		kd := kubeletplugin.Device{Requests: []string{dev.Request}, PoolName: dev.Pool, DeviceName: dev.Device}
		if dev.CDIDeviceID != "" {
			kd.CDIDeviceIDs = []string{dev.CDIDeviceID}
		}
		if dev.ShareID != "" {
			id := types.UID(dev.ShareID)
			kd.ShareID = &id
		}
		out = append(out, kd)
	}
	return out
}

// PreparedClaims returns a copy of the checkpointed claims, for tests and
// debugging.
func (d *Driver) PreparedClaims() []ClaimCheckpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []ClaimCheckpoint
	for _, cl := range d.ckpt.SortedClaims() {
		out = append(out, *cl)
	}
	return out
}
