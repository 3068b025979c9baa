package grouper_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestGangJobWithoutTheAPI: the Job TestUpstreamGangs (test/e2e/scheduler)
// schedules through Kubernetes 1.37's own PodGroup — Indexed, 3 pods × 2
// GPUs, spec.scheduling's gang policy — created on a control plane that
// does not serve scheduling.k8s.io/v1beta1 (a default 1.37 cluster). No
// upstream group exists and its pods name none; the pod grouper makes the
// Job one gang from its shape: on 4 free GPUs no pod binds (2 would fit)
// and each says why; when room appears all 3 bind in one cycle.
func TestGangJobWithoutTheAPI(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-1", "h100-sxm-8")
	e.gpuTemplate("two-gpus", 2)
	e.gpuTemplate("four-gpus", 4)
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "tessera-train"}, Value: 50}
	if _, err := e.Client.SchedulingV1().PriorityClasses().Create(e.Ctx, pc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	queue := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue", "metadata": map[string]any{"name": "team-a"},
		"spec": map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "16"}}},
	}}
	if _, err := e.Dyn.Resource(kube.QueueGVR).Create(e.Ctx, queue, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startController()
	// 4 of the 8 GPUs taken by team-a's own pod that is no victim (the gang
	// would otherwise evict it to run).
	tmpl := podTemplate("four-gpus", map[string]string{kube.LabelQueue: "team-a"})
	filler := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "filler", Namespace: e.NS, Labels: tmpl.Labels,
		Annotations: map[string]string{kube.AnnotationPreemptible: "false"}}, Spec: tmpl.Spec}
	if _, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, filler, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the filler bound", 30*time.Second, func() (bool, string) {
		p, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, "filler", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", scheduledReason(p)
	})

	job, err := e.Client.BatchV1().Jobs(e.NS).Create(e.Ctx, framework.GangJob(e.NS, "llama", 3, "team-a", "two-gpus", "tessera-train"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Job llama as stored: spec.scheduling %+v (the API server drops it where WorkloadWithJob is off)", job.Spec.Scheduling)
	words := fmt.Sprintf("job %s/llama: 3 pods × 2 GPUs must start together; 4 GPUs are free", e.NS)
	e.eventually("3 pods in the grouper's gang, none bound, each saying why", 60*time.Second, func() (bool, string) {
		pods := e.jobPods("llama")
		if framework.Bound(pods) > 0 {
			t.Fatalf("a pod of the gang bound with 4 GPUs free: %s", summary(pods))
		}
		ok := len(pods) == 3
		for _, p := range pods {
			if p.Spec.SchedulingGroup != nil {
				t.Fatalf("pod %s names an upstream group %+v on a control plane that does not serve them", p.Name, p.Spec.SchedulingGroup)
			}
			ok = ok && p.Annotations[kube.AnnotationPodGroup] == "job-llama" && strings.HasPrefix(scheduledReason(&p), words)
		}
		return ok, summary(pods)
	})
	if pg := e.podGroup("job-llama"); pg == nil || minMember(pg) != 3 {
		t.Fatalf("PodGroup job-llama: %v", pg)
	}
	time.Sleep(2 * time.Second) // more cycles
	pods := e.jobPods("llama")
	if framework.Bound(pods) > 0 {
		t.Fatalf("a pod of the gang bound with 4 GPUs free: %s", summary(pods))
	}
	t.Logf("pending reason: %s", scheduledReason(&pods[0]))

	if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "filler", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("all 3 bound", 60*time.Second, func() (bool, string) {
		pods = e.jobPods("llama")
		return len(pods) == 3 && framework.Bound(pods) == 3, summary(pods)
	})
	var first, last time.Time
	for _, p := range pods {
		at := scheduledAt(&p)
		if first.IsZero() || at.Before(first) {
			first = at
		}
		last = later(last, at)
	}
	if last.Sub(first) > time.Second {
		t.Fatalf("the gang's pods bound over %v; want one cycle", last.Sub(first))
	}
}

// scheduledAt is when a bound pod's PodScheduled condition turned true
// (to the second).
func scheduledAt(p *v1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
