package grouper_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestIndexedJobIsAGang is the measurement: an Indexed Job of 4
// workers × 2 GPUs, created by the real Job controller, on a node with 6
// free GPUs. Without the grouper 3 workers bound and the 4th waited for
// good; now none binds, each says why, and once room appears all 4 bind
// in one cycle. Scaling the Job's parallelism changes the group's minimum,
// and the PodGroup goes with the Job.
func TestIndexedJobIsAGang(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-1", "h100-sxm-8")
	e.gpuTemplate("two-gpus", 2)
	e.startController()
	// 2 of the 8 GPUs taken by a bare pod (no owner: scheduled alone at once).
	e.barePod("blocker", "two-gpus")
	e.eventually("the blocker bound", 30*time.Second, func() (bool, string) {
		p, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, "blocker", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", scheduledReason(p)
	})

	job := e.indexedJob("llama", 4, "two-gpus", nil)
	e.eventually("4 pods grouped, none bound, each saying why", 60*time.Second, func() (bool, string) {
		pods := e.jobPods("llama")
		if framework.Bound(pods) > 0 {
			t.Fatalf("a pod of the gang bound with 6 GPUs free: %s", summary(pods))
		}
		ok := len(pods) == 4
		for _, p := range pods {
			ok = ok && p.Annotations[kube.AnnotationPodGroup] == "job-llama" && scheduledReason(&p) != "" &&
				!strings.Contains(scheduledReason(&p), "pod grouper")
		}
		return ok, summary(pods)
	})
	pg := e.podGroup("job-llama")
	if pg == nil || minMember(pg) != 4 {
		t.Fatalf("PodGroup job-llama: %v", pg)
	}
	if refs := pg.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != job.UID || refs[0].Kind != "Job" {
		t.Fatalf("PodGroup job-llama is owned by %v, want the Job", refs)
	}
	if pg.GetLabels()[kube.LabelGroupedBy] != kube.GroupedByPodGrouper {
		t.Fatalf("PodGroup job-llama labels %v", pg.GetLabels())
	}
	// Stays so: a few more cycles.
	time.Sleep(2 * time.Second)
	pods := e.jobPods("llama")
	if framework.Bound(pods) > 0 {
		t.Fatalf("a pod of the gang bound with 6 GPUs free: %s", summary(pods))
	}
	// In people's words: the user wrote a Job, not a PodGroup.
	const words = "job team-a/llama: 4 pods × 2 GPUs must start together; 6 GPUs are free"
	for _, p := range pods {
		if why := scheduledReason(&p); !strings.HasPrefix(why, words) {
			t.Fatalf("pod %s waits with %q; want it to start with %q", p.Name, why, words)
		}
	}
	t.Logf("pending reason: %s", scheduledReason(&pods[0]))

	// Room appears: every pod binds, in one cycle (no pod binds alone
	// first: checked above; all four are bound together below).
	if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "blocker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("all 4 bound", 60*time.Second, func() (bool, string) {
		pods := e.jobPods("llama")
		return len(pods) == 4 && framework.Bound(pods) == 4, summary(pods)
	})

	// The minimum follows the Job: parallelism 4 → 2 (completions stay 4)
	// is no gang any more; the group needs 1.
	patch := []byte(`{"spec":{"parallelism":2}}`)
	if _, err := e.Client.BatchV1().Jobs(e.NS).Patch(e.Ctx, "llama", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("minMember 1 after scaling", 30*time.Second, func() (bool, string) {
		pg := e.podGroup("job-llama")
		return pg != nil && minMember(pg) == 1, fmt.Sprintf("%v", pg)
	})

	// Garbage-collected with its Job.
	fg := metav1.DeletePropagationForeground
	if err := e.Client.BatchV1().Jobs(e.NS).Delete(e.Ctx, "llama", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	e.eventually("PodGroup job-llama collected", 60*time.Second, func() (bool, string) {
		return e.podGroup("job-llama") == nil, "still there"
	})
}

// TestReclaimEvictsTheGang: a grouped Job over its queue's quota is
// reclaimed whole — every pod of the gang goes, none is left running below
// its minimum. The gang's queue comes from the namespace's
// tessera.dev/queue label (its pods carry none).
func TestReclaimEvictsTheGang(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-1", "h100-sxm-8")
	e.gpuTemplate("two-gpus", 2)
	for name, quota := range map[string]string{"train": "0", "serve": "8"} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": quota}}},
		}}
		if _, err := e.Dyn.Resource(kube.QueueGVR).Create(e.Ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch := []byte(`{"metadata":{"labels":{"` + kube.LabelQueue + `":"train"}}}`)
	if _, err := e.Client.CoreV1().Namespaces().Patch(e.Ctx, e.NS, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startController()
	e.indexedJob("llama", 4, "two-gpus", nil)
	var gang []v1.Pod
	e.eventually("the gang of 4 bound (all 8 GPUs)", 60*time.Second, func() (bool, string) {
		gang = e.jobPods("llama")
		return len(gang) == 4 && framework.Bound(gang) == 4, summary(gang)
	})
	if q, _, _ := unstructured.NestedString(e.podGroup("job-llama").Object, "spec", "queue"); q != "train" {
		t.Fatalf("PodGroup job-llama queue %q, want the namespace's train", q)
	}

	// A pod of queue serve (quota 8) needs 2 GPUs: train is over its quota.
	tmpl := podTemplate("two-gpus", map[string]string{kube.LabelQueue: "serve"})
	server := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: e.NS, Labels: tmpl.Labels}, Spec: tmpl.Spec}
	if _, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("server bound, the whole gang gone", 60*time.Second, func() (bool, string) {
		s, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, "server", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, g := range gang {
			cur, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, g.Name, metav1.GetOptions{})
			if err == nil && cur.UID == g.UID && cur.DeletionTimestamp == nil {
				left++
			}
		}
		return s.Spec.NodeName != "" && left == 0, fmt.Sprintf("server on %q (%s); %d of the gang's pods still there", s.Spec.NodeName, scheduledReason(s), left)
	})
}
