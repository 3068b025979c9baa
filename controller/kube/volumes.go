package kube

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/storage/ephemeral"
	volumehelpers "k8s.io/component-helpers/storage/volume"
)

// Volumes: the part of kube-scheduler's VolumeBinding plugin that decides
// where a pod with PersistentVolumeClaims may run, so that a pod is never
// bound where its volume cannot follow, nor left with a claim nobody will
// ever provision.
//
//   - A bound claim: the node must match its PersistentVolume's node
//     affinity (a local disk, a zonal cloud disk).
//   - An unbound claim whose StorageClass binds immediately (or that has no
//     class): the pod waits until the claim is bound.
//   - An unbound claim of a WaitForFirstConsumer class with a provisioner:
//     the node must be in the class's allowed topologies; the commit writes
//     the chosen node into the claim's volume.kubernetes.io/selected-node
//     annotation (as kube-scheduler does before binding), which tells the
//     provisioner where to create the volume. A claim that already names a
//     node keeps the pod to that node.
//   - An unbound WaitForFirstConsumer claim without a provisioner
//     (kubernetes.io/no-provisioner: pre-created local volumes) waits with
//     a reason: choosing among pre-created volumes is not implemented.
//
// Generic ephemeral volumes are claims named <pod>-<volume>, created by the
// ephemeral-volume controller; the pod waits until its claim exists.

// noProvisioner is the provisioner of classes whose volumes are pre-created.
const noProvisioner = "kubernetes.io/no-provisioner"

// podVolumes is what a pod's claims ask of its node.
type podVolumes struct {
	// checks must all hold for a node.
	checks []func(*v1.Node) bool
	// provision are the unbound WaitForFirstConsumer claims the commit
	// annotates with the chosen node.
	provision []*v1.PersistentVolumeClaim
}

// volumesOf reads the pod's claims. An error says why the pod must wait.
func (s *Scheduler) volumesOf(pod *v1.Pod) (podVolumes, error) {
	var out podVolumes
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		var name string
		switch {
		case vol.PersistentVolumeClaim != nil:
			name = vol.PersistentVolumeClaim.ClaimName
		case vol.Ephemeral != nil:
			name = ephemeral.VolumeClaimName(pod, vol)
		default:
			continue
		}
		pvc, err := s.pvcLister.PersistentVolumeClaims(pod.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			return out, fmt.Errorf("waiting for PersistentVolumeClaim %q to exist", name)
		}
		if err != nil {
			return out, fmt.Errorf("PersistentVolumeClaim %q: %w", name, err)
		}
		if vol.Ephemeral != nil {
			if err := ephemeral.VolumeIsForPod(pod, pvc); err != nil {
				return out, err
			}
		}
		if pvc.DeletionTimestamp != nil {
			return out, fmt.Errorf("PersistentVolumeClaim %q is being deleted", name)
		}
		if pvc.Spec.VolumeName != "" {
			pv, err := s.pvLister.Get(pvc.Spec.VolumeName)
			if apierrors.IsNotFound(err) {
				return out, fmt.Errorf("waiting for PersistentVolume %q of claim %q", pvc.Spec.VolumeName, name)
			}
			if err != nil {
				return out, fmt.Errorf("PersistentVolume %q: %w", pvc.Spec.VolumeName, err)
			}
			if pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil {
				out.checks = append(out.checks, func(n *v1.Node) bool { return volumehelpers.CheckNodeAffinity(pv, n.Labels) == nil })
			}
			continue
		}
		class := volumehelpers.GetPersistentVolumeClaimClass(pvc)
		if class == "" {
			return out, fmt.Errorf("PersistentVolumeClaim %q is not bound yet (it has no storage class)", name)
		}
		sc, err := s.storageClassLister.Get(class)
		if apierrors.IsNotFound(err) {
			return out, fmt.Errorf("PersistentVolumeClaim %q is not bound yet: its storage class %q does not exist", name, class)
		}
		if err != nil {
			return out, fmt.Errorf("storage class %q: %w", class, err)
		}
		if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			return out, fmt.Errorf("PersistentVolumeClaim %q is not bound yet (storage class %q binds immediately)", name, class)
		}
		if node := pvc.Annotations[volumehelpers.AnnSelectedNode]; node != "" {
			out.checks = append(out.checks, func(n *v1.Node) bool { return n.Name == node })
			continue
		}
		if sc.Provisioner == noProvisioner {
			return out, fmt.Errorf("PersistentVolumeClaim %q waits for a pre-created volume (storage class %q has no provisioner); tessera-scheduler does not choose among pre-created volumes: bind the claim to one (spec.volumeName) or use a provisioner", name, class)
		}
		if len(sc.AllowedTopologies) > 0 {
			terms := topologyTerms(sc.AllowedTopologies)
			out.checks = append(out.checks, func(n *v1.Node) bool {
				ok, err := corev1helpers.MatchNodeSelectorTerms(n, terms)
				return err == nil && ok
			})
		}
		out.provision = append(out.provision, pvc)
	}
	return out, nil
}

// topologyTerms turns a class's allowed topologies into node selector terms
// (any term; within one, every label).
func topologyTerms(topologies []v1.TopologySelectorTerm) *v1.NodeSelector {
	sel := &v1.NodeSelector{}
	for _, t := range topologies {
		var term v1.NodeSelectorTerm
		for _, e := range t.MatchLabelExpressions {
			term.MatchExpressions = append(term.MatchExpressions, v1.NodeSelectorRequirement{Key: e.Key, Operator: v1.NodeSelectorOpIn, Values: e.Values})
		}
		sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, term)
	}
	return sel
}

// selectNode writes the chosen node into the pod's unbound
// WaitForFirstConsumer claims, so their provisioner creates the volumes
// there. A claim that meanwhile names another node fails the commit (the
// next cycle keeps the pod to that node).
func (s *Scheduler) selectNode(ctx context.Context, pod *v1.Pod, node string) error {
	vols, err := s.volumesOf(pod)
	if err != nil {
		return err
	}
	for _, pvc := range vols.provision {
		err := retryOnError(retry.DefaultBackoff, retriable, func() error {
			cur, err := s.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Spec.VolumeName != "" {
				return nil // bound meanwhile: nothing to provision
			}
			switch sel := cur.Annotations[volumehelpers.AnnSelectedNode]; sel {
			case node:
				return nil
			case "":
			default:
				return fmt.Errorf("PersistentVolumeClaim %q was meanwhile given to node %s", cur.Name, sel)
			}
			// A merge patch guarded by the resourceVersion: a concurrent
			// change is a conflict, retried on a fresh read.
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
				"resourceVersion": cur.ResourceVersion,
				"annotations":     map[string]string{volumehelpers.AnnSelectedNode: node},
			}})
			if err != nil {
				return err
			}
			_, err = s.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("PersistentVolumeClaim %s/%s: selecting node %s: %w", pvc.Namespace, pvc.Name, node, err)
		}
	}
	return nil
}
