package kube

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
	upstreamlisters "k8s.io/client-go/listers/scheduling/v1beta1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	volumehelpers "k8s.io/component-helpers/storage/volume"
)

// listerView is everything a cycle reads the cluster through: the
// informers' listers in a running controller, static indexers over a dump's
// objects in a frozen cycle and in replay (dump.go, replay.go). The same
// snapshot code runs on either.
type listerView struct {
	pods           corelisters.PodLister
	nodes          corelisters.NodeLister
	claims         resourcelisters.ResourceClaimLister
	classes        resourcelisters.DeviceClassLister
	slices         resourcelisters.ResourceSliceLister
	sliceIndexer   cache.Indexer
	priorities     schedulinglisters.PriorityClassLister
	upstream       upstreamlisters.PodGroupLister
	pvcs           corelisters.PersistentVolumeClaimLister
	pvs            corelisters.PersistentVolumeLister
	pvIndexer      cache.Indexer
	storageClasses storagelisters.StorageClassLister
	csiNodes       storagelisters.CSINodeLister
	csiDrivers     storagelisters.CSIDriverLister
	capacities     cache.Indexer
	namespaces     corelisters.NamespaceLister
	queues         cache.SharedIndexInformer
	groups         cache.SharedIndexInformer
	topologies     cache.SharedIndexInformer
}

// view returns what the cycle reads now.
func (s *Scheduler) view() listerView {
	return listerView{
		pods: s.podLister, nodes: s.nodeLister, claims: s.claimLister, classes: s.classLister,
		slices: s.sliceLister, sliceIndexer: s.sliceIndexer, priorities: s.priorityLister,
		upstream: s.upstreamLister, pvcs: s.pvcLister, pvs: s.pvLister, pvIndexer: s.pvIndexer,
		storageClasses: s.storageClassLister, csiNodes: s.csiNodeLister, csiDrivers: s.csiDriverLister,
		capacities: s.capacityIndexer, namespaces: s.namespaceLister,
		queues: s.queueInformer, groups: s.groupInformer, topologies: s.topologyInformer,
	}
}

// setView makes the cycle read v.
func (s *Scheduler) setView(v listerView) {
	s.podLister, s.nodeLister, s.claimLister, s.classLister = v.pods, v.nodes, v.claims, v.classes
	s.sliceLister, s.sliceIndexer, s.priorityLister = v.slices, v.sliceIndexer, v.priorities
	s.upstreamLister, s.pvcLister, s.pvLister, s.pvIndexer = v.upstream, v.pvcs, v.pvs, v.pvIndexer
	s.storageClassLister, s.csiNodeLister, s.csiDriverLister = v.storageClasses, v.csiNodes, v.csiDrivers
	s.capacityIndexer, s.namespaceLister = v.capacities, v.namespaces
	s.queueInformer, s.groupInformer, s.topologyInformer = v.queues, v.groups, v.topologies
}

// Index functions shared by the informers and the static view.

// sliceByNode indexes ResourceSlices by spec.nodeName ("" for slices not
// local to one node), so a commit reads one node's slices.
func sliceByNode(obj any) ([]string, error) {
	sl, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || sl.Spec.NodeName == nil {
		return []string{""}, nil
	}
	return []string{*sl.Spec.NodeName}, nil
}

// pvByClass indexes PersistentVolumes by storage class.
func pvByClass(obj any) ([]string, error) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return nil, nil
	}
	return []string{volumehelpers.GetPersistentVolumeClass(pv)}, nil
}

// capacityByClass indexes CSIStorageCapacity objects by storage class.
func capacityByClass(obj any) ([]string, error) {
	c, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return nil, nil
	}
	return []string{c.StorageClassName}, nil
}

// staticIndexer holds objs, indexed as the listers expect (by namespace)
// plus extra.
func staticIndexer[T any](objs []T, extra cache.Indexers) (cache.Indexer, error) {
	ix := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for k, f := range extra {
		ix[k] = f
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, ix)
	for i := range objs {
		if err := idx.Add(&objs[i]); err != nil {
			return nil, err
		}
	}
	return idx, nil
}

// staticInformer is an informer that never runs, holding objs: the cycle
// reads Queues and PodGroups through an informer's store.
func staticInformer(objs []map[string]any) (cache.SharedIndexInformer, error) {
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, o := range objs {
		if err := inf.GetStore().Add(&unstructured.Unstructured{Object: o}); err != nil {
			return nil, err
		}
	}
	return inf, nil
}
