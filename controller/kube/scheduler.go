package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
	upstreamlisters "k8s.io/client-go/listers/scheduling/v1beta1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/klog/v2"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

var everything = labels.Everything()

// Informer indexes: ResourceSlices by spec.nodeName ("" for slices not
// local to one node), PersistentVolumes by storage class.
const (
	sliceNodeIndex = "node"
	pvClassIndex   = "storageClass"
	// capacityClassIndex indexes CSIStorageCapacity objects by storage class.
	capacityClassIndex = "storageClass"
)

// GVRs of Tessera's CRDs.
var (
	QueueGVR    = schema.GroupVersionResource{Group: schedv1.GroupName, Version: "v1alpha1", Resource: "queues"}
	PodGroupGVR = schema.GroupVersionResource{Group: schedv1.GroupName, Version: "v1alpha1", Resource: "podgroups"}
)

// Options configure a Scheduler.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Interval between cycles (default 1 s); a relevant change starts one sooner.
	Interval time.Duration
	// Core tunes the scheduling core.
	Core core.Config
	// Workers bounds the parallel API writes of a commit (default 32).
	Workers int
	// Metrics, when set, receives the scheduler's figures.
	Metrics *Metrics
	// GPUResource is the extended resource of whole GPUs that tessera-node's
	// device plugin advertises (default assignment.DefaultResourceGPU,
	// nvidia.com/gpu): a pod asking for it gets that many GPUs from the core
	// and an assignment annotation (assign.go).
	GPUResource string
	// Fence, when set, is asked before every write of a commit whether this
	// replica may still write (nil) or not (why): the leader election's
	// check that the Lease is still ours and renewed within its deadline.
	// A refusal ends the commit, the cycle and Run with ErrFenced. Nil: no
	// fencing (no leader election: one replica only).
	Fence func() error
	// Hook, when set, is called at the commit's HookPoints; tests stop or
	// crash the process there (EnvTestCommitHook).
	Hook func(HookPoint)
	// AwaitGrouper, when set, is the pod grouper's word on a pending pod of
	// ours: a reason while the pod waits for its gang to be worked out
	// (controller/grouper; AwaitsGrouper), "" otherwise.
	AwaitGrouper func(*v1.Pod) string
	// Usage, when set, keeps the usage history (usage.go): Queue status
	// and metrics show it, and fair share weighs it when
	// Core.UsageCoefficient is above 0.
	Usage *UsageOptions
	// Shadow, when set, runs shadow cycles (shadow.go): decisions for the
	// pods of other schedulers, nothing written, a ShadowReport each cycle.
	Shadow *ShadowOptions
}

// Scheduler is tessera-scheduler: informers in, core decisions out.
type Scheduler struct {
	opts        Options
	client      kubernetes.Interface
	dyn         dynamic.Interface
	factory     informers.SharedInformerFactory
	dfactory    dynamicinformer.DynamicSharedInformerFactory
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster

	podLister      corelisters.PodLister
	nodeLister     corelisters.NodeLister
	claimLister    resourcelisters.ResourceClaimLister
	classLister    resourcelisters.DeviceClassLister
	sliceLister    resourcelisters.ResourceSliceLister
	priorityLister schedulinglisters.PriorityClassLister
	// upstreamLister reads scheduling.k8s.io/v1beta1 PodGroups; nil when
	// the API server did not serve them at Start (upstream.go).
	upstreamLister upstreamlisters.PodGroupLister
	// Volumes (volumes.go).
	pvcLister          corelisters.PersistentVolumeClaimLister
	pvLister           corelisters.PersistentVolumeLister
	pvIndexer          cache.Indexer // by storage class (pvClassIndex)
	storageClassLister storagelisters.StorageClassLister
	csiNodeLister      storagelisters.CSINodeLister
	csiDriverLister    storagelisters.CSIDriverLister
	capacityIndexer    cache.Indexer // CSIStorageCapacity by storage class (capacityClassIndex)
	// Namespaces, for pod affinity terms with a namespaceSelector.
	namespaceLister corelisters.NamespaceLister
	sliceIndexer    cache.Indexer
	queueInformer   cache.SharedIndexInformer
	groupInformer   cache.SharedIndexInformer
	// topologyInformer holds the Topology objects (topology.go).
	topologyInformer cache.SharedIndexInformer
	celCache         *cel.Cache

	kick chan struct{}

	// Cycle state, touched only by the cycle goroutine.
	podCache   map[types.UID]*podEntry
	gpuCache   map[string]*nodeGPUs
	belowSince map[string]time.Time
	pdbBlocked map[string]bool
	pdbExpiry  map[string]time.Time
	nominated  map[string]nomination
	// malformed remembers the last device-plugin warning given on each
	// bound pod (warnOnce: a malformed or ignored assignment, a node record
	// that disagrees), so it is reported once.
	malformed map[types.UID]string
	// problems are the core's Result.Problems of the last cycle, logged
	// when they first appear (logProblems).
	problems map[core.Problem]bool
	// pending remembers the reason last written on each pending pod so
	// unchanged reasons cost no API call.
	pending map[string]string
	// queueStatus and groupStatus remember what was last written.
	queueStatus map[string]schedv1.QueueStatus
	groupStatus map[string]schedv1.PodGroupStatus

	dirtyMu    sync.Mutex
	dirtyNodes map[string]bool
	allDirty   bool

	// usage is the usage history; nil without Options.Usage.
	usage *usageKeeper

	// synced is set once the informers' caches are filled (readiness).
	synced atomic.Bool
	// nextWindow is the next boundary of a Queue's schedule (Unix ns; 0:
	// none), from the last cycle's snapshot.
	nextWindow atomic.Int64
	// own is what the last commit wrote; the next cycle waits for it.
	own ownWrites
	// dumps are the snapshot requests for the next cycle (replay.go).
	dumps dumpRequests
	// shadowLast is the last shadow cycle's report (shadow.go).
	shadowLast shadowState
}

// New builds a Scheduler; Run starts it.
func New(opts Options) (*Scheduler, error) {
	if opts.Client == nil || opts.Dynamic == nil {
		return nil, fmt.Errorf("kube: Client and Dynamic are required")
	}
	if opts.Shadow != nil && (opts.Usage != nil || opts.Hook != nil) {
		// The usage history saves a ConfigMap; shadow mode writes nothing.
		return nil, fmt.Errorf("kube: shadow mode keeps no usage history and has no commit hooks")
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Workers <= 0 {
		opts.Workers = 32
	}
	if opts.GPUResource == "" {
		opts.GPUResource = assignment.DefaultResourceGPU
	}
	s := &Scheduler{
		opts:        opts,
		client:      opts.Client,
		dyn:         opts.Dynamic,
		factory:     informers.NewSharedInformerFactory(opts.Client, 0),
		dfactory:    dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0),
		kick:        make(chan struct{}, 1),
		podCache:    map[types.UID]*podEntry{},
		gpuCache:    map[string]*nodeGPUs{},
		belowSince:  map[string]time.Time{},
		pdbBlocked:  map[string]bool{},
		pdbExpiry:   map[string]time.Time{},
		nominated:   map[string]nomination{},
		malformed:   map[types.UID]string{},
		pending:     map[string]string{},
		queueStatus: map[string]schedv1.QueueStatus{},
		groupStatus: map[string]schedv1.PodGroupStatus{},
		dirtyNodes:  map[string]bool{},
		allDirty:    true,
		celCache:    cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true}),
	}
	var err error
	if s.usage, err = newUsageKeeper(s, opts.Usage); err != nil {
		return nil, err
	}
	s.broadcaster = record.NewBroadcaster()
	s.recorder = s.broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: SchedulerName})

	if err := s.indexInformers(); err != nil {
		return nil, err
	}
	if err := s.addHandlers(); err != nil {
		return nil, err
	}
	return s, nil
}

// indexInformers sets the listers the cycle reads and the indexes that keep
// per-pod reads to one node's or one class's objects.
func (s *Scheduler) indexInformers() error {
	s.podLister = s.factory.Core().V1().Pods().Lister()
	s.nodeLister = s.factory.Core().V1().Nodes().Lister()
	s.claimLister = s.factory.Resource().V1().ResourceClaims().Lister()
	s.classLister = s.factory.Resource().V1().DeviceClasses().Lister()
	s.sliceLister = s.factory.Resource().V1().ResourceSlices().Lister()
	s.priorityLister = s.factory.Scheduling().V1().PriorityClasses().Lister()
	s.pvcLister = s.factory.Core().V1().PersistentVolumeClaims().Lister()
	s.pvLister = s.factory.Core().V1().PersistentVolumes().Lister()
	s.storageClassLister = s.factory.Storage().V1().StorageClasses().Lister()
	s.csiNodeLister = s.factory.Storage().V1().CSINodes().Lister()
	s.namespaceLister = s.factory.Core().V1().Namespaces().Lister()
	sliceInformer := s.factory.Resource().V1().ResourceSlices().Informer()
	// Slices by node, so a commit reads one node's slices, not the cluster's.
	if err := sliceInformer.AddIndexers(cache.Indexers{sliceNodeIndex: sliceByNode}); err != nil {
		return err
	}
	s.sliceIndexer = sliceInformer.GetIndexer()
	// Volumes by storage class, so a pod waiting for a pre-created volume
	// reads its class's volumes, not the cluster's (per pod, per cycle).
	pvInformer := s.factory.Core().V1().PersistentVolumes().Informer()
	if err := pvInformer.AddIndexers(cache.Indexers{pvClassIndex: pvByClass}); err != nil {
		return err
	}
	s.pvIndexer = pvInformer.GetIndexer()
	s.csiDriverLister = s.factory.Storage().V1().CSIDrivers().Lister()
	// Storage capacity by class, so a pod's claim reads its class's
	// capacities, not the cluster's (one object per class and topology).
	capacityInformer := s.factory.Storage().V1().CSIStorageCapacities().Informer()
	if err := capacityInformer.AddIndexers(cache.Indexers{capacityClassIndex: capacityByClass}); err != nil {
		return err
	}
	s.capacityIndexer = capacityInformer.GetIndexer()
	s.queueInformer = s.dfactory.ForResource(QueueGVR).Informer()
	s.groupInformer = s.dfactory.ForResource(PodGroupGVR).Informer()
	s.topologyInformer = s.dfactory.ForResource(TopologyGVR).Informer()

	return nil
}

// addHandlers kicks a cycle on the changes that can matter.
func (s *Scheduler) addHandlers() error {
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.Kick() },
		UpdateFunc: func(any, any) { s.Kick() },
		DeleteFunc: func(any) { s.Kick() },
	}
	// Pods: only changes that can matter (ours, or a pod leaving a node).
	if _, err := s.factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*v1.Pod); ok && p.Spec.SchedulerName == SchedulerName && p.Spec.NodeName == "" {
				s.Kick()
			}
		},
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*v1.Pod); ok && (p.DeletionTimestamp != nil || p.Spec.SchedulerName == SchedulerName && p.Spec.NodeName == "") {
				s.Kick()
			}
		},
		DeleteFunc: func(any) { s.Kick() },
	}); err != nil {
		return err
	}
	if _, err := s.factory.Resource().V1().ResourceSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.sliceChanged(obj) },
		UpdateFunc: func(_, obj any) { s.sliceChanged(obj) },
		DeleteFunc: func(obj any) { s.sliceChanged(obj) },
	}); err != nil {
		return err
	}
	for _, inf := range []cache.SharedIndexInformer{
		s.factory.Core().V1().Nodes().Informer(),
		s.factory.Resource().V1().ResourceClaims().Informer(),
		s.factory.Resource().V1().DeviceClasses().Informer(),
		s.factory.Scheduling().V1().PriorityClasses().Informer(),
		s.factory.Core().V1().PersistentVolumeClaims().Informer(),
		s.factory.Core().V1().PersistentVolumes().Informer(),
		s.factory.Storage().V1().StorageClasses().Informer(),
		s.factory.Storage().V1().CSINodes().Informer(),
		s.factory.Storage().V1().CSIDrivers().Informer(),
		s.factory.Storage().V1().CSIStorageCapacities().Informer(),
		s.factory.Core().V1().Namespaces().Informer(),
		s.queueInformer, s.groupInformer, s.topologyInformer,
	} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return err
		}
	}
	return nil
}

// Kick asks for a cycle soon.
func (s *Scheduler) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Scheduler) sliceChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s.dirtyMu.Lock()
	if sl, ok := obj.(*resourceapi.ResourceSlice); ok && sl.Spec.NodeName != nil {
		s.dirtyNodes[*sl.Spec.NodeName] = true
	} else {
		s.allDirty = true
	}
	s.dirtyMu.Unlock()
	s.Kick()
}

// refreshGPUs re-reads the GPUs of nodes whose slices changed.
func (s *Scheduler) refreshGPUs(logger klog.Logger) {
	s.dirtyMu.Lock()
	dirty, all := s.dirtyNodes, s.allDirty
	s.dirtyNodes, s.allDirty = map[string]bool{}, false
	s.dirtyMu.Unlock()
	if !all && len(dirty) == 0 {
		return
	}
	slices, err := s.sliceLister.List(everything)
	if err != nil {
		logger.Error(err, "Listing ResourceSlices")
		return
	}
	byNode := map[string][]*resourceapi.ResourceSlice{}
	for _, sl := range slices {
		if sl.Spec.NodeName == nil || sl.Spec.Driver != DriverName {
			continue
		}
		if all || dirty[*sl.Spec.NodeName] {
			byNode[*sl.Spec.NodeName] = append(byNode[*sl.Spec.NodeName], sl)
		}
	}
	if all {
		s.gpuCache = map[string]*nodeGPUs{}
	}
	for name := range dirty {
		delete(s.gpuCache, name)
	}
	for name, sls := range byNode {
		s.gpuCache[name] = gpusFromSlices(logger, sls)
	}
}

func (s *Scheduler) getClaim(namespace, name string) *resourceapi.ResourceClaim {
	c, err := s.claimLister.ResourceClaims(namespace).Get(name)
	if err != nil {
		return nil
	}
	return c
}

func (s *Scheduler) getClass(name string) *resourceapi.DeviceClass {
	c, err := s.classLister.Get(name)
	if err != nil {
		return nil
	}
	return c
}

// getPodGroup returns a PodGroup, nil when it does not exist; the error
// says why one that exists cannot be read (its pods wait with it).
func (s *Scheduler) getPodGroup(namespace, name string) (*schedv1.PodGroup, error) {
	obj, ok, err := s.groupInformer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, nil
	}
	pg, err := fromUnstructured[schedv1.PodGroup](obj)
	if err != nil {
		return nil, fmt.Errorf("PodGroup %s/%s cannot be read: %w", namespace, name, err)
	}
	return pg, nil
}

// listQueues returns the Queues; one that cannot be decoded is returned by
// name only, with the reason in bad (it is left out, its pods wait).
func (s *Scheduler) listQueues() (out []*schedv1.Queue, bad map[string]string) {
	bad = map[string]string{}
	for _, obj := range s.queueInformer.GetStore().List() {
		q, err := fromUnstructured[schedv1.Queue](obj)
		if err != nil {
			u, ok := obj.(metav1.Object)
			if !ok {
				continue
			}
			q = &schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: u.GetName()}}
			bad[q.Name] = fmt.Sprintf("queue %s cannot be read: %v", q.Name, err)
		}
		out = append(out, q)
	}
	return out, bad
}

// Start starts the informers and waits for their caches.
func (s *Scheduler) Start(ctx context.Context) error {
	if err := s.watchUpstreamGroups(); err != nil {
		return err
	}
	s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	s.factory.Start(ctx.Done())
	s.dfactory.Start(ctx.Done())
	for t, ok := range s.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync", t)
		}
	}
	for r, ok := range s.dfactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync (is the CRD installed?)", r)
		}
	}
	s.synced.Store(true)
	return nil
}

// Synced says whether Start has filled the informers' caches.
func (s *Scheduler) Synced() bool { return s.synced.Load() }

// Run schedules until ctx is done: a cycle every Interval, and soon after a
// relevant change.
func (s *Scheduler) Run(ctx context.Context) error {
	if err := s.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	defer s.broadcaster.Shutdown()
	ticker := time.NewTicker(s.opts.Interval)
	defer ticker.Stop()
	for {
		if err := s.RunOnce(ctx); errors.Is(err, ErrFenced) {
			return err
		} else if err != nil {
			klog.FromContext(ctx).Error(err, "Scheduling cycle failed")
		}
		// A quota window's boundary comes sooner than the next tick: run
		// a cycle at it, so the queue switches then (DESIGN.md, "Quota
		// schedules").
		var window <-chan time.Time
		if n := s.nextWindow.Load(); n != 0 {
			if d := time.Until(time.Unix(0, n)); d < s.opts.Interval {
				window = time.After(max(d, 0)) // sooner than the tick: gone with it
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-window:
		case <-s.kick:
			// Let a burst of changes (a gang's pods, a deployment) land first.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// RunOnce runs one scheduling cycle: snapshot, decide, commit, report; in
// shadow mode, a shadow cycle (shadow.go), which writes nothing.
func (s *Scheduler) RunOnce(ctx context.Context) error {
	if s.opts.Shadow != nil {
		return s.shadowOnce(ctx)
	}
	s.awaitOwnWrites(ctx)
	start := time.Now()
	// A snapshot asked for: this cycle reads it (replay.go); nil otherwise.
	frozen := s.freeze(start)
	if frozen != nil {
		defer s.thaw(frozen)
	}
	snap, idx, err := s.buildSnapshot(ctx, start)
	if err != nil {
		return fmt.Errorf("building snapshot: %w", err)
	}
	s.nextWindow.Store(0)
	if !idx.nextWindow.IsZero() {
		s.nextWindow.Store(idx.nextWindow.UnixNano())
	}
	s.usage.begin(ctx, start, snap)
	res, err := core.Schedule(snap, s.opts.Core)
	if err != nil {
		return err
	}
	s.usage.end(snap, res)
	usage := s.usage.usageOf(snap)
	s.logProblems(ctx, res.Problems)
	decided := time.Now()
	stats := s.commit(ctx, res, idx)
	m := s.opts.Metrics
	if m != nil {
		m.observeCommit(res, idx, stats, usage)
	}
	if err := s.fence(ctx, stats, "writing statuses"); err != nil {
		return err // a fenced replica writes nothing more, statuses neither
	}
	gangWords(snap, idx, res)
	frozen.record(snap, res, idx)
	s.report(ctx, res, idx, stats, usage)
	if err := s.fence(ctx, stats, "saving the usage history"); err != nil {
		return err
	}
	s.usage.save(ctx, start)
	if m != nil {
		m.observeDurations(res, start, decided, time.Now())
	}
	klog.FromContext(ctx).V(2).Info("Cycle", "binds", stats.bound, "evictions", stats.evicted, "pending", len(res.Pending)+len(idx.problems),
		"decide", decided.Sub(start), "total", time.Since(start))
	return nil
}

type schemaGVR = schema.GroupVersionResource
type dynamicResource = dynamic.ResourceInterface

// logProblems logs what the core could not take as given, once while it
// lasts: each cycle reports it again, and a log line every 200 ms would
// drown the rest. Pending pods among them get their reason as a condition
// and an event (report).
func (s *Scheduler) logProblems(ctx context.Context, problems []core.Problem) {
	now := make(map[core.Problem]bool, len(problems))
	for _, p := range problems {
		now[p] = true
		if !s.problems[p] {
			klog.FromContext(ctx).Info("Left out of scheduling, the rest goes on", "object", p.Object, "reason", p.Reason)
		}
	}
	s.problems = now
}
