package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Indexed Job of act 4 (demo/examples/30-team-a-llama-job.yaml).
const (
	jobNamespace = "team-a"
	jobName      = "llama-finetune"
	jobWorkers   = 4
)

// jobAct is act 4: an Indexed Job with no PodGroup arrives when the cluster
// has less room than it needs; the pod grouper makes its gang, so no worker
// binds, and every worker binds in one go when team-a's llm-train gang
// finishes.
func (d *demo) jobAct(ctx context.Context, res *Result) error {
	d.say("\n════ Act 4: training as people submit it: an Indexed Job, no PodGroup written ════")
	if err := d.apply(ctx, func(name string) bool { return name >= "30" && name < "40" }); err != nil {
		return err
	}
	d.logf("waiting for the Job controller's %d workers and the pod grouper's gang", jobWorkers)
	prefix := jobNamespace + "/" + jobName + "-"
	var err error
	if res.JobWaiting, err = d.workloadPods(ctx, prefix, jobWorkers, gangWaiting); err != nil {
		return err
	}
	d.sayWaiting(res.JobWaiting)
	if res.JobWhy, err = d.why(ctx, sortedKeys(res.JobWaiting)[0]); err != nil {
		return err
	}

	d.say("team-a's llm-train gang finishes (its pods are deleted): 8 GPUs free up")
	for _, name := range []string{"llm-train-0", "llm-train-1"} {
		if err := d.client.CoreV1().Pods(jobNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting %s: %w", name, err)
		}
	}
	if res.JobBound, err = d.workloadPods(ctx, prefix, jobWorkers, allBound); err != nil {
		return err
	}
	d.sayBound(res.JobBound)
	return nil
}
