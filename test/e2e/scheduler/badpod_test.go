package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// TestBadPodFailsAlone: pods whose quantities overflow or are out of range
// (issue 17: before the fix each of the first two made every cycle fail
// with "invalid snapshot", and the fraction annotations "1e19", "10E" and
// "1e100" read as no GPU at all), a Queue and a claim the API lets through
// but Tessera cannot use, each wait alone with a reason naming what is
// wrong and its value, as a PodScheduled condition and an event; valid pods
// created after them are still scheduled. Created as admin: no webhook.
func TestBadPodFailsAlone(t *testing.T) {
	e := newEnv(t)
	e.addGPUNodeWith("dp-0", "h100-sxm-8", v1.ResourceList{
		assignment.DefaultResourceGPU: resource.MustParse("8"),
		assignment.ResourceShare:      resource.MustParse("80"),
	})
	e.startScheduler(core.Config{})

	memAnn := func(v string) map[string]string { return map[string]string{kube.AnnotationGPUMemory: v} }
	bad := map[string]string{} // pod → a part of the reason it must wait with
	for _, c := range []struct {
		name string
		spec podSpec
		want string
	}{
		{"mem-2-63", podSpec{limits: slotLimits, annotations: memAnn("9223372036854775808")},
			`annotation tessera.dev/gpu-memory: "9223372036854775808" is more memory than any GPU has; the most Tessera accepts is 64Ti`},
		{"mem-1e19", podSpec{limits: slotLimits, annotations: memAnn("1e19")}, `annotation tessera.dev/gpu-memory: "1e19" is more memory than any GPU has`},
		{"mem-10e", podSpec{limits: slotLimits, annotations: memAnn("10E")}, `annotation tessera.dev/gpu-memory: "10E" is more memory than any GPU has`},
		{"mem-1e100", podSpec{limits: slotLimits, annotations: memAnn("1e100")}, `annotation tessera.dev/gpu-memory: "1e100" is more memory than any GPU has`},
		{"huge-cpu", podSpec{cpu: "9223372036854776"}, "asks for cpu 9223372036854776: is above the most Tessera accepts, 70368744177664m"},
		{"huge-gpus", podSpec{limits: wholeLimits("100000")}, "asks for 100000 nvidia.com/gpu; the most Tessera accepts is 65536"},
	} {
		c.spec.name = c.name
		e.createPod(c.spec)
		bad[c.name] = c.want
	}

	// A Queue whose quota passes the CRD's validation but not Tessera's
	// range, a queue under it, and a PodGroup in it.
	e.createQueue("huge-q", "", "1e100", "", 100)
	e.createQueue("under-huge", "huge-q", "", "", 100)
	e.createPodGroup("in-huge", "huge-q", 1)
	e.createPod(podSpec{name: "in-huge-q", queue: "huge-q", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "under-huge-q", queue: "under-huge", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "in-huge-group", group: "in-huge", claim: &gpuClaim{}})
	queueWhy := "queue huge-q: spec.resources.gpu.quota 10e99: is above the most Tessera accepts"
	bad["in-huge-q"] = "queue huge-q cannot be used: " + queueWhy
	bad["under-huge-q"] = "queue under-huge cannot be used: " + queueWhy
	bad["in-huge-group"] = "queue huge-q cannot be used: " + queueWhy

	// A claim asking for more GPU memory than Tessera reads, where the API
	// lets it through.
	if e.tryHugeClaimPod("huge-claim") {
		bad["huge-claim"] = `capacity request memory "10e99": not a positive amount of memory up to 64Ti`
	}
	// A PodGroup of minMember 0: the CRD refuses it, so it never reaches
	// the scheduler (podGroupSpec refuses it too: TestPodGroupSpec).
	if err := e.tryPodGroup("no-members", 0); err == nil {
		e.createPod(podSpec{name: "in-no-members", group: "no-members", claim: &gpuClaim{}})
		bad["in-no-members"] = "PodGroup " + e.NS + "/no-members: spec.minMember 0 must be at least 1"
	} else {
		t.Logf("the API refuses a PodGroup of minMember 0: %v", err)
	}

	for name, want := range bad {
		e.eventually(name+" pending with its reason", 60*time.Second, func() (bool, string) {
			p := e.pod(name)
			if p.Spec.NodeName != "" {
				t.Fatalf("%s was bound to %s", name, p.Spec.NodeName)
			}
			return contains(pendingReason(p), want), pendingReason(p)
		})
	}

	// Valid pods created afterwards: by claim, by share annotation, by
	// whole device-plugin GPUs and without GPUs.
	e.createPod(podSpec{name: "ok-claim", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "ok-share", limits: slotLimits, annotations: memAnn("20Gi")})
	e.createPod(podSpec{name: "ok-whole", limits: wholeLimits("1")})
	e.createPod(podSpec{name: "ok-cpu", cpu: "2"})
	e.waitBound("ok-claim", "ok-share", "ok-whole", "ok-cpu")

	for name, want := range bad {
		p := e.pod(name)
		if p.Spec.NodeName != "" {
			t.Errorf("%s was bound to %s", name, p.Spec.NodeName)
		}
		e.eventually(name+"'s FailedScheduling event", 30*time.Second, func() (bool, string) {
			ev, err := e.Client.CoreV1().Events(e.NS).List(e.Ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
				fields.OneTermEqualSelector("reason", "FailedScheduling"), fields.OneTermEqualSelector("involvedObject.name", name)).String()})
			if err != nil {
				return false, err.Error()
			}
			for _, x := range ev.Items {
				if contains(x.Message, want) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d FailedScheduling events, none saying %q", len(ev.Items), want)
		})
	}
	e.checkNoDoubleAllocation()
}

// tryHugeClaimPod creates a pod whose claim asks for 1e100 bytes of GPU
// memory; false (with a log line) when the API refuses the claim template.
func (e *env) tryHugeClaimPod(name string) bool {
	e.T.Helper()
	req := resourceapi.ExactDeviceRequest{DeviceClassName: deviceclasses.MPS, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1e100")}}}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}},
	}
	if _, err := e.Client.ResourceV1().ResourceClaimTemplates(e.NS).Create(e.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		e.T.Logf("the API refuses a claim asking for 1e100 bytes: %v", err)
		return false
	}
	e.createPod(podSpec{name: name, claimTemplate: tmpl.Name})
	return true
}

// tryPodGroup creates a PodGroup and returns the API's error.
func (e *env) tryPodGroup(name string, minMember int64) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": e.NS},
		"spec":     map[string]any{"minMember": minMember},
	}}
	_, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Create(e.Ctx, u, metav1.CreateOptions{})
	return err
}
