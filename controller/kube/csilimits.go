package kube

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	volumehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/tessera-gpu/tessera/controller/core"
)

// csiAttachPrefix names the other resources that stand for a node's CSI
// volume attach limit (kube-scheduler's NodeVolumeLimits filter): a node
// holds, per CSI driver, the count its CSINode allows (or an unlimited
// amount when it sets none), and a pod asks for one per volume of that
// driver. Volumes are counted per pod: two pods on one node sharing a
// volume count it twice (kube-scheduler counts it once), which can only
// keep a pod off a node it would have fitted, never place one that does
// not.
const csiAttachPrefix = "CSI volume attachments of "

// noAttachLimit is a node's allowance for a driver whose CSINode sets no
// count.
const noAttachLimit = 1 << 40

// csiVolumes counts the pod's volumes per CSI driver: inline CSI volumes,
// and claims (generic ephemeral ones too) by their bound volume's driver or,
// unbound, by their storage class's provisioner, as kube-scheduler does.
// Claims or volumes not found yet count nothing: the volume checks keep
// such a pod waiting anyway.
func (s *Scheduler) csiVolumes(pod *v1.Pod) map[string]int64 {
	var out map[string]int64
	add := func(driver string) {
		if driver == "" {
			return
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[csiAttachPrefix+driver]++
	}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		if vol.CSI != nil {
			add(vol.CSI.Driver)
			continue
		}
		claim := claimName(pod, vol)
		if claim == "" {
			continue
		}
		pvc, err := s.pvcLister.PersistentVolumeClaims(pod.Namespace).Get(claim)
		if err != nil {
			continue
		}
		if pvc.Spec.VolumeName != "" {
			if pv, err := s.pvLister.Get(pvc.Spec.VolumeName); err == nil && pv.Spec.CSI != nil {
				add(pv.Spec.CSI.Driver)
			}
			continue
		}
		if class := volumehelpers.GetPersistentVolumeClaimClass(pvc); class != "" {
			if sc, err := s.storageClassLister.Get(class); err == nil && sc.Provisioner != noProvisioner {
				add(sc.Provisioner)
			}
		}
	}
	return out
}

// withCSIVolumes returns req asking also for the pod's CSI volumes; req's
// Other map is the pod cache's and is copied, not written.
func (s *Scheduler) withCSIVolumes(pod *v1.Pod, req core.Request) core.Request {
	if len(pod.Spec.Volumes) == 0 {
		return req
	}
	vols := s.csiVolumes(pod)
	if len(vols) == 0 {
		return req
	}
	other := make(map[string]int64, len(req.Other)+len(vols))
	for k, v := range req.Other {
		other[k] = v
	}
	for k, v := range vols {
		other[k] = v
	}
	req.Other = other
	return req
}

// addAttachLimits gives every node its attach limit for each CSI driver
// that some pod's volumes use (see csiAttachPrefix).
func (s *Scheduler) addAttachLimits(snap *core.Snapshot, jobs map[string]*core.Job) {
	drivers := map[string]bool{}
	for _, j := range jobs {
		for i := range j.Pods {
			for name := range j.Pods[i].Request.Other {
				if len(name) > len(csiAttachPrefix) && name[:len(csiAttachPrefix)] == csiAttachPrefix {
					drivers[name[len(csiAttachPrefix):]] = true
				}
			}
		}
	}
	if len(drivers) == 0 {
		return
	}
	names := make([]string, 0, len(drivers))
	for d := range drivers {
		names = append(names, d)
	}
	sort.Strings(names)
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		limits := map[string]int64{}
		if cn, err := s.csiNodeLister.Get(n.Name); err == nil {
			for _, d := range cn.Spec.Drivers {
				if d.Allocatable != nil && d.Allocatable.Count != nil {
					limits[d.Name] = int64(*d.Allocatable.Count)
				}
			}
		}
		if n.Other == nil {
			n.Other = map[string]int64{}
		}
		for _, d := range names {
			limit, ok := limits[d]
			if !ok {
				limit = noAttachLimit
			}
			n.Other[csiAttachPrefix+d] = limit
		}
	}
}
