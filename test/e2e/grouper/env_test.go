package grouper_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/test/framework"
)

// env: a real control plane (kube-controller-manager's Job, ReplicaSet,
// ResourceClaim and garbage collector controllers), kwok nodes with an
// in-process tessera-node each, and tessera-controller in-process with the
// pod grouper, as its ServiceAccount under deploy/rbac (so a missing RBAC
// rule fails the test).
type env struct {
	*framework.Env
}

func newEnv(t *testing.T) *env {
	t.Helper()
	fe := framework.NewEnv(t, framework.EnvOptions{Namespace: "team-a", ControllerRBAC: true})
	return &env{Env: fe}
}

// startController runs tessera-controller (scheduler + pod grouper)
// in-process as its ServiceAccount.
func (e *env) startController() {
	e.T.Helper()
	c, err := app.New(app.Config{RestConfig: framework.ControllerConfig(e.CP), Interval: 200 * time.Millisecond, PodGrouper: true})
	if err != nil {
		e.T.Fatal(err)
	}
	e.Background("controller", c.Run)
}

// addGPUNode adds a kwok node with a fake tessera-node of profile.
func (e *env) addGPUNode(name, profile string) {
	e.T.Helper()
	e.AddGPUNode(name, profile, framework.NodeOptions{})
}

func (e *env) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.T.Helper()
	e.Eventually(what, timeout, cond)
}

// gpuTemplate creates a ResourceClaimTemplate of n whole GPUs.
func (e *env) gpuTemplate(name string, n int64) {
	e.T.Helper()
	req := resourceapi.ExactDeviceRequest{DeviceClassName: deviceclasses.Exclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}},
		}}},
	}
	if _, err := e.Client.ResourceV1().ResourceClaimTemplates(e.NS).Create(e.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
}

// podTemplate is a tessera-scheduler pod asking for the GPUs of the claim
// template gpuTmpl ("" = none).
func podTemplate(gpuTmpl string, labels map[string]string) v1.PodTemplateSpec {
	spec := v1.PodSpec{
		SchedulerName: kube.SchedulerName,
		RestartPolicy: v1.RestartPolicyNever,
		Containers:    []v1.Container{{Name: "main", Image: "busybox"}},
		Tolerations:   []v1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: v1.TolerationOpExists}},
	}
	if gpuTmpl != "" {
		spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(gpuTmpl)}}
		spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	}
	return v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
}

// indexedJob creates an Indexed Job of n pods (completions = parallelism).
func (e *env) indexedJob(name string, n int32, gpuTmpl string, annotations map[string]string) *batchv1.Job {
	e.T.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS, Annotations: annotations},
		Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Completions:    ptr.To(n), Parallelism: ptr.To(n),
			BackoffLimit: ptr.To[int32](0),
			Template:     podTemplate(gpuTmpl, nil),
		},
	}
	job, err := e.Client.BatchV1().Jobs(e.NS).Create(e.Ctx, job, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return job
}

// jobPods are the live pods of a Job.
func (e *env) jobPods(job string) []v1.Pod {
	e.T.Helper()
	return e.LivePods("batch.kubernetes.io/job-name=" + job)
}

// scheduledReason is the message of a pod's PodScheduled=False condition.
func scheduledReason(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// podGroup returns a PodGroup, nil when it does not exist.
func (e *env) podGroup(name string) *unstructured.Unstructured {
	e.T.Helper()
	u, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Get(e.Ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.T.Fatal(err)
	}
	return u
}

func minMember(u *unstructured.Unstructured) int64 {
	n, _, _ := unstructured.NestedInt64(u.Object, "spec", "minMember")
	return n
}

// barePod creates a pod of ours with no owner, asking for gpuTmpl's GPUs.
func (e *env) barePod(name, gpuTmpl string) *v1.Pod {
	e.T.Helper()
	tmpl := podTemplate(gpuTmpl, nil)
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS}, Spec: tmpl.Spec}
	p, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, p, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return p
}

func summary(pods []v1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "%s node=%q group=%q off=%q why=%q; ", p.Name, p.Spec.NodeName, p.Annotations[kube.AnnotationPodGroup], p.Annotations[kube.AnnotationPodGrouper], scheduledReason(&p))
	}
	return b.String()
}
