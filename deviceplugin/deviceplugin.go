// Package deviceplugin is tessera-node's kubelet device plugin: it serves the
// node's GPUs as extended resources, whole GPUs (nvidia.com/gpu by default)
// and fraction slots (tessera.dev/gpu-share), next to the DRA plugin and on
// the same ledger (the driver's checkpoint), so the two paths never hand out
// the same GPU capacity twice. See README.md.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// DefaultShareSlots is the number of fraction slots per GPU.
const DefaultShareSlots = 10

// Socket names in the device-plugin directory.
const (
	GPUSocket   = "tessera-gpu.sock"
	ShareSocket = "tessera-gpu-share.sock"
)

// Ledger is the node's one ledger (driver.Driver): both paths record and
// check there, under one lock.
type Ledger interface {
	GPUs() []gpu.Device
	AllocatePod(ctx context.Context, req driver.PodRequest) (*driver.PodCheckpoint, error)
	ReleasePod(ctx context.Context, uid string) (bool, error)
	PodAllocations() []driver.PodCheckpoint
	RecordRefusal(resource, reason string)
	// UnprepareGoneClaims unprepares the claims holding any of these GPUs
	// that the API server no longer has for this node (the driver's claim
	// check, now), returning how many.
	UnprepareGoneClaims(ctx context.Context, gpus []string) (int, error)
	// DeviceState gives the unhealthy GPUs and those claims and shares hold,
	// with a channel closed at the next change of either: the node's one
	// view of health (one NVML subscription, the driver's).
	DeviceState() (unhealthy, held map[string]bool, changed <-chan struct{})
}

var _ Ledger = &driver.Driver{}

// Options configure the device plugins.
type Options struct {
	NodeName   string
	KubeClient kubernetes.Interface
	Inventory  gpu.Inventory
	Ledger     Ledger
	// Dir is the kubelet's device-plugin directory (kubelet.sock and the
	// plugins' sockets); pluginapi.DevicePluginPath when empty.
	Dir string
	// GPUResource is the resource of whole GPUs; assignment.DefaultResourceGPU when empty.
	GPUResource string
	// ShareSlots is the number of tessera.dev/gpu-share slots per GPU;
	// DefaultShareSlots when 0.
	ShareSlots int
	// CheckInterval is how often the kubelet socket is checked for a kubelet
	// restart (1s when 0).
	CheckInterval time.Duration
	// ResyncInterval is how often the ledger is reconciled against the pods
	// (retrying failed releases); 1m when 0.
	ResyncInterval time.Duration
}

// Manager runs the two plugins and the pod informer that finds and releases
// device-plugin pods.
type Manager struct {
	opts    Options
	gpus    []gpu.Device
	byIndex map[int]gpu.Device
	byUUID  map[string]gpu.Device
	plugins []*plugin
	pods    corelisters.PodLister

	// allocMu serialises Allocate of both plugins, so two calls never pick
	// the same pod.
	allocMu sync.Mutex

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	regMu      sync.Mutex
	registered int  // successful registration rounds, for tests
	current    bool // registered with the kubelet now running (for the metrics)
}

// Start reconciles the ledger against the node's pods, serves the plugins'
// sockets and registers them with the kubelet (and again whenever the
// kubelet restarts). Stop (or cancelling ctx) stops them.
func Start(ctx context.Context, opts Options) (*Manager, error) {
	if opts.NodeName == "" || opts.KubeClient == nil || opts.Inventory == nil || opts.Ledger == nil {
		return nil, errors.New("device plugin: node name, Kubernetes client, inventory and ledger are required")
	}
	if opts.Dir == "" {
		opts.Dir = pluginapi.DevicePluginPath
	}
	if opts.GPUResource == "" {
		opts.GPUResource = assignment.DefaultResourceGPU
	}
	if opts.ShareSlots == 0 {
		opts.ShareSlots = DefaultShareSlots
	}
	if opts.GPUResource == assignment.ResourceShare {
		return nil, fmt.Errorf("device plugin: the whole-GPU resource cannot be %s, the resource of shares", assignment.ResourceShare)
	}
	if opts.ShareSlots < 0 {
		return nil, fmt.Errorf("device plugin: %d share slots per GPU", opts.ShareSlots)
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Second
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = time.Minute
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("device plugin: creating %s: %w", opts.Dir, err)
	}
	m := &Manager{opts: opts, byIndex: map[int]gpu.Device{}, byUUID: map[string]gpu.Device{}}
	m.gpus = opts.Ledger.GPUs()
	for _, g := range m.gpus {
		m.byIndex[g.Index] = g
		m.byUUID[g.UUID] = g
	}
	m.plugins = []*plugin{
		{m: m, resource: opts.GPUResource, socket: filepath.Join(opts.Dir, GPUSocket), whole: true},
		{m: m, resource: assignment.ResourceShare, socket: filepath.Join(opts.Dir, ShareSocket)},
	}
	m.ctx, m.cancel = context.WithCancel(ctx)
	logger := klog.FromContext(ctx)

	// Only this node's pods: the kubelet's pods are the candidates of
	// Allocate, and their end releases their GPUs.
	factory := informers.NewSharedInformerFactoryWithOptions(opts.KubeClient, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
		}))
	inf := factory.Core().V1().Pods()
	m.pods = inf.Lister()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if pod, ok := obj.(*corev1.Pod); ok && terminal(pod) {
				m.release(pod.UID, "pod finished ("+string(pod.Status.Phase)+")")
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				m.release(pod.UID, "pod deleted")
			}
		},
	}); err != nil {
		m.cancel()
		return nil, fmt.Errorf("device plugin: pod informer: %w", err)
	}
	factory.Start(m.ctx.Done())
	syncCtx, cancelSync := context.WithTimeout(m.ctx, time.Minute)
	synced := cache.WaitForCacheSync(syncCtx.Done(), inf.Informer().HasSynced)
	cancelSync()
	if !synced {
		m.cancel()
		factory.Shutdown()
		return nil, fmt.Errorf("device plugin: the pods of node %s did not sync within a minute (may tessera-node list and watch pods? see the chart's node-rbac.yaml)", opts.NodeName)
	}
	// Pods that went away while tessera-node was down release their GPUs
	// before anything is offered.
	m.reconcile(m.ctx)

	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.run(m.ctx)
		for _, p := range m.plugins {
			p.stop()
		}
		factory.Shutdown()
	}()
	logger.Info("Device plugins started", "dir", opts.Dir, "gpuResource", opts.GPUResource, "shareSlots", opts.ShareSlots)
	return m, nil
}

// Stop stops the plugins; the ledger stays.
func (m *Manager) Stop() {
	m.cancel()
	m.wg.Wait()
}

// Registrations is how many times both plugins registered with a kubelet.
func (m *Manager) Registrations() int {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	return m.registered
}

// Registered reports whether both plugins are registered with the kubelet
// whose socket is there now: false before the first registration, after a
// failed one, and while kubelet.sock is gone.
func (m *Manager) Registered() bool {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	return m.current
}

func (m *Manager) setCurrent(on bool) {
	m.regMu.Lock()
	m.current = on
	m.regMu.Unlock()
}

// run serves and registers the plugins, and does it again when the kubelet
// restarts: kubelet.sock replaced, or our sockets removed (the kubelet
// deletes the directory's sockets when it starts), as NVIDIA's device
// plugin does. It polls instead of using inotify: one stat per second is
// cheap and works on every filesystem.
func (m *Manager) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	kubeletSock := filepath.Join(m.opts.Dir, filepath.Base(pluginapi.KubeletSocket))
	var kubelet os.FileInfo // the kubelet.sock we registered with
	resync := time.NewTicker(m.opts.ResyncInterval)
	defer resync.Stop()
	check := time.NewTicker(m.opts.CheckInterval)
	defer check.Stop()
	for {
		cur, err := os.Stat(kubeletSock)
		switch {
		case err != nil:
			if kubelet != nil {
				logger.Info("Kubelet socket gone; waiting for the kubelet", "socket", kubeletSock)
			}
			kubelet = nil
			m.setCurrent(false)
		// A new kubelet.sock may reuse the old inode: compare the
		// modification time too.
		case kubelet == nil || !os.SameFile(kubelet, cur) || !cur.ModTime().Equal(kubelet.ModTime()) || m.socketsMissing():
			if kubelet != nil {
				logger.Info("Kubelet restarted; serving and registering the device plugins again")
			}
			if err := m.serveAndRegister(ctx, kubeletSock); err != nil {
				logger.Error(err, "Registering device plugins; retrying")
				kubelet = nil
				m.setCurrent(false)
			} else {
				kubelet = cur
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-check.C:
		case <-resync.C:
			m.reconcile(ctx)
		}
	}
}

func (m *Manager) socketsMissing() bool {
	for _, p := range m.plugins {
		if _, err := os.Stat(p.socket); err != nil {
			return true
		}
	}
	return false
}

func (m *Manager) serveAndRegister(ctx context.Context, kubeletSock string) error {
	for _, p := range m.plugins {
		if err := p.serve(ctx); err != nil {
			return err
		}
	}
	for _, p := range m.plugins {
		if err := p.register(ctx, kubeletSock); err != nil {
			return err
		}
	}
	m.regMu.Lock()
	m.registered++
	m.current = true
	m.regMu.Unlock()
	return nil
}

// release frees a pod's ledger entry, if it has one.
func (m *Manager) release(uid any, why string) {
	id := fmt.Sprint(uid)
	released, err := m.opts.Ledger.ReleasePod(m.ctx, id)
	if err != nil {
		// The periodic reconcile retries.
		klog.FromContext(m.ctx).Error(err, "Releasing device-plugin pod", "uid", id, "reason", why)
		return
	}
	if released {
		klog.FromContext(m.ctx).V(2).Info("Device-plugin pod released", "uid", id, "reason", why)
	}
}

// reconcile releases ledger entries whose pods are gone or finished. A pod
// missing from the informer's cache is looked up in the API server first, so
// an entry of a pod the cache has not seen yet is kept.
func (m *Manager) reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, p := range m.opts.Ledger.PodAllocations() {
		pod, err := m.pods.Pods(p.Namespace).Get(p.Name)
		if err != nil || string(pod.UID) != p.UID {
			live, lerr := m.opts.KubeClient.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			switch {
			case lerr == nil && string(live.UID) == p.UID:
				pod = live
			case lerr == nil || isNotFound(lerr):
				pod = nil
			default:
				logger.Error(lerr, "Checking a device-plugin pod; keeping its entry", "pod", klog.KRef(p.Namespace, p.Name))
				continue
			}
		}
		if pod == nil {
			m.release(p.UID, "pod gone")
		} else if terminal(pod) {
			m.release(p.UID, "pod finished")
		}
	}
}

func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// plugin is one resource's device plugin.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	m        *Manager
	resource string
	socket   string
	whole    bool

	mu     sync.Mutex
	server *grpc.Server
}

// serve (re)starts the plugin's gRPC server on its socket.
func (p *plugin) serve(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.stop()
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("device plugin %s: removing old socket: %w", p.resource, err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("device plugin %s: listening on %s: %w", p.resource, p.socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	p.mu.Lock()
	p.server = srv
	p.mu.Unlock()
	go func() {
		if err := srv.Serve(lis); err != nil {
			logger.Error(err, "Device plugin server stopped", "resource", p.resource)
		}
	}()
	return nil
}

func (p *plugin) stop() {
	p.mu.Lock()
	srv := p.server
	p.server = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// register tells the kubelet about the plugin.
func (p *plugin) register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("device plugin %s: connecting to the kubelet: %w", p.resource, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      p.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("device plugin %s: registering with the kubelet: %w", p.resource, err)
	}
	klog.FromContext(ctx).Info("Registered device plugin with the kubelet", "resource", p.resource, "endpoint", filepath.Base(p.socket))
	return nil
}

func (p *plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: p.whole}
}
