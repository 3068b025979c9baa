// Package webhook tests tessera-controller's admission webhook on a real
// kube-apiserver: the webhook runs in-process on loopback with a self-signed
// certificate, registered by a MutatingWebhookConfiguration like the chart's
// (matchConditions, failurePolicy Fail, sideEffects None).
package webhook

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/webhook"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/selfsigned"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

func pod(name string, ann map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "busybox"}}},
	}
}

// withCPU sets the first container's CPU request.
func withCPU(p *v1.Pod, cpu string) *v1.Pod {
	p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)}
	return p
}

// register points a MutatingWebhookConfiguration at the webhook on addr and
// waits until the API server calls it.
func register(t *testing.T, ctx context.Context, client kubernetes.Interface, addr string, caPEM []byte, ns string) {
	t.Helper()
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-test"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "pods.tessera.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To("https://" + addr + webhook.Path),
				CABundle: caPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "fraction-annotations", Expression: webhook.MatchCondition}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			TimeoutSeconds:          ptr.To(int32(5)),
		}},
	}
	_, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), cfg.Name, metav1.DeleteOptions{})
	})
	// The API server picks the configuration up from an informer: probe
	// with dry-run creates until an annotated pod comes back mutated.
	require.Eventually(t, func() bool {
		p, err := client.CoreV1().Pods(ns).Create(ctx, pod("probe", map[string]string{assignment.AnnotationGPUFraction: "0.5"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Spec.SchedulerName == "tessera-scheduler"
	}, 30*time.Second, 200*time.Millisecond, "the webhook configuration never took effect")
}

// serve runs the webhook server on a loopback port with a fresh
// self-signed certificate until the test ends or stop is called; it
// returns the server, the certificate (the CA bundle to register) and stop,
// which returns once the server has stopped.
func serve(t *testing.T, ctx context.Context) (srv *webhook.Server, crt []byte, stop func()) {
	t.Helper()
	dir := t.TempDir()
	crt, key, err := selfsigned.Generate("tessera-webhook", "127.0.0.1")
	require.NoError(t, err)
	require.NoError(t, selfsigned.WriteDir(dir, crt, key))
	srv, err = webhook.New(webhook.Options{Addr: "127.0.0.1:0", CertDir: dir})
	require.NoError(t, err)
	srvCtx, stopServer := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, srv.Run(srvCtx))
	}()
	var once sync.Once
	stop = func() { once.Do(func() { stopServer(); <-done }) }
	t.Cleanup(stop)
	return srv, crt, stop
}

func TestWebhook(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver; skipped with -short")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	client := cp.Client(t)
	ctx := t.Context()
	ns := cp.CreateNamespace(t, "webhook").Name

	srv, crt, stopServer := serve(t, ctx)
	register(t, ctx, client, srv.Addr(), crt, ns)

	create := func(p *v1.Pod) (*v1.Pod, error) {
		return client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	}
	one := resource.MustParse("1")

	t.Run("annotated pods get the share slot and tessera-scheduler", func(t *testing.T) {
		for name, ann := range map[string]map[string]string{
			"half":       {assignment.AnnotationGPUFraction: "0.5"},
			"mem-sliced": {assignment.AnnotationGPUMemory: "20Gi", assignment.AnnotationGPUSharing: "timeslice"},
		} {
			got, err := create(pod(name, ann))
			require.NoError(t, err, name)
			assert.Equal(t, "tessera-scheduler", got.Spec.SchedulerName, name)
			res := got.Spec.Containers[0].Resources
			assert.True(t, one.Equal(res.Limits[assignment.ResourceShare]), "%s: limits %v", name, res.Limits)
			assert.True(t, one.Equal(res.Requests[assignment.ResourceShare]), "%s: requests %v", name, res.Requests)
			assert.Equal(t, ann, got.Annotations, name)
		}
	})

	t.Run("malformed annotations are rejected with the reason", func(t *testing.T) {
		for msg, ann := range map[string]map[string]string{
			`annotation tessera.dev/gpu-fraction: "half" is not a fraction between 0 and 1`:       {assignment.AnnotationGPUFraction: "half"},
			`annotation tessera.dev/gpu-memory: "lots" is not a positive amount of memory`:        {assignment.AnnotationGPUMemory: "lots"},
			`annotation tessera.dev/gpu-sharing without tessera.dev/gpu-fraction`:                 {assignment.AnnotationGPUSharing: "mps"},
			`annotation tessera.dev/gpu-sharing: "mig" is not mps or timeslice`:                   {assignment.AnnotationGPUFraction: "0.5", assignment.AnnotationGPUSharing: "mig"},
			`annotations tessera.dev/gpu-fraction and tessera.dev/gpu-memory: give one, not both`: {assignment.AnnotationGPUFraction: "0.5", assignment.AnnotationGPUMemory: "1Gi"},
		} {
			_, err := create(pod("bad", ann))
			require.Error(t, err, "%v", ann)
			assert.Contains(t, err.Error(), msg)
			assert.Contains(t, err.Error(), `admission webhook "pods.tessera.dev" denied the request`)
		}
	})

	// Issue 17: these were admitted (the amounts wrapped to a negative
	// number or to 0) and then stopped every scheduling cycle or waited as
	// GPU-less pods. The words are the scheduler's (kube.PodAdmissionError).
	t.Run("what the scheduler would refuse is rejected with its words", func(t *testing.T) {
		for _, c := range []struct {
			pod *v1.Pod
			msg string
		}{
			{pod("mem-2-63", map[string]string{assignment.AnnotationGPUMemory: "9223372036854775808"}),
				`annotation tessera.dev/gpu-memory: "9223372036854775808" is more memory than any GPU has; the most Tessera accepts is 64Ti`},
			{pod("mem-1e19", map[string]string{assignment.AnnotationGPUMemory: "1e19"}), `annotation tessera.dev/gpu-memory: "1e19" is more memory than any GPU has`},
			{pod("mem-10e", map[string]string{assignment.AnnotationGPUMemory: "10E"}), `annotation tessera.dev/gpu-memory: "10E" is more memory than any GPU has`},
			{pod("mem-1e100", map[string]string{assignment.AnnotationGPUMemory: "1e100"}), `annotation tessera.dev/gpu-memory: "1e100" is more memory than any GPU has`},
			{withCPU(pod("huge-cpu", map[string]string{assignment.AnnotationGPUFraction: "0.5"}), "9223372036854776"),
				"asks for cpu 9223372036854776: is above the most Tessera accepts, 70368744177664m"},
		} {
			_, err := create(c.pod)
			require.Error(t, err, c.pod.Name)
			assert.Contains(t, err.Error(), c.msg)
			assert.Contains(t, err.Error(), `admission webhook "pods.tessera.dev" denied the request`)
		}
	})

	// UPDATE: a bound pod's share cannot change; a pending pod's new
	// annotations must be what the scheduler accepts; other updates pass.
	t.Run("updates of the annotations", func(t *testing.T) {
		update := func(name string, change func(p *v1.Pod)) error {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			change(p)
			_, err = client.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{})
			return err
		}
		setMem := func(v string) func(p *v1.Pod) {
			return func(p *v1.Pod) { p.Annotations[assignment.AnnotationGPUMemory] = v }
		}
		bound := pod("bound-share", map[string]string{assignment.AnnotationGPUMemory: "20Gi"})
		bound.Spec.NodeName = "node-a" // bound at creation; no node needed for the API
		_, err := create(bound)
		require.NoError(t, err)
		err = update("bound-share", setMem("40Gi"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `pod is bound to node node-a and the node enforces the GPU share it was given: its fraction annotations cannot change (tessera.dev/gpu-memory "20Gi" → "40Gi")`)
		err = update("bound-share", func(p *v1.Pod) { delete(p.Annotations, assignment.AnnotationGPUMemory) })
		require.Error(t, err, "removing the annotation is a change too")
		assert.Contains(t, err.Error(), `tessera.dev/gpu-memory removed (was "20Gi")`)
		require.NoError(t, update("bound-share", func(p *v1.Pod) { p.Labels = map[string]string{"team": "a"} }), "other changes pass")

		_, err = create(pod("pending-share", map[string]string{assignment.AnnotationGPUMemory: "20Gi"}))
		require.NoError(t, err)
		err = update("pending-share", setMem("1e19"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `annotation tessera.dev/gpu-memory: "1e19" is more memory than any GPU has; the most Tessera accepts is 64Ti`)
		require.NoError(t, update("pending-share", setMem("10Gi")), "a pending pod may change to a valid share")

		_, err = create(pod("late", nil))
		require.NoError(t, err)
		err = update("late", func(p *v1.Pod) { p.Annotations = map[string]string{assignment.AnnotationGPUFraction: "0.5"} })
		require.Error(t, err, "annotations added after creation: the slot cannot be added any more")
		assert.Contains(t, err.Error(), "asks for a GPU share through annotations, but no container asks for the tessera.dev/gpu-share resource")
	})

	t.Run("plain pods pass unchanged", func(t *testing.T) {
		got, err := create(pod("plain", map[string]string{"example.com/other": "x"}))
		require.NoError(t, err)
		assert.Equal(t, v1.DefaultSchedulerName, got.Spec.SchedulerName)
		assert.Empty(t, got.Spec.Containers[0].Resources.Limits)
	})

	// The example of demo/device-plugin stays what its comments say.
	t.Run("the device-plugin demo's pods", func(t *testing.T) {
		f, err := os.Open("../../../demo/device-plugin/pods.yaml")
		require.NoError(t, err)
		defer f.Close()
		dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
		got := map[string]*v1.Pod{}
		for {
			var p v1.Pod
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else {
				require.NoError(t, err)
			}
			p.Namespace = ns
			p.Spec.PriorityClassName = "" // the chart's PriorityClasses are not installed here
			out, err := create(&p)
			require.NoError(t, err, p.Name)
			got[p.Name] = out
		}
		require.Len(t, got, 3)
		for _, name := range []string{"half-a", "half-b"} {
			assert.Equal(t, "tessera-scheduler", got[name].Spec.SchedulerName, name)
			assert.True(t, one.Equal(got[name].Spec.Containers[0].Resources.Limits[assignment.ResourceShare]), name)
		}
		two := got["two-gpus"]
		assert.Equal(t, "tessera-scheduler", two.Spec.SchedulerName)
		assert.NotContains(t, two.Spec.Containers[0].Resources.Limits, v1.ResourceName(assignment.ResourceShare))
	})

	// matchConditions send only annotated pods: with the webhook down
	// (failurePolicy Fail) plain pods are still created, annotated ones not.
	t.Run("webhook down: only annotated pods are refused", func(t *testing.T) {
		stopServer()
		_, err := create(pod("plain-2", nil))
		require.NoError(t, err)
		_, err = create(pod("half-2", map[string]string{assignment.AnnotationGPUFraction: "0.5"}))
		require.Error(t, err)
		assert.True(t, strings.Contains(err.Error(), "failed calling webhook"), fmt.Sprint(err))
	})
}
