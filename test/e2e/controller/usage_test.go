package controller

import (
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
)

// TestUsageHistorySurvivesRestart: the usage history grows from what a
// queue's running pods hold, is shown in the Queue's status and
// tessera_queue_usage, and is saved in the ConfigMap tessera-usage; a second
// controller started after the first stopped and after the pods are gone
// continues from the saved value (nothing is held any more, so without the
// saved history it would show 0). Half-life 0 (no decay) and 1 s buckets
// make the figures plain GPU-seconds.
func TestUsageHistorySurvivesRestart(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	_ = client.CoreV1().ConfigMaps(rbac.Namespace).Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{})
	ns := cp.CreateNamespace(t, "usage").Name
	t.Cleanup(func() { deletePods(t, client, ns) })
	addGPUNode(t, cp, "usage-node", 2)
	createTemplate(t, client, ns, "one-gpu", 1)
	const queue = "usage-team"
	createUnstructured(t, dyn, map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": queue},
		"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "2"}}},
	})
	withUsage := func(c *app.Config) {
		c.Usage = &kube.UsageOptions{Config: core.UsageConfig{Bucket: time.Second, Window: 10 * time.Minute}, Namespace: rbac.Namespace, SaveEvery: time.Second}
	}
	a := startReplica(t, cp, "usage-a", withUsage)
	for i := range 2 {
		p := gpuPod(ns, fmt.Sprintf("u-%d", i), "one-gpu")
		p.Labels = map[string]string{kube.LabelQueue: queue}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both pods bound", time.Minute, func() (bool, string) {
		for i := range 2 {
			if ok, msg := boundWithClaim(ctx, client, ns, fmt.Sprintf("u-%d", i)); !ok {
				return false, msg
			}
		}
		return true, ""
	})
	// Usage grows while the pods hold their GPUs: 2 GPU-seconds a second.
	var first float64
	eventually(t, "usage in tessera_queue_usage", 30*time.Second, func() (bool, string) {
		first = usageMetric(t, a, queue)
		return first >= 4, fmt.Sprintf("%v GPU-seconds", first)
	})
	eventually(t, "usage growing", 30*time.Second, func() (bool, string) {
		v := usageMetric(t, a, queue)
		return v >= first+4, fmt.Sprintf("%v GPU-seconds, first %v", v, first)
	})
	eventually(t, "usage in the Queue's status", 30*time.Second, func() (bool, string) {
		v, err := queueUsage(t, dyn, queue)
		return err == nil && v >= first, fmt.Sprintf("%v GPU-seconds (%v)", v, err)
	})
	if err := a.stop(); err != nil {
		t.Fatalf("stopping the first controller: %v", err)
	}
	saved := usageMetric(t, a, queue)
	cm, err := client.CoreV1().ConfigMaps(rbac.Namespace).Get(ctx, kube.DefaultUsageConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the saved usage history: %v", err)
	}
	t.Logf("first controller stopped at %v GPU-seconds; ConfigMap of %d bytes", saved, len(cm.BinaryData["usage.json.gz"]))

	// Nothing holds GPUs any more: the second controller can only show what
	// was saved (plus the gap since the save, counted as held then).
	deletePods(t, client, ns)
	b := startReplica(t, cp, "usage-b", withUsage)
	eventually(t, "second controller continues the saved usage", 30*time.Second, func() (bool, string) {
		v := usageMetric(t, b, queue)
		// One bucket of the two GPUs may not have been saved yet.
		return v >= saved-2, fmt.Sprintf("%v GPU-seconds, the first controller had %v", v, saved)
	})
	eventually(t, "the Queue's status written by the second controller", 30*time.Second, func() (bool, string) {
		v, err := queueUsage(t, dyn, queue)
		return err == nil && v >= saved-2, fmt.Sprintf("%v GPU-seconds (%v)", v, err)
	})
	for _, r := range []*replica{a, b} {
		if n := r.forbidden.n.Load(); n != 0 {
			t.Errorf("%s: %d requests Forbidden: %v", r.c.Identity(), n, r.forbidden.requests())
		}
	}
}

// usageMetric is tessera_queue_usage{queue, resource="gpu"} of a replica,
// -1 when absent.
func usageMetric(t *testing.T, r *replica, queue string) float64 {
	t.Helper()
	mfs, err := r.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tessera_queue_usage" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "queue") == queue && label(m, "resource") == "gpu" {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// queueUsage is status.resources.gpu.usage of a Queue, in GPU-seconds.
func queueUsage(t *testing.T, dyn dynamic.Interface, name string) (float64, error) {
	u, err := dyn.Resource(kube.QueueGVR).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	status, _ := u.Object["status"].(map[string]any)
	res, _ := status["resources"].(map[string]any)
	gpu, _ := res["gpu"].(map[string]any)
	raw, ok := gpu["usage"]
	if !ok {
		return 0, fmt.Errorf("no status.resources.gpu.usage in %v", u.Object["status"])
	}
	q, err := resource.ParseQuantity(fmt.Sprint(raw))
	if err != nil {
		return 0, err
	}
	return q.AsApproximateFloat64(), nil
}
