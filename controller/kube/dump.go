package kube

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
	upstreamlisters "k8s.io/client-go/listers/scheduling/v1beta1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controller/core"
)

// DumpVersion names the cycle snapshot format (docs/DESIGN.md, "Cycle
// snapshots and replay"); a file of another version is refused.
const DumpVersion = "tessera.dev/cycle-snapshot/v1"

// Dump is the exact input of one scheduling cycle: the objects it read and
// the state the controller carries between cycles, plus what the controller
// decided on it. Secrets are stripped (sanitizePod).
type Dump struct {
	Version string `json:"version"`
	// Now is the cycle's clock: gang clocks, nominations and budgets'
	// back-offs are judged against it.
	Now time.Time `json:"now"`
	// Config is the core's configuration; GPUResource the whole-GPU
	// extended resource (Options).
	Config  DumpConfig  `json:"config"`
	Objects DumpObjects `json:"objects"`
	State   DumpState   `json:"state"`
	// Decisions are the controller's own for this input (absent in a
	// hand-made file).
	Decisions *Decisions `json:"decisions,omitempty"`
}

// DumpConfig is what of Options shapes decisions.
type DumpConfig struct {
	Placement            core.PlacementPolicy `json:"placement,omitempty"`
	DisableConsolidation bool                 `json:"disableConsolidation,omitempty"`
	StaleGangTimeout     time.Duration        `json:"staleGangTimeout,omitempty"`
	UsageCoefficient     int64                `json:"usageCoefficient,omitempty"`
	GPUResource          string               `json:"gpuResource,omitempty"`
}

// DumpObjects are the objects a cycle reads, as the informers held them.
// Queues and PodGroups are kept as the API server served them (one that
// cannot be decoded replays as it failed).
type DumpObjects struct {
	Nodes                  []v1.Node                      `json:"nodes,omitempty"`
	ResourceSlices         []resourceapi.ResourceSlice    `json:"resourceSlices,omitempty"`
	ResourceClaims         []resourceapi.ResourceClaim    `json:"resourceClaims,omitempty"`
	DeviceClasses          []resourceapi.DeviceClass      `json:"deviceClasses,omitempty"`
	Pods                   []v1.Pod                       `json:"pods,omitempty"`
	PriorityClasses        []schedulingv1.PriorityClass   `json:"priorityClasses,omitempty"`
	Namespaces             []v1.Namespace                 `json:"namespaces,omitempty"`
	PersistentVolumeClaims []v1.PersistentVolumeClaim     `json:"persistentVolumeClaims,omitempty"`
	PersistentVolumes      []v1.PersistentVolume          `json:"persistentVolumes,omitempty"`
	StorageClasses         []storagev1.StorageClass       `json:"storageClasses,omitempty"`
	CSINodes               []storagev1.CSINode            `json:"csiNodes,omitempty"`
	CSIDrivers             []storagev1.CSIDriver          `json:"csiDrivers,omitempty"`
	CSIStorageCapacities   []storagev1.CSIStorageCapacity `json:"csiStorageCapacities,omitempty"`
	// UpstreamPodGroups are scheduling.k8s.io/v1beta1 PodGroups; nil when
	// the API server did not serve them.
	UpstreamPodGroups *[]schedulingv1beta1.PodGroup `json:"upstreamPodGroups,omitempty"`
	Queues            []map[string]any              `json:"queues,omitempty"`
	PodGroups         []map[string]any              `json:"podGroups,omitempty"`
	Topologies        []map[string]any              `json:"topologies,omitempty"`
}

// DumpState is what the controller carries from one cycle to the next.
type DumpState struct {
	// BelowMinMemberSince: when each gang fell below its minimum.
	BelowMinMemberSince map[string]time.Time `json:"belowMinMemberSince,omitempty"`
	// EvictionBlockedUntil: pods a PodDisruptionBudget kept from eviction,
	// left out of the victims until then.
	EvictionBlockedUntil map[string]time.Time `json:"evictionBlockedUntil,omitempty"`
	// Nominations: pods bound onto room their victims still hold.
	Nominations map[string]DumpNomination `json:"nominations,omitempty"`
	// AwaitGrouper: the pod grouper's reason for each pending pod it holds.
	AwaitGrouper map[string]string `json:"awaitGrouper,omitempty"`
	// Usage is each leaf queue's decayed past usage the cycle's fair share
	// weighed (core.Snapshot.Usage; only with a usage coefficient above 0).
	Usage map[string]core.Resources `json:"usage,omitempty"`
}

// DumpNomination is a nomination (commit_evict.go).
type DumpNomination struct {
	UID     types.UID `json:"uid"`
	Node    string    `json:"node"`
	Victims []string  `json:"victims,omitempty"`
	Until   time.Time `json:"until"`
}

// captureDump lists what the cycle would read, now, and the carried state.
// Called on the cycle goroutine, before the snapshot is built; the cycle
// then reads the dump itself (freeze), so the dump is its exact input.
func (s *Scheduler) captureDump(now time.Time) (*Dump, error) {
	d := &Dump{Version: DumpVersion, Now: now, Config: DumpConfig{
		Placement: s.opts.Core.Placement, DisableConsolidation: s.opts.Core.DisableConsolidation,
		StaleGangTimeout: s.opts.Core.StaleGangTimeout, UsageCoefficient: s.opts.Core.UsageCoefficient,
		GPUResource: s.opts.GPUResource,
	}}
	o := &d.Objects
	var err error
	list := func(what string, f func() error) {
		if err == nil {
			if e := f(); e != nil {
				err = fmt.Errorf("listing %s: %w", what, e)
			}
		}
	}
	list("nodes", func() (e error) { o.Nodes, e = listed(s.nodeLister.List(everything)); return })
	list("slices", func() (e error) { o.ResourceSlices, e = listed(s.sliceLister.List(everything)); return })
	list("claims", func() (e error) { o.ResourceClaims, e = listed(s.claimLister.List(everything)); return })
	list("device classes", func() (e error) { o.DeviceClasses, e = listed(s.classLister.List(everything)); return })
	list("pods", func() (e error) { o.Pods, e = listed(s.podLister.List(everything)); return })
	list("priority classes", func() (e error) { o.PriorityClasses, e = listed(s.priorityLister.List(everything)); return })
	list("namespaces", func() (e error) { o.Namespaces, e = listed(s.namespaceLister.List(everything)); return })
	list("PVCs", func() (e error) { o.PersistentVolumeClaims, e = listed(s.pvcLister.List(everything)); return })
	list("PVs", func() (e error) { o.PersistentVolumes, e = listed(s.pvLister.List(everything)); return })
	list("storage classes", func() (e error) { o.StorageClasses, e = listed(s.storageClassLister.List(everything)); return })
	list("CSINodes", func() (e error) { o.CSINodes, e = listed(s.csiNodeLister.List(everything)); return })
	list("CSIDrivers", func() (e error) { o.CSIDrivers, e = listed(s.csiDriverLister.List(everything)); return })
	list("storage capacities", func() (e error) {
		o.CSIStorageCapacities, e = listedAny[storagev1.CSIStorageCapacity](s.capacityIndexer.List())
		return
	})
	if s.upstreamLister != nil {
		list("upstream PodGroups", func() error {
			pgs, e := listed(s.upstreamLister.List(everything))
			o.UpstreamPodGroups = &pgs
			return e
		})
	}
	if err != nil {
		return nil, err
	}
	o.Queues, o.PodGroups = unstructuredOf(s.queueInformer.GetStore().List()), unstructuredOf(s.groupInformer.GetStore().List())
	if s.topologyInformer != nil {
		o.Topologies = unstructuredOf(s.topologyInformer.GetStore().List())
	}
	for i := range o.Pods {
		sanitizePod(&o.Pods[i])
	}
	s.captureState(d)
	return d, nil
}

// captureState copies the carried state into d.
func (s *Scheduler) captureState(d *Dump) {
	st := &d.State
	st.BelowMinMemberSince = map[string]time.Time{}
	for k, v := range s.belowSince {
		st.BelowMinMemberSince[k] = v
	}
	st.EvictionBlockedUntil = map[string]time.Time{}
	for k := range s.pdbBlocked {
		st.EvictionBlockedUntil[k] = s.pdbExpiry[k]
	}
	st.Nominations = map[string]DumpNomination{}
	for k, n := range s.nominated {
		st.Nominations[k] = DumpNomination{UID: n.uid, Node: n.node, Victims: append([]string(nil), n.victims...), Until: n.until}
	}
	st.AwaitGrouper = map[string]string{}
	if s.opts.AwaitGrouper == nil {
		return
	}
	for i := range d.Objects.Pods {
		pod := &d.Objects.Pods[i]
		if pod.Spec.SchedulerName == SchedulerName && pod.Spec.NodeName == "" {
			if why := s.opts.AwaitGrouper(pod); why != "" {
				st.AwaitGrouper[pod.Namespace+"/"+pod.Name] = why
			}
		}
	}
}

// restoreState makes d's carried state the scheduler's.
func (s *Scheduler) restoreState(d *Dump) {
	s.belowSince, s.pdbBlocked, s.pdbExpiry, s.nominated = map[string]time.Time{}, map[string]bool{}, map[string]time.Time{}, map[string]nomination{}
	for k, v := range d.State.BelowMinMemberSince {
		s.belowSince[k] = v
	}
	for k, v := range d.State.EvictionBlockedUntil {
		s.pdbBlocked[k], s.pdbExpiry[k] = true, v
	}
	for k, n := range d.State.Nominations {
		s.nominated[k] = nomination{uid: n.UID, node: n.Node, victims: append([]string(nil), n.Victims...), until: n.Until}
	}
}

// groupAnswers answers the pod grouper's question from a dump.
func groupAnswers(d *Dump) func(*v1.Pod) string {
	return func(pod *v1.Pod) string { return d.State.AwaitGrouper[pod.Namespace+"/"+pod.Name] }
}

// listed copies a lister's objects, sorted by namespace and name.
func listed[T any](ptrs []*T, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(ptrs))
	for _, p := range ptrs {
		out = append(out, *deepCopy(p))
	}
	sortByKey(out)
	return out, nil
}

func listedAny[T any](objs []any) ([]T, error) {
	ptrs := make([]*T, 0, len(objs))
	for _, o := range objs {
		p, ok := o.(*T)
		if !ok {
			return nil, fmt.Errorf("unexpected object %T", o)
		}
		ptrs = append(ptrs, p)
	}
	return listed(ptrs, nil)
}

// deepCopy copies an API object (informer objects must not be changed).
func deepCopy[T any](p *T) *T {
	if o, ok := any(p).(runtime.Object); ok {
		if c, ok := o.DeepCopyObject().(any).(*T); ok {
			return c
		}
	}
	c := *p
	return &c
}

func sortByKey[T any](objs []T) {
	key := func(i int) string {
		k, _ := cache.MetaNamespaceKeyFunc(any(&objs[i]))
		return k
	}
	keys := make([]string, len(objs))
	for i := range objs {
		keys[i] = key(i)
	}
	idx := make([]int, len(objs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return keys[idx[a]] < keys[idx[b]] })
	sorted := make([]T, len(objs))
	for i, j := range idx {
		sorted[i] = objs[j]
	}
	copy(objs, sorted)
}

func unstructuredOf(objs []any) []map[string]any {
	out := make([]map[string]any, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(runtime.Unstructured); ok {
			out = append(out, runtime.DeepCopyJSON(u.UnstructuredContent()))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := &unstructured.Unstructured{Object: out[i]}, &unstructured.Unstructured{Object: out[j]}
		return a.GetNamespace()+"/"+a.GetName() < b.GetNamespace()+"/"+b.GetName()
	})
	return out
}

// Redacted replaces what a dump must not carry.
const Redacted = "redacted"

// sanitizePod strips what may hold secrets and never shapes a decision:
// commands, arguments, environment, probes' and hooks' commands, image pull
// secrets, secret volumes' names, managed fields and the last applied
// configuration (which holds the whole spec again).
func sanitizePod(pod *v1.Pod) {
	pod.ManagedFields = nil
	delete(pod.Annotations, v1.LastAppliedConfigAnnotation)
	pod.Spec.ImagePullSecrets = nil
	strip := func(c *v1.Container) {
		c.Command, c.Args, c.Env, c.EnvFrom = nil, nil, nil, nil
		c.LivenessProbe, c.ReadinessProbe, c.StartupProbe, c.Lifecycle = nil, nil, nil, nil
	}
	for i := range pod.Spec.InitContainers {
		strip(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		strip(&pod.Spec.Containers[i])
	}
	for i := range pod.Spec.EphemeralContainers {
		strip((*v1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	for i := range pod.Spec.Volumes {
		vs := &pod.Spec.Volumes[i].VolumeSource
		if vs.Secret != nil {
			vs.Secret = &v1.SecretVolumeSource{SecretName: Redacted}
		}
		if vs.Projected != nil {
			vs.Projected = &v1.ProjectedVolumeSource{}
		}
		if vs.CSI != nil {
			vs.CSI.NodePublishSecretRef, vs.CSI.VolumeAttributes = nil, nil
		}
		if vs.ISCSI != nil || vs.RBD != nil || vs.CephFS != nil || vs.FlexVolume != nil || vs.AzureFile != nil || vs.ScaleIO != nil || vs.StorageOS != nil {
			// In-tree volumes with secret references: the adapter reads
			// nothing of them, so they become an emptyDir.
			*vs = v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}
		}
	}
}

// MarshalDump writes d as YAML.
func MarshalDump(d *Dump) ([]byte, error) {
	return yaml.Marshal(d)
}

// ParseDump reads a dump, strictly: an unknown field or another version is
// an error naming it.
func ParseDump(data []byte) (*Dump, error) {
	var d Dump
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		return nil, fmt.Errorf("reading cycle snapshot: %w", err)
	}
	if d.Version != DumpVersion {
		return nil, fmt.Errorf("cycle snapshot version %q: this tool reads %q", d.Version, DumpVersion)
	}
	if d.Now.IsZero() {
		return nil, fmt.Errorf("cycle snapshot: now is missing")
	}
	if err := checkObjects(&d.Objects); err != nil {
		return nil, err
	}
	return &d, nil
}

// checkObjects refuses objects without a name, or two of a kind with one
// name: an indexer would silently keep one.
func checkObjects(o *DumpObjects) error {
	var errs []string
	check := func(kind string, metas []string) {
		seen := map[string]bool{}
		for i, k := range metas {
			switch {
			case strings.HasSuffix(k, "/") || k == "":
				errs = append(errs, fmt.Sprintf("%s #%d has no name", kind, i))
			case seen[k]:
				errs = append(errs, fmt.Sprintf("%s %s appears twice", kind, k))
			}
			seen[k] = true
		}
	}
	check("node", keysOf(o.Nodes))
	check("pod", keysOf(o.Pods))
	check("ResourceClaim", keysOf(o.ResourceClaims))
	check("ResourceSlice", keysOf(o.ResourceSlices))
	check("DeviceClass", keysOf(o.DeviceClasses))
	check("Queue", unstructuredKeys(o.Queues))
	check("PodGroup", unstructuredKeys(o.PodGroups))
	check("Topology", unstructuredKeys(o.Topologies))
	if len(errs) > 0 {
		return fmt.Errorf("cycle snapshot: %s", strings.Join(errs, "; "))
	}
	return nil
}

func keysOf[T any](objs []T) []string {
	out := make([]string, len(objs))
	for i := range objs {
		out[i], _ = cache.MetaNamespaceKeyFunc(any(&objs[i]))
	}
	return out
}

func unstructuredKeys(objs []map[string]any) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		u := &unstructured.Unstructured{Object: o}
		out[i] = u.GetName()
		if u.GetNamespace() != "" {
			out[i] = u.GetNamespace() + "/" + u.GetName()
		}
	}
	return out
}

// viewOf builds static listers over a dump's objects.
func viewOf(o *DumpObjects) (listerView, error) {
	var v listerView
	var err error
	ix := func(f func() (cache.Indexer, error)) cache.Indexer {
		if err != nil {
			return nil
		}
		var i cache.Indexer
		i, err = f()
		return i
	}
	none := cache.Indexers{}
	pods := ix(func() (cache.Indexer, error) { return staticIndexer(o.Pods, none) })
	nodes := ix(func() (cache.Indexer, error) { return staticIndexer(o.Nodes, none) })
	claims := ix(func() (cache.Indexer, error) { return staticIndexer(o.ResourceClaims, none) })
	classes := ix(func() (cache.Indexer, error) { return staticIndexer(o.DeviceClasses, none) })
	v.sliceIndexer = ix(func() (cache.Indexer, error) {
		return staticIndexer(o.ResourceSlices, cache.Indexers{sliceNodeIndex: sliceByNode})
	})
	prios := ix(func() (cache.Indexer, error) { return staticIndexer(o.PriorityClasses, none) })
	pvcs := ix(func() (cache.Indexer, error) { return staticIndexer(o.PersistentVolumeClaims, none) })
	v.pvIndexer = ix(func() (cache.Indexer, error) {
		return staticIndexer(o.PersistentVolumes, cache.Indexers{pvClassIndex: pvByClass})
	})
	scs := ix(func() (cache.Indexer, error) { return staticIndexer(o.StorageClasses, none) })
	csiNodes := ix(func() (cache.Indexer, error) { return staticIndexer(o.CSINodes, none) })
	csiDrivers := ix(func() (cache.Indexer, error) { return staticIndexer(o.CSIDrivers, none) })
	v.capacities = ix(func() (cache.Indexer, error) {
		return staticIndexer(o.CSIStorageCapacities, cache.Indexers{capacityClassIndex: capacityByClass})
	})
	nss := ix(func() (cache.Indexer, error) { return staticIndexer(o.Namespaces, none) })
	if o.UpstreamPodGroups != nil {
		up := ix(func() (cache.Indexer, error) { return staticIndexer(*o.UpstreamPodGroups, none) })
		if err == nil {
			v.upstream = upstreamlisters.NewPodGroupLister(up)
		}
	}
	if err != nil {
		return v, fmt.Errorf("indexing cycle snapshot: %w", err)
	}
	v.pods, v.nodes = corelisters.NewPodLister(pods), corelisters.NewNodeLister(nodes)
	v.claims, v.classes = resourcelisters.NewResourceClaimLister(claims), resourcelisters.NewDeviceClassLister(classes)
	v.slices, v.priorities = resourcelisters.NewResourceSliceLister(v.sliceIndexer), schedulinglisters.NewPriorityClassLister(prios)
	v.pvcs, v.pvs = corelisters.NewPersistentVolumeClaimLister(pvcs), corelisters.NewPersistentVolumeLister(v.pvIndexer)
	v.storageClasses, v.csiNodes = storagelisters.NewStorageClassLister(scs), storagelisters.NewCSINodeLister(csiNodes)
	v.csiDrivers, v.namespaces = storagelisters.NewCSIDriverLister(csiDrivers), corelisters.NewNamespaceLister(nss)
	if v.queues, err = staticInformer(o.Queues); err != nil {
		return v, fmt.Errorf("indexing Queues: %w", err)
	}
	if v.groups, err = staticInformer(o.PodGroups); err != nil {
		return v, fmt.Errorf("indexing PodGroups: %w", err)
	}
	if v.topologies, err = staticInformer(o.Topologies); err != nil {
		return v, fmt.Errorf("indexing Topologies: %w", err)
	}
	return v, nil
}
