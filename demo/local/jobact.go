package main

import (
	"bytes"
	"context"
	"fmt"

	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
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
	if err := d.apply(ctx, func(name string) bool { return name >= "30" }); err != nil {
		return err
	}
	d.logf("waiting for the Job controller's %d workers and the pod grouper's gang", jobWorkers)
	var err error
	if res.JobWaiting, err = d.jobPods(ctx, func(ps map[string]Placement) (bool, string) {
		for k, p := range ps {
			if p.Node != "" {
				return true, k + " bound"
			}
			// Until the grouper has made the gang, the pods wait for it.
			if p.Pending == "" || strings.Contains(p.Pending, "pod grouper") {
				return false, k + ": " + p.Pending
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	for _, k := range sortedKeys(res.JobWaiting) {
		p := res.JobWaiting[k]
		if p.Node != "" {
			d.say("  ✗ %-30s bound to %s before its gang could start: the gang was broken", k, p.Node)
			continue
		}
		d.say("  ⏸ %-30s %s", k, p.Pending)
	}
	first := sortedKeys(res.JobWaiting)[0]
	var why bytes.Buffer
	clients := ctl.Clients{Kube: d.client, Dynamic: d.dyn, Namespace: jobNamespace}
	if err := ctl.Run(ctx, clients, []string{"why", strings.TrimPrefix(first, jobNamespace+"/")}, &why); err != nil {
		return fmt.Errorf("kubectl tessera why %s: %w", first, err)
	}
	res.JobWhy = why.String()
	d.say("\n$ kubectl tessera why -n %s %s\n%s", jobNamespace, strings.TrimPrefix(first, jobNamespace+"/"), res.JobWhy)

	d.say("team-a's llm-train gang finishes (its pods are deleted): 8 GPUs free up")
	for _, name := range []string{"llm-train-0", "llm-train-1"} {
		if err := d.client.CoreV1().Pods(jobNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting %s: %w", name, err)
		}
	}
	if res.JobBound, err = d.jobPods(ctx, func(ps map[string]Placement) (bool, string) {
		for k, p := range ps {
			if p.Node == "" {
				return false, k + ": " + p.Pending
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	for _, k := range sortedKeys(res.JobBound) {
		p := res.JobBound[k]
		d.say("  ✓ %-30s %s %s", k, p.Node, strings.Join(p.Devices, " "))
	}
	return nil
}

// jobPods waits until the Job's workers all exist and done says so, and
// returns their placements.
func (d *demo) jobPods(ctx context.Context, done func(map[string]Placement) (bool, string)) (map[string]Placement, error) {
	var out map[string]Placement
	err := d.poll(ctx, 3*time.Minute, "the Job's workers", func() (bool, string) {
		all, err := d.placements(ctx)
		if err != nil {
			return false, err.Error()
		}
		out = map[string]Placement{}
		for k, p := range all {
			if strings.HasPrefix(k, jobNamespace+"/"+jobName+"-") {
				out[k] = p
			}
		}
		if len(out) < jobWorkers {
			return false, fmt.Sprintf("%d of %d workers created", len(out), jobWorkers)
		}
		return done(out)
	})
	return out, err
}
