package scheduler_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// slotLimits asks for one fraction slot, as the webhook adds it.
var slotLimits = v1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}

func wholeLimits(n string) v1.ResourceList {
	return v1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse(n)}
}

// sliceGPUs reads a node's published GPUs: UUID and memory by index.
func (e *env) sliceGPUs(node string) (uuids map[int]string, memory map[int]int64) {
	e.T.Helper()
	uuids, memory = map[int]string{}, map[int]int64{}
	sl, err := e.Client.ResourceV1().ResourceSlices().List(e.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	require.NoError(e.T, err)
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			i := int(*d.Attributes["gpu.tessera.dev/index"].IntValue)
			uuids[i] = *d.Attributes["gpu.tessera.dev/uuid"].StringValue
			q := d.Capacity["memory"].Value
			memory[i] = q.Value()
		}
	}
	require.NotEmpty(e.T, uuids, "node %s publishes no GPUs", node)
	return uuids, memory
}

// assignmentOf reads and validates a bound pod's assignment.
func (e *env) assignmentOf(pod string) assignment.Assignment {
	e.T.Helper()
	p := e.pod(pod)
	a, ok, err := assignment.Of(p.Annotations)
	require.True(e.T, ok, "pod %s has no %s annotation", pod, assignment.Annotation)
	require.NoError(e.T, err)
	return a
}

// claimGPUs lists the GPU indices of a pod's allocated claim.
func (e *env) claimGPUs(pod string) []int {
	e.T.Helper()
	var out []int
	for _, d := range e.devicesOf(pod) {
		i, err := strconv.Atoi(strings.TrimPrefix(d[strings.LastIndex(d, "/")+1:], "gpu-"))
		require.NoError(e.T, err, "device %s", d)
		out = append(out, i)
	}
	return out
}

// TestDevicePluginPods schedules pods that ask for GPUs through tessera-node's
// device plugin (extended resources; the fraction annotations with a share
// slot): the controller picks the GPUs, records them in the assignment
// annotation before binding, and never gives a GPU to both a DRA claim and a
// device-plugin pod.
func TestDevicePluginPods(t *testing.T) {
	e := newEnv(t)
	e.addGPUNodeWith("dp-0", "h100-sxm-8", v1.ResourceList{
		assignment.DefaultResourceGPU: resource.MustParse("8"),
		assignment.ResourceShare:      resource.MustParse("80"),
	})
	// A GPU node without the device plugin (no extended resources): never
	// chosen for a device-plugin pod, though its GPUs are free.
	e.addGPUNode("no-dp", "h100-sxm-8")
	e.startScheduler(core.Config{})
	uuids, memory := e.sliceGPUs("dp-0")
	onDP := map[string]string{"kubernetes.io/hostname": "dp-0"}

	t.Run("two halves share one GPU", func(t *testing.T) {
		for _, n := range []string{"half-a", "half-b"} {
			e.createPod(podSpec{name: n, limits: slotLimits, annotations: map[string]string{kube.AnnotationGPUFraction: "0.5"}})
		}
		e.waitBound("half-a", "half-b")
		a, b := e.assignmentOf("half-a"), e.assignmentOf("half-b")
		require.Len(t, a.GPUs, 1)
		assert.Equal(t, a.GPUs, b.GPUs, "two halves on the same GPU")
		g := a.GPUs[0]
		for name, as := range map[string]assignment.Assignment{"half-a": a, "half-b": b} {
			assert.Equal(t, "dp-0", e.pod(name).Spec.NodeName)
			assert.Equal(t, []string{uuids[g]}, as.UUIDs, "%s: the UUID of its GPU", name)
			assert.Equal(t, memory[g]/2, as.MemoryBytes, "%s: half of the GPU's memory", name)
			assert.Equal(t, int64(500), as.ComputeMilli, name)
			assert.Equal(t, assignment.SharingMPS, as.Sharing, name)
		}
	})

	t.Run("whole GPUs", func(t *testing.T) {
		e.createPod(podSpec{name: "two-gpus", limits: wholeLimits("2")})
		e.waitBound("two-gpus")
		assert.Equal(t, "dp-0", e.pod("two-gpus").Spec.NodeName)
		a := e.assignmentOf("two-gpus")
		require.Len(t, a.GPUs, 2)
		assert.False(t, a.IsShare())
		assert.Equal(t, []string{uuids[a.GPUs[0]], uuids[a.GPUs[1]]}, a.UUIDs)
		assert.NotContains(t, a.GPUs, e.assignmentOf("half-a").GPUs[0], "the shared GPU is not given whole")
	})

	t.Run("annotated pod without the share slot waits", func(t *testing.T) {
		e.createPod(podSpec{name: "no-slot", annotations: map[string]string{kube.AnnotationGPUFraction: "0.25"}})
		e.createPod(podSpec{name: "bad-fraction", limits: slotLimits, annotations: map[string]string{kube.AnnotationGPUFraction: "half"}})
		for name, want := range map[string]string{
			"no-slot":      "add tessera.dev/gpu-share: 1 to a container's limits, or install Tessera's admission webhook",
			"bad-fraction": `annotation tessera.dev/gpu-fraction: "half" is not a fraction`,
		} {
			e.eventually(name+" pending with its reason", 60*time.Second, func() (bool, string) {
				p := e.pod(name)
				if p.Spec.NodeName != "" {
					t.Fatalf("%s bound to %s", name, p.Spec.NodeName)
				}
				return contains(pendingReason(p), want), pendingReason(p)
			})
		}
	})

	// Fill dp-0 through both paths: 1 shared GPU and 2 whole ones so far,
	// then 2 + 1 GPUs by claims and 2 by the device plugin.
	t.Run("claims and device-plugin pods never share a GPU", func(t *testing.T) {
		e.createPod(podSpec{name: "dra-two", claim: &gpuClaim{count: 2}, nodeSelector: onDP})
		e.createPod(podSpec{name: "dp-two", limits: wholeLimits("2")})
		e.createPod(podSpec{name: "dra-one", claim: &gpuClaim{}, nodeSelector: onDP})
		e.waitBound("dra-two", "dp-two", "dra-one")
		owner := map[int]string{}
		take := func(pod string, gpus []int) {
			for _, g := range gpus {
				if other, ok := owner[g]; ok && !(strings.HasPrefix(other, "half-") && strings.HasPrefix(pod, "half-")) {
					t.Errorf("GPU %d given to %s and %s", g, other, pod)
				}
				owner[g] = pod
			}
		}
		for _, p := range []string{"half-a", "half-b", "two-gpus", "dp-two"} {
			assert.Equal(t, "dp-0", e.pod(p).Spec.NodeName, p)
			take(p, e.assignmentOf(p).GPUs)
		}
		for _, p := range []string{"dra-two", "dra-one"} {
			assert.Equal(t, "dp-0", e.pod(p).Spec.NodeName, p)
			take(p, e.claimGPUs(p))
		}
		assert.Len(t, owner, 8, "the node is full: %v", owner)
		e.checkNoDoubleAllocation()

		// Full: the next pods wait, whichever path they ask through; the
		// device-plugin ones do not go to no-dp, whose GPUs are free.
		e.createPod(podSpec{name: "dp-next", limits: wholeLimits("1")})
		e.createPod(podSpec{name: "half-next", limits: slotLimits, annotations: map[string]string{kube.AnnotationGPUFraction: "0.5"}})
		e.createPod(podSpec{name: "dra-next", claim: &gpuClaim{}, nodeSelector: onDP})
		for _, name := range []string{"dp-next", "half-next", "dra-next"} {
			e.eventually(name+" pending with a reason", 60*time.Second, func() (bool, string) {
				p := e.pod(name)
				if p.Spec.NodeName != "" {
					t.Fatalf("%s bound to %s, though dp-0 is full", name, p.Spec.NodeName)
				}
				r := pendingReason(p)
				return strings.HasPrefix(r, "Unschedulable: ") && len(r) > len("Unschedulable: "), r
			})
		}
		time.Sleep(time.Second)
		for _, name := range []string{"dp-next", "half-next", "dra-next"} {
			assert.Empty(t, e.pod(name).Spec.NodeName, "%s bound later", name)
		}
		// Room again: the device-plugin pod goes where the claim was.
		for _, name := range []string{"half-next", "dra-next"} {
			require.NoError(t, e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		}
		freed := e.claimGPUs("dra-one")
		require.NoError(t, e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "dra-one", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		e.waitBound("dp-next")
		assert.Equal(t, "dp-0", e.pod("dp-next").Spec.NodeName)
		assert.Equal(t, freed, e.assignmentOf("dp-next").GPUs)
	})
}

// dpTaint is the device-plugin taint value of a GPU in a node's slice.
func (e *env) dpTaint(node, device string) string {
	e.T.Helper()
	sl, err := e.Client.ResourceV1().ResourceSlices().List(e.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	require.NoError(e.T, err)
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			for _, t := range d.Taints {
				if d.Name == device && t.Key == driver.TaintDevicePlugin {
					return t.Value
				}
			}
		}
	}
	return ""
}

func (e *env) waitDPTaint(node, device, want string) {
	e.T.Helper()
	e.eventually(fmt.Sprintf("%s/%s tainted %q", node, device, want), 30*time.Second, func() (bool, string) {
		got := e.dpTaint(node, device)
		return got == want, got
	})
}

// TestDevicePluginTaints: the GPUs tessera-node's device plugin holds carry
// the device taint gpu.tessera.dev/device-plugin. A GPU tainted "whole" that
// no pod's assignment accounts for (a pod kube-scheduler bound) is never
// given by the controller; a GPU tainted "shared" whose holder it knows
// takes more shares of the same mode, through either path.
func TestDevicePluginTaints(t *testing.T) {
	e := newEnv(t)
	const node = "dp-taint"
	d := e.addGPUNodeWith(node, "l4-2", v1.ResourceList{
		assignment.DefaultResourceGPU: resource.MustParse("2"),
		assignment.ResourceShare:      resource.MustParse("20"),
	})
	uuids, _ := e.sliceGPUs(node)
	onNode := map[string]string{"kubernetes.io/hostname": node}

	// kube-scheduler bound a pod with nvidia.com/gpu: 1 there (no
	// assignment) and the kubelet allocated GPU 0 for it.
	_, err := d.AllocatePod(e.Ctx, driver.PodRequest{UID: "uid-kube-scheduled", Namespace: "other", Name: "kube-scheduled",
		Resource: assignment.DefaultResourceGPU, DeviceIDs: []string{uuids[0]}, GPUs: []string{uuids[0]}})
	require.NoError(t, err)
	e.waitDPTaint(node, "gpu-0", "whole")
	e.startScheduler(core.Config{})

	t.Run("a whole GPU held without an assignment is not given", func(t *testing.T) {
		e.createPod(podSpec{name: "claim-a", claim: &gpuClaim{}, nodeSelector: onNode})
		e.waitBound("claim-a")
		assert.Equal(t, []int{1}, e.claimGPUs("claim-a"))
		e.createPod(podSpec{name: "claim-b", claim: &gpuClaim{}, nodeSelector: onNode})
		e.eventually("claim-b pending with a reason", 60*time.Second, func() (bool, string) {
			p := e.pod("claim-b")
			if p.Spec.NodeName != "" {
				t.Fatalf("claim-b bound to %s, though GPU 0 is the device plugin's", p.Spec.NodeName)
			}
			r := pendingReason(p)
			return strings.HasPrefix(r, "Unschedulable: ") && len(r) > len("Unschedulable: "), r
		})
		// The node releases the GPU (the pod ended): the taint goes, and
		// the claim gets it.
		_, err := d.ReleasePod(e.Ctx, "uid-kube-scheduled")
		require.NoError(t, err)
		e.waitBound("claim-b")
		assert.Equal(t, []int{0}, e.claimGPUs("claim-b"))
		e.checkNoDoubleAllocation()
	})

	t.Run("a shared GPU whose holder is known takes more shares", func(t *testing.T) {
		// GPU 1 becomes free; GPU 0 stays with claim-b.
		require.NoError(t, e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "claim-a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		quarter := map[string]string{kube.AnnotationGPUFraction: "0.25", kube.AnnotationGPUSharing: "timeslice"}
		e.createPod(podSpec{name: "dp-share", limits: slotLimits, annotations: quarter})
		e.waitBound("dp-share")
		a := e.assignmentOf("dp-share")
		require.Equal(t, []int{1}, a.GPUs)
		// The kubelet admits it: the device plugin's Allocate, on the ledger.
		p := e.pod("dp-share")
		_, err := d.AllocatePod(e.Ctx, driver.PodRequest{UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
			Resource: assignment.ResourceShare, DeviceIDs: []string{"gpu-1-slot-0"}, GPUs: []string{uuids[1]},
			MemoryBytes: uint64(a.MemoryBytes), Config: v1alpha1.NewTimeSlicingConfig("")})
		require.NoError(t, err)
		e.waitDPTaint(node, "gpu-1", "shared")

		e.createPod(podSpec{name: "dp-share-2", limits: slotLimits, annotations: quarter})
		e.createPod(podSpec{name: "claim-share", claim: &gpuClaim{class: "timeslice.gpu.tessera.dev", memory: "4Gi"}, nodeSelector: onNode})
		e.waitBound("dp-share-2", "claim-share")
		assert.Equal(t, []int{1}, e.assignmentOf("dp-share-2").GPUs)
		assert.Equal(t, []int{1}, e.claimGPUs("claim-share"))
		e.checkNoDoubleAllocation()
	})
}
