package kube

import (
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// What holds capacity without a pod of the snapshot to show for it: claims
// allocated for nobody the snapshot holds, GPUs the device plugin holds for
// pods the controller cannot see; and the node resources the pods define
// (host ports).

// stillHeld says whether an allocated claim keeps its devices: it is
// reserved for a pod that exists and has not ended, or for nobody (an
// allocated claim that was never reserved stays allocated; nothing
// deallocates it). A claim reserved only for pods that are gone (victims of
// an eviction, say) is about to be deallocated by kube-controller-manager,
// which deallocates on the last consumer's removal: counting it as held
// would make the core evict more for room that is coming anyway.
func stillHeld(c *resourceapi.ResourceClaim, pods corelisters.PodLister) bool {
	if len(c.Status.ReservedFor) == 0 {
		return true
	}
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		p, err := pods.Pods(c.Namespace).Get(r.Name)
		if err == nil && p.UID == r.UID && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			return true
		}
	}
	return false
}

// addUnattributedClaims adds, for each allocated claim that still holds
// Tessera GPUs (stillHeld) and that no pod of the snapshot accounts for, a
// bound pod of the external queue holding those GPUs.
func (s *Scheduler) addUnattributedClaims(idx *cycleIndex, attributed map[types.UID]bool, poolNode map[string]string, jobs map[string]*core.Job, jobOrder *[]string) {
	var held []*resourceapi.ResourceClaim
	for _, c := range idx.claims {
		if c.Status.Allocation == nil || attributed[c.UID] {
			continue
		}
		if stillHeld(c, s.podLister) {
			held = append(held, c)
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == DriverName {
				if idx.releasing == nil {
					idx.releasing = map[string]string{}
				}
				idx.releasing[r.Pool+"/"+r.Device] = c.Namespace + "/" + c.Name
			}
		}
	}
	// Few, usually none: sorted for a deterministic job order.
	sort.Slice(held, func(i, j int) bool {
		if held[i].Namespace != held[j].Namespace {
			return held[i].Namespace < held[j].Namespace
		}
		return held[i].Name < held[j].Name
	})
	for _, c := range held {
		node := heldNode([]*resourceapi.ResourceClaim{c}, poolNode)
		if node == "" {
			continue
		}
		pl := allocatedPlacement(node, []*resourceapi.ResourceClaim{c}, idx.gpus[node])
		if len(pl.GPUs) == 0 {
			continue
		}
		addExternalHolder(idx, jobs, jobOrder, "<claim>/"+c.Namespace+"/"+c.Name, pl, c.CreationTimestamp.Time)
	}
}

// addExternalHolder adds a bound, pinned pod named key of the external
// queue, holding pl: capacity that something Tessera does not schedule holds.
func addExternalHolder(idx *cycleIndex, jobs map[string]*core.Job, jobOrder *[]string, key string, pl core.Placement, created time.Time) {
	cp := core.Pod{Name: key, Phase: core.PodBound, Placement: pl, Pinned: true}
	holdPlacement(&cp)
	name := "<external>/" + key
	jobs[name] = &core.Job{Name: name, Queue: externalQueue, Priority: 1 << 30, CreatedAt: created, Pods: []core.Pod{cp}}
	*jobOrder = append(*jobOrder, name)
	idx.jobs[name] = &jobRef{pods: []string{key}}
}

// addDevicePluginHeld adds, for each node whose slice taints GPUs as held by
// the device plugin (draname.TaintDevicePlugin) that no bound pod's assignment
// accounts for, a bound pod of the external queue holding those GPUs whole.
// Such a GPU is held by a pod another scheduler bound with nvidia.com/gpu
// (it has no assignment), or by a pod gone from the cache whose release
// the node has not published yet. A "shared" GPU without a known holder is
// counted whole too: its holder's sharing mode and memory are unknown, and
// a share always has an assignment, so this lasts only until the node
// publishes the release (or the controller sees the pod).
func addDevicePluginHeld(idx *cycleIndex, assigned map[string]map[int]bool, jobs map[string]*core.Job, jobOrder *[]string) {
	nodes := make([]string, 0, len(idx.gpus))
	for name, g := range idx.gpus {
		if g != nil && len(g.dpHeld) > 0 {
			nodes = append(nodes, name)
		}
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		g := idx.gpus[node]
		pl := core.Placement{Node: node}
		for _, gp := range g.gpus {
			dev := draname.DeviceName(gp.Index)
			if _, held := g.dpHeld[dev]; !held || assigned[node][gp.Index] {
				continue
			}
			pl.GPUs = append(pl.GPUs, gp.Index)
			pl.GPUMemory = append(pl.GPUMemory, gp.Memory)
			pl.GPUMilli = append(pl.GPUMilli, 1000)
		}
		if len(pl.GPUs) == 0 {
			continue
		}
		addExternalHolder(idx, jobs, jobOrder, "<device-plugin>/"+node, pl, time.Time{})
	}
}

// addHostPorts gives every node one of each host port a pod asks for (see
// hostPortPrefix).
func addHostPorts(snap *core.Snapshot, jobs map[string]*core.Job) {
	ports := map[string]bool{}
	for _, j := range jobs {
		for i := range j.Pods {
			for name := range j.Pods[i].Request.Other {
				if strings.HasPrefix(name, hostPortPrefix) {
					ports[name] = true
				}
			}
		}
	}
	for i := range snap.Nodes {
		for port := range ports {
			if snap.Nodes[i].Other == nil {
				snap.Nodes[i].Other = map[string]int64{}
			}
			snap.Nodes[i].Other[port] = 1
		}
	}
}
