package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// TestSubGroups: a PodGroup with a leader subgroup (1 pod of 1 GPU) and a
// workers subgroup (3 pods of 2 GPUs) on a node with 6 GPUs free: the
// workers would fit, the leader would not, so nothing binds and the pods
// say which subgroup's pod does not fit; once the filler goes, all four
// bind. The API server refuses subgroups the CRD does not allow, and a pod
// naming a subgroup its group lacks waits with the reason.
func TestSubGroups(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.startScheduler(core.Config{})

	for _, bad := range []struct {
		name string
		subs []any
		want string
	}{
		{name: "dup", subs: []any{sub("a", 1), sub("a", 2)}, want: "Duplicate value"},
		{name: "zero", subs: []any{sub("a", 0)}, want: "should be greater than or equal to 1"},
		{name: "upper", subs: []any{sub("Leader", 1)}, want: "should match"},
	} {
		if err := e.createSubGroupPodGroup(bad.name, bad.subs); err == nil || !contains(err.Error(), bad.want) {
			t.Errorf("PodGroup %s with subGroups %v: got %v, want an error with %q", bad.name, bad.subs, err, bad.want)
		}
	}

	e.createPod(podSpec{name: "filler", claim: &gpuClaim{count: 2}})
	e.waitBound("filler")

	if err := e.createSubGroupPodGroup("lws", []any{sub("leader", 1), sub("workers", 3)}); err != nil {
		t.Fatal(err)
	}
	names := []string{"lws-leader"}
	e.createPod(podSpec{name: "lws-leader", group: "lws", claim: &gpuClaim{count: 1},
		annotations: map[string]string{kube.AnnotationPodSubGroup: "leader"}})
	for i := 0; i < 3; i++ {
		n := fmt.Sprintf("lws-worker-%d", i)
		names = append(names, n)
		e.createPod(podSpec{name: n, group: "lws", claim: &gpuClaim{count: 2},
			annotations: map[string]string{kube.AnnotationPodSubGroup: "workers"}})
	}
	// A pod naming a subgroup its group does not define.
	if err := e.createSubGroupPodGroup("other", []any{sub("a", 1)}); err != nil {
		t.Fatal(err)
	}
	e.createPod(podSpec{name: "other-0", group: "other", claim: &gpuClaim{count: 1},
		annotations: map[string]string{kube.AnnotationPodSubGroup: "b"}})

	want := fmt.Sprintf("gang %s/lws needs 4 pods (subgroups leader 1, workers 3); only 3 fit (pod %s/lws-leader (subgroup leader): ", e.NS, e.NS)
	e.eventually("the gang pending with its subgroup's reason", 30*time.Second, func() (bool, string) {
		got := pendingReason(e.pod("lws-worker-0"))
		return contains(got, want), got
	})
	e.eventually("the pod of an unknown subgroup pending with the reason", 30*time.Second, func() (bool, string) {
		got := pendingReason(e.pod("other-0"))
		return contains(got, `names subgroup "b", which gang `+e.NS+`/other does not have (its subgroups: a)`), got
	})
	// Several cycles have run: still no member bound.
	time.Sleep(2 * time.Second)
	for _, n := range names {
		if node := e.pod(n).Spec.NodeName; node != "" {
			t.Fatalf("%s bound to %s although its leader does not fit", n, node)
		}
	}
	if claim := e.findClaim("lws-worker-0"); claim != nil && claim.Status.Allocation != nil {
		t.Fatalf("claim of lws-worker-0 allocated although its gang does not fit")
	}

	if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "filler", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitBound(names...)
	e.checkNoDoubleAllocation()

	// The phase counts subgroups: Running with all four running; once the
	// leader is gone its three workers still meet the group's minMember
	// (1), but not the leader subgroup's, so the gang is not Running.
	e.waitGroupPhase("lws", "Running")
	if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "lws-leader", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.waitGroupPhase("lws", "Pending")
}

// waitGroupPhase waits until Tessera's PodGroup name reports phase.
func (e *env) waitGroupPhase(name, phase string) {
	e.T.Helper()
	e.eventually("PodGroup "+name+" phase "+phase, 30*time.Second, func() (bool, string) {
		pg, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Get(e.Ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, _, _ := unstructured.NestedString(pg.Object, "status", "phase")
		return got == phase, "phase " + got
	})
}

func sub(name string, minMember int64) any {
	return map[string]any{"name": name, "minMember": minMember}
}

// createSubGroupPodGroup creates a PodGroup with subGroups (minMember left
// to its default) and returns the API server's answer.
func (e *env) createSubGroupPodGroup(name string, subs []any) error {
	e.T.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": e.NS},
		"spec":     map[string]any{"subGroups": subs},
	}}
	_, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Create(e.Ctx, u, metav1.CreateOptions{})
	return err
}
