// Package workloads_test schedules workloads as people submit them — a
// PyTorchJob, a JobSet, a LeaderWorkerSet, a RayCluster, a TrainJob —
// driven by their real controllers (test/framework: StartOperator) on a real
// control plane with a kwok GPU node whose tessera-node publishes its fake
// GPUs, and tessera-controller (scheduler and pod grouper) as a process.
// Nobody writes a PodGroup: the grouper derives each gang from its owner.
package workloads_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

const (
	// node is the one GPU node: 8 fake H100s.
	node        = "dgx-0"
	nodeProfile = "h100-sxm-8"
	nodeGPUs    = 8
	// teamA runs the workloads, teamB reclaims from it: GPU quota 4 each,
	// so each one's fair share of the 8 GPUs is 4.
	teamA, teamB = "team-a", "team-b"
)

type env struct {
	t      *testing.T
	ctx    context.Context
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	dyn    dynamic.Interface
	ns     string
	ops    map[string]*framework.Operator
}

// newEnv starts the control plane, the queues, the GPU node with its
// tessera-node, the workload controllers named and tessera-controller.
func newEnv(t *testing.T, operators ...string) *env {
	t.Helper()
	framework.OperatorsDir(t) // builds them, or skips under -short, before anything starts
	nodeBin := controlplane.GoBinary(t, "./cmd/tessera-node")
	cp := controlplane.Start(t, controlplane.Options{})
	e := &env{t: t, ctx: t.Context(), cp: cp, client: cp.Client(t), ops: map[string]*framework.Operator{}}
	var err error
	if e.dyn, err = dynamic.NewForConfig(cp.AdminConfig); err != nil {
		t.Fatal(err)
	}
	if err := framework.InstallCRDs(e.ctx, e.dyn); err != nil {
		t.Fatal(err)
	}
	if err := framework.ApplyDeviceClasses(e.ctx, e.client); err != nil {
		t.Fatal(err)
	}
	cp.CreateNamespace(t, rbac.Namespace)
	if err := framework.ApplyControllerRBAC(e.ctx, e.client); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{teamA, teamB} {
		e.createQueue(q, "4")
	}
	e.ns = cp.CreateNamespace(t, "ml").Name
	cp.StartKwok(t)
	n, err := framework.FakeGPUNode(node, nodeProfile, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp.AddKwokNodeWith(t, n)
	kubeconfig := cp.WriteKubeconfig(t, cp.UserConfig("system:node:"+node, "system:nodes"))
	cp.StartChild(t, controlplane.ChildOptions{Name: "tessera-node-" + node, Bin: nodeBin,
		Args: framework.FakeTesseraNodeArgs(node, nodeProfile, kubeconfig, filepath.Join(shortDir(t), node))})
	e.waitSlices()
	for _, name := range operators {
		start := time.Now()
		e.ops[name] = framework.StartOperator(t, cp, name)
		t.Logf("%s ready in %v", name, time.Since(start).Round(time.Millisecond))
	}
	c := framework.StartController(t, cp, framework.ControllerOptions{})
	c.WaitLeader(t, time.Minute)
	return e
}

// shortDir is a temporary folder with a short path: tessera-node's unix
// sockets are limited to 108 bytes.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (e *env) createQueue(name, quota string) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": quota}}},
	}}
	if _, err := e.dyn.Resource(kube.QueueGVR).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating Queue %s: %v", name, err)
	}
}

func (e *env) waitSlices() {
	e.eventually("the GPUs of "+node+" published", time.Minute, func() (bool, string) {
		sl, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Spec.Devices)
		}
		return n == nodeGPUs, fmt.Sprintf("%d of %d", n, nodeGPUs)
	})
}

func (e *env) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	framework.Eventually(e.t, what, timeout, cond)
}

// create creates a workload's object.
func (e *env) create(w framework.Workload) {
	e.t.Helper()
	if _, err := e.dyn.Resource(w.GVR).Namespace(w.Object.GetNamespace()).Create(e.ctx, w.Object, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating %s %s: %v", w.Object.GetKind(), w.Object.GetName(), err)
	}
}

// bareGPUPod creates a pod of its own (a gang of one) asking for gpus GPUs
// in queue; preemptible false makes it no victim of reclaim.
func (e *env) bareGPUPod(name, queue string, gpus int, preemptible bool) {
	e.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: map[string]string{kube.LabelQueue: queue},
			Annotations: map[string]string{kube.AnnotationPreemptible: fmt.Sprint(preemptible)}},
		Spec: corev1.PodSpec{SchedulerName: framework.SchedulerName, Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				assignment.DefaultResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}},
		}}},
	}
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating pod %s: %v", name, err)
	}
}

func (e *env) waitBound(name string) {
	e.t.Helper()
	e.eventually("pod "+name+" bound", time.Minute, func() (bool, string) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", pendingReason(p)
	})
}

// pods lists a workload's live pods (not being deleted), by name.
func (e *env) pods(w framework.Workload) []corev1.Pod {
	e.t.Helper()
	list, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: w.PodSelector})
	if err != nil {
		e.t.Fatalf("listing pods of %s: %v", w.Object.GetName(), err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// pendingReason is the PodScheduled condition tessera-scheduler writes on a
// pod it cannot place.
func pendingReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return fmt.Sprintf("%s: %s", c.Reason, c.Message)
		}
	}
	return "no PodScheduled condition"
}

// boundAt is when a bound pod's PodScheduled condition turned true.
func boundAt(p corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// gone says whether none of the pods uids is live any more.
func (e *env) gone(uids map[types.UID]string) (bool, string) {
	list, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	var live []string
	for _, p := range list.Items {
		if _, ok := uids[p.UID]; ok && p.DeletionTimestamp == nil {
			live = append(live, p.Name)
		}
	}
	return len(live) == 0, "still running: " + strings.Join(live, ", ")
}
