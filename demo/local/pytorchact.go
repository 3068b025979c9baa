package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/framework"
)

// The PyTorchJob of act 5 (demo/examples/40-team-a-pytorchjob.yaml): a
// master and 3 workers, each asking for 2 GPUs the device-plugin way.
const (
	pytorchName = "bert-pretrain"
	pytorchPods = 4
	// pytorchOperator is the controller act 5 runs, built from its module
	// by hack/build-operators.sh (the only one the demo builds).
	pytorchOperator = framework.TrainingOperator
)

// startOperatorAsync starts the training-operator while the first acts run
// (it takes a while to be ready); waitOperator waits for it.
func (d *demo) startOperatorAsync() {
	d.opDone = make(chan error, 1)
	go func() { d.opDone <- d.startOperator() }()
}

// waitOperator returns startOperator's result once it has one; nil when it
// was not started.
func (d *demo) waitOperator() error {
	if d.opDone != nil {
		d.opErr = <-d.opDone
		d.opDone = nil
	}
	return d.opErr
}

// startOperator runs Kubeflow's training-operator beside the control plane
// the way the e2e tests do (test/framework: its CRDs from its module, the
// process, its cert rotator's Secret), stopped at teardown.
func (d *demo) startOperator() error {
	dir := d.opts.OperatorsDir
	if dir == "" {
		d.logf("finding %s (a first build takes minutes, then cached by version in _cache/)", pytorchOperator)
		var err error
		if dir, err = framework.FindOperatorsDir(pytorchOperator); err != nil {
			return err
		}
	}
	start := time.Now()
	var op *framework.Operator
	if err := d.tbCall(func(t testing.TB) { op = framework.StartOperatorIn(t, d.cp, dir, pytorchOperator) }); err != nil {
		return fmt.Errorf("starting %s: %w", pytorchOperator, err)
	}
	d.operator = op
	d.logf("Kubeflow %s ready in %s (pid %d, from %s)", pytorchOperator, time.Since(start).Round(100*time.Millisecond), op.Pid(), op.Dir)
	return nil
}

// pytorchAct is act 5: a PyTorchJob arrives while the Indexed Job holds the
// GPUs it needs; the pod grouper makes its gang from the PyTorchJob's
// replicas, so no replica binds, and every one binds in one cycle when the
// Job is done.
func (d *demo) pytorchAct(ctx context.Context, res *Result) error {
	d.say("\n════ Act 5: the same through Kubeflow: a PyTorchJob, no PodGroup written ════")
	if err := d.apply(ctx, func(name string) bool { return name >= "40" && name < "50" }); err != nil {
		return err
	}
	d.logf("waiting for training-operator's %d pods and the pod grouper's gang", pytorchPods)
	prefix := jobNamespace + "/" + pytorchName + "-"
	var err error
	if res.PyTorchWaiting, err = d.workloadPods(ctx, prefix, pytorchPods, gangWaiting); err != nil {
		return err
	}
	d.sayWaiting(res.PyTorchWaiting)
	first := sortedKeys(res.PyTorchWaiting)[0]
	if res.PyTorchGroup, err = d.podGroupOf(ctx, first); err != nil {
		return err
	}
	if res.PyTorchWhy, err = d.why(ctx, first); err != nil {
		return err
	}

	d.say("team-a's llama-finetune Job is done (deleted): its 8 GPUs free up")
	bg := metav1.DeletePropagationBackground
	if err := d.client.BatchV1().Jobs(jobNamespace).Delete(ctx, jobName, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		return fmt.Errorf("deleting Job %s: %w", jobName, err)
	}
	if res.PyTorchBound, err = d.workloadPods(ctx, prefix, pytorchPods, allBound); err != nil {
		return err
	}
	d.sayBound(res.PyTorchBound)
	return nil
}

// gangWaiting: every pod waits with its gang's reason (not for the grouper
// to make the gang), or one bound, which breaks the gang and ends the wait.
func gangWaiting(ps map[string]Placement) (bool, string) {
	for k, p := range ps {
		if p.Node != "" {
			return true, k + " bound"
		}
		if p.Pending == "" || strings.Contains(p.Pending, "pod grouper") || !strings.Contains(p.Pending, "must start together") {
			return false, k + ": " + p.Pending
		}
	}
	return true, ""
}

func allBound(ps map[string]Placement) (bool, string) {
	for k, p := range ps {
		if p.Node == "" {
			return false, k + ": " + p.Pending
		}
	}
	return true, ""
}

// sayWaiting prints each pod of a gang that waits, and why.
func (d *demo) sayWaiting(ps map[string]Placement) {
	for _, k := range sortedKeys(ps) {
		p := ps[k]
		if p.Node != "" {
			d.say("  ✗ %-30s bound to %s before its gang could start: the gang was broken", k, p.Node)
			continue
		}
		d.say("  ⏸ %-30s %s", k, p.Pending)
	}
}

// sayBound prints where each pod of a gang went and how far apart in time
// they bound (PodScheduled's transition, 1 s resolution).
func (d *demo) sayBound(ps map[string]Placement) {
	for _, k := range sortedKeys(ps) {
		p := ps[k]
		d.say("  ✓ %-30s %s %s", k, p.Node, strings.Join(p.Devices, " "))
	}
	d.say("  all %d bound within %s of each other (PodScheduled times, 1 s resolution): one scheduling cycle, none alone", len(ps), bindSpread(ps))
}

// bindSpread is the time between the first and the last bind of ps.
func bindSpread(ps map[string]Placement) time.Duration {
	var first, last time.Time
	for _, p := range ps {
		if first.IsZero() || p.BoundAt.Before(first) {
			first = p.BoundAt
		}
		if p.BoundAt.After(last) {
			last = p.BoundAt
		}
	}
	return last.Sub(first)
}

// why prints and returns what `kubectl tessera why` says of pod
// ("namespace/name"), the plugin's own code on the demo's clients.
func (d *demo) why(ctx context.Context, pod string) (string, error) {
	ns, name, _ := strings.Cut(pod, "/")
	var out bytes.Buffer
	clients := ctl.Clients{Kube: d.client, Dynamic: d.dyn, Namespace: ns}
	if err := ctl.Run(ctx, clients, []string{"why", name}, &out); err != nil {
		return "", fmt.Errorf("kubectl tessera why %s: %w", pod, err)
	}
	d.say("\n$ kubectl tessera why -n %s %s\n%s", ns, name, out.String())
	return out.String(), nil
}

// podGroupOf is the group the pod grouper gave pod ("namespace/name").
func (d *demo) podGroupOf(ctx context.Context, pod string) (string, error) {
	ns, name, _ := strings.Cut(pod, "/")
	p, err := d.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return p.Annotations[kube.AnnotationPodGroup], nil
}

// workloadPods waits until n pods whose "namespace/name" starts with prefix
// exist and done says so, and returns their placements.
func (d *demo) workloadPods(ctx context.Context, prefix string, n int, done func(map[string]Placement) (bool, string)) (map[string]Placement, error) {
	var out map[string]Placement
	err := d.poll(ctx, 3*time.Minute, "the pods of "+strings.TrimSuffix(prefix, "-"), func() (bool, string) {
		all, err := d.placements(ctx)
		if err != nil {
			return false, err.Error()
		}
		out = map[string]Placement{}
		for k, p := range all {
			if strings.HasPrefix(k, prefix) {
				out[k] = p
			}
		}
		if len(out) < n {
			return false, fmt.Sprintf("%d of %d pods created", len(out), n)
		}
		return done(out)
	})
	return out, err
}
