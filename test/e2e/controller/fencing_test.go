package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestFencingPausedLeader is the "No fencing" defect of issue 17: a leader
// frozen mid-commit (a GC pause, a stopped node) past its Lease wakes up
// after the standby took over and has started from a picture without the
// rest of that commit. Replica A (a real process, --workers=1) decides four
// one-GPU pods onto the four GPUs of a node, writes the first, and stops
// itself with SIGSTOP before the second (the between-jobs hook). While it
// is frozen, three high-priority pods arrive and replica B takes over and
// gives them the three GPUs A had planned for its other pods. Then A
// continues: without fencing it wrote those three claims as it had planned
// them (three GPUs given to two claims each, until its renew loop gave up 3
// s later); with fencing its next write is refused by the local clock
// (last renewal older than the renew deadline), it counts and logs the
// fenced commit and exits as a lost leader. No device may be over its
// capacity and no pod may be lost.
func TestFencingPausedLeader(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	client := cp.Client(t)
	ns := cp.CreateNamespace(t, "fencing").Name
	t.Cleanup(func() { deletePods(t, client, ns) })
	const node = "fence-0"
	addGPUNode(t, cp, node, 4)
	createTemplate(t, client, ns, "one-gpu", 1)
	for i := range 4 {
		createPinnedPod(t, client, ns, fmt.Sprintf("low-%d", i), node, "test-low")
	}
	waitClaims(t, client, ns, 4)

	hook := kube.EnvTestCommitHook + "=" + string(kube.HookBetweenJobs) + "=" + kube.HookPause
	a := framework.StartController(t, cp, framework.ControllerOptions{Name: "fence-a", Args: []string{"--workers=1"}, Env: []string{hook}})
	pauseCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := a.WaitPaused(pauseCtx); err != nil {
		t.Fatalf("%v; last lines:\n%s", err, a.Tail(30))
	}
	frozen := time.Now()
	if n := countBound(t, client, ns); n != 1 {
		t.Fatalf("A paused with %d pods bound, want 1 (its first job)", n)
	}

	for i := range 3 {
		createPinnedPod(t, client, ns, fmt.Sprintf("high-%d", i), node, "test-high")
	}
	waitClaims(t, client, ns, 7)
	b := framework.StartController(t, cp, framework.ControllerOptions{Name: "fence-b", Args: []string{"--workers=1"}})
	b.WaitLeader(t, 30*time.Second)
	eventually(t, "B binds the high-priority pods", 60*time.Second, func() (bool, string) {
		var waiting []string
		for i := range 3 {
			name := fmt.Sprintf("high-%d", i)
			if ok, msg := boundWithClaim(ctx, client, ns, name); !ok {
				waiting = append(waiting, name+": "+msg)
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
	t.Logf("A frozen for %v; B leads and bound the high-priority pods", time.Since(frozen).Round(time.Millisecond))

	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	code, err := a.Wait(waitCtx)
	if err != nil {
		t.Fatalf("A did not step down after waking: %v; last lines:\n%s", err, a.Tail(30))
	}
	if code != 1 {
		t.Errorf("A exited with %d, want 1 (leadership lost)", code)
	}
	if log := a.Log(); !strings.Contains(log, "Commit fenced") {
		t.Errorf("A's log does not say its commit was fenced; last lines:\n%s", a.Tail(30))
	}

	checkAllocations(t, client, ns, resource.MustParse("80Gi"))
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 7 {
		t.Errorf("%d pods left of 7", len(pods.Items))
	}
	if !b.IsLeader() {
		t.Errorf("B stopped leading; last lines:\n%s", b.Tail(30))
	}
}

// createPinnedPod creates a one-GPU pod (template one-gpu) of a priority
// class on one node, so other tests' nodes stay out of its way.
func createPinnedPod(t *testing.T, client kubernetes.Interface, ns, name, node, priorityClass string) {
	t.Helper()
	pod := gpuPod(ns, name, "one-gpu")
	pod.Spec.NodeSelector = map[string]string{v1.LabelHostname: node}
	pod.Spec.PriorityClassName = priorityClass
	if _, err := client.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
}

// waitClaims waits until KCM has made n ResourceClaims in ns (one per pod),
// so a replica's first cycle sees every pod with its claim.
func waitClaims(t *testing.T, client kubernetes.Interface, ns string, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d claims in %s", n, ns), 30*time.Second, func() (bool, string) {
		l, err := client.ResourceV1().ResourceClaims(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) >= n, fmt.Sprintf("%d claims", len(l.Items))
	})
}

func countBound(t *testing.T, client kubernetes.Interface, ns string) int {
	t.Helper()
	l, err := client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l.Items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}
