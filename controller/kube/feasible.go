package kube

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
)

// driverOnlySelector is the selector of the shipped DeviceClasses: it holds
// for every Tessera device, so it need not be evaluated per device.
const driverOnlySelector = `device.driver == "` + DriverName + `"`

// feasibility builds a pod's core.Pod.Feasible check, or nil when nothing
// beyond what the core already checks applies: untolerated node taints,
// required node affinity, its volumes' nodes (volumes.go), unhealthy
// (tainted) GPUs, and CEL selectors of the pod's DeviceClasses and claim
// requests, evaluated per device. An error says why the pod must wait.
//
// For a placed pod it describes where the pod could be moved to (its
// controller recreates it with fresh claims of the same spec), so allocated
// claims' selectors count too.
//
// Of a firstAvailable request, the selectors of subrequest sub count ("":
// the first), so each of the core's alternatives gets its own check.
func (s *Scheduler) feasibility(pod *v1.Pod, claims []*resourceapi.ResourceClaim, idx *cycleIndex, sub string) (func(node string, gpu int) bool, error) {
	placed := pod.Spec.NodeName != ""
	nodeChecks, err := s.nodeChecks(pod, claims, idx, placed)
	if err != nil {
		return nil, err
	}
	compiled, err := s.compileSelectors(s.deviceSelectors(claims, placed, sub))
	if err != nil {
		return nil, err
	}
	if len(nodeChecks) == 0 && !idx.taintedGPUs && len(compiled) == 0 {
		return nil, nil
	}
	return feasibleFunc(idx, nodeChecks, compiled), nil
}

// nodeChecks lists what a node must pass for pod: its volumes' nodes,
// tolerated taints, required node affinity, and room for claims of other
// drivers. A placed pod ignores volume errors: it stays where it is.
func (s *Scheduler) nodeChecks(pod *v1.Pod, claims []*resourceapi.ResourceClaim, idx *cycleIndex, placed bool) ([]func(*v1.Node) bool, error) {
	vols, err := s.volumesOf(pod)
	if err != nil && !placed {
		return nil, err
	}
	checks := vols.checks
	if idx.taintedNodes {
		tolerations := pod.Spec.Tolerations
		checks = append(checks, func(n *v1.Node) bool { return toleratesAll(tolerations, n.Spec.Taints) })
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		sel, err := nodeaffinity.NewNodeSelector(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
		if err != nil {
			return nil, fmt.Errorf("node affinity: %w", err)
		}
		checks = append(checks, sel.Match)
	}
	// Claims for other drivers' devices: the node must be able to satisfy
	// them too (the commit allocates them with the structured allocator).
	if other := s.otherDriverClaims(claims, placed); len(other) > 0 {
		checks = append(checks, func(n *v1.Node) bool { return s.otherClaimsFit(n, other, idx) })
	}
	return checks, nil
}

// otherDriverClaims returns the pod's unallocated claims that ask no
// Tessera DeviceClass (none for a placed pod: its node already holds them).
func (s *Scheduler) otherDriverClaims(claims []*resourceapi.ResourceClaim, placed bool) []*resourceapi.ResourceClaim {
	var other []*resourceapi.ResourceClaim
	for _, c := range claims {
		if c.Status.Allocation != nil || placed {
			continue
		}
		tessera := false
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly != nil {
				if class := s.getClass(r.Exactly.DeviceClassName); class != nil && isTesseraClass(class) {
					tessera = true
				}
			}
			for _, fa := range r.FirstAvailable {
				if class := s.getClass(fa.DeviceClassName); class != nil && isTesseraClass(class) {
					tessera = true
				}
			}
		}
		if !tessera {
			other = append(other, c)
		}
	}
	return other
}

// deviceSelectors collects the CEL expressions a Tessera device must match:
// those of the requests' DeviceClasses (but the shipped driver-only one)
// and of the requests themselves; of a firstAvailable request, subrequest
// sub's ("": the first).
func (s *Scheduler) deviceSelectors(claims []*resourceapi.ResourceClaim, placed bool, sub string) []string {
	var exprs []string
	for _, c := range claims {
		if c.Status.Allocation != nil && !placed {
			continue
		}
		for _, r := range c.Spec.Devices.Requests {
			className, selectors := "", []resourceapi.DeviceSelector(nil)
			switch {
			case r.Exactly != nil:
				className, selectors = r.Exactly.DeviceClassName, r.Exactly.Selectors
			case len(r.FirstAvailable) > 0:
				k := 0
				for i, fa := range r.FirstAvailable {
					if fa.Name == sub {
						k = i
					}
				}
				className, selectors = r.FirstAvailable[k].DeviceClassName, r.FirstAvailable[k].Selectors
			}
			class := s.getClass(className)
			if class == nil || !isTesseraClass(class) {
				continue
			}
			for _, sel := range class.Spec.Selectors {
				if sel.CEL != nil && strings.TrimSpace(sel.CEL.Expression) != driverOnlySelector {
					exprs = append(exprs, sel.CEL.Expression)
				}
			}
			for _, sel := range selectors {
				if sel.CEL != nil {
					exprs = append(exprs, sel.CEL.Expression)
				}
			}
		}
	}
	return exprs
}

// compileSelectors compiles exprs through the scheduler's cache; an
// expression that does not compile makes the pod wait, named.
func (s *Scheduler) compileSelectors(exprs []string) ([]cel.CompilationResult, error) {
	var compiled []cel.CompilationResult
	for _, e := range exprs {
		r := s.celCache.GetOrCompile(e)
		if r.Error != nil {
			return nil, fmt.Errorf("CEL selector %q: %w", e, r.Error)
		}
		compiled = append(compiled, r)
	}
	return compiled, nil
}

// feasibleFunc is the check itself: gpu < 0 asks about the node (cached
// per node for the cycle), else about one GPU of it (healthy, and matching
// every compiled selector).
func feasibleFunc(idx *cycleIndex, nodeChecks []func(*v1.Node) bool, compiled []cel.CompilationResult) func(node string, gpu int) bool {
	nodeOK := map[string]bool{}
	return func(node string, gpu int) bool {
		if gpu < 0 {
			ok, seen := nodeOK[node]
			if !seen {
				ok = true
				n := idx.nodes[node]
				for _, check := range nodeChecks {
					if n == nil || !check(n) {
						ok = false
						break
					}
				}
				nodeOK[node] = ok
			}
			return ok
		}
		g := idx.gpus[node]
		if g == nil {
			return false
		}
		dev, ok := g.devices[gpu]
		if !ok || g.tainted[dev.Name] {
			return false
		}
		for _, c := range compiled {
			match, _, err := c.DeviceMatches(context.Background(), cel.Device{
				Driver: DriverName, AllowMultipleAllocations: dev.AllowMultipleAllocations,
				Attributes: dev.Attributes, Capacity: dev.Capacity,
			})
			if err != nil || !match {
				return false
			}
		}
		return true
	}
}

// toleratesAll reports whether tolerations tolerate every NoSchedule and
// NoExecute taint.
func toleratesAll(tolerations []v1.Toleration, taints []v1.Taint) bool {
	for i := range taints {
		t := &taints[i]
		if t.Effect != v1.TaintEffectNoSchedule && t.Effect != v1.TaintEffectNoExecute {
			continue
		}
		ok := false
		for j := range tolerations {
			if tolerations[j].ToleratesTaint(klog.Background(), t, true) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// otherClaimsFit reports whether claims for other drivers' devices can be
// allocated on node, given what is allocated at the cycle's start.
func (s *Scheduler) otherClaimsFit(node *v1.Node, claims []*resourceapi.ResourceClaim, idx *cycleIndex) bool {
	local, _ := s.sliceIndexer.ByIndex(sliceNodeIndex, node.Name)
	shared, _ := s.sliceIndexer.ByIndex(sliceNodeIndex, "")
	var slices []*resourceapi.ResourceSlice
	for _, obj := range append(local, shared...) {
		if sl := obj.(*resourceapi.ResourceSlice); sl.Spec.Driver != DriverName {
			slices = append(slices, sl)
		}
	}
	alloc, err := structured.NewAllocator(context.Background(), allocatorFeatures, *idx.allocatedState(s), classLister{s}, slices, s.celCache)
	if err != nil {
		return false
	}
	res, err := alloc.Allocate(context.Background(), node, claims)
	return err == nil && res != nil
}
