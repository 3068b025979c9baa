package packing

// bestFitScore is BestFit as the FGD paper's simulator defines it: what the
// node would have left, CPU and GPU weighted equally, each divided by the
// largest node's amount:
//
//	left = ½·(freeCPU − reqCPU)/maxCPU + ½·(freeGPU − reqGPU)/maxGPU
//
// and the score is −left, so the tightest node wins (memory is not scored,
// as in the paper). Whole GPUs are the lowest-index free ones; a fraction
// goes to the tightest GPU that holds it, so partly used GPUs fill first.
func (p *Placer) bestFitScore(n *NodeState, r *Request) (float64, []int) {
	var left float64
	if p.maxCPU > 0 {
		left += 0.5 * float64(n.FreeCPUMilli-r.CPUMilli) / float64(p.maxCPU)
	}
	if p.maxGPU > 0 {
		left += 0.5 * float64(freeGPUMilli(n)-r.GPUMilliTotal()) / float64(p.maxGPU)
	}
	g := p.cand[:0]
	switch {
	case r.GPUs > 0:
		g = p.firstGPUs(n, r, g)
	case r.GPUMilli > 0:
		g = append(g, tightestGPU(n, r))
	}
	p.cand = g
	return -left, g
}
