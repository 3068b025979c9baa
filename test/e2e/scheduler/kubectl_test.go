package scheduler_test

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// TestKubectlPlugin: kubectl tessera queues, nodes and why read what the
// controller and the node plugin wrote, on a real control plane.
func TestKubectlPlugin(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-a", "l4-2")
	e.createQueue("research", "", "2", "", 100)
	e.createQueue("vision", "research", "1", "2", 100)
	// A usage history of 1 s buckets, so recent usage shows within seconds.
	e.usage = &kube.UsageOptions{Config: core.UsageConfig{Bucket: time.Second, Window: 10 * time.Minute}, Namespace: e.NS}
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "trainer", queue: "vision", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "infer-a", queue: "vision", claim: &gpuClaim{class: "mps.gpu.tessera.dev", memory: "6Gi"}})
	e.createPod(podSpec{name: "infer-b", queue: "vision", claim: &gpuClaim{class: "mps.gpu.tessera.dev", memory: "6Gi"}})
	e.waitBound("trainer", "infer-a", "infer-b")
	// A node with the device plugin: a half-GPU pod of queue default through
	// the annotation, and GPU 1 held by a pod another scheduler bound (the
	// node's ledger taints it; no assignment names it).
	d := e.addGPUNodeWith("dp-b", "l4-2", v1.ResourceList{
		assignment.DefaultResourceGPU: resource.MustParse("2"),
		assignment.ResourceShare:      resource.MustParse("20"),
	})
	uuids, _ := e.sliceGPUs("dp-b")
	_, err := d.AllocatePod(e.Ctx, driver.PodRequest{UID: "uid-other", Namespace: "other", Name: "other",
		Resource: assignment.DefaultResourceGPU, DeviceIDs: []string{uuids[1]}, GPUs: []string{uuids[1]}})
	require.NoError(t, err)
	e.waitDPTaint("dp-b", "gpu-1", "whole")
	e.createPod(podSpec{name: "dp-half", limits: slotLimits, annotations: map[string]string{assignment.AnnotationGPUFraction: "0.5"}})
	e.waitBound("dp-half")
	e.createPod(podSpec{name: "too-big", queue: "vision", claim: &gpuClaim{count: 2}})
	c := ctl.Clients{Kube: e.Client, Dynamic: e.Dyn, Namespace: e.NS}
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := ctl.Run(e.Ctx, c, args, &out); err != nil {
			t.Fatalf("kubectl tessera %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	// The queue status is written each cycle: wait for the figures.
	var queues string
	e.eventually("queue status in kubectl tessera queues", 30*time.Second, func() (bool, string) {
		queues = run("queues")
		// vision: priority, quota, limit, weight, fair share, allocated
		// (a whole GPU and two halves), pending (too-big's 2), pods.
		// research: the sums of its subtree. Each queue's status is its
		// own write, so wait for both.
		return hasRow(queues, "└─", "vision", "100", "1", "2", "1", "2", "1.5", "2", "3/1") &&
			hasRow(queues, "research", "100", "2", "none", "1", "2", "1.5", "2", "3/1"), queues
	})
	// Recent usage: 1.5 GPUs held for a few seconds is a few thousandths of
	// a GPU-hour, the same for vision and its parent.
	e.eventually("recent usage in kubectl tessera queues", 30*time.Second, func() (bool, string) {
		queues = run("queues")
		for _, line := range strings.Split(queues, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && (f[0] == "research" || f[1] == "vision") {
				if h, err := strconv.ParseFloat(f[len(f)-1], 64); err != nil || h <= 0 {
					return false, queues
				}
			}
		}
		return true, queues
	})
	if !strings.Contains(queues, `run in queue "default", which has no Queue object`) {
		t.Errorf("no word on the implicit default queue:\n%s", queues)
	}

	nodes := run("nodes")
	lines := strings.Split(strings.TrimSpace(nodes), "\n")
	if len(lines) != 5 {
		t.Fatalf("want a header and 4 GPUs:\n%s", nodes)
	}
	whole, shared, dpShare, dpOther := 0, 0, 0, 0
	for _, l := range lines[1:] {
		switch {
		case rowHas(l, "gpu-a", "Exclusive", "whole", e.NS+"/trainer"):
			whole++
		case rowHas(l, "gpu-a", "MPS", "12Gi", e.NS+"/infer-a,", e.NS+"/infer-b"):
			shared++
		case rowHas(l, "dp-b", "gpu-0", "MPS", "12Gi", "(50%)", e.NS+"/dp-half"):
			dpShare++
		case rowHas(l, "dp-b", "gpu-1", "whole", "(a device-plugin pod)"):
			dpOther++
		}
	}
	if whole != 1 || shared != 1 || dpShare != 1 || dpOther != 1 {
		t.Errorf("want one GPU whole to trainer, one shared by the two MPS pods, one half to dp-half by its assignment and one held by the device plugin for a pod without one:\n%s", nodes)
	}

	var why string
	e.eventually("the pending reason in kubectl tessera why", 30*time.Second, func() (bool, string) {
		why = run("why", "too-big")
		return strings.Contains(why, "Pending: ") && !strings.Contains(why, "no decision yet"), why
	})
	for _, want := range []string{"queue vision", "FailedScheduling"} {
		if !strings.Contains(why, want) {
			t.Errorf("why too-big: no %q:\n%s", want, why)
		}
	}
	t.Logf("kubectl tessera queues:\n%s\nkubectl tessera nodes:\n%s\nkubectl tessera why too-big:\n%s", queues, nodes, why)
	if got := run("why", "trainer"); !strings.Contains(got, "Scheduled to node gpu-a") {
		t.Errorf("why trainer:\n%s", got)
	}
	if got := run("why", "dp-half"); !strings.Contains(got, "Device plugin: 12Gi of gpu-0 (50.0% compute), MPS") {
		t.Errorf("why dp-half:\n%s", got)
	}
	var out bytes.Buffer
	if err := ctl.Run(e.Ctx, c, []string{"frobnicate"}, &out); err == nil || !strings.Contains(err.Error(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %v", err)
	}
}

// hasRow reports whether some line of out starts with these fields.
func hasRow(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= len(fields) && slices.Equal(f[:len(fields)], fields) {
			return true
		}
	}
	return false
}

// rowHas reports whether some line of out has every field, in order.
func rowHas(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := line, true
		for _, f := range fields {
			i := strings.Index(rest, f)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(f):]
		}
		if ok {
			return true
		}
	}
	return false
}
