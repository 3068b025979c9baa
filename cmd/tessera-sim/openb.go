package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/controller/openb"
	"github.com/tessera-gpu/tessera/controller/packing"
)

func init() {
	register("openb", "replay an Alibaba openb GPU trace on the FGD paper's protocol", runOpenB)
}

// runOpenB implements `tessera-sim openb` (SCENARIOS.md). Exit 0 on success,
// 2 on bad flags or unreadable trace files.
func runOpenB(args []string) int { return openbMain(args, os.Stdout, os.Stderr) }

func openbMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("openb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodesPath := fs.String("nodes", "", "node list CSV (openb_node_list_gpu_node.csv)")
	podsPath := fs.String("pods", "", "pod list CSV (openb_pod_list_*.csv)")
	tune := fs.Float64("tune", 1.3, "arrived GPU demand as a multiple of cluster GPU capacity")
	seed := fs.Uint64("seed", 42, "random seed for the shuffle and the copies")
	seeds := fs.String("seeds", "", "several seeds, e.g. 42-51 or 1,5,9: prints each and the mean (instead of --seed; each seed once, at most 10000)")
	asJSON := fs.Bool("json", false, "print JSON, one object per line")
	policies := fs.String("policy", "tessera", "placement policy: tessera (default), fgd (FGD as published), bestfit, firstfit; a comma list compares them in one run")
	ceiling := fs.Bool("ceiling", false, "also print the clairvoyant ceiling (a reference, not a policy: knows every arrival in advance and ignores nodes; see README)")
	bound := fs.Bool("bound", false, "also print the pool bound: no policy that places every pod that fits can allocate more on the cluster seen as one pool of GPUs (a limit, not a policy; see README)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tessera-sim openb --nodes NODES.csv --pods PODS.csv [--tune 1.3] [--seed 42 | --seeds 42-51] [--json] [--policy tessera|fgd|bestfit|firstfit[,...]] [--ceiling] [--bound]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "tessera-sim openb: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if *nodesPath == "" || *podsPath == "" {
		return fail(errors.New("--nodes and --pods are required"))
	}
	seedList := []uint64{*seed}
	if *seeds != "" {
		seedSet := false
		fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "seed" })
		if seedSet {
			return fail(errors.New("--seed and --seeds: give one of them"))
		}
		var err error
		if seedList, err = parseSeeds(*seeds); err != nil {
			return fail(err)
		}
	}
	pols, err := openbRunners(*policies, *tune, *ceiling, *bound)
	if err != nil {
		return fail(err)
	}
	if err := openb.CheckTune(*tune); err != nil {
		return fail(fmt.Errorf("--tune: %w", err))
	}
	nodes, pods, err := loadOpenb(*nodesPath, *podsPath, stderr)
	if err != nil {
		return fail(err)
	}
	out := openbOutput{w: stdout, enc: json.NewEncoder(stdout), json: *asJSON, multi: len(seedList) > 1 || len(pols) > 1, tune: *tune}
	if !out.json && out.multi {
		fmt.Fprintf(stdout, "%-9s %6s %9s %10s %8s %8s %8s\n", "policy", "seed", "rate %", "allocated", "arrived", "placed", "failed")
	}
	for _, pol := range pols {
		var sum float64
		for _, s := range seedList {
			res, err := pol.run(nodes, pods, s)
			if err != nil {
				return fail(err)
			}
			sum += res.GPUAllocationRate
			if err := out.row(pol, s, res); err != nil {
				return fail(err)
			}
		}
		if len(seedList) > 1 {
			if err := out.mean(pol, sum/float64(len(seedList)), seedList); err != nil {
				return fail(err)
			}
		}
	}
	return 0
}

// openbRunner is a row source: a policy's replay, the ceiling or the bound
// (which places no pods, so it has no pod counts to print).
type openbRunner struct {
	name   string
	run    func(nodes []openb.Node, pods []openb.Pod, seed uint64) (openb.Result, error)
	noPods bool
}

// openbRunners are the rows --policy, --ceiling and --bound ask for.
func openbRunners(policies string, tune float64, ceiling, bound bool) ([]openbRunner, error) {
	var pols []openbRunner
	seenPol := map[packing.Policy]bool{}
	for _, s := range strings.Split(policies, ",") {
		if strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("--policy %q: an empty policy name", policies)
		}
		p, err := packing.ParsePolicy(s)
		if err != nil {
			return nil, err
		}
		if seenPol[p] {
			return nil, fmt.Errorf("--policy %q: %s is listed twice", policies, p)
		}
		seenPol[p] = true
		pols = append(pols, openbRunner{name: p.String(), run: func(nodes []openb.Node, pods []openb.Pod, seed uint64) (openb.Result, error) {
			return openb.Replay(nodes, pods, openb.Config{Tune: tune, Seed: seed, Policy: p})
		}})
	}
	if ceiling {
		pols = append(pols, openbRunner{name: "ceiling", run: func(nodes []openb.Node, pods []openb.Pod, seed uint64) (openb.Result, error) {
			c, err := openb.Ceiling(nodes, pods, tune, seed, 1)
			return c.Result, err
		}})
	}
	if bound {
		pols = append(pols, openbRunner{name: "bound", noPods: true, run: func(nodes []openb.Node, pods []openb.Pod, seed uint64) (openb.Result, error) {
			b, err := openb.Bound(nodes, pods, tune, seed)
			return b.Result, err
		}})
	}
	return pols, nil
}

// loadOpenb reads the trace, checked before any output so that a table
// never starts and then stops.
func loadOpenb(nodesPath, podsPath string, stderr io.Writer) ([]openb.Node, []openb.Pod, error) {
	nodes, err := openb.LoadNodes(nodesPath)
	if err != nil {
		return nil, nil, fmt.Errorf("--nodes: %w", err)
	}
	pods, err := openb.LoadPods(podsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("--pods: %w", err)
	}
	if !slices.ContainsFunc(nodes, func(n openb.Node) bool { return n.GPUs > 0 }) {
		return nil, nil, fmt.Errorf("--nodes: %s lists no node with GPUs", nodesPath)
	}
	// A model name that no node has is most likely a typo in the trace;
	// such pods still arrive (and fail), as the protocol says, but say so.
	if missing, n := openb.UnknownModels(nodes, pods); n > 0 {
		fmt.Fprintf(stderr, "tessera-sim openb: warning: %d pods may use only GPU models that no node has (%s); they will fail\n", n, strings.Join(missing, ", "))
	}
	return nodes, pods, nil
}

// openbOutput prints results: a sentence for one policy and seed, a table
// for several, or JSON lines.
type openbOutput struct {
	w           io.Writer
	enc         *json.Encoder
	json, multi bool
	tune        float64
}

func (o openbOutput) row(pol openbRunner, seed uint64, res openb.Result) error {
	switch {
	case o.json && o.multi:
		return o.enc.Encode(struct {
			Policy string `json:"policy"`
			openb.Result
		}{pol.name, res})
	case o.json:
		return o.enc.Encode(res)
	case o.multi && pol.noPods:
		_, err := fmt.Fprintf(o.w, "%-9s %6d %9.2f %10.2f %8d %8s %8s\n", pol.name, seed, 100*res.GPUAllocationRate,
			res.GPUAllocated, res.PodsArrived, "-", "-")
		return err
	case o.multi:
		_, err := fmt.Fprintf(o.w, "%-9s %6d %9.2f %10.2f %8d %8d %8d\n", pol.name, seed, 100*res.GPUAllocationRate,
			res.GPUAllocated, res.PodsArrived, res.PodsPlaced, res.PodsFailed)
		return err
	default:
		_, err := fmt.Fprintf(o.w, "policy %s, seed %d, tune %g: GPU allocation rate %.2f %% (%.2f of %d GPUs); pods arrived %d, placed %d, failed %d\n",
			pol.name, seed, o.tune, 100*res.GPUAllocationRate, res.GPUAllocated, res.GPUCapacity, res.PodsArrived, res.PodsPlaced, res.PodsFailed)
		return err
	}
}

func (o openbOutput) mean(pol openbRunner, mean float64, seeds []uint64) error {
	if o.json {
		return o.enc.Encode(struct {
			Policy string   `json:"policy"`
			Mean   float64  `json:"meanGpuAllocationRate"`
			Seeds  []uint64 `json:"seeds"`
			Tune   float64  `json:"tune"`
		}{pol.name, mean, seeds, o.tune})
	}
	_, err := fmt.Fprintf(o.w, "%-9s %6s %9.2f\n", pol.name, "mean", 100*mean)
	return err
}

// maxSeeds bounds --seeds (each seed is a full replay).
const maxSeeds = 10000

// parseSeeds reads "42-51" (inclusive) or "1,5,9" or a mix ("1,42-44"); a
// seed listed twice would count twice in the mean, so it is refused.
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	seen := map[uint64]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("--seeds %q: %q is not a range like 42-51", s, part)
			}
		}
		if b-a >= maxSeeds || len(out)+int(b-a)+1 > maxSeeds {
			return nil, fmt.Errorf("--seeds %q: more than %d seeds", s, maxSeeds)
		}
		for v := a; ; v++ {
			if seen[v] {
				return nil, fmt.Errorf("--seeds %q: seed %d is listed twice", s, v)
			}
			seen[v] = true
			out = append(out, v)
			if v == b {
				break
			}
		}
	}
	return out, nil
}
