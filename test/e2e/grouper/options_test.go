package grouper_test

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestGrouperOptions, one after the other on a node of 8 GPUs with 6 free:
// the opt-out and override annotations on the Job, a malformed override,
// a Deployment's pods (one group each, no write) and a bare pod.
func TestGrouperOptions(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-1", "h100-sxm-8")
	e.gpuTemplate("two-gpus", 2)
	e.startController()
	e.barePod("blocker", "two-gpus")
	e.eventually("the bare pod bound, with no annotation", 30*time.Second, func() (bool, string) {
		p, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, "blocker", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(p.Annotations) > 0 {
			t.Fatalf("a bare pod was annotated: %v", p.Annotations)
		}
		return p.Spec.NodeName != "", scheduledReason(p)
	})
	fg := metav1.DeletePropagationForeground
	deleteJob := func(name string) {
		if err := e.Client.BatchV1().Jobs(e.NS).Delete(e.Ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Fatal(err)
		}
		e.eventually(name+" gone", 60*time.Second, func() (bool, string) {
			return len(e.jobPods(name)) == 0, summary(e.jobPods(name))
		})
	}

	t.Run("opt-out: pods alone", func(t *testing.T) {
		e.indexedJob("solo", 4, "two-gpus", map[string]string{kube.AnnotationPodGrouper: kube.PodGrouperOff})
		e.eventually("3 of 4 bound, each marked off", 60*time.Second, func() (bool, string) {
			pods := e.jobPods("solo")
			ok := len(pods) == 4 && framework.Bound(pods) == 3
			for _, p := range pods {
				ok = ok && p.Annotations[kube.AnnotationPodGrouper] == kube.PodGrouperOff && p.Annotations[kube.AnnotationPodGroup] == ""
			}
			return ok, summary(pods)
		})
		if e.podGroup("job-solo") != nil {
			t.Fatal("a PodGroup was made for an opted-out Job")
		}
		deleteJob("solo")
	})

	t.Run("override: a plain Job of 4 made a gang of 4", func(t *testing.T) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: e.NS, Annotations: map[string]string{kube.AnnotationMinMember: "4"}},
			Spec: batchv1.JobSpec{Completions: ptr.To[int32](4), Parallelism: ptr.To[int32](4), BackoffLimit: ptr.To[int32](0),
				Template: podTemplate("two-gpus", nil)},
		}
		if _, err := e.Client.BatchV1().Jobs(e.NS).Create(e.Ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.eventually("4 pods in job-plain, none bound", 60*time.Second, func() (bool, string) {
			pods := e.jobPods("plain")
			if framework.Bound(pods) > 0 {
				t.Fatalf("bound below the override: %s", summary(pods))
			}
			pg := e.podGroup("job-plain")
			ok := len(pods) == 4 && pg != nil && minMember(pg) == 4
			for _, p := range pods {
				ok = ok && p.Annotations[kube.AnnotationPodGroup] == "job-plain"
			}
			return ok, summary(pods)
		})
		deleteJob("plain")
	})

	t.Run("a malformed override: the pods wait saying so", func(t *testing.T) {
		e.indexedJob("typo", 2, "two-gpus", map[string]string{kube.AnnotationMinMember: "two"})
		want := `annotation tessera.dev/min-member: "two" is not a whole number of pods`
		e.eventually("both pods waiting with the reason", 60*time.Second, func() (bool, string) {
			pods := e.jobPods("typo")
			ok := len(pods) == 2 && framework.Bound(pods) == 0
			for _, p := range pods {
				ok = ok && strings.Contains(scheduledReason(&p), "waiting for the pod grouper") && strings.Contains(scheduledReason(&p), want)
			}
			return ok, summary(pods)
		})
		deleteJob("typo")
	})

	t.Run("a Deployment's pods: one group each, no write", func(t *testing.T) {
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "serve", Namespace: e.NS},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](4),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "serve"}},
				Template: podTemplate("two-gpus", map[string]string{"app": "serve"}),
			},
		}
		dep.Spec.Template.Spec.RestartPolicy = v1.RestartPolicyAlways
		if _, err := e.Client.AppsV1().Deployments(e.NS).Create(e.Ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.eventually("3 of 4 bound, none annotated", 60*time.Second, func() (bool, string) {
			l, err := e.Client.CoreV1().Pods(e.NS).List(e.Ctx, metav1.ListOptions{LabelSelector: "app=serve"})
			if err != nil {
				return false, err.Error()
			}
			ok := len(l.Items) == 4 && framework.Bound(l.Items) == 3
			for _, p := range l.Items {
				ok = ok && p.Annotations[kube.AnnotationPodGroup] == "" && p.Annotations[kube.AnnotationPodGrouper] == ""
			}
			return ok, summary(l.Items)
		})
	})
}
