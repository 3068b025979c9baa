package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
)

// A pod's volumes count against each CSI driver's attach limit by the
// driver that serves them; nodes get their CSINode's count, or no limit.
func TestCSIAttachLimits(t *testing.T) {
	indexer := func(objs ...any) cache.Indexer {
		i := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		for _, o := range objs {
			require.NoError(t, i.Add(o))
		}
		return i
	}
	claim := func(name, class, volume string) *v1.PersistentVolumeClaim {
		c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: v1.PersistentVolumeClaimSpec{VolumeName: volume}}
		if class != "" {
			c.Spec.StorageClassName = &class
		}
		return c
	}
	s := &Scheduler{
		pvcLister: corelisters.NewPersistentVolumeClaimLister(indexer(
			claim("bound-csi", "", "pv-csi"), claim("bound-local", "", "pv-local"),
			claim("wffc", "disks", ""), claim("manual", "local", ""), claim("pod-scratch", "disks", ""))),
		pvLister: corelisters.NewPersistentVolumeLister(indexer(
			&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-csi"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "disk.csi"}}}},
			&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-local"}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/x"}}}})),
		storageClassLister: storagelisters.NewStorageClassLister(indexer(
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "disks"}, Provisioner: "disk.csi"},
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: noProvisioner})),
		csiNodeLister: storagelisters.NewCSINodeLister(indexer(
			&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "limited"}, Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
				{Name: "disk.csi", Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To(int32(3))}}, {Name: "nfs.csi"}}}})),
	}
	pvcVol := func(name string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod"}, Spec: v1.PodSpec{Volumes: []v1.Volume{
		pvcVol("bound-csi"), pvcVol("bound-local"), pvcVol("wffc"), pvcVol("manual"), pvcVol("missing"),
		{Name: "inline", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "nfs.csi"}}},
		{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}, // claim pod-scratch
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}},
	}}}
	// A bound CSI volume, a WaitForFirstConsumer claim and a generic
	// ephemeral one count for disk.csi; the local, the no-provisioner and
	// the missing claims and the ConfigMap count nothing.
	assert.Equal(t, map[string]int64{csiAttachPrefix + "disk.csi": 3, csiAttachPrefix + "nfs.csi": 1}, s.csiVolumes(pod))

	cached := core.Request{Other: map[string]int64{"pods": 1}}
	req := s.withCSIVolumes(pod, cached)
	assert.Equal(t, map[string]int64{"pods": 1}, cached.Other, "the cached request is not written")
	assert.Equal(t, int64(3), req.Other[csiAttachPrefix+"disk.csi"])

	snap := &core.Snapshot{Nodes: []core.Node{{Name: "limited"}, {Name: "open"}}}
	s.addAttachLimits(snap, map[string]*core.Job{"j": {Pods: []core.Pod{{Request: req}}}})
	assert.Equal(t, map[string]int64{csiAttachPrefix + "disk.csi": 3, csiAttachPrefix + "nfs.csi": noAttachLimit}, snap.Nodes[0].Other)
	assert.Equal(t, map[string]int64{csiAttachPrefix + "disk.csi": noAttachLimit, csiAttachPrefix + "nfs.csi": noAttachLimit}, snap.Nodes[1].Other)
}
