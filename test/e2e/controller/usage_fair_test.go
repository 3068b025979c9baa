package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
)

// TestUsageCoefficientFavoursLessUsed: with a usage coefficient above 0, the
// controller weighs the over-quota split by the usage history (DESIGN.md,
// "Fair share with history"). Two leaf queues of equal weight and no quota
// under a parent capped at 4 GPUs (so other tests' nodes do not change the
// split): first a runs 4 GPUs until it has ~100 GPU-seconds, then both ask
// for 4. With coefficient 10, b (no usage) is entitled to all 4 and gets
// them (a's pods are preemptible and reclaimed); with coefficient 0 they
// split by weight, 2 and 2. A controller that ignored the history would
// give 2 and 2 in both.
//
// Coefficient 10: e = ½ each, u_a ≈ 1, so w'_a = max(0, 11·½ − 10·u_a) = 0
// and w'_b = 5.5: b takes the 4, and keeps them until its own usage reaches
// about 0.82 of a's (tens of seconds), after the checks here.
func TestUsageCoefficientFavoursLessUsed(t *testing.T) {
	cp := cluster(t)
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	addGPUNode(t, cp, "history-node", 8)
	for _, tc := range []struct {
		name        string
		coefficient int64 // thousandths
		wantA       int
	}{
		{"coefficient 10", 10_000, 0},
		{"coefficient 0", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			_ = client.CoreV1().ConfigMaps(rbac.Namespace).Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{})
			ns := cp.CreateNamespace(t, fmt.Sprintf("history-%d", tc.coefficient)).Name
			t.Cleanup(func() { deletePods(t, client, ns) })
			createTemplate(t, client, ns, "one-gpu", 1)
			parent := fmt.Sprintf("hist-%d", tc.coefficient)
			qa, qb := parent+"-a", parent+"-b"
			createQueue(t, dyn, parent, "", map[string]any{"quota": "4", "limit": "4"})
			createQueue(t, dyn, qa, parent, nil)
			createQueue(t, dyn, qb, parent, nil)
			r := startReplica(t, cp, "history-"+tc.name[len("coefficient "):], func(c *app.Config) {
				c.Core.UsageCoefficient = tc.coefficient
				c.Usage = &kube.UsageOptions{Config: core.UsageConfig{Bucket: time.Second, Window: 10 * time.Minute}, Namespace: rbac.Namespace, SaveEvery: time.Second}
			})
			defer func() {
				if err := r.stop(); err != nil {
					t.Error(err)
				}
			}()

			// a's past: 4 GPUs for ~25 s.
			createQueuePods(t, client, ns, qa, "past", 4)
			eventually(t, "a's past usage", 90*time.Second, func() (bool, string) {
				v := usageMetric(t, r, qa)
				return v >= 100, fmt.Sprintf("%v GPU-seconds", v)
			})
			deletePods(t, client, ns)
			eventually(t, "a's past pods gone", 30*time.Second, func() (bool, string) {
				n := countQueuePods(t, client, ns, qa, "")
				return n == 0, fmt.Sprintf("%d left", n)
			})

			// Both ask for 4 at once.
			createQueuePods(t, client, ns, qb, "b", 4)
			createQueuePods(t, client, ns, qa, "a", 4)
			wantB := 4 - tc.wantA
			eventually(t, "fair shares and allocations", 45*time.Second, func() (bool, string) {
				fa, fb := queueStatusGPU(t, dyn, qa, "fairShare"), queueStatusGPU(t, dyn, qb, "fairShare")
				ba, bb := countQueuePods(t, client, ns, qa, "bound"), countQueuePods(t, client, ns, qb, "bound")
				ok := fa == float64(tc.wantA) && fb == float64(wantB) && ba == tc.wantA && bb == wantB
				return ok, fmt.Sprintf("a: fair share %v, %d bound; b: fair share %v, %d bound; usage a %v, b %v GPU-s; want a %d, b %d",
					fa, ba, fb, bb, usageMetric(t, r, qa), usageMetric(t, r, qb), tc.wantA, wantB)
			})
			t.Logf("a %v GPU-seconds, b %v: a's fair share %v, b's %v", usageMetric(t, r, qa), usageMetric(t, r, qb),
				queueStatusGPU(t, dyn, qa, "fairShare"), queueStatusGPU(t, dyn, qb, "fairShare"))
		})
	}
}

// createQueue creates a Queue with the given GPU settings (nil: defaults).
func createQueue(t *testing.T, dyn dynamic.Interface, name, parent string, gpu map[string]any) {
	t.Helper()
	spec := map[string]any{}
	if parent != "" {
		spec["parent"] = parent
	}
	if gpu != nil {
		spec["resources"] = map[string]any{"gpu": gpu}
	}
	createUnstructured(t, dyn, map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": name}, "spec": spec,
	})
}

// createQueuePods creates n preemptible one-GPU pods prefix-0, … in queue.
func createQueuePods(t *testing.T, client kubernetes.Interface, ns, queue, prefix string, n int) {
	t.Helper()
	for i := range n {
		p := gpuPod(ns, fmt.Sprintf("%s-%d", prefix, i), "one-gpu")
		p.Labels = map[string]string{kube.LabelQueue: queue}
		p.Annotations = map[string]string{kube.AnnotationPreemptible: "true"}
		if _, err := client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// countQueuePods counts the pods of queue in ns: all that are not being
// deleted (what ""), or those bound to a node ("bound").
func countQueuePods(t *testing.T, client kubernetes.Interface, ns, queue, what string) int {
	t.Helper()
	pods, err := client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: kube.LabelQueue + "=" + queue})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		if what == "bound" && p.Spec.NodeName == "" {
			continue
		}
		n++
	}
	return n
}

// queueStatusGPU is status.resources.gpu.<field> of a Queue in GPUs, -1 when
// absent.
func queueStatusGPU(t *testing.T, dyn dynamic.Interface, name, field string) float64 {
	t.Helper()
	u, err := dyn.Resource(kube.QueueGVR).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status, _ := u.Object["status"].(map[string]any)
	res, _ := status["resources"].(map[string]any)
	gpu, _ := res["gpu"].(map[string]any)
	raw, ok := gpu[field]
	if !ok {
		return -1
	}
	q, err := resource.ParseQuantity(fmt.Sprint(raw))
	if err != nil {
		t.Fatalf("queue %s: status.resources.gpu.%s %v: %v", name, field, raw, err)
	}
	return q.AsApproximateFloat64()
}

// TestUsageConfigMapDeletedOrCorrupted: the usage ConfigMap changed under a
// running controller loses nothing in memory. Deleted, it is created again
// (event UsageHistoryRecreated); overwritten with bytes that are not a
// history, recreated without the history's key, or recreated from an older
// copy, the controller keeps its in-memory history and saves it over the
// ConfigMap; unreadable content is named in a Warning event
// (UsageHistoryRejected) and kept under rejected-usage.json.gz. The recent
// usage (half-life 0, one GPU held all along) never goes down. A new
// controller that finds it corrupt starts over and says that the saved
// usage is lost.
func TestUsageConfigMapDeletedOrCorrupted(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	cms := client.CoreV1().ConfigMaps(rbac.Namespace)
	_ = cms.Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{})
	ns := cp.CreateNamespace(t, "usage-cm").Name
	t.Cleanup(func() { deletePods(t, client, ns) })
	addGPUNode(t, cp, "usage-cm-node", 1)
	createTemplate(t, client, ns, "one-gpu", 1)
	const queue = "usage-cm-team"
	createQueue(t, dyn, queue, "", map[string]any{"quota": "1"})
	cfg := core.UsageConfig{Bucket: time.Second, Window: 10 * time.Minute}
	withUsage := func(c *app.Config) {
		c.Usage = &kube.UsageOptions{Config: cfg, Namespace: rbac.Namespace, SaveEvery: time.Second}
	}
	r := startReplica(t, cp, "usage-cm-a", withUsage)
	createQueuePods(t, client, ns, queue, "held", 1)
	eventually(t, "usage growing", 60*time.Second, func() (bool, string) {
		v := usageMetric(t, r, queue)
		return v >= 5, fmt.Sprintf("%v GPU-seconds", v)
	})
	eventually(t, "the ConfigMap saved", 10*time.Second, func() (bool, string) {
		_, err := cms.Get(ctx, kube.DefaultUsageConfigMap, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	old, err := cms.Get(ctx, kube.DefaultUsageConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Usage only grows while the pod holds its GPU: a lost history shows
	// as a drop.
	stop := make(chan struct{})
	drops := make(chan string, 1)
	go func() {
		prev := 0.0
		for {
			select {
			case <-stop:
				close(drops)
				return
			case <-time.After(100 * time.Millisecond):
			}
			if v := usageMetric(t, r, queue); v < prev {
				select {
				case drops <- fmt.Sprintf("usage went from %v to %v GPU-seconds", prev, v):
				default:
				}
			} else {
				prev = v
			}
		}
	}()

	for _, tc := range []struct {
		name   string
		change func() error
		// reason and words of the event that must follow; the rejected
		// content the ConfigMap must then keep ("": none).
		reason, words, rejected string
	}{
		{"deleted", func() error { return cms.Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{}) },
			"UsageHistoryRecreated", "nothing lost", ""},
		{"overwritten with bytes that are not a history", func() error {
			return updateUsageConfigMap(t, client, map[string][]byte{"usage.json.gz": []byte("not a history")})
		}, "UsageHistoryRejected", "usage.json.gz: not gzip", "not a history"},
		{"recreated without the history's key", func() error {
			if err := cms.Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{}); err != nil {
				return err
			}
			_, err := cms.Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.DefaultUsageConfigMap}, Data: map[string]string{"usage": "none"}}, metav1.CreateOptions{})
			return err
		}, "UsageHistoryRejected", "no binaryData[usage.json.gz] in the ConfigMap (it has [data.usage])", ""},
		{"recreated from an older copy", func() error {
			if err := cms.Delete(ctx, kube.DefaultUsageConfigMap, metav1.DeleteOptions{}); err != nil {
				return err
			}
			_, err := cms.Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.DefaultUsageConfigMap}, BinaryData: old.BinaryData}, metav1.CreateOptions{})
			return err
		}, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := time.Now().Add(-time.Second)
			before := usageMetric(t, r, queue)
			if err := tc.change(); err != nil {
				t.Fatal(err)
			}
			if tc.reason != "" {
				eventually(t, "event "+tc.reason, 20*time.Second, func() (bool, string) {
					msg := usageEvent(t, client, tc.reason, since)
					return msg != "" && containsAll(msg, tc.words), fmt.Sprintf("event %q", msg)
				})
			}
			// The ConfigMap holds the in-memory history again: at least
			// what the controller showed before the change.
			eventually(t, "the ConfigMap saved over", 20*time.Second, func() (bool, string) {
				cm, err := cms.Get(ctx, kube.DefaultUsageConfigMap, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				if tc.rejected != "" && string(cm.BinaryData["rejected-usage.json.gz"]) != tc.rejected {
					return false, fmt.Sprintf("rejected-usage.json.gz %q", cm.BinaryData["rejected-usage.json.gz"])
				}
				got, err := kube.SavedUsage(cm, cfg, core.ResGPU)
				return err == nil && got[queue] >= before, fmt.Sprintf("saved %v GPU-seconds (%v), before the change %v", got[queue], err, before)
			})
		})
	}
	close(stop)
	if d, ok := <-drops; ok {
		t.Errorf("the in-memory history was lost: %s", d)
	}
	select {
	case err := <-r.done:
		t.Fatalf("the controller stopped: %v", err)
	default:
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// A new controller that finds the ConfigMap corrupt starts over, and
	// says the saved usage is lost.
	if err := updateUsageConfigMap(t, client, map[string][]byte{"usage.json.gz": []byte("corrupt at start")}); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	b := startReplica(t, cp, "usage-cm-b", withUsage)
	eventually(t, "event UsageHistoryRejected at start", 30*time.Second, func() (bool, string) {
		msg := usageEvent(t, client, "UsageHistoryRejected", since)
		return containsAll(msg, "not gzip", "starting over: the saved usage is lost"), fmt.Sprintf("event %q", msg)
	})
	eventually(t, "corrupt content kept", 20*time.Second, func() (bool, string) {
		cm, err := cms.Get(ctx, kube.DefaultUsageConfigMap, metav1.GetOptions{})
		return err == nil && string(cm.BinaryData["rejected-usage.json.gz"]) == "corrupt at start", fmt.Sprint(err)
	})
	for _, x := range []*replica{r, b} {
		if n := x.forbidden.n.Load(); n != 0 {
			t.Errorf("%s: %d requests Forbidden: %v", x.c.Identity(), n, x.forbidden.requests())
		}
	}
}

// updateUsageConfigMap replaces the usage ConfigMap's binaryData, retrying
// while the controller's saves conflict.
func updateUsageConfigMap(t *testing.T, client kubernetes.Interface, data map[string][]byte) error {
	t.Helper()
	cms := client.CoreV1().ConfigMaps(rbac.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(t.Context(), kube.DefaultUsageConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.BinaryData = data
		_, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
		return err
	})
}

// usageEvent is the message of the newest event with reason on the usage
// ConfigMap since, or "".
func usageEvent(t *testing.T, client kubernetes.Interface, reason string, since time.Time) string {
	t.Helper()
	evs, err := client.CoreV1().Events(rbac.Namespace).List(t.Context(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=" + kube.DefaultUsageConfigMap + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	msg, newest := "", time.Time{}
	for _, e := range evs.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if !at.Before(since.Truncate(time.Second)) && !at.Before(newest) {
			msg, newest = e.Message, at
		}
	}
	return msg
}

func containsAll(s string, words ...string) bool {
	for _, w := range words {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return s != ""
}
