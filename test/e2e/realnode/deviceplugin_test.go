package realnode_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/realnode"
)

// TestDevicePlugin: pods that ask for GPUs through extended resources get
// them from the real kubelet calling tessera-node's device plugin, with the
// CDI devices of its Allocate applied by containerd. With tessera-scheduler:
// two half-GPU pods (fraction annotation, one gpu-share slot) share the GPU
// their assignment names, under MPS limits, and a two-GPU pod gets the GPUs
// of its assignment. With kube-scheduler, which writes no assignment: a
// one-GPU pod gets the GPU the kubelet picked. Deleting the pods releases the
// ledger. For both schedulers, a claim for a GPU that dp-whole holds waits
// (tessera-node taints the GPUs the device plugin holds, and tessera knows
// the assignment), and runs once dp-whole is gone; a GPU a claim or a share
// holds is not in the kubelet's allocatable of nvidia.com/gpu.
func TestDevicePlugin(t *testing.T) { setup(t).each(t, testDevicePlugin) }

func testDevicePlugin(t *testing.T, c *cluster) {
	uuids := c.devices(t) // device name ("gpu-3") → UUID
	wholeGPUs := int64(1)
	if c.tessera() {
		wholeGPUs = 2
	}
	c.create(t, c.dpPod("dp-whole", assignment.DefaultResourceGPU, wholeGPUs, nil))
	names := []string{"dp-whole"}
	if c.tessera() {
		for _, name := range []string{"dp-half-a", "dp-half-b"} {
			c.create(t, c.dpPod(name, assignment.ResourceShare, 1, map[string]string{assignment.AnnotationGPUFraction: "0.5"}))
			names = append(names, name)
		}
	}
	for _, name := range names {
		c.waitRunning(t, name)
	}

	env := c.printedEnv(t, "dp-whole")
	got := strings.Split(env["TESSERA_GPU_UUIDS"], ",")
	if c.tessera() {
		a := c.assignmentOf(t, "dp-whole")
		var want []string
		for _, i := range a.GPUs {
			want = append(want, uuids[deviceName(i)])
		}
		if len(a.GPUs) != 2 || !sameSet(got, want) {
			t.Errorf("dp-whole: container got GPUs %v, assignment %v (UUIDs %v); want the assigned two", got, a.GPUs, want)
		}
	} else if len(got) != 1 || !isUUID(uuids, got[0]) {
		t.Errorf("dp-whole: container got GPUs %q, want one GPU of the node", env["TESSERA_GPU_UUIDS"])
	}
	if err := checkEnv(env, map[string]string{"TESSERA_SHARING": "Exclusive", "nvidia-devices": "0"}); err != nil {
		t.Errorf("dp-whole: %v", err)
	}

	if c.tessera() {
		a := c.assignmentOf(t, "dp-half-a")
		if b := c.assignmentOf(t, "dp-half-b"); b.GPUs[0] != a.GPUs[0] {
			t.Errorf("the half-GPU pods were assigned GPUs %d and %d, want one GPU shared", a.GPUs[0], b.GPUs[0])
		}
		uuid := uuids[deviceName(a.GPUs[0])]
		for _, name := range []string{"dp-half-a", "dp-half-b"} {
			if err := checkEnv(c.printedEnv(t, name), map[string]string{
				"TESSERA_GPU_UUIDS":                 uuid,
				"TESSERA_SHARING":                   "MPS",
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  uuid + "=40960M",
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
			}); err != nil {
				t.Errorf("pod %s: %v", name, err)
			}
		}
		if got := starts(c.mpsRecords(t)); got != 1 {
			t.Errorf("MPS stand-in started %d times, want once for the shared GPU; record %v", got, c.mpsRecords(t))
		}
		c.checkBinds(t, len(names))
	}

	// A GPU a claim or a share holds leaves the kubelet's allocatable of
	// whole GPUs (the device plugin reports it Unhealthy): a whole claim on
	// a free GPU, and with tessera-scheduler the GPU the halves share.
	used := map[string]bool{}
	for _, u := range got {
		used[u] = true
	}
	held := int64(1)
	if c.tessera() {
		used[uuids[deviceName(c.assignmentOf(t, "dp-half-a").GPUs[0])]] = true
		held++
	}
	free := 0
	for used[uuids[deviceName(free)]] {
		free++
	}
	c.claim(t, "dp-claimed", deviceclasses.Exclusive, free, "")
	c.create(t, c.gpuPod(t, "dp-claimed", "dp-claimed"))
	c.waitRunning(t, "dp-claimed")
	c.waitAllocatable(t, gpuCount-held)

	// A claim for one of dp-whole's GPUs waits while dp-whole holds it.
	clashUUID := got[0]
	clashIndex := -1
	for dev, u := range uuids {
		if u == clashUUID {
			clashIndex, _ = strconv.Atoi(strings.TrimPrefix(dev, "gpu-"))
		}
	}
	c.claim(t, "dp-clash", deviceclasses.Exclusive, clashIndex, "")
	c.create(t, c.gpuPod(t, "dp-clash", "dp-clash"))
	c.refused(t, "dp-clash", "")

	if held := c.agent.metric(t, "tessera_node_deviceplugin_pods", ""); held != float64(len(names)) {
		t.Errorf("tessera-node's ledger holds %v device-plugin pods, want %d", held, len(names))
	}
	for _, name := range append(names, "dp-claimed") {
		c.deletePod(t, name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.agent.metric(t, "tessera_node_deviceplugin_pods", "") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("device-plugin pods still in tessera-node's ledger 30s after deletion; log:\n%s", tail(c.agent.logPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The GPU is free again: the waiting claim gets it.
	c.waitRunning(t, "dp-clash")
	if _, u := c.allocatedUUID(t, "dp-clash"); u != clashUUID {
		t.Errorf("dp-clash got GPU %s, want %s (its selector's)", u, clashUUID)
	}
	// The released GPUs are back in the allocatable, less dp-clash's.
	c.waitAllocatable(t, gpuCount-1)
	if c.tessera() {
		c.checkBinds(t, len(names)+2) // and dp-claimed, dp-clash
	}
}

// dpPod is a busybox pod asking count of an extended resource, for this
// run's scheduler.
func (c *cluster) dpPod(name string, res corev1.ResourceName, count int64, annotations map[string]string) *corev1.Pod {
	p := realnode.BusyboxPod(c.ns, name, "", envScript)
	p.Annotations = annotations
	q := *resource.NewQuantity(count, resource.DecimalSI)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: q}
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{res: q}
	p.Spec.SchedulerName = c.schedulerName
	return p
}

// assignmentOf reads the pod's tessera.dev/gpu-assignment.
func (c *cluster) assignmentOf(t *testing.T, pod string) assignment.Assignment {
	t.Helper()
	p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting pod %s: %v", pod, err)
	}
	a, ok, err := assignment.Of(p.Annotations)
	if !ok || err != nil {
		t.Fatalf("pod %s: assignment %v, %v", pod, ok, err)
	}
	return a
}

func deviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

func isUUID(uuids map[string]string, u string) bool {
	for _, v := range uuids {
		if v == u {
			return true
		}
	}
	return false
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		if seen[x]--; seen[x] < 0 {
			return false
		}
	}
	return true
}
