// Package workloads_test schedules workloads as people submit them — a
// PyTorchJob, a JobSet, a LeaderWorkerSet, a RayCluster, a TrainJob —
// driven by their real controllers (test/framework: StartOperator) on a real
// control plane with a kwok GPU node whose tessera-node publishes its fake
// GPUs, and tessera-controller (scheduler and pod grouper) as a process.
// Nobody writes a PodGroup: the grouper derives each gang from its owner.
package workloads_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/kube"
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
	*framework.Env
	ops map[string]*framework.Operator
}

// newEnv starts the control plane, the queues, the GPU node with its
// tessera-node, the workload controllers named and tessera-controller.
func newEnv(t *testing.T, operators ...string) *env {
	t.Helper()
	framework.OperatorsDir(t) // builds them, or skips under -short, before anything starts
	nodeBin := controlplane.GoBinary(t, "./cmd/tessera-node")
	fe := framework.NewEnv(t, framework.EnvOptions{Namespace: "ml", ControllerRBAC: true})
	e := &env{Env: fe, ops: map[string]*framework.Operator{}}
	for _, q := range []string{teamA, teamB} {
		e.createQueue(q, "4")
	}
	n, err := framework.FakeGPUNode(node, nodeProfile, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.CP.AddKwokNodeWith(t, n)
	kubeconfig := e.CP.WriteKubeconfig(t, e.CP.UserConfig("system:node:"+node, "system:nodes"))
	e.CP.StartChild(t, controlplane.ChildOptions{Name: "tessera-node-" + node, Bin: nodeBin,
		Args: framework.FakeTesseraNodeArgs(node, nodeProfile, kubeconfig, filepath.Join(shortDir(t), node))})
	e.WaitDevices(node, nodeGPUs, time.Minute)
	for _, name := range operators {
		start := time.Now()
		e.ops[name] = framework.StartOperator(t, e.CP, name)
		t.Logf("%s ready in %v", name, time.Since(start).Round(time.Millisecond))
	}
	c := framework.StartController(t, e.CP, framework.ControllerOptions{})
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
	e.T.Helper()
	e.CreateQueue(name, map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": quota}}})
}

func (e *env) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.T.Helper()
	e.Eventually(what, timeout, cond)
}

// create creates a workload's object.
func (e *env) create(w framework.Workload) {
	e.T.Helper()
	if _, err := e.Dyn.Resource(w.GVR).Namespace(w.Object.GetNamespace()).Create(e.Ctx, w.Object, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating %s %s: %v", w.Object.GetKind(), w.Object.GetName(), err)
	}
}

// bareGPUPod creates a pod of its own (a gang of one) asking for gpus GPUs
// in queue; preemptible false makes it no victim of reclaim.
func (e *env) bareGPUPod(name, queue string, gpus int, preemptible bool) {
	e.T.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.NS, Name: name, Labels: map[string]string{kube.LabelQueue: queue},
			Annotations: map[string]string{kube.AnnotationPreemptible: fmt.Sprint(preemptible)}},
		Spec: corev1.PodSpec{SchedulerName: framework.SchedulerName, Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				assignment.DefaultResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}},
		}}},
	}
	if _, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, pod, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating pod %s: %v", name, err)
	}
}

func (e *env) waitBound(name string) {
	e.T.Helper()
	e.WaitBound(time.Minute, name)
}

// pods lists a workload's live pods (not being deleted), by name.
func (e *env) pods(w framework.Workload) []corev1.Pod {
	e.T.Helper()
	return e.LivePods(w.PodSelector)
}

// pendingReason is the PodScheduled condition tessera-scheduler writes on a
// pod it cannot place.
var pendingReason = framework.PendingReason

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
	list, err := e.Client.CoreV1().Pods(e.NS).List(e.Ctx, metav1.ListOptions{})
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
