package scheduler_test

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
)

// createFirstAvailablePod creates a pod whose claim "gpu" asks for GPUs by
// a prioritized list (DRAPrioritizedList): subrequest "two" (2 GPUs), else
// "one" (1 GPU).
func (e *env) createFirstAvailablePod(name string) {
	e.T.Helper()
	sub := func(n string, count int64) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: n, DeviceClassName: deviceclasses.Exclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{sub("two", 2), sub("one", 1)}}},
		}}},
	}
	got, err := e.Client.ResourceV1().ResourceClaimTemplates(e.NS).Create(e.Ctx, tmpl, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatalf("creating ResourceClaimTemplate %s: %v", name, err)
	}
	if reqs := got.Spec.Spec.Devices.Requests; len(reqs) != 1 || len(reqs[0].FirstAvailable) != 2 {
		e.T.Fatalf("the API server dropped firstAvailable (DRAPrioritizedList off?): %+v", reqs)
	}
	e.createPod(podSpec{name: name, claimTemplate: tmpl.Name})
}

// TestPrioritizedList: a claim "2 GPUs, else 1" gets 1 on a node with one
// free GPU left, waits with both reasons when none is free, and gets 2 once
// a node has 2 free; the claim's allocation names the subrequest.
func TestPrioritizedList(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("a100-0", "a100-pcie-4")
	e.startScheduler(core.Config{})

	// subrequest checks the allocation of the pod's claim: the subrequest
	// named in every result, and the number of GPUs.
	subrequest := func(pod, want string, gpus int) {
		t.Helper()
		c := e.claimOf(pod)
		if c.Status.Allocation == nil {
			t.Fatalf("claim of %s not allocated", pod)
		}
		res := c.Status.Allocation.Devices.Results
		if len(res) != gpus {
			t.Fatalf("%s: %d devices allocated, want %d: %+v", pod, len(res), gpus, res)
		}
		for _, r := range res {
			if r.Request != want {
				t.Fatalf("%s: allocated for request %q, want %q", pod, r.Request, want)
			}
		}
	}

	e.createPod(podSpec{name: "filler", claim: &gpuClaim{count: 3}})
	e.waitBound("filler")
	e.createFirstAvailablePod("one-left")
	e.waitBound("one-left")
	subrequest("one-left", "gpu/one", 1)

	// Nothing free: it waits, with each subrequest's reason in words.
	e.createFirstAvailablePod("none-left")
	e.eventually("none-left waits with both reasons", 30*time.Second, func() (bool, string) {
		why := pendingReason(e.pod("none-left"))
		return strings.Contains(why, "needs 2 free GPUs on one node") && strings.Contains(why, "else (alternative 1) needs 1 free GPU on one node"), why
	})

	// A node with two free GPUs: the first subrequest.
	e.addGPUNode("l4-0", "l4-2")
	e.waitBound("none-left")
	if n := e.pod("none-left").Spec.NodeName; n != "l4-0" {
		t.Fatalf("none-left bound to %s, want l4-0", n)
	}
	subrequest("none-left", "gpu/two", 2)
	e.checkNoDoubleAllocation()
}
