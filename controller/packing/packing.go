// Package packing chooses a node and GPUs for one pod: whole GPUs, or a
// fraction of one GPU. It is pure Go (no Kubernetes types) so that the
// scheduling core, tessera-sim and the openb replay share one scorer.
//
// Policies:
//   - Tessera (Default): FGD with Tessera's refinements, a CPU/memory
//     stranding term and fill values for fractions (see tessera.go).
//   - FGD: fragmentation-gradient placement as the FGD paper publishes it.
//     The fragmentation of a node is the free GPU capacity that the expected
//     workload (a Workload: the mix of pod types the scheduler knows about)
//     could not use; the pod goes where that fragmentation grows least,
//     scored as the paper's plugin scores it (an integer 0–100, ties to the
//     lowest node index). See fgd.go for the exact definition.
//   - BestFit: the feasible node left tightest in CPU and GPU (see bestfit.go).
//   - FirstFit: the first feasible node in the order given.
//
// The hot path (Placer.Place, Placer.Score) does not allocate: scratch space
// lives in the Placer, which is therefore not safe for concurrent use.
package packing

import (
	"fmt"
	"strings"
)

// MilliPerGPU is one whole GPU in milli-GPU.
const MilliPerGPU = 1000

// Sharing is how the fractions on a GPU share it. One mode per GPU at a time.
type Sharing uint8

const (
	// SharingNone: the GPU holds no fraction (it is free or held whole).
	SharingNone Sharing = iota
	// SharingMPS: fractions under MPS (the default mode for a fraction).
	SharingMPS
	// SharingTimeSlice: fractions under time-slicing.
	SharingTimeSlice
)

// GPU is the scheduler's view of one GPU of a node.
type GPU struct {
	// FreeMilli is the unallocated share, 0..MilliPerGPU. A GPU is wholly
	// free when FreeMilli == MilliPerGPU.
	FreeMilli int
	// Model is the GPU's product name as matched by Request.Models.
	Model string
	// Sharing is the mode of the fractions it holds (SharingNone when none).
	Sharing Sharing
}

// NodeState is the scheduler's view of one node.
type NodeState struct {
	// FreeCPUMilli and FreeMemory are what is left to allocate. Memory is in
	// any unit, the same as Request.Memory.
	FreeCPUMilli int64
	FreeMemory   int64
	// CPUMilli and Memory are the node's allocatable totals; BestFit uses
	// them to normalise what is left (0 means unknown: CPU is then ignored).
	CPUMilli int64
	Memory   int64
	// GPUs in index order; the indices returned by Place index this slice.
	GPUs []GPU
}

// Request is what one pod asks for.
type Request struct {
	CPUMilli int64
	Memory   int64
	// GPUs is the number of whole GPUs (each must be wholly free).
	GPUs int
	// GPUMilli is a fraction of one GPU, 1..999, when GPUs == 0.
	// A value of MilliPerGPU or more is read as one whole GPU.
	GPUMilli int
	// Sharing is the mode a fraction needs; SharingNone means SharingMPS.
	Sharing Sharing
	// Models lists the GPU models allowed; empty allows any.
	Models []string
}

// WantsGPU reports whether the request needs any GPU capacity.
func (r *Request) WantsGPU() bool { return r.GPUs > 0 || r.GPUMilli > 0 }

// norm returns the request with a whole-GPU GPUMilli folded into GPUs and
// the fraction's sharing mode defaulted, so the rest of the package sees one
// shape per kind of request.
func (r Request) norm() Request {
	if r.GPUs == 0 && r.GPUMilli >= MilliPerGPU {
		r.GPUs = 1
	}
	if r.GPUs > 0 {
		r.GPUMilli = 0
		r.Sharing = SharingNone
	} else if r.GPUMilli > 0 && r.Sharing == SharingNone {
		r.Sharing = SharingMPS
	}
	return r
}

// GPUMilliTotal is the request's GPU demand in milli-GPU.
func (r *Request) GPUMilliTotal() int64 {
	n := r.norm()
	if n.GPUs > 0 {
		return int64(n.GPUs) * MilliPerGPU
	}
	return int64(n.GPUMilli)
}

// Policy selects how a node and GPUs are chosen.
type Policy uint8

const (
	// FGD is plain fragmentation-gradient placement (the FGD paper's); the
	// default is Tessera, which refines it.
	FGD Policy = iota
	// BestFit picks the node left tightest in CPU and GPU.
	BestFit
	// FirstFit picks the first feasible node.
	FirstFit
	// Tessera is FGD with Tessera's refinements (see tessera.go); it is the
	// default policy. Like FGD it falls back to BestFit without a Workload.
	Tessera
)

// Default is the policy used when none is named.
const Default = Tessera

// String returns the policy's name as ParsePolicy accepts it.
func (p Policy) String() string {
	switch p {
	case FGD:
		return "fgd"
	case BestFit:
		return "bestfit"
	case FirstFit:
		return "firstfit"
	case Tessera:
		return "tessera"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy reads "tessera" (or "default" or ""), "fgd", "bestfit" or
// "firstfit".
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "default", "tessera":
		return Tessera, nil
	case "fgd":
		return FGD, nil
	case "bestfit", "best-fit":
		return BestFit, nil
	case "firstfit", "first-fit":
		return FirstFit, nil
	}
	return 0, fmt.Errorf("unknown placement policy %q (want tessera, fgd, bestfit or firstfit)", s)
}

// Apply records req as allocated on node at the given GPU indices (as
// returned by Place). It does not check feasibility.
func Apply(node *NodeState, req Request, gpus []int) {
	r := req.norm()
	node.FreeCPUMilli -= r.CPUMilli
	node.FreeMemory -= r.Memory
	if r.GPUs > 0 {
		for _, g := range gpus {
			node.GPUs[g].FreeMilli -= MilliPerGPU
		}
		return
	}
	if r.GPUMilli > 0 && len(gpus) > 0 {
		g := &node.GPUs[gpus[0]]
		g.FreeMilli -= r.GPUMilli
		g.Sharing = r.Sharing
	}
}

// Release undoes Apply.
func Release(node *NodeState, req Request, gpus []int) {
	r := req.norm()
	node.FreeCPUMilli += r.CPUMilli
	node.FreeMemory += r.Memory
	if r.GPUs > 0 {
		for _, g := range gpus {
			node.GPUs[g].FreeMilli += MilliPerGPU
		}
		return
	}
	if r.GPUMilli > 0 && len(gpus) > 0 {
		g := &node.GPUs[gpus[0]]
		g.FreeMilli += r.GPUMilli
		if g.FreeMilli >= MilliPerGPU {
			g.Sharing = SharingNone
		}
	}
}

// modelAllowed reports whether model is in the allowed list (empty: all).
func modelAllowed(models []string, model string) bool {
	if len(models) == 0 {
		return true
	}
	for _, m := range models {
		if m == model {
			return true
		}
	}
	return false
}

// gpuUsable reports whether GPU g can take (part of) the normalised request.
func gpuUsable(g *GPU, r *Request) bool {
	if !modelAllowed(r.Models, g.Model) {
		return false
	}
	if r.GPUs > 0 {
		return g.FreeMilli >= MilliPerGPU
	}
	return g.FreeMilli >= r.GPUMilli && (g.Sharing == SharingNone || g.Sharing == r.Sharing)
}

// Fits reports whether the request could be placed on the node at all.
func Fits(node *NodeState, req Request) bool {
	r := req.norm()
	return fits(node, &r)
}

func fits(node *NodeState, r *Request) bool {
	if node.FreeCPUMilli < r.CPUMilli || node.FreeMemory < r.Memory {
		return false
	}
	if r.GPUs > 0 {
		n := 0
		for i := range node.GPUs {
			if gpuUsable(&node.GPUs[i], r) {
				n++
			}
		}
		return n >= r.GPUs
	}
	if r.GPUMilli > 0 {
		for i := range node.GPUs {
			if gpuUsable(&node.GPUs[i], r) {
				return true
			}
		}
		return false
	}
	return true
}
