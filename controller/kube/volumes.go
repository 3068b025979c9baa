package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
//   - An unbound claim of a WaitForFirstConsumer class: on the node, either
//     an available pre-created PersistentVolume matches it (class, size,
//     access and volume modes, selector, node affinity: component-helpers'
//     FindMatchingVolume, as kube-scheduler and the PV controller match),
//     or the class has a provisioner and the node is in its allowed
//     topologies. The commit binds the matched volume to the claim (its
//     claimRef, which the PV controller completes), or writes the chosen
//     node into the claim's volume.kubernetes.io/selected-node annotation
//     for the provisioner, before the pod's bind. A claim that already
//     names a node keeps the pod to that node. Volumes a commit binds are
//     reserved for the rest of it, so two pods do not take one volume.
//   - Storage capacity: when the provisioner is a CSI driver that publishes
//     its capacity (CSIDriver spec.storageCapacity), a volume is provisioned
//     only on a node that a CSIStorageCapacity object of the claim's class
//     covers (its nodeTopology) with room for the claim's size (its
//     maximumVolumeSize, or else its capacity), as kube-scheduler checks.
//     Local NVMe on GPU nodes (TopoLVM, for instance) works this way.
//
// Generic ephemeral volumes are claims named <pod>-<volume>, created by the
// ephemeral-volume controller; the pod waits until its claim exists.

// noProvisioner is the provisioner of classes whose volumes are pre-created.
const noProvisioner = "kubernetes.io/no-provisioner"

// podVolumes is what a pod's claims ask of its node.
type podVolumes struct {
	// checks must all hold for a node.
	checks []func(*v1.Node) bool
	// delayed are the unbound WaitForFirstConsumer claims, and pvs the
	// volumes that may match them.
	delayed []delayedClaim
	pvs     []*v1.PersistentVolume
}

// delayedClaim is an unbound WaitForFirstConsumer claim.
type delayedClaim struct {
	pvc *v1.PersistentVolumeClaim
	// provision: the class has a provisioner, which may create the volume
	// on a node in allowed (nil: anywhere) when no pre-created one matches.
	provision bool
	allowed   *v1.NodeSelector
	// capacities, when not nil, are the CSIStorageCapacity objects of the
	// claim's class: the provisioner's driver publishes its capacity, so a
	// volume is provisioned only where one of them has room for it.
	capacities []*storagev1.CSIStorageCapacity
}

// hasRoom reports whether the driver can provision the claim on node n: no
// capacity is published, the claim asks no size, or a CSIStorageCapacity
// of its class covers n with room for it.
func (d *delayedClaim) hasRoom(n *v1.Node) bool {
	if d.capacities == nil {
		return true
	}
	size, ok := d.pvc.Spec.Resources.Requests[v1.ResourceStorage]
	if !ok {
		return true
	}
	for _, c := range d.capacities {
		if capacityFits(c, size) && capacityCovers(c, n) {
			return true
		}
	}
	return false
}

// volumeRoom is the largest volume c offers: its maximumVolumeSize when set,
// else its capacity; nil when it says neither.
func volumeRoom(c *storagev1.CSIStorageCapacity) *resource.Quantity {
	if c.MaximumVolumeSize != nil {
		return c.MaximumVolumeSize
	}
	return c.Capacity
}

// capacityFits reports whether one volume of size fits c.
func capacityFits(c *storagev1.CSIStorageCapacity, size resource.Quantity) bool {
	room := volumeRoom(c)
	return room != nil && room.Cmp(size) >= 0
}

// capacityCovers reports whether node n is in c's topology; an object
// without one covers no node.
func capacityCovers(c *storagev1.CSIStorageCapacity, n *v1.Node) bool {
	if c.NodeTopology == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(c.NodeTopology)
	return err == nil && sel.Matches(labels.Set(n.Labels))
}

// volumeChoice is what the commit does for one delayed claim on the chosen
// node: bind it to pv, or (pv nil) ask its provisioner for a volume there.
type volumeChoice struct {
	claim *v1.PersistentVolumeClaim
	pv    *v1.PersistentVolume
}

// match chooses, on node n, a volume for every delayed claim (none twice,
// none in taken), or says that n cannot serve them all.
func (v *podVolumes) match(n *v1.Node, taken map[string]bool) ([]volumeChoice, bool) {
	excluded := map[string]*v1.PersistentVolume{}
	for _, pv := range v.pvs {
		if taken[pv.Name] {
			excluded[pv.Name] = pv
		}
	}
	out := make([]volumeChoice, 0, len(v.delayed))
	for _, d := range v.delayed {
		pv, err := volumehelpers.FindMatchingVolume(d.pvc, v.pvs, n, excluded, false, true)
		if err == nil && pv != nil {
			excluded[pv.Name] = pv
			out = append(out, volumeChoice{claim: d.pvc, pv: pv})
			continue
		}
		if !d.provision {
			return nil, false
		}
		if d.allowed != nil {
			if ok, err := corev1helpers.MatchNodeSelectorTerms(n, d.allowed); err != nil || !ok {
				return nil, false
			}
		}
		if !d.hasRoom(n) {
			return nil, false
		}
		out = append(out, volumeChoice{claim: d.pvc})
	}
	return out, true
}

// claimName is the PersistentVolumeClaim behind a pod volume: its own, or
// the one the ephemeral-volume controller makes for a generic ephemeral
// volume; "" for other volumes.
func claimName(pod *v1.Pod, vol *v1.Volume) string {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName
	case vol.Ephemeral != nil:
		return ephemeral.VolumeClaimName(pod, vol)
	}
	return ""
}

// volumesOf reads the pod's claims. An error says why the pod must wait.
func (s *Scheduler) volumesOf(pod *v1.Pod) (podVolumes, error) {
	var out podVolumes
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		name := claimName(pod, vol)
		if name == "" {
			continue
		}
		if err := s.addClaim(&out, pod, vol, name); err != nil {
			return out, err
		}
	}
	if len(out.delayed) == 0 {
		return out, nil
	}
	if err := s.readDelayed(&out); err != nil {
		return out, err
	}
	out.checks = append(out.checks, func(n *v1.Node) bool {
		_, ok := out.match(n, nil)
		return ok
	})
	return out, nil
}

// addClaim adds the PersistentVolumeClaim name behind vol to out: a node
// check for a bound or node-selected claim, a delayed claim for one that
// waits for its first consumer. An error says why the pod must wait.
func (s *Scheduler) addClaim(out *podVolumes, pod *v1.Pod, vol *v1.Volume, name string) error {
	pvc, err := s.pvcLister.PersistentVolumeClaims(pod.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("waiting for PersistentVolumeClaim %q to exist", name)
	}
	if err != nil {
		return fmt.Errorf("PersistentVolumeClaim %q: %w", name, err)
	}
	if vol.Ephemeral != nil {
		if err := ephemeral.VolumeIsForPod(pod, pvc); err != nil {
			return err
		}
	}
	if pvc.DeletionTimestamp != nil {
		return fmt.Errorf("PersistentVolumeClaim %q is being deleted", name)
	}
	if pvc.Spec.VolumeName != "" {
		pv, err := s.pvLister.Get(pvc.Spec.VolumeName)
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("waiting for PersistentVolume %q of claim %q", pvc.Spec.VolumeName, name)
		}
		if err != nil {
			return fmt.Errorf("PersistentVolume %q: %w", pvc.Spec.VolumeName, err)
		}
		if pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil {
			out.checks = append(out.checks, func(n *v1.Node) bool { return volumehelpers.CheckNodeAffinity(pv, n.Labels) == nil })
		}
		return nil
	}
	class := volumehelpers.GetPersistentVolumeClaimClass(pvc)
	if class == "" {
		return fmt.Errorf("PersistentVolumeClaim %q is not bound yet (it has no storage class)", name)
	}
	sc, err := s.storageClassLister.Get(class)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("PersistentVolumeClaim %q is not bound yet: its storage class %q does not exist", name, class)
	}
	if err != nil {
		return fmt.Errorf("storage class %q: %w", class, err)
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return fmt.Errorf("PersistentVolumeClaim %q is not bound yet (storage class %q binds immediately)", name, class)
	}
	if node := pvc.Annotations[volumehelpers.AnnSelectedNode]; node != "" {
		out.checks = append(out.checks, func(n *v1.Node) bool { return n.Name == node })
		return nil
	}
	d := delayedClaim{pvc: pvc, provision: sc.Provisioner != noProvisioner}
	if d.provision && len(sc.AllowedTopologies) > 0 {
		d.allowed = topologyTerms(sc.AllowedTopologies)
	}
	if d.provision {
		if d.capacities, err = s.storageCapacities(sc); err != nil {
			return err
		}
	}
	out.delayed = append(out.delayed, d)
	return nil
}

// readDelayed lists the PersistentVolumes of the delayed claims' classes
// into out.pvs, and fails when a delayed claim can be served nowhere.
func (s *Scheduler) readDelayed(out *podVolumes) error {
	classes := map[string]bool{}
	for _, d := range out.delayed {
		class := volumehelpers.GetPersistentVolumeClaimClass(d.pvc)
		if classes[class] {
			continue
		}
		classes[class] = true
		objs, err := s.pvIndexer.ByIndex(pvClassIndex, class)
		if err != nil {
			return fmt.Errorf("listing PersistentVolumes of storage class %q: %w", class, err)
		}
		for _, o := range objs {
			out.pvs = append(out.pvs, o.(*v1.PersistentVolume))
		}
	}
	// A claim that only a pre-created volume can serve, or whose driver
	// has room for it on no node, and that no pre-created volume matches
	// anywhere: say so, rather than "no node fits".
	for _, d := range out.delayed {
		why := d.roomAnywhere()
		if !d.provision {
			why = fmt.Errorf("PersistentVolumeClaim %q waits for a pre-created volume (storage class %q has no provisioner) and no available PersistentVolume matches its class, size and selector",
				d.pvc.Name, volumehelpers.GetPersistentVolumeClaimClass(d.pvc))
		}
		if why == nil {
			continue
		}
		if pv, err := volumehelpers.FindMatchingVolume(d.pvc, out.pvs, nil, nil, false, true); err == nil && pv != nil {
			continue
		}
		return why
	}
	return nil
}

// storageCapacities returns the CSIStorageCapacity objects of class sc when
// its provisioner is a CSI driver that publishes capacity, else nil (no
// CSIDriver object, or storageCapacity off: capacity is not checked, as in
// kube-scheduler). The slice is never nil when capacity is checked.
func (s *Scheduler) storageCapacities(sc *storagev1.StorageClass) ([]*storagev1.CSIStorageCapacity, error) {
	driver, err := s.csiDriverLister.Get(sc.Provisioner)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("CSIDriver %q: %w", sc.Provisioner, err)
	}
	if driver.Spec.StorageCapacity == nil || !*driver.Spec.StorageCapacity {
		return nil, nil
	}
	objs, err := s.capacityIndexer.ByIndex(capacityClassIndex, sc.Name)
	if err != nil {
		return nil, fmt.Errorf("listing CSIStorageCapacity of storage class %q: %w", sc.Name, err)
	}
	out := make([]*storagev1.CSIStorageCapacity, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*storagev1.CSIStorageCapacity))
	}
	return out, nil
}

// roomAnywhere says why a claim to provision waits when no published
// capacity of its class has room for it on any node.
func (d *delayedClaim) roomAnywhere() error {
	size, ok := d.pvc.Spec.Resources.Requests[v1.ResourceStorage]
	if d.capacities == nil || !ok {
		return nil
	}
	var most *resource.Quantity
	for _, c := range d.capacities {
		if c.NodeTopology == nil {
			continue
		}
		if capacityFits(c, size) {
			return nil
		}
		if room := volumeRoom(c); room != nil && (most == nil || room.Cmp(*most) > 0) {
			most = room
		}
	}
	class := volumehelpers.GetPersistentVolumeClaimClass(d.pvc)
	if most == nil {
		return fmt.Errorf("PersistentVolumeClaim %q needs %s of storage class %q, and its CSI driver publishes no capacity for it on any node (CSIStorageCapacity)",
			d.pvc.Name, size.String(), class)
	}
	return fmt.Errorf("PersistentVolumeClaim %q needs %s of storage class %q; the most its CSI driver can provision on any node is %s (CSIStorageCapacity)",
		d.pvc.Name, size.String(), class, most.String())
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

// volumeReservations are the volumes a commit has bound so far: the
// listers do not show them yet, and jobs commit in parallel.
type volumeReservations struct {
	mu    sync.Mutex
	taken map[string]bool
}

// selectNode prepares the pod's unbound WaitForFirstConsumer claims for the
// chosen node: each is bound to a matching pre-created volume there
// (reserved in res for the rest of the commit), or gets the node in its
// selected-node annotation for its provisioner. A claim that meanwhile
// names another node, or a volume meanwhile taken, fails the commit (the
// next cycle decides again).
func (s *Scheduler) selectNode(ctx context.Context, pod *v1.Pod, node *v1.Node, res *volumeReservations) error {
	vols, err := s.volumesOf(pod)
	if err != nil || len(vols.delayed) == 0 {
		return err
	}
	res.mu.Lock()
	choices, ok := vols.match(node, res.taken)
	if ok {
		for _, c := range choices {
			if c.pv != nil {
				res.taken[c.pv.Name] = true
			}
		}
	}
	res.mu.Unlock()
	if !ok {
		return fmt.Errorf("the volumes of its claims no longer fit node %s", node.Name)
	}
	for _, c := range choices {
		if c.pv != nil {
			err = s.bindVolume(ctx, c.claim, c.pv)
		} else {
			err = s.annotateSelectedNode(ctx, c.claim, node.Name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// bindVolume points the volume's claimRef at the claim, as kube-scheduler's
// binder does; the PV controller then binds the claim.
func (s *Scheduler) bindVolume(ctx context.Context, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) error {
	err := retryOnError(retry.DefaultBackoff, retriable, func() error {
		cur, err := s.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.Spec.ClaimRef != nil && !volumehelpers.IsVolumeBoundToClaim(cur, pvc) {
			return fmt.Errorf("it was meanwhile taken by %s/%s", cur.Spec.ClaimRef.Namespace, cur.Spec.ClaimRef.Name)
		}
		bound, dirty, err := volumehelpers.GetBindVolumeToClaim(cur, pvc)
		if err != nil || !dirty {
			return err
		}
		_, err = s.client.CoreV1().PersistentVolumes().Update(ctx, bound, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("PersistentVolumeClaim %s/%s: binding volume %s: %w", pvc.Namespace, pvc.Name, pv.Name, err)
	}
	return nil
}

// annotateSelectedNode writes the chosen node into a claim for its
// provisioner.
func (s *Scheduler) annotateSelectedNode(ctx context.Context, pvc *v1.PersistentVolumeClaim, node string) error {
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
	return nil
}
