package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// writeScenario writes d as a scenario file (docs/SCENARIOS.md) of one
// cycle, from the core's snapshot the replay builds, and says on w what the
// format cannot hold.
func writeScenario(d *kube.Dump, from, out string, w io.Writer) error {
	snap, err := kube.SnapshotOf(d)
	if err != nil {
		return err
	}
	sc, dropped := scenarioOf(snap, strings.TrimSuffix(filepath.Base(from), filepath.Ext(from)))
	b, err := yaml.Marshal(sc)
	if err != nil {
		return err
	}
	head := fmt.Sprintf("# tessera-sim replay %s --to-scenario: the cycle snapshot of %s as a scenario.\n", filepath.Base(from), d.Now.UTC().Format("2006-01-02T15:04:05Z"))
	for _, l := range dropped {
		head += "# dropped: " + l + "\n"
	}
	if err := os.WriteFile(out, append([]byte(head), b...), 0o644); err != nil {
		return err
	}
	for _, l := range dropped {
		fmt.Fprintf(w, "tessera-sim replay: %s: dropped: %s\n", out, l)
	}
	return nil
}

// scenarioOf turns a snapshot into a scenario's fields; dropped says, one
// line per kind, what the format cannot say.
func scenarioOf(snap *core.Snapshot, name string) (map[string]any, []string) {
	drop := map[string][]string{}
	nodes := scenarioNodes(snap, drop)
	queues := []any{}
	for _, q := range snap.Queues {
		if strings.HasPrefix(q.Name, "<") {
			continue
		}
		fq := map[string]any{"name": q.Name}
		if q.Parent != "" {
			fq["parent"] = q.Parent
		}
		fq["priority"] = q.Priority
		for r, key := range map[core.Resource]string{core.ResGPU: "gpu", core.ResCPU: "cpu", core.ResMemory: "memory"} {
			qr := q.Resources[r]
			fq[key] = map[string]any{"quota": amount(r, qr.Quota), "limit": amount(r, qr.Limit), "overQuotaWeight": qr.OverQuotaWeight}
		}
		queues = append(queues, fq)
	}
	jobs := []any{}
	var epoch int64
	largest := 0
	for _, n := range snap.Nodes {
		largest = max(largest, len(n.GPUs))
	}
	for _, j := range snap.Jobs {
		if c := j.CreatedAt.Unix(); !j.CreatedAt.IsZero() && (epoch == 0 || c < epoch) {
			epoch = c
		}
	}
	for _, j := range snap.Jobs {
		if strings.HasPrefix(j.Queue, "<") {
			drop["pods of other schedulers and claims no pod accounts for (their capacity is not held in the scenario)"] = append(drop["pods of other schedulers and claims no pod accounts for (their capacity is not held in the scenario)"], j.Name)
			continue
		}
		if fj := scenarioJob(j, epoch, largest, drop); fj != nil {
			jobs = append(jobs, fj)
		}
	}
	sc := map[string]any{"name": name, "cycles": 1, "nodes": nodes, "queues": queues, "jobs": jobs}
	if len(snap.PodTerms) > 0 {
		drop["pod affinity and topology spread terms"] = []string{fmt.Sprint(len(snap.PodTerms), " terms")}
	}
	var out []string
	for _, k := range sortedKeys(drop) {
		v := drop[k]
		if len(v) > 5 {
			v = append(v[:5:5], fmt.Sprintf("and %d more", len(drop[k])-5))
		}
		out = append(out, k+": "+strings.Join(v, ", "))
	}
	return sc, out
}

func scenarioNodes(snap *core.Snapshot, drop map[string][]string) []any {
	var nodes []any
	for _, n := range snap.Nodes {
		fn := map[string]any{"name": n.Name, "gpus": len(n.GPUs), "cpu": amount(core.ResCPU, n.CPU), "memory": amount(core.ResMemory, n.Memory)}
		if len(n.Labels) > 0 {
			fn["labels"] = n.Labels
		}
		if n.Unschedulable {
			drop["unschedulable (cordoned or not ready) nodes, kept schedulable"] = append(drop["unschedulable (cordoned or not ready) nodes, kept schedulable"], n.Name)
		}
		if len(n.Other) > 1 || len(n.Other) == 1 && n.Other["pods"] == 0 {
			drop["node resources besides GPUs, CPU and memory (pods, ports, extended resources)"] = append(drop["node resources besides GPUs, CPU and memory (pods, ports, extended resources)"], n.Name)
		}
		if len(n.GPUs) > 0 {
			g := n.GPUs[0]
			fn["gpuMemory"] = g.Memory
			if g.Model != "" {
				fn["gpuModel"] = g.Model
			}
			fn["nvlink"] = nvlinkOf(n.GPUs)
			same := true
			for i, x := range n.GPUs {
				same = same && x.Index == i && x.Memory == g.Memory && x.Model == g.Model
			}
			if !same || fn["nvlink"] == "" {
				fn["nvlink"] = "none"
				drop["GPUs of one node unlike each other, with gaps in their indices, or NVLink domains other than all, pairs or none"] = append(drop["GPUs of one node unlike each other, with gaps in their indices, or NVLink domains other than all, pairs or none"], n.Name)
			}
		}
		nodes = append(nodes, fn)
	}
	return nodes
}

// nvlinkOf names the scenario's NVLink layout of gpus, "" for none of them.
func nvlinkOf(gpus []core.GPU) string {
	all, none, pairs := true, true, true
	for i, g := range gpus {
		all = all && g.NVLinkDomain != "" && g.NVLinkDomain == gpus[0].NVLinkDomain
		none = none && g.NVLinkDomain == ""
		pairs = pairs && g.NVLinkDomain != "" && (i%2 == 0 || g.NVLinkDomain == gpus[i-1].NVLinkDomain) && (i%2 == 1 || i == 0 || g.NVLinkDomain != gpus[i-1].NVLinkDomain)
	}
	switch {
	case all:
		return "all"
	case none:
		return "none"
	case pairs && len(gpus) > 1:
		return "pairs"
	}
	return ""
}

// scenarioJob is a job of the scenario, nil when none of its pods can be
// said (a pod asking more GPUs than the largest node has: the format refuses
// it). createdAt counts from epoch, the oldest job's creation.
func scenarioJob(j core.Job, epoch int64, largest int, drop map[string][]string) map[string]any {
	fj := map[string]any{"name": j.Name, "queue": j.Queue, "priority": j.Priority, "preemptible": j.Preemptible}
	if !j.CreatedAt.IsZero() {
		fj["createdAt"] = j.CreatedAt.Unix() - epoch
	}
	if j.MinMember > 0 {
		fj["minMember"] = min(j.MinMember, len(j.Pods))
	}
	if j.NeverEvicts {
		fj["preemptionPolicy"] = "Never"
	}
	var pods []any
	for _, p := range j.Pods {
		fp := map[string]any{"cpu": amount(core.ResCPU, p.Request.CPU), "memory": amount(core.ResMemory, p.Request.Memory)}
		r := p.Request
		switch {
		case r.GPUMemory > 0:
			fp["gpuMemory"] = r.GPUMemory
		case r.GPUMilli > 0:
			fp["gpu"] = amount(core.ResGPU, r.GPUMilli)
		case r.GPUs > 0:
			fp["gpu"] = r.GPUs
		}
		if r.IsFraction() && r.Sharing != "" {
			fp["sharing"] = string(r.Sharing)
		}
		if p.Placement.Node != "" {
			fp["running"] = map[string]any{"node": p.Placement.Node, "gpus": p.Placement.GPUs}
		}
		if p.Feasible != nil || p.NodeScore != nil || len(p.NodeSelector) > 0 || len(p.Alternatives) > 0 {
			drop["per-pod node and GPU constraints (CEL selectors, taints, node selectors and affinity, volumes, preferences, firstAvailable)"] = append(drop["per-pod node and GPU constraints (CEL selectors, taints, node selectors and affinity, volumes, preferences, firstAvailable)"], p.Name)
		}
		if r.GPUs > largest {
			const why = "pods asking more GPUs than the largest node has (the format refuses them)"
			drop[why] = append(drop[why], p.Name)
			continue
		}
		pods = append(pods, fp)
	}
	if len(pods) == 0 {
		return nil
	}
	fj["pods"] = pods
	return fj
}

// amount writes a queue or node amount in the scenario's units: GPUs,
// cores, bytes; -1 stays -1.
func amount(r core.Resource, v int64) any {
	if v < 0 {
		return -1
	}
	switch r {
	case core.ResGPU:
		if v%1000 == 0 {
			return v / 1000
		}
		return milli(v)
	case core.ResCPU:
		if v%1000 == 0 {
			return v / 1000
		}
		return fmt.Sprintf("%dm", v)
	}
	return v
}
