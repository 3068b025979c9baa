package kube

import (
	"fmt"
	"strings"

	"github.com/tessera-gpu/tessera/controller/core"
)

// gangWords puts a pod grouper's gang that places no pod this cycle in
// people's words, ahead of the core's reason: "job team-a/llama: 4 pods ×
// 2 GPUs must start together; 6 GPUs are free". The user wrote a Job, not
// a PodGroup: the words name the workload (the PodGroup's owner), how many
// pods of what size must start together, and what is free — whole GPUs no
// placed pod holds, over every node.
func gangWords(snap *core.Snapshot, idx *cycleIndex, res *core.Result) {
	words := map[string]string{}
	free := -1
	for i, p := range res.Pending {
		w, seen := words[p.Job]
		if !seen {
			if free < 0 {
				free = freeWholeGPUs(snap)
			}
			w = jobWords(snap, idx, res, p.Job, free)
			words[p.Job] = w
		}
		if w != "" && !strings.HasPrefix(p.Reason, w) {
			res.Pending[i].Reason = w + " — " + p.Reason
		}
	}
}

// jobWords is gangWords' sentence for one job, "" when it has none (not a
// grouper's gang, or some of it placed).
func jobWords(snap *core.Snapshot, idx *cycleIndex, res *core.Result, name string, free int) string {
	ref := idx.jobs[name]
	if ref == nil || ref.group == nil || ref.group.Labels[LabelGroupedBy] != GroupedByPodGrouper || res.Jobs[name].Placed > 0 {
		return ""
	}
	g := ref.group
	subject := "PodGroup " + g.Namespace + "/" + g.Name
	if owners := g.OwnerReferences; len(owners) > 0 {
		subject = strings.ToLower(owners[0].Kind) + " " + g.Namespace + "/" + owners[0].Name
	}
	var job *core.Job
	for i := range snap.Jobs {
		if snap.Jobs[i].Name == name {
			job = &snap.Jobs[i]
			break
		}
	}
	if job == nil || job.MinMember < 2 {
		return ""
	}
	gpus, same := -1, true
	for _, p := range job.Pods {
		if gpus >= 0 && p.Request.GPUs != gpus {
			same = false
		}
		gpus = p.Request.GPUs
	}
	size := fmt.Sprintf("%d pods", job.MinMember)
	if same && gpus > 0 {
		size += fmt.Sprintf(" × %s", plural(gpus, "GPU"))
	}
	return fmt.Sprintf("%s: %s must start together; %s free", subject, size, pluralVerb(free, "GPU"))
}

// freeWholeGPUs counts the GPUs no placed pod holds (whole or a share).
func freeWholeGPUs(snap *core.Snapshot) int {
	held := map[string]map[int]bool{}
	for _, j := range snap.Jobs {
		for _, p := range j.Pods {
			if p.Phase == core.PodPending || p.Placement.Node == "" {
				continue
			}
			if held[p.Placement.Node] == nil {
				held[p.Placement.Node] = map[int]bool{}
			}
			for _, g := range p.Placement.GPUs {
				held[p.Placement.Node][g] = true
			}
		}
	}
	n := 0
	for _, node := range snap.Nodes {
		for _, g := range node.GPUs {
			if !held[node.Name][g.Index] {
				n++
			}
		}
	}
	return n
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// pluralVerb is "1 GPU is" or "6 GPUs are".
func pluralVerb(n int, what string) string {
	if n == 1 {
		return "1 " + what + " is"
	}
	return fmt.Sprintf("%d %ss are", n, what)
}
