package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestPodVolumesMatch(t *testing.T) {
	class := "local"
	claim := func(name, size string) *v1.PersistentVolumeClaim {
		return &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}}}}
	}
	pv := func(name, node, size string) *v1.PersistentVolume {
		return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeSpec{
			StorageClassName: class, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
				{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}}},
			Status: v1.PersistentVolumeStatus{Phase: v1.VolumeAvailable}}
	}
	node := func(name, zone string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "zone": zone}}}
	}
	a, b, c := node("a", "z1"), node("b", "z1"), node("c", "z2")
	pvs := []*v1.PersistentVolume{pv("a-big", "a", "10Gi"), pv("a-small", "a", "1Gi"), pv("b-small", "b", "1Gi")}
	// Published storage capacity (CSIStorageCapacity): 20Gi left on node a
	// in volumes of at most 8Gi, 3Gi on b, and one object without a topology.
	capacity := func(node string, capacity, maxVolume string) *storagev1.CSIStorageCapacity {
		c := &storagev1.CSIStorageCapacity{StorageClassName: class}
		if node != "" {
			c.NodeTopology = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": node}}
		}
		if capacity != "" {
			c.Capacity = ptr.To(resource.MustParse(capacity))
		}
		if maxVolume != "" {
			c.MaximumVolumeSize = ptr.To(resource.MustParse(maxVolume))
		}
		return c
	}
	published := []*storagev1.CSIStorageCapacity{capacity("a", "20Gi", "8Gi"), capacity("b", "3Gi", ""), capacity("", "1Ti", "")}
	zone1 := &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "zone", Operator: v1.NodeSelectorOpIn, Values: []string{"z1"}}}}}}
	tests := []struct {
		name    string
		delayed []delayedClaim
		taken   map[string]bool
		node    *v1.Node
		want    []string // per claim: the volume, or "" to provision; nil: the node cannot serve
	}{
		{"the smallest volume that fits", []delayedClaim{{pvc: claim("x", "1Gi")}}, nil, a, []string{"a-small"}},
		{"two claims never share a volume", []delayedClaim{{pvc: claim("x", "1Gi")}, {pvc: claim("y", "1Gi")}}, nil, a, []string{"a-small", "a-big"}},
		{"a volume the commit took is not offered again", []delayedClaim{{pvc: claim("x", "1Gi")}}, map[string]bool{"a-small": true}, a, []string{"a-big"}},
		{"too few volumes on the node, no provisioner", []delayedClaim{{pvc: claim("x", "1Gi")}, {pvc: claim("y", "1Gi")}}, nil, b, nil},
		{"too small", []delayedClaim{{pvc: claim("x", "5Gi")}}, nil, b, nil},
		{"no volume, but a provisioner may create one in its topology", []delayedClaim{{pvc: claim("x", "5Gi"), provision: true, allowed: zone1}}, nil, b, []string{""}},
		{"nor outside it", []delayedClaim{{pvc: claim("x", "5Gi"), provision: true, allowed: zone1}}, nil, c, nil},
		{"published capacity: room on the node", []delayedClaim{{pvc: claim("x", "3Gi"), provision: true, capacities: published}}, nil, b, []string{""}},
		{"published capacity: not enough on the node", []delayedClaim{{pvc: claim("x", "4Gi"), provision: true, capacities: published}}, nil, b, nil},
		{"published capacity: the largest volume counts, not the total", []delayedClaim{{pvc: claim("x", "12Gi"), provision: true, capacities: published}}, nil, a, nil},
		{"published capacity: a volume within the largest", []delayedClaim{{pvc: claim("x", "8Gi"), provision: true, capacities: published}}, map[string]bool{"a-big": true}, a, []string{""}},
		{"published capacity: none for the node (an object without topology covers none)", []delayedClaim{{pvc: claim("x", "1Gi"), provision: true, capacities: published}}, nil, c, nil},
		{"published capacity, none at all: nowhere", []delayedClaim{{pvc: claim("x", "1Gi"), provision: true, capacities: []*storagev1.CSIStorageCapacity{}}}, nil, c, nil},
		{"a pre-created volume needs no capacity", []delayedClaim{{pvc: claim("x", "1Gi"), provision: true, capacities: []*storagev1.CSIStorageCapacity{}}}, nil, b, []string{"b-small"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &podVolumes{delayed: tt.delayed, pvs: pvs}
			got, ok := v.match(tt.node, tt.taken)
			if tt.want == nil {
				assert.False(t, ok)
				return
			}
			assert.True(t, ok)
			var names []string
			for _, ch := range got {
				n := ""
				if ch.pv != nil {
					n = ch.pv.Name
				}
				names = append(names, n)
			}
			assert.Equal(t, tt.want, names)
		})
	}
}

func TestRoomAnywhere(t *testing.T) {
	class := "nvme"
	claim := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}, Spec: v1.PersistentVolumeClaimSpec{
		StorageClassName: &class, Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("100Gi")}}}}
	on := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": "a"}}
	tests := []struct {
		name       string
		capacities []*storagev1.CSIStorageCapacity
		want       string // "" for no error
	}{
		{"capacity not checked", nil, ""},
		{"room somewhere", []*storagev1.CSIStorageCapacity{{NodeTopology: on, Capacity: ptr.To(resource.MustParse("1Ti"))}}, ""},
		{"nothing published", []*storagev1.CSIStorageCapacity{}, `PersistentVolumeClaim "scratch" needs 100Gi of storage class "nvme", and its CSI driver publishes no capacity for it on any node (CSIStorageCapacity)`},
		{"too little everywhere", []*storagev1.CSIStorageCapacity{
			{NodeTopology: on, Capacity: ptr.To(resource.MustParse("1Ti")), MaximumVolumeSize: ptr.To(resource.MustParse("64Gi"))},
			{NodeTopology: on, Capacity: ptr.To(resource.MustParse("20Gi"))},
		}, `PersistentVolumeClaim "scratch" needs 100Gi of storage class "nvme"; the most its CSI driver can provision on any node is 64Gi (CSIStorageCapacity)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &delayedClaim{pvc: claim, provision: true, capacities: tt.capacities}
			err := d.roomAnywhere()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tt.want)
		})
	}
}
