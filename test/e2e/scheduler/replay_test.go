package scheduler_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
)

// TestReplayEqualsController: the controller dumps the exact input of a
// cycle (whole GPUs, MPS fractions, a gang, a reclaim, a pod pending for a
// CEL selector) with what it decided, and kube.Replay, on the file alone,
// decides the same.
func TestReplayEqualsController(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.createQueue("team-a", "", "4", "", 100)
	e.createQueue("team-b", "", "4", "", 100)
	e.startScheduler(core.Config{DisableConsolidation: true})
	var running []string
	for i := 0; i < 7; i++ {
		running = append(running, fmt.Sprintf("a-%d", i))
		e.createPod(podSpec{name: running[i], queue: "team-a", priority: "tessera-train", claim: &gpuClaim{}})
	}
	for _, n := range []string{"af-0", "af-1"} {
		running = append(running, n)
		e.createPod(podSpec{name: n, queue: "team-a", priority: "tessera-train", claim: &gpuClaim{class: deviceclasses.MPS, memory: "20Gi"}})
	}
	e.waitBound(running...)
	e.stopScheduler()

	// What the next cycle decides on: team-b below its share, with a gang,
	// a fraction, and a pod no GPU here matches.
	e.createPodGroup("gang", "team-b", 2)
	pending := []string{"b-0", "bf-0", "gang-0", "gang-1", "picky"}
	e.createPod(podSpec{name: "b-0", queue: "team-b", priority: "tessera-train", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "bf-0", queue: "team-b", priority: "tessera-train", claim: &gpuClaim{class: deviceclasses.MPS, memory: "10Gi"}})
	e.createPod(podSpec{name: "gang-0", group: "gang", priority: "tessera-train", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "gang-1", group: "gang", priority: "tessera-train", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "picky", queue: "team-b", claim: &gpuClaim{cel: `device.attributes["gpu.tessera.dev"].productName == "NVIDIA B200"`}})
	for _, n := range pending {
		e.waitClaim(n) // kube-controller-manager made it from the template
	}

	s, err := kube.New(kube.Options{Client: e.Client, Dynamic: e.Dyn, Interval: 200 * time.Millisecond,
		Core: core.Config{DisableConsolidation: true}, Metrics: kube.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	req := s.RequestSnapshot() // the first cycle's
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(e.Ctx, time.Minute)
	defer wcancel()
	data, err := req.Wait(wctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := kube.ParseDump(data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "busybox") == false {
		t.Fatal("the dump lacks the pods' images: not the cluster's pods")
	}
	checkDecisionsCover(t, d.Decisions, e.NS)

	got, err := kube.Replay(e.Ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	want := d.Decisions
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("replay differs from the controller on its own input:\ncontroller: %+v\nreplay:     %+v", want, got)
	}
	t.Logf("controller and replay agree: %d binds, %d evictions, %d pending", len(got.Binds), len(got.Evictions), len(got.Pending))

	// Anonymised (kubectl tessera snapshot --anonymize-key does this), the
	// same cycle replays to the controller's decisions mapped through the
	// key, and no namespace, pod, node or queue name is left.
	anon, an, err := kube.AnonymizeSnapshot(e.Ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(an.Warnings) > 0 {
		t.Errorf("anonymising warned: %q", an.Warnings)
	}
	checkAnonymized(t, anon, an.Key, want, append([]string{e.NS, "dgx-0", "team-a", "team-b"}, append(running, pending...)...)...)
}

// checkDecisionsCover fails unless the cycle did what the test is about: a
// reclaim, a bind, the gang decided as one, the CEL pod waiting.
func checkDecisionsCover(t *testing.T, d *kube.Decisions, ns string) {
	t.Helper()
	if d == nil {
		t.Fatal("the dump holds no decisions")
	}
	reclaims := 0
	for _, ev := range d.Evictions {
		if ev.Action == core.ActionReclaim {
			reclaims++
		}
	}
	bound := map[string]bool{}
	for _, b := range d.Binds {
		bound[b.Pod] = true
	}
	waiting := map[string]string{}
	for _, p := range d.Pending {
		waiting[p.Pod] = p.Reason
	}
	if reclaims == 0 || len(d.Binds) == 0 {
		t.Fatalf("want a reclaim and binds in the dumped cycle; got %+v", d)
	}
	if bound[ns+"/gang-0"] != bound[ns+"/gang-1"] {
		t.Fatalf("gang half decided: %+v", d)
	}
	if why, ok := waiting[ns+"/picky"]; !ok || !strings.Contains(why, "constraints") {
		t.Fatalf("picky should wait for its CEL selector; reason %q", why)
	}
	if _, ok := d.FairShare["team-b"]; !ok {
		t.Fatalf("no fair share recorded for team-b: %+v", d.FairShare)
	}
}
