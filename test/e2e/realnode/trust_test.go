package realnode_test

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/realnode"
)

// TestKubeletChoosesOtherGPUs: the real kubelet gives a tessera-scheduler
// pod other GPUs than its assignment, and tessera-controller counts what
// the node records (issue 17, "Capacity counted twice"; it made
// TestDevicePlugin/tessera-scheduler flake). Made deterministic with the
// kubelet paused: a pod bound directly (no assignment, created first) and a
// tessera-scheduler pod both ask for 2 GPUs. The kubelet admits the older
// first; the device plugin prefers for it the best 2 GPUs of the empty node,
// which are the ones the controller assigned to the other pod (checked, not
// assumed), so the tessera pod gets 2 others. Once the first pod is gone, 6
// GPUs are free and a pod of 6 is placed; before the fix the controller
// counted the assignment and the node's marks apart (4 held, 4 free) and the
// pod waited.
func TestKubeletChoosesOtherGPUs(t *testing.T) { setup(t).each(t, testKubeletChoosesOtherGPUs) }

func testKubeletChoosesOtherGPUs(t *testing.T, c *cluster) {
	if !c.tessera() {
		t.Skip("only tessera-scheduler writes assignments; a kube-scheduler pod has none to differ from")
	}
	uuids := c.devices(t)
	if err := c.node.PauseKubelet(); err != nil {
		t.Fatal(err)
	}
	paused := true
	resume := func() {
		if paused {
			paused = false
			if err := c.node.ResumeKubelet(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer resume()
	older := c.dpPod("older", assignment.DefaultResourceGPU, 2, nil)
	older.Spec.SchedulerName, older.Spec.NodeName = "", c.node.Name
	c.create(t, older)
	c.create(t, c.dpPod("assigned", assignment.DefaultResourceGPU, 2, nil))
	realnode.WaitPod(t, c.client, c.ns, "assigned", 30*time.Second, "bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	a := c.assignmentOf(t, "assigned")
	resume()
	c.waitRunning(t, "older")
	c.waitRunning(t, "assigned")

	olderGPUs, got := c.recordOf(t, "older", 2), c.recordOf(t, "assigned", 2)
	if !slices.ContainsFunc(olderGPUs, func(g int) bool { return slices.Contains(a.GPUs, g) }) {
		t.Fatalf("setup: the kubelet gave the older pod GPUs %v, none of the tessera pod's assignment %v; "+
			"the test relies on both the controller and the device plugin choosing the best GPUs of an empty node first", olderGPUs, a.GPUs)
	}
	if slices.Equal(got, a.GPUs) {
		t.Fatalf("the kubelet gave the tessera pod its assigned GPUs %v though the older pod holds %v", got, olderGPUs)
	}
	t.Logf("assigned %v, the kubelet gave %v (the older pod got %v)", a.GPUs, got, olderGPUs)
	var want []string
	for _, g := range got {
		want = append(want, uuids[deviceName(g)])
	}
	if env := c.printedEnv(t, "assigned"); !sameSet(strings.Split(env["TESSERA_GPU_UUIDS"], ","), want) {
		t.Errorf("the tessera pod's container got GPUs %q, want the node's record %v", env["TESSERA_GPU_UUIDS"], want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.controller.metric(t, "tessera_device_plugin_disagreements_total", "") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("tessera_device_plugin_disagreements_total still 0; controller log:\n%s", tail(c.controller.logPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}

	c.deletePod(t, "older")
	deadline = time.Now().Add(30 * time.Second)
	for c.agent.metric(t, "tessera_node_deviceplugin_pods", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the older pod is still in tessera-node's ledger 30s after its deletion; log:\n%s", tail(c.agent.logPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.create(t, c.dpPod("six", assignment.DefaultResourceGPU, 6, nil))
	c.waitRunning(t, "six")
	if six := c.recordOf(t, "six", 6); slices.ContainsFunc(six, func(g int) bool { return slices.Contains(got, g) }) {
		t.Errorf("the pod of 6 got GPUs %v, which overlap the tessera pod's %v", six, got)
	}
	c.checkBinds(t, 2)
}

// recordOf waits for the node's record of a pod (its UID on the GPUs it
// holds whole, assignment.AttrDevicePluginPod) to list n GPUs, and returns
// their indices, ascending.
func (c *cluster) recordOf(t *testing.T, pod string, n int) []int {
	t.Helper()
	ctx := context.Background()
	p, err := c.client.CoreV1().Pods(c.ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting pod %s: %v", pod, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out []int
		sl, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node.Name})
		if err != nil {
			t.Fatalf("listing slices: %v", err)
		}
		for _, s := range sl.Items {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[assignment.AttrDevicePluginPod]; ok && a.StringValue != nil && *a.StringValue == string(p.UID) {
					i, _ := strconv.Atoi(strings.TrimPrefix(d.Name, "gpu-"))
					out = append(out, i)
				}
			}
		}
		sort.Ints(out)
		if len(out) == n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node records GPUs %v for pod %s after 30s, want %d", out, pod, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
