package scheduler_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// metric sums the samples of a metric family of the running scheduler
// (counters), 0 when absent.
func (e *env) metric(name string) float64 {
	e.T.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(e.T, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// warningEvent waits for a Warning event of reason on a pod.
func (e *env) warningEvent(pod, reason string) string {
	e.T.Helper()
	var msg string
	e.eventually(fmt.Sprintf("event %s on %s", reason, pod), 30*time.Second, func() (bool, string) {
		evs, err := e.Client.CoreV1().Events(e.NS).List(e.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == reason && ev.Type == v1.EventTypeWarning {
				msg = ev.Message
				return true, ""
			}
			seen = append(seen, ev.Reason)
		}
		return false, fmt.Sprintf("events %v", seen)
	})
	return msg
}

// boundCPUPod creates a CPU-only pod already bound to node (spec.nodeName,
// no scheduler) with the given assignment annotation: what anyone who may
// create pods could write without the chart's admission policy.
func (e *env) boundCPUPod(name, node, value string) {
	e.T.Helper()
	_, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS, Annotations: map[string]string{assignment.Annotation: value}},
		Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "main", Image: "busybox"}},
			Tolerations: []v1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: v1.TolerationOpExists}}},
	}, metav1.CreateOptions{})
	require.NoError(e.T, err)
}

func (e *env) deletePod(name string) {
	e.T.Helper()
	require.NoError(e.T, e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	e.eventually(name+" gone", 30*time.Second, func() (bool, string) {
		_, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, name, metav1.GetOptions{})
		return err != nil, "still there"
	})
}

// TestDevicePluginTrust: regression tests of issue 17's "A forged
// annotation takes a node's GPUs" and "Capacity counted twice", on a node
// of 4 GPUs with tessera-node's device plugin. The assignment annotation is
// trusted only on a pod that asks for what it assigns, and the node's
// record of what the kubelet gave a pod (the pod's UID on the GPUs it holds
// whole) wins over the assignment, so no GPU is counted twice.
func TestDevicePluginTrust(t *testing.T) {
	e := newEnv(t)
	const node = "dp-trust"
	d := e.addGPUNodeWith(node, "a100-pcie-4", v1.ResourceList{
		assignment.DefaultResourceGPU: resource.MustParse("4"),
		assignment.ResourceShare:      resource.MustParse("40"),
	})
	uuids, _ := e.sliceGPUs(node)
	e.startScheduler(core.Config{})

	// Each forged pod alone would hold the node's 4 GPUs; a pod asking
	// for all 4 must still be placed, and the forged pod gets an event.
	for i, forged := range []string{"x", `{"gpus":[0,1,2,3]}`} {
		name := fmt.Sprintf("forged-%d", i)
		t.Run("a CPU-only pod with the annotation "+forged, func(t *testing.T) {
			e.boundCPUPod(name, node, forged)
			e.createPod(podSpec{name: "all-" + name, limits: wholeLimits("4")})
			e.waitBound("all-" + name)
			assert.Equal(t, []int{0, 1, 2, 3}, e.assignmentOf("all-"+name).GPUs)
			assert.Contains(t, e.warningEvent(name, "AssignmentIgnored"), "asks for no GPUs through the device plugin")
			e.deletePod("all-" + name)
			e.deletePod(name)
		})
	}
	assert.Equal(t, 2.0, e.metric("tessera_assignments_ignored_total"))

	t.Run("the kubelet gives other GPUs than assigned: counted once", func(t *testing.T) {
		e.createPod(podSpec{name: "first", limits: wholeLimits("2")})
		e.waitBound("first")
		assigned := e.assignmentOf("first").GPUs
		var others []int
		for i := range 4 {
			if !slices.Contains(assigned, i) {
				others = append(others, i)
			}
		}
		// The kubelet's choice, recorded as the device plugin's Allocate
		// records it (GetPreferredAllocation is only a preference).
		p := e.pod("first")
		req := driver.PodRequest{UID: string(p.UID), Namespace: p.Namespace, Name: p.Name, Resource: assignment.DefaultResourceGPU}
		for _, i := range others {
			req.GPUs = append(req.GPUs, uuids[i])
			req.DeviceIDs = append(req.DeviceIDs, uuids[i])
		}
		_, err := d.AllocatePod(e.Ctx, req)
		require.NoError(t, err)
		for _, i := range others {
			e.waitDPTaint(node, fmt.Sprintf("gpu-%d", i), "whole")
		}
		// 2 GPUs held, 2 free: the next pod of 2 gets the free ones, which
		// are the first pod's assignment.
		e.createPod(podSpec{name: "second", limits: wholeLimits("2")})
		e.waitBound("second")
		assert.Equal(t, assigned, e.assignmentOf("second").GPUs)
		e.eventually("the disagreement counted", 10*time.Second, func() (bool, string) {
			n := e.metric("tessera_device_plugin_disagreements_total")
			return n == 1, fmt.Sprint(n)
		})
		// Nothing else fits: a third pod of 1 waits.
		e.createPod(podSpec{name: "third", limits: wholeLimits("1")})
		time.Sleep(2 * time.Second)
		assert.Empty(t, e.pod("third").Spec.NodeName, "no GPU is left")
	})
}
