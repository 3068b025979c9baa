package scheduler_test

import (
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
	if _, err := e.client.StorageV1().StorageClasses().Create(e.ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "first-consumer-b"},
		Provisioner:       "example.com/tessera-test",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowedTopologies: hostIs("vol-b"),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := func(name, class, volume string) {
		t.Helper()
		c := &v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
			Spec: v1.PersistentVolumeClaimSpec{
				AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Resources:   v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
				VolumeName:  volume,
			},
		}
		if class != "" {
			c.Spec.StorageClassName = &class
		}
		if _, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
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
		c, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "scratch", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Annotations[volumehelpers.AnnSelectedNode]; got != "vol-b" {
			t.Fatalf("claim scratch: selected-node %q, want vol-b", got)
		}
	})

	t.Run("a bound volume's node affinity", func(t *testing.T) {
		// vol-b is the fuller node now, so bin-packing alone would pick it.
		if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-local-a"},
			Spec: v1.PersistentVolumeSpec{
				Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
				StorageClassName:              "manual",
				PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/data"}},
				NodeAffinity:                  &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{"vol-a"}}}}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pvc("data-a", "manual", e.ns+"-local-a")
		e.createPod(podSpec{name: "pinned-volume", claim: &gpuClaim{}, pvc: "data-a"})
		e.waitBound("pinned-volume")
		if n := e.pod("pinned-volume").Spec.NodeName; n != "vol-a" {
			t.Fatalf("pinned-volume on %s; its volume is on vol-a", n)
		}
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
	e.checkNoDoubleAllocation()
}
