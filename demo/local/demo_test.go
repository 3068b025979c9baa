package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

// TestDemo runs the local demo's whole flow and checks its story: act 1
// places everything but the pod of an unknown queue, act 2's reclaim binds
// team-b's gang by evicting only borrowed (preemptible, over-quota) pods,
// act 3's device-plugin pod shares an MPS GPU with claims, act 4's Indexed
// Job is one gang with no PodGroup written.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane, kwok nodes, tessera-node and tessera-controller; skipped with -short")
	}
	binDir := controlplane.BinDir(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	picture := filepath.Join(t.TempDir(), "demo-queues.svg")
	res, err := Run(ctx, Options{BinDir: binDir, Out: &out, Log: &out, Picture: picture})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}

	for pod, p := range res.Act1 {
		if pod == "default/lost" {
			if p.Node != "" || !strings.Contains(p.Pending, "team-x") {
				t.Errorf("default/lost: want pending with a reason naming team-x, got %+v", p)
			}
			continue
		}
		if p.Node == "" {
			t.Errorf("act 1: %s not bound: %s", pod, p.Pending)
		}
	}
	// The picture of the run: written where asked, said so, and it shows
	// both teams.
	svg, err := os.ReadFile(picture)
	if err != nil || res.Picture != picture || !strings.Contains(out.String(), picture) {
		t.Errorf("picture: %v, result %q, output names it: %v", err, res.Picture, strings.Contains(out.String(), picture))
	}
	for _, q := range []string{"team-a", "team-b"} {
		if !strings.Contains(string(svg), ">"+q+"<") {
			t.Errorf("no panel of %s in the picture", q)
		}
	}
	if n := len(res.Act1); n != 14 {
		t.Errorf("act 1: %d pods, want 14", n)
	}
	for _, pod := range []string{"team-a/llm-train-0", "team-a/llm-train-1"} {
		if d := res.Act1[pod].Devices; len(d) != 4 {
			t.Errorf("%s: devices %v, want 4", pod, d)
		}
	}
	for _, pod := range []string{"team-a/chat-0", "team-a/chat-1", "team-a/chat-2"} {
		if d := res.Act1[pod].Devices; len(d) != 1 || !strings.Contains(d[0], "20Gi MPS") {
			t.Errorf("%s: devices %v, want one 20Gi MPS fraction", pod, d)
		}
	}

	for _, pod := range []string{"team-b/vision-train-0", "team-b/vision-train-1", "team-b/vision-train-2"} {
		if p := res.Act2[pod]; p.Node == "" || len(p.Devices) != 2 {
			t.Errorf("act 2: %s: %+v, want bound with 2 GPUs", pod, p)
		}
	}
	if len(res.Evicted) == 0 {
		t.Errorf("act 2: nothing evicted")
	}
	// Only preemptible (tessera-train) pods may go, and team-a keeps at
	// least its quota of 8 GPUs.
	for _, pod := range res.Evicted {
		if !strings.HasPrefix(pod, "team-a/sweep-") && !strings.HasPrefix(pod, "team-a/llm-train-") && pod != "default/eval" {
			t.Errorf("act 2 evicted %s; only preemptible pods may go", pod)
		}
	}
	for _, pod := range []string{"team-a/notebook", "team-a/chat-0", "team-a/chat-1", "team-a/chat-2"} {
		if res.Act2[pod].Node == "" {
			t.Errorf("act 2: non-preemptible %s lost its place", pod)
		}
	}
	// Queue status: team-b has its 6 GPUs; team-a (fractions count) keeps its quota.
	eight, six := resource.MustParse("8"), resource.MustParse("6")
	if a := res.Allocated2["team-b"]; a.Cmp(six) != 0 {
		t.Errorf("act 2: team-b allocated %s GPUs, want 6", a.String())
	}
	if a := res.Allocated2["team-a"]; a.Cmp(eight) < 0 {
		t.Errorf("act 2: team-a allocated %s GPUs, below its quota of 8", a.String())
	}

	// Act 3: the device-plugin pod takes 20Gi of MPS room on a GPU that a
	// chat pod's claim shares (claims and an assignment on one GPU): the
	// cluster has no other room. Nobody moves.
	embed := res.Act3["team-b/embed"]
	shared := false
	for _, pod := range []string{"team-a/chat-0", "team-a/chat-1", "team-a/chat-2"} {
		chat := res.Act3[pod]
		if len(embed.Devices) == 1 && len(chat.Devices) == 1 && embed.Node == chat.Node &&
			embed.Devices[0] == strings.Split(chat.Devices[0], " ")[0]+" (20Gi MPS, device plugin)" {
			shared = true
		}
	}
	if !shared {
		t.Errorf("act 3: team-b/embed %+v, want 20Gi MPS on a GPU a chat pod's claim shares; act 3: %+v", embed, res.Act3)
	}
	for pod, p := range res.Act2 {
		if q := res.Act3[pod]; q.Node != p.Node || strings.Join(q.Devices, ",") != strings.Join(p.Devices, ",") {
			t.Errorf("act 3 moved %s: %+v, was %+v", pod, q, p)
		}
	}

	checkJobAct(t, res)
	checkPyTorchAct(t, res)
}

// checkJobAct: act 4's Indexed Job, with no PodGroup written, waits whole
// while it cannot start whole, `why` names the gang the grouper made, and
// every worker binds once llm-train's 8 GPUs are free.
func checkJobAct(t *testing.T, res *Result) {
	t.Helper()
	if len(res.JobWaiting) != jobWorkers || len(res.JobBound) != jobWorkers {
		t.Fatalf("act 4: want %d workers waiting then bound, got %+v then %+v", jobWorkers, res.JobWaiting, res.JobBound)
	}
	for pod, p := range res.JobWaiting {
		if p.Node != "" || !strings.Contains(p.Pending, "4 pods") {
			t.Errorf("act 4: %s should wait with its gang of 4 (no worker bound alone), got %+v", pod, p)
		}
	}
	for _, want := range []string{"PodGroup team-a/job-" + jobName, "made by the pod grouper for Job " + jobName, "4 pods must start together"} {
		if !strings.Contains(res.JobWhy, want) {
			t.Errorf("act 4: kubectl tessera why does not say %q:\n%s", want, res.JobWhy)
		}
	}
	for pod, p := range res.JobBound {
		if p.Node == "" || len(p.Devices) != 2 {
			t.Errorf("act 4: %s should run on 2 GPUs once room appeared, got %+v", pod, p)
		}
	}
	if s := bindSpread(res.JobBound); s > time.Second {
		t.Errorf("act 4: the workers bound over %v; want one cycle", s)
	}
}

// checkPyTorchAct: act 5's PyTorchJob, made into pods by the real
// training-operator, waits whole (its gang made by the pod grouper from the
// PyTorchJob), `why` names that group and its state, and all four replicas
// bind in one cycle once the Indexed Job's 8 GPUs are free.
func checkPyTorchAct(t *testing.T, res *Result) {
	t.Helper()
	if len(res.PyTorchWaiting) != pytorchPods || len(res.PyTorchBound) != pytorchPods {
		t.Fatalf("act 5: want %d pods waiting then bound, got %+v then %+v", pytorchPods, res.PyTorchWaiting, res.PyTorchBound)
	}
	for pod, p := range res.PyTorchWaiting {
		if p.Node != "" || !strings.Contains(p.Pending, "pytorchjob team-a/"+pytorchName+": 4 pods × 2 GPUs must start together") {
			t.Errorf("act 5: %s should wait with its gang of 4 in people's words, got %+v", pod, p)
		}
	}
	if res.PyTorchGroup == "" {
		t.Fatalf("act 5: the pod grouper gave the PyTorchJob's pods no group")
	}
	for _, want := range []string{
		"PodGroup team-a/" + res.PyTorchGroup,
		"made by the pod grouper for PyTorchJob " + pytorchName,
		"4 pods must start together",
		"State: phase Pending, 0 scheduled",
	} {
		if !strings.Contains(res.PyTorchWhy, want) {
			t.Errorf("act 5: kubectl tessera why does not say %q:\n%s", want, res.PyTorchWhy)
		}
	}
	for pod, p := range res.PyTorchBound {
		if p.Node == "" || len(p.Devices) != 2 || !strings.Contains(p.Devices[0], "device plugin") {
			t.Errorf("act 5: %s should run on 2 device-plugin GPUs once room appeared, got %+v", pod, p)
		}
	}
	if s := bindSpread(res.PyTorchBound); s > time.Second {
		t.Errorf("act 5: the replicas bound over %v; want one cycle", s)
	}
}
