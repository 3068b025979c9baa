package kube

import (
	"fmt"

	"github.com/tessera-gpu/tessera/controller/core"
)

// holdIncompleteGangs keeps a PodGroup's pending pods away from the core
// while fewer of its pods can be considered than its minMember: the others
// are problems of their own this cycle (a claim kube-controller-manager has
// not created yet, a pod the adapter cannot read). The core reads a
// minMember above a job's pod count as "all of them", so it placed such a
// gang below its minimum — one pod of a three-pod gang bound alone, found
// by TestControllerKillPoints. Its pending pods wait with the reason
// instead; bound members stay, so their capacity is still counted. It
// returns jobOrder without the jobs left with no pod.
func holdIncompleteGangs(idx *cycleIndex, jobs map[string]*core.Job, jobOrder []string) []string {
	out := jobOrder[:0]
	for _, name := range jobOrder {
		j, ref := jobs[name], idx.jobs[name]
		if ref == nil || ref.groupName() == "" || j.MinMember <= len(j.Pods) {
			out = append(out, name)
			continue
		}
		why := fmt.Sprintf("%s needs %d pods together; only %d can be scheduled now (the others wait for their own reasons)",
			ref.groupName(), j.MinMember, len(j.Pods))
		kept := j.Pods[:0]
		for _, p := range j.Pods {
			if p.Phase == core.PodPending {
				idx.problems = append(idx.problems, core.PendingPod{Pod: p.Name, Reason: why})
				continue
			}
			kept = append(kept, p)
		}
		j.Pods = kept
		if len(kept) > 0 {
			out = append(out, name)
		}
	}
	return out
}
