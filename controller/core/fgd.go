package core

import (
	"math"
	"strings"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// fgdRefiner breaks ties between placements with controller/packing's
// fragmentation-aware score (FGD, ATC'23), the scorer tessera-sim openb
// replays, against the workload of this snapshot's pods (pending and
// placed). Only the public packing API is used, so the scorer can be tuned
// there without touching the core.
type fgdRefiner struct {
	placer *packing.Placer
	// node is scratch space: the node being scored in packing's terms.
	node    packing.NodeState
	maxMem  int64
	scratch []int
}

// newFGDRefiner builds the workload from every pod that asks for a GPU,
// grouped by shape so that big snapshots cost one Add per shape.
func newFGDRefiner(s *session) *fgdRefiner {
	type key struct {
		cpu, mem    int64
		gpus, milli int
		sharing     packing.Sharing
		models      string
	}
	counts := map[key]float64{}
	var order []key
	var maxCPU int64
	maxGPUs := 0
	for _, n := range s.nodes {
		maxCPU, maxGPUs = max(maxCPU, n.cpu), max(maxGPUs, len(n.gpus))
	}
	f := &fgdRefiner{maxMem: s.maxGPUMem}
	for _, p := range s.pods {
		r := f.request(p, 0)
		if !r.WantsGPU() {
			continue
		}
		k := key{cpu: r.CPUMilli, mem: r.Memory, gpus: r.GPUs, milli: r.GPUMilli, sharing: r.Sharing, models: strings.Join(p.models, "|")}
		if _, ok := counts[k]; !ok {
			order = append(order, k)
		}
		counts[k]++
	}
	w := packing.NewWorkload()
	for _, k := range order { // first-seen order: pods are sorted by job name
		r := packing.Request{CPUMilli: k.cpu, Memory: k.mem, GPUs: k.gpus, GPUMilli: k.milli, Sharing: k.sharing}
		if k.models != "" {
			r.Models = strings.Split(k.models, "|")
		}
		w.Add(r, counts[k])
	}
	// The package's default policy is what tessera-sim openb runs.
	pol, _ := packing.ParsePolicy("")
	f.placer = packing.NewPlacer(pol, w)
	f.placer.SetClusterMax(maxCPU, maxGPUs)
	return f
}

// request is p in packing's terms; milli, when positive, is the share a
// memory fraction takes of the GPU chosen for it.
func (f *fgdRefiner) request(p *podState, milli int64) packing.Request {
	r := packing.Request{CPUMilli: p.req.CPU, Memory: p.req.Memory, GPUs: p.req.GPUs, Models: p.models}
	switch {
	case p.req.GPUMilli > 0:
		r.GPUMilli = int(p.req.GPUMilli)
	case p.req.GPUMemory > 0:
		if milli <= 0 {
			milli = 1
			if f.maxMem > 0 {
				milli = memMilli(p.req.GPUMemory, f.maxMem)
			}
		}
		r.GPUMilli = int(milli)
	}
	if r.GPUMilli > 0 {
		r.Sharing = packing.SharingMPS
		if p.req.Sharing == SharingTimeSlice {
			r.Sharing = packing.SharingTimeSlice
		}
	}
	return r
}

// load writes n's live state into the scratch NodeState; GPU i of it is
// position i of n.gpus.
func (f *fgdRefiner) load(n *nodeState) *packing.NodeState {
	ns := &f.node
	ns.FreeCPUMilli, ns.FreeMemory = n.cpu-n.usedCPU, n.mem-n.usedMem
	ns.CPUMilli, ns.Memory = n.cpu, n.mem
	ns.GPUs = ns.GPUs[:0]
	for i := range n.gpus {
		g := &n.gpus[i]
		sh := packing.SharingNone
		switch g.sharing {
		case SharingMPS:
			sh = packing.SharingMPS
		case SharingTimeSlice:
			sh = packing.SharingTimeSlice
		}
		ns.GPUs = append(ns.GPUs, packing.GPU{FreeMilli: int(max(0, 1000-g.usedMilli)), Model: g.model, Sharing: sh})
	}
	return ns
}

// refine is packing's score for placing p on pl's node (higher is better).
// For a fraction it may move pl to the GPU packing prefers, when the core
// may use that GPU and the move keeps pl's primary key (shared stays
// shared, free stays free); packing cannot see the core's per-GPU memory,
// feasibility hook or NVLink domains, so the core keeps the last word.
func (f *fgdRefiner) refine(p *podState, pl *plan) float64 {
	var milli int64
	if len(pl.milli) == 1 && p.req.IsFraction() {
		milli = pl.milli[0]
	}
	sc, gpus, ok := f.placer.Score(f.load(pl.node), f.request(p, milli))
	if !ok {
		return math.Inf(-1)
	}
	if p.req.IsFraction() && len(pl.gpus) == 1 && len(gpus) == 1 && gpus[0] != pl.gpus[0] {
		n, gi := pl.node, gpus[0]
		g := &n.gpus[gi]
		m, mem := fractionOn(&p.req, g)
		free := g.pods == 0
		if free == pl.brokeWhole && gpuOK(p, n, g) && g.fitsFraction(&p.req, m, mem) &&
			(free || g.sharing == p.req.Sharing) {
			pl.gpus[0], pl.milli[0], pl.mem[0] = gi, m, mem
		}
	}
	return sc
}
