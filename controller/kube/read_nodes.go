package kube

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/controller/core"
)

// readNodes adds every node, with its allocatable resources and its GPUs
// from the node's ResourceSlices (gpusFromSlices, cached by slice).
func (b *snapshotBuild) readNodes() error {
	s, idx := b.s, b.idx
	nodes, err := s.nodeLister.List(everything)
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	s.refreshGPUs(b.logger)
	for _, n := range nodes {
		idx.nodes[n.Name] = n
		g := s.gpuCache[n.Name]
		idx.gpus[n.Name] = g
		cn := core.Node{
			Name:          n.Name,
			Labels:        n.Labels,
			CPU:           nodeAmount(n.Status.Allocatable, v1.ResourceCPU),
			Memory:        nodeAmount(n.Status.Allocatable, v1.ResourceMemory),
			Unschedulable: n.Spec.Unschedulable || !nodeReady(n),
			Other:         nodeOther(n),
		}
		if g != nil {
			cn.GPUs = g.gpus
			idx.taintedGPUs = idx.taintedGPUs || len(g.tainted) > 0
		}
		for _, t := range n.Spec.Taints {
			switch t.Effect {
			case v1.TaintEffectNoSchedule, v1.TaintEffectNoExecute:
				idx.taintedNodes = true
			case v1.TaintEffectPreferNoSchedule:
				idx.preferNoSchedule = true
			}
		}
		b.snap.Nodes = append(b.snap.Nodes, cn)
	}
	for name, g := range idx.gpus {
		if g != nil {
			b.poolNode[g.pool] = name
		}
	}
	return nil
}

// readClaims lists every ResourceClaim once for the cycle.
func (b *snapshotBuild) readClaims() error {
	var err error
	if b.idx.claims, err = b.s.claimLister.List(everything); err != nil {
		return fmt.Errorf("listing ResourceClaims: %w", err)
	}
	return nil
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
