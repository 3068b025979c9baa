package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	volumehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
)

// TestVolumes: pods go where their PersistentVolumeClaims let them, against
// bin-packing's preference — a bound volume's node affinity, a
// WaitForFirstConsumer class's allowed topology (and the claim is then
// annotated with the node, for its provisioner) — and wait, saying why,
// for a claim that does not exist yet or is not bound.
func TestVolumes(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("vol-a", "l4-2")
	e.addGPUNode("vol-b", "l4-2")
	e.startScheduler(core.Config{})
	hostIs := func(node string) []v1.TopologySelectorTerm {
		return []v1.TopologySelectorTerm{{MatchLabelExpressions: []v1.TopologySelectorLabelRequirement{{Key: "kubernetes.io/hostname", Values: []string{node}}}}}
	}
	if _, err := e.Client.StorageV1().StorageClasses().Create(e.Ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "first-consumer-b"},
		Provisioner:       "example.com/tessera-test",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowedTopologies: hostIs("vol-b"),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sizedPVC := func(name, class, volume, size string) {
		t.Helper()
		c := &v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
			Spec: v1.PersistentVolumeClaimSpec{
				AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Resources:   v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)}},
				VolumeName:  volume,
			},
		}
		if class != "" {
			c.Spec.StorageClassName = &class
		}
		if _, err := e.Client.CoreV1().PersistentVolumeClaims(e.NS).Create(e.Ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pvc := func(name, class, volume string) { t.Helper(); sizedPVC(name, class, volume, "1Gi") }
	// localPV is a pre-created local volume of class on node.
	localPV := func(name, class, node, size string) {
		t.Helper()
		if _, err := e.Client.CoreV1().PersistentVolumes().Create(e.Ctx, &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: e.NS + "-" + name},
			Spec: v1.PersistentVolumeSpec{
				Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse(size)},
				AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
				StorageClassName:              class,
				PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/nvme"}},
				NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
					{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("WaitForFirstConsumer: the class's topology, and the claim names the node", func(t *testing.T) {
		pvc("scratch", "first-consumer-b", "")
		e.createPod(podSpec{name: "provisioned", claim: &gpuClaim{}, pvc: "scratch"})
		e.waitBound("provisioned")
		if n := e.pod("provisioned").Spec.NodeName; n != "vol-b" {
			t.Fatalf("provisioned on %s; its class allows vol-b only", n)
		}
		c, err := e.Client.CoreV1().PersistentVolumeClaims(e.NS).Get(e.Ctx, "scratch", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Annotations[volumehelpers.AnnSelectedNode]; got != "vol-b" {
			t.Fatalf("claim scratch: selected-node %q, want vol-b", got)
		}
	})

	t.Run("a bound volume's node affinity", func(t *testing.T) {
		// vol-b is the fuller node now, so bin-packing alone would pick it.
		localPV("local-a", "manual", "vol-a", "1Gi")
		pvc("data-a", "manual", e.NS+"-local-a")
		e.createPod(podSpec{name: "pinned-volume", claim: &gpuClaim{}, pvc: "data-a"})
		e.waitBound("pinned-volume")
		if n := e.pod("pinned-volume").Spec.NodeName; n != "vol-a" {
			t.Fatalf("pinned-volume on %s; its volume is on vol-a", n)
		}
	})

	// Pre-created local volumes (no provisioner): the pod goes to a node
	// that has a matching volume, the volume is bound to its claim, and a
	// claim no volume matches waits, saying so. Pods without GPUs: bin-
	// packing alone would put them on vol-b, the fuller node.
	t.Run("pre-created volumes for WaitForFirstConsumer claims", func(t *testing.T) {
		if _, err := e.Client.StorageV1().StorageClasses().Create(e.Ctx, &storagev1.StorageClass{
			ObjectMeta:        metav1.ObjectMeta{Name: e.NS + "-local"},
			Provisioner:       "kubernetes.io/no-provisioner",
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		localPV("nvme-a0", e.NS+"-local", "vol-a", "1Gi")
		localPV("nvme-a1", e.NS+"-local", "vol-a", "1Gi")
		localPV("nvme-b-small", e.NS+"-local", "vol-b", "100Mi") // too small for the claims
		for i, claim := range []string{"nvme-0", "nvme-1"} {
			pvc(claim, e.NS+"-local", "")
			name := fmt.Sprintf("local-%d", i)
			e.createPod(podSpec{name: name, pvc: claim})
			e.waitBound(name)
			if n := e.pod(name).Spec.NodeName; n != "vol-a" {
				t.Fatalf("%s on %s; the only volumes that fit its claim are on vol-a", name, n)
			}
		}
		owners := map[string]string{}
		for _, pv := range []string{"nvme-a0", "nvme-a1"} {
			got, err := e.Client.CoreV1().PersistentVolumes().Get(e.Ctx, e.NS+"-"+pv, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.ClaimRef == nil {
				t.Fatalf("volume %s not bound to a claim", pv)
			}
			owners[got.Spec.ClaimRef.Name] = pv
		}
		if len(owners) != 2 {
			t.Fatalf("claims of the two volumes: %v; want one volume each for nvme-0 and nvme-1", owners)
		}
		e.eventually("the PV controller binds the claims", 60*time.Second, func() (bool, string) {
			for claim, pv := range owners {
				c, err := e.Client.CoreV1().PersistentVolumeClaims(e.NS).Get(e.Ctx, claim, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				if c.Spec.VolumeName != e.NS+"-"+pv {
					return false, fmt.Sprintf("claim %s: volume %q", claim, c.Spec.VolumeName)
				}
			}
			return true, ""
		})
		pvc("nvme-2", e.NS+"-local", "")
		e.createPod(podSpec{name: "local-2", pvc: "nvme-2"})
		want := `PersistentVolumeClaim "nvme-2" waits for a pre-created volume`
		e.eventually("local-2 pending with its reason", 60*time.Second, func() (bool, string) {
			p := e.pod("local-2")
			if p.Spec.NodeName != "" {
				t.Fatalf("local-2 bound to %s without a volume", p.Spec.NodeName)
			}
			return contains(pendingReason(p), want), pendingReason(p)
		})
	})

	t.Run("claims that are missing or not bound", func(t *testing.T) {
		pvc("no-class", "", "")
		e.createPod(podSpec{name: "unbound", claim: &gpuClaim{}, pvc: "no-class"})
		e.createPod(podSpec{name: "early", claim: &gpuClaim{}, pvc: "later"})
		for pod, want := range map[string]string{
			"unbound": `PersistentVolumeClaim "no-class" is not bound yet (it has no storage class)`,
			"early":   `waiting for PersistentVolumeClaim "later" to exist`,
		} {
			e.eventually(pod+" pending with its reason", 60*time.Second, func() (bool, string) {
				p := e.pod(pod)
				if p.Spec.NodeName != "" {
					t.Fatalf("%s bound to %s", pod, p.Spec.NodeName)
				}
				return contains(pendingReason(p), want), pendingReason(p)
			})
		}
		// The claim appears: the pod is placed where its class allows.
		pvc("later", "first-consumer-b", "")
		e.waitBound("early")
		if n := e.pod("early").Spec.NodeName; n != "vol-b" {
			t.Fatalf("early on %s; its class allows vol-b only", n)
		}
		if n := e.pod("unbound").Spec.NodeName; n != "" {
			t.Fatalf("unbound bound to %s, its claim still unbound", n)
		}
	})

	t.Run("CSI attach limits", func(t *testing.T) {
		const driver = "csi.example.com"
		if _, err := e.Client.StorageV1().StorageClasses().Create(e.Ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: "csi-disk"}, Provisioner: driver,
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		csiNode := func(node string, count int32) {
			t.Helper()
			if _, err := e.Client.StorageV1().CSINodes().Create(e.Ctx, &storagev1.CSINode{
				ObjectMeta: metav1.ObjectMeta{Name: node},
				Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driver, NodeID: node,
					Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To(count)}}}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// Where bin-packing puts a pod without volumes now: x. x takes no
		// volume of the driver, the other node one.
		e.createPod(podSpec{name: "csi-probe"})
		e.waitBound("csi-probe")
		x := e.pod("csi-probe").Spec.NodeName
		y := map[string]string{"vol-a": "vol-b", "vol-b": "vol-a"}[x]
		csiNode(x, 0)
		csiNode(y, 1)
		pvc("disk-1", "csi-disk", "")
		pvc("disk-2", "csi-disk", "")
		e.createPod(podSpec{name: "csi-1", pvc: "disk-1"})
		e.waitBound("csi-1")
		if n := e.pod("csi-1").Spec.NodeName; n != y {
			t.Fatalf("csi-1 on %s; %s attaches no volume of %s", n, x, driver)
		}
		e.createPod(podSpec{name: "csi-2", pvc: "disk-2"})
		e.eventually("csi-2 pending with its reason", 30*time.Second, func() (bool, string) {
			p := e.pod("csi-2")
			if p.Spec.NodeName != "" {
				t.Fatalf("csi-2 bound to %s, past its attach limit", p.Spec.NodeName)
			}
			return contains(pendingReason(p), "needs 1 CSI volume attachments of "+driver+"; the most free on any node is 0"), pendingReason(p)
		})
	})

	// A CSI driver that publishes its storage capacity (local NVMe, as
	// TopoLVM does): a volume is provisioned only on a node whose
	// CSIStorageCapacity has room for it, and a claim too big for every
	// node waits, saying so, until the capacity grows.
	t.Run("CSI storage capacity", func(t *testing.T) {
		const driver = "capacity.example.com"
		if _, err := e.Client.StorageV1().CSIDrivers().Create(e.Ctx, &storagev1.CSIDriver{
			ObjectMeta: metav1.ObjectMeta{Name: driver},
			Spec:       storagev1.CSIDriverSpec{StorageCapacity: ptr.To(true)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		class := e.NS + "-nvme"
		if _, err := e.Client.StorageV1().StorageClasses().Create(e.Ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: driver,
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		capacity := func(node, size, maxVolume string) *storagev1.CSIStorageCapacity {
			return &storagev1.CSIStorageCapacity{
				ObjectMeta:        metav1.ObjectMeta{Name: "nvme-" + node},
				StorageClassName:  class,
				NodeTopology:      &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": node}},
				Capacity:          ptr.To(resource.MustParse(size)),
				MaximumVolumeSize: ptr.To(resource.MustParse(maxVolume)),
			}
		}
		// Bin-packing puts a pod without volumes on x; only y has room.
		e.createPod(podSpec{name: "capacity-probe"})
		e.waitBound("capacity-probe")
		x := e.pod("capacity-probe").Spec.NodeName
		y := map[string]string{"vol-a": "vol-b", "vol-b": "vol-a"}[x]
		for _, c := range []*storagev1.CSIStorageCapacity{capacity(x, "1Gi", "1Gi"), capacity(y, "100Gi", "50Gi")} {
			if _, err := e.Client.StorageV1().CSIStorageCapacities(e.NS).Create(e.Ctx, c, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		sizedPVC("fast-1", class, "", "20Gi")
		e.createPod(podSpec{name: "capacity-1", pvc: "fast-1"})
		e.waitBound("capacity-1")
		if n := e.pod("capacity-1").Spec.NodeName; n != y {
			t.Fatalf("capacity-1 on %s; only %s has room for its 20Gi volume", n, y)
		}
		c, err := e.Client.CoreV1().PersistentVolumeClaims(e.NS).Get(e.Ctx, "fast-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Annotations[volumehelpers.AnnSelectedNode]; got != y {
			t.Fatalf("claim fast-1: selected-node %q, want %s", got, y)
		}

		// A pre-created volume of the class serves a claim whatever the
		// published capacity says.
		localPV("nvme-precreated", class, y, "300Gi")
		sizedPVC("fast-3", class, "", "300Gi")
		e.createPod(podSpec{name: "capacity-3", pvc: "fast-3"})
		e.waitBound("capacity-3")
		if n := e.pod("capacity-3").Spec.NodeName; n != y {
			t.Fatalf("capacity-3 on %s; its pre-created volume is on %s", n, y)
		}

		sizedPVC("fast-2", class, "", "200Gi")
		e.createPod(podSpec{name: "capacity-2", pvc: "fast-2"})
		want := `PersistentVolumeClaim "fast-2" needs 200Gi of storage class "` + class + `"; the most its CSI driver can provision on any node is 50Gi (CSIStorageCapacity)`
		e.eventually("capacity-2 pending with its reason", 60*time.Second, func() (bool, string) {
			p := e.pod("capacity-2")
			if p.Spec.NodeName != "" {
				t.Fatalf("capacity-2 bound to %s; no node has room for its volume", p.Spec.NodeName)
			}
			return contains(pendingReason(p), want), pendingReason(p)
		})
		// The driver reports more room on x: the pod goes there.
		grown := capacity(x, "1Ti", "1Ti")
		cur, err := e.Client.StorageV1().CSIStorageCapacities(e.NS).Get(e.Ctx, grown.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		grown.ResourceVersion = cur.ResourceVersion
		if _, err := e.Client.StorageV1().CSIStorageCapacities(e.NS).Update(e.Ctx, grown, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitBound("capacity-2")
		if n := e.pod("capacity-2").Spec.NodeName; n != x {
			t.Fatalf("capacity-2 on %s; only %s has room for its 200Gi volume", n, x)
		}
	})
	e.checkNoDoubleAllocation()
}
