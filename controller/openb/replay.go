package openb

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// Config is one replay.
type Config struct {
	// Tune is the arrived GPU demand as a multiple of the cluster's GPU
	// capacity (the paper's "130 %" is 1.3).
	Tune float64
	// Seed drives the shuffle and the copies.
	Seed uint64
	// Policy places the pods.
	Policy packing.Policy
}

// Result is what SCENARIOS.md's --json prints.
type Result struct {
	GPUAllocationRate float64 `json:"gpuAllocationRate"`
	GPUCapacity       int64   `json:"gpuCapacity"`
	GPUAllocated      float64 `json:"gpuAllocated"`
	PodsArrived       int     `json:"podsArrived"`
	PodsPlaced        int     `json:"podsPlaced"`
	PodsFailed        int     `json:"podsFailed"`
	Seed              uint64  `json:"seed"`
	Tune              float64 `json:"tune"`
	// AllocatedMilli is the exact allocation behind GPUAllocated.
	AllocatedMilli int64 `json:"-"`
}

// NewRand is the replay's random source: math/rand/v2's PCG seeded with
// (seed, seed). Same seed, same arrivals, on every platform and Go version
// that keeps PCG's documented algorithm.
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

// SortByName returns the pods sorted by name (a copy).
func SortByName(pods []Pod) []Pod {
	out := append([]Pod(nil), pods...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Arrivals is the paper's arrival sequence as indices into sorted (pods
// sorted by name): every pod once, shuffled with rng; then pods drawn
// uniformly at random (copies) for as long as the next copy keeps the total
// GPU request within tune × capacityMilli. The first copy that would go over
// ends the sequence.
func Arrivals(sorted []Pod, tune float64, capacityMilli int64, rng *rand.Rand) []int {
	seq := make([]int, len(sorted), len(sorted)*2)
	var total, traceTotal int64
	for i := range sorted {
		seq[i] = i
		total += sorted[i].GPUMilliTotal()
	}
	traceTotal = total
	rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
	if traceTotal == 0 || len(sorted) == 0 {
		return seq // nothing to copy that could ever reach the limit
	}
	limit := demandLimit(tune, capacityMilli)
	for {
		i := rng.IntN(len(sorted))
		g := sorted[i].GPUMilliTotal()
		if total+g > limit {
			return seq
		}
		total += g
		seq = append(seq, i)
	}
}

// MaxTune bounds the arrived demand: at 100 × the cluster's capacity a
// replay of the default trace holds about 800,000 arrivals; beyond that
// memory and time grow without bound (and tune × capacity in milli-GPU
// would overflow int64 long before the loop ended).
const MaxTune = 100

// CheckTune says what is wrong with a tune, if anything.
func CheckTune(tune float64) error {
	if tune <= 0 || math.IsNaN(tune) || math.IsInf(tune, 0) || tune > MaxTune {
		return fmt.Errorf("tune %v must be a number above 0 and at most %d", tune, MaxTune)
	}
	return nil
}

// demandLimit is tune × capacity in milli-GPU, with tune read to six
// decimals so that 1.3 × 6212 GPUs is exactly 8,075,600 milli-GPU rather
// than whatever float rounding makes of it.
func demandLimit(tune float64, capacityMilli int64) int64 {
	micro := int64(math.Round(tune * 1e6))
	return capacityMilli/1e6*micro + capacityMilli%1e6*micro/1e6
}

// Cluster converts the nodes to the packing view.
func Cluster(nodes []Node) []packing.NodeState {
	out := make([]packing.NodeState, len(nodes))
	for i, n := range nodes {
		gs := make([]packing.GPU, n.GPUs)
		for g := range gs {
			gs[g] = packing.GPU{FreeMilli: packing.MilliPerGPU, Model: n.Model}
		}
		out[i] = packing.NodeState{
			FreeCPUMilli: n.CPUMilli, FreeMemory: n.MemoryMiB,
			CPUMilli: n.CPUMilli, Memory: n.MemoryMiB, GPUs: gs,
		}
	}
	return out
}

// KnownWorkload is the pod mix FGD scores against: the trace's pods, each
// counted once — what a scheduler that has seen the trace knows about its
// workload (the copies are drawn from the same pods, so they share its mix).
func KnownWorkload(pods []Pod) *packing.Workload {
	w := packing.NewWorkload()
	for i := range pods {
		w.Add(pods[i].Request(), 1)
	}
	return w
}

// Replay runs one seed: arrival only, no departures, no retries.
func Replay(nodes []Node, pods []Pod, cfg Config) (Result, error) {
	res, _, err := replay(nodes, pods, cfg)
	return res, err
}

// replay is Replay that also returns the final cluster state.
func replay(nodes []Node, pods []Pod, cfg Config) (Result, []packing.NodeState, error) {
	if err := CheckTune(cfg.Tune); err != nil {
		return Result{}, nil, err
	}
	if len(nodes) == 0 || len(pods) == 0 {
		return Result{}, nil, fmt.Errorf("openb: need nodes and pods (got %d nodes, %d pods)", len(nodes), len(pods))
	}
	sorted := SortByName(pods)
	state := Cluster(nodes)
	var capMilli int64
	for _, n := range nodes {
		capMilli += int64(n.GPUs) * packing.MilliPerGPU
	}
	if capMilli == 0 {
		return Result{}, nil, fmt.Errorf("openb: the cluster has no GPUs")
	}
	seq := Arrivals(sorted, cfg.Tune, capMilli, NewRand(cfg.Seed))
	reqs := make([]packing.Request, len(sorted))
	for i := range sorted {
		reqs[i] = sorted[i].Request()
	}
	placer := packing.NewPlacer(cfg.Policy, KnownWorkload(sorted))
	placer.CacheByIndex(true)
	res := Result{Seed: cfg.Seed, Tune: cfg.Tune, PodsArrived: len(seq), GPUCapacity: capMilli / packing.MilliPerGPU}
	for _, pi := range seq {
		r := reqs[pi]
		ni, gpus, ok := placer.Place(state, r)
		if !ok {
			res.PodsFailed++
			continue
		}
		packing.Apply(&state[ni], r, gpus)
		res.PodsPlaced++
		res.AllocatedMilli += sorted[pi].GPUMilliTotal()
	}
	res.GPUAllocated = float64(res.AllocatedMilli) / packing.MilliPerGPU
	res.GPUAllocationRate = float64(res.AllocatedMilli) / float64(capMilli)
	return res, state, nil
}
