package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

// Each test runs one real workload controller beside a real control plane
// (kube-controller-manager included, which turns JobSet's Jobs and LWS's
// StatefulSets into pods) and checks it makes the pods of a small object,
// each naming tessera-scheduler as its template does. No scheduler runs:
// the pods stay Pending, which is all these tests need.
func TestOperators(t *testing.T) {
	gpu := PodShape{GPUs: 1}
	cases := []struct {
		name      string
		operators []string
		workload  func(t *testing.T, ns string, ops map[string]*Operator) Workload
		// webhooks the API server must have called by URL.
		webhooks []string
	}{
		{"pytorchjob", []string{TrainingOperator}, func(_ *testing.T, ns string, _ map[string]*Operator) Workload {
			return PyTorchJob(ns, "llama", 3, gpu) // master + 3 workers
		}, nil},
		{"jobset", []string{JobSet}, func(_ *testing.T, ns string, _ map[string]*Operator) Workload {
			return JobSetOf(ns, "js", []int{2, 3}, gpu) // 2 replicated jobs
		}, []string{"mjobset.kb.io", "vjobset.kb.io", "mpod.kb.io", "vpod.kb.io"}},
		{"leaderworkerset", []string{LWS}, func(_ *testing.T, ns string, _ map[string]*Operator) Workload {
			return LeaderWorkerSet(ns, "lws", 2, 3, gpu) // 2 groups × (leader + 2 workers)
		}, []string{"mleaderworkerset.kb.io", "vleaderworkerset.kb.io", "mpod.kb.io", "vpod.kb.io"}},
		{"raycluster", []string{KubeRay}, func(_ *testing.T, ns string, _ map[string]*Operator) Workload {
			return RayCluster(ns, "ray", PodShape{}, 2, gpu) // head + 2 workers
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			OperatorsDir(t) // builds them (or skips) before a control plane starts
			cp := controlplane.Start(t, controlplane.Options{})
			client := cp.Client(t)
			ns := cp.CreateNamespace(t, "team-a").Name
			ops := map[string]*Operator{}
			for _, name := range tc.operators {
				start := time.Now()
				ops[name] = StartOperator(t, cp, name)
				t.Logf("%s ready in %v", name, time.Since(start).Round(time.Millisecond))
			}
			w := tc.workload(t, ns, ops)
			createObject(t, cp, w)
			pods, err := WaitPods(t.Context(), client, ns, w.PodSelector, w.Pods, 2*time.Minute)
			if err != nil {
				t.Fatalf("%s %s: %v", w.Object.GetKind(), w.Object.GetName(), err)
			}
			checkPods(t, pods)
			calls, err := WebhookRequests(t.Context(), client)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range tc.webhooks {
				if calls[name] == 0 {
					t.Errorf("the API server never called webhook %s (calls: %v)", name, calls)
				}
			}
			if len(tc.webhooks) > 0 {
				t.Logf("webhook calls by URL: %v", calls)
			}
			// No more pods than that come later.
			time.Sleep(2 * time.Second)
			if pods, err := WaitPods(t.Context(), client, ns, w.PodSelector, w.Pods, time.Second); err != nil {
				t.Fatalf("after 2 s more: %v", err)
			} else {
				t.Logf("%s %s: %d pods, e.g. %s", w.Object.GetKind(), w.Object.GetName(), len(pods), pods[0].Name)
			}
		})
	}
}

func dynamicClient(t testing.TB, cp *controlplane.ControlPlane) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	return dyn
}

func createObject(t *testing.T, cp *controlplane.ControlPlane, w Workload) {
	t.Helper()
	_, err := dynamicClient(t, cp).Resource(w.GVR).Namespace(w.Object.GetNamespace()).Create(t.Context(), w.Object, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s %s: %v", w.Object.GetKind(), w.Object.GetName(), err)
	}
}

// checkPods: every pod names tessera-scheduler, taken from the template,
// and has an owner (its controller made it, not the test).
func checkPods(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if p.Spec.SchedulerName != SchedulerName {
			t.Errorf("pod %s: schedulerName %q, want %q", p.Name, p.Spec.SchedulerName, SchedulerName)
		}
		if len(p.OwnerReferences) == 0 {
			t.Errorf("pod %s has no owner", p.Name)
		}
	}
}

// TestLockFixedCertDir: a second taker of the fixed cert dir's lock waits,
// then fails naming who holds it (a kept demo holds it for hours); once the
// holder lets go, the lock is taken and records its new holder.
func TestLockFixedCertDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := lockFixedCertDir(path, "training-operator", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	holder := fmt.Sprintf("pid %d", os.Getpid())
	_, err = lockFixedCertDir(path, "trainer", 1500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "held by "+holder) || !strings.Contains(err.Error(), "for training-operator") {
		t.Fatalf("second lock: err %v, want one naming the holder (%s, for training-operator)", err, holder)
	}
	first.Close()
	second, err := lockFixedCertDir(path, "trainer", time.Second)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	defer second.Close()
	if data, _ := os.ReadFile(path); !strings.Contains(string(data), "for trainer") {
		t.Errorf("lock file says %q, want its new holder (for trainer)", data)
	}
}
