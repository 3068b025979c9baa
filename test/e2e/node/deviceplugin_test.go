package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// devicePluginKubelet is the kubelet's device-plugin Registration service on
// kubelet.sock.
type devicePluginKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu  sync.Mutex
	got map[string]string // resource → endpoint
}

func (k *devicePluginKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.got[r.ResourceName] = r.Endpoint
	return &pluginapi.Empty{}, nil
}

func (k *devicePluginKubelet) endpoint(resourceName string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.got[resourceName]
}

// startDevicePluginKubelet serves the kubelet's kubelet.sock in the node's
// device-plugin directory.
func (e *nodeEnv) startDevicePluginKubelet(t testing.TB) *devicePluginKubelet {
	t.Helper()
	require.NoError(t, os.MkdirAll(e.devicePlugins, 0o750))
	sock := filepath.Join(e.devicePlugins, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	k := &devicePluginKubelet{got: map[string]string{}}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return k
}

// shareClient waits until the share plugin registered with k and returns a
// client of its endpoint.
func (e *nodeEnv) shareClient(t testing.TB, k *devicePluginKubelet) pluginapi.DevicePluginClient {
	t.Helper()
	require.Eventually(t, func() bool { return k.endpoint(assignment.ResourceShare) != "" }, 30*time.Second, 20*time.Millisecond)
	return pluginapi.NewDevicePluginClient(dial(t, filepath.Join(e.devicePlugins, k.endpoint(assignment.ResourceShare))))
}

// startDevicePlugins starts the device plugins in this process on d's
// ledger, with a kubelet; it returns a client of the share plugin.
func (e *nodeEnv) startDevicePlugins(t testing.TB, d *driver.Driver) pluginapi.DevicePluginClient {
	t.Helper()
	share, _ := e.startDevicePluginClients(t, d)
	return share
}

// startDevicePluginClients is startDevicePlugins returning clients of both
// plugins: shares and whole GPUs.
func (e *nodeEnv) startDevicePluginClients(t testing.TB, d *driver.Driver) (share, whole pluginapi.DevicePluginClient) {
	t.Helper()
	k := e.startDevicePluginKubelet(t)
	m, err := deviceplugin.Start(context.Background(), deviceplugin.Options{
		NodeName: e.name, KubeClient: cluster(t).Client(t), Inventory: e.fake, Ledger: d,
		Dir: e.devicePlugins, CheckInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(m.Stop)
	share = e.shareClient(t, k)
	require.Eventually(t, func() bool { return k.endpoint(assignment.DefaultResourceGPU) != "" }, 30*time.Second, 20*time.Millisecond)
	whole = pluginapi.NewDevicePluginClient(dial(t, filepath.Join(e.devicePlugins, k.endpoint(assignment.DefaultResourceGPU))))
	return share, whole
}

func allocateShare(ctx context.Context, c pluginapi.DevicePluginClient, slot string) (*pluginapi.ContainerAllocateResponse, error) {
	return allocateIDs(ctx, c, slot)
}

// allocateIDs is the kubelet's Allocate of one container.
func allocateIDs(ctx context.Context, c pluginapi.DevicePluginClient, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

// kwokNode is the set-up of a test with a node of its own: the package's
// control plane, a kwok node named name with a node environment for a
// tessera-node of profile, removed with its slices at the end, and the
// namespace ns.
func kwokNode(t *testing.T, name, profile, ns string) (*controlplane.ControlPlane, kubernetes.Interface, *nodeEnv) {
	t.Helper()
	c := cluster(t)
	client := c.Client(t)
	e := newNodeEnv(t, name, profile)
	c.AddKwokNode(t, e.name, nil)
	removeNodeAtEnd(t, client, e.name)
	c.CreateNamespace(t, ns)
	return c, client, e
}

// removeNodeAtEnd deletes the kwok node and its ResourceSlices when the
// test ends, so the stock scheduler of later tests does not place their
// pods on it.
func removeNodeAtEnd(t testing.TB, client kubernetes.Interface, node string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_ = client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		_ = client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node,
		})
	})
}

// sharePod is a pod bound to node with one share slot and the controller's
// assignment.
func sharePod(ns, name, node string, a assignment.Assignment) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{assignment.Annotation: a.String()}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "busybox",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{assignment.ResourceShare: resource.MustParse("1")}},
		}}},
	}
}

// TestDevicePluginShareAndClaim: a device-plugin share and a DRA claim on
// one GPU go through one ledger: the claim that does not fit next to the
// pod is refused naming the pod, and fits once the pod is deleted.
func TestDevicePluginShareAndClaim(t *testing.T) {
	ns := "deviceplugin"
	_, client, e := kwokNode(t, "dp-h100", "h100-sxm-8", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	d := e.start(t, nil)
	defer d.Stop()
	dra := register(t, e.registrar)
	share := e.startDevicePlugins(t, d)

	// The controller assigned 60 GiB and 75% of GPU 3; the pod is bound.
	uuid := gpu.FakeUUID(e.name, 3)
	pod, err := client.CoreV1().Pods(ns).Create(ctx, sharePod(ns, "train", e.name, assignment.Assignment{
		GPUs: []int{3}, UUIDs: []string{uuid}, MemoryBytes: 60 << 30, ComputeMilli: 750, Sharing: assignment.SharingMPS,
	}), metav1.CreateOptions{})
	require.NoError(t, err)

	// The kubelet admits it: Allocate over the plugin's socket.
	resp, err := allocateShare(ctx, share, "gpu-3-slot-0")
	require.NoError(t, err)
	require.Len(t, resp.CdiDevices, 1)
	cdiID := resp.CdiDevices[0].Name
	env := envOf(t, readSpec(t, e.cdi, string(pod.UID)))
	assert.Equal(t, uuid+"=61440M", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	assert.Equal(t, "75", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
	assert.Equal(t, uuid, env["NVIDIA_VISIBLE_DEVICES"])
	assert.Equal(t, []string{"start_" + uuid}, drivertest.Record(t, e.record), "the MPS daemon, as for a claim")

	ck := readCheckpoint(t, e)
	require.Contains(t, ck.DevicePlugin, string(pod.UID))
	entry := ck.DevicePlugin[string(pod.UID)]
	assert.Equal(t, driver.StatePrepared, entry.State)
	assert.Equal(t, ns, entry.Namespace)
	assert.Equal(t, "train", entry.Name)
	assert.Equal(t, assignment.ResourceShare, entry.Resource)
	require.Len(t, entry.Devices, 1)
	assert.Equal(t, uuid, entry.Devices[0].GPUUUID)
	assert.Equal(t, uint64(60<<30), entry.Devices[0].MemoryBytes)
	assert.Equal(t, "MPS", entry.Devices[0].Strategy)
	assert.Equal(t, cdiID, entry.Devices[0].CDIDeviceID)

	// A DRA claim for 30 GiB of the same GPU does not fit next to it.
	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "half", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-3", "30Gi"),
	}, drivertest.Strategy("MPS")))
	res, err := dra.prepare(ctx, claim)
	require.NoError(t, err)
	assert.Contains(t, res[string(claim.UID)].Error, "pod deviceplugin/train (device plugin)")
	assert.Contains(t, res[string(claim.UID)].Error, "over-committed")

	// The pod is deleted: its entry, CDI spec and MPS client go, and the
	// claim is prepared.
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "train", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	require.Eventually(t, func() bool { return len(readCheckpoint(t, e).DevicePlugin) == 0 }, 30*time.Second, 50*time.Millisecond)
	_, err = readSpecErr(e.cdi, string(pod.UID))
	assert.True(t, os.IsNotExist(err), "the pod's CDI spec is removed")
	dra.mustPrepare(t, claim)
	dra.mustUnprepare(t, claim)
}

// TestDevicePluginSurvivesRestart runs the tessera-node binary: a share
// allocated through the device plugin survives a crash (the ledger is
// reloaded and still holds the GPU); a pod deleted while tessera-node is
// down is released when it starts again.
func TestDevicePluginSurvivesRestart(t *testing.T) {
	ns := "deviceplugin-restart"
	c, client, e := kwokNode(t, "dp-restart", "h100-sxm-8", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	draSocket := filepath.Join(e.plugins, "dra.sock")
	uuid := gpu.FakeUUID(e.name, 5)
	pod, err := client.CoreV1().Pods(ns).Create(ctx, sharePod(ns, "infer", e.name, assignment.Assignment{
		GPUs: []int{5}, MemoryBytes: 50 << 30, ComputeMilli: 500, Sharing: assignment.SharingTimeSlicing,
	}), metav1.CreateOptions{})
	require.NoError(t, err)

	k := e.startDevicePluginKubelet(t)
	p := e.spawn(t, c.KubeconfigPath, nil)
	resp, err := allocateShare(ctx, e.shareClient(t, k), "gpu-5-slot-3")
	require.NoError(t, err)
	require.Len(t, resp.CdiDevices, 1)
	env := envOf(t, readSpec(t, e.cdi, string(pod.UID)))
	assert.Equal(t, "TimeSlicing", env["TESSERA_SHARING"])
	assert.Equal(t, "Default", env["TESSERA_TIMESLICE_INTERVAL"])
	assert.Equal(t, uuid, env["NVIDIA_VISIBLE_DEVICES"])

	// Crash, restart: the entry is still there and still holds the GPU.
	require.NoError(t, p.cmd.Process.Kill())
	_ = p.wait(t, 30*time.Second)
	os.Remove(draSocket)
	p = e.spawn(t, c.KubeconfigPath, nil)
	require.Contains(t, readCheckpoint(t, e).DevicePlugin, string(pod.UID))
	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "big", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-5", "40Gi"),
	}, drivertest.Strategy("TimeSlicing")))
	dra := direct(t, draSocket)
	res, err := dra.prepare(ctx, claim)
	require.NoError(t, err)
	assert.Contains(t, res[string(claim.UID)].Error, "pod deviceplugin-restart/infer (device plugin)")
	_, err = readSpecErr(e.cdi, string(pod.UID))
	require.NoError(t, err, "the pod's CDI spec is kept across the restart")

	// Down again; the pod is deleted meanwhile; the start releases it.
	p.stop(t)
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "infer", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	require.Eventually(t, func() bool {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "infer", metav1.GetOptions{})
		return ignoreNotFound(err) == nil && err != nil
	}, 30*time.Second, 50*time.Millisecond)
	os.Remove(draSocket)
	p = e.spawn(t, c.KubeconfigPath, nil)
	dra = direct(t, draSocket)
	require.Eventually(t, func() bool { return len(readCheckpoint(t, e).DevicePlugin) == 0 }, 30*time.Second, 50*time.Millisecond)
	_, err = readSpecErr(e.cdi, string(pod.UID))
	assert.True(t, os.IsNotExist(err), "the pod's CDI spec is removed")
	dra.mustPrepare(t, claim)
	dra.mustUnprepare(t, claim)
	p.stop(t)
}

// dpTaints reads the device-plugin taint of each GPU of a slice ("" for
// none) and whether it also carries the unhealthy taint.
func dpTaints(slices []resourceapi.ResourceSlice) (held map[string]string, unhealthy map[string]bool) {
	held, unhealthy = map[string]string{}, map[string]bool{}
	for name, d := range sliceDevices(slices) {
		held[name] = ""
		for _, t := range d.Taints {
			switch t.Key {
			case driver.TaintDevicePlugin:
				held[name] = t.Value
			case driver.TaintUnhealthy:
				unhealthy[name] = true
			}
		}
	}
	return held, unhealthy
}

// dpPods reads the node's record of each GPU's whole-GPU device-plugin
// holder (driver.AttrDevicePluginPod; "" for none).
func dpPods(slices []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for name, d := range sliceDevices(slices) {
		out[name] = ""
		if a, ok := d.Attributes[driver.AttrDevicePluginPod]; ok && a.StringValue != nil {
			out[name] = *a.StringValue
		}
	}
	return out
}

// TestDevicePluginTaints: a pod bound by another scheduler (no assignment)
// gets whole GPUs, one Allocate per container; every GPU the device plugin
// holds carries the NoSchedule taint gpu.tessera.dev/device-plugin in the
// published slice (whole or shared, next to the unhealthy taint), a GPU
// held whole names its pod's UID (the node's record the controller counts),
// a claim on it is refused naming the pod, and the pod's deletion removes the
// taints and the record.
func TestDevicePluginTaints(t *testing.T) {
	ns := "deviceplugin-taint"
	_, client, e := kwokNode(t, "dp-taint", "a100-pcie-4", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	d := e.start(t, nil)
	defer d.Stop()
	dra := register(t, e.registrar)
	share, whole := e.startDevicePluginClients(t, d)
	uuid := func(i int) string { return gpu.FakeUUID(e.name, i) }

	// Bound by kube-scheduler: two containers with one GPU each, no
	// assignment.
	oneGPU := corev1.ResourceRequirements{Limits: corev1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("1")}}
	plain, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: corev1.PodSpec{NodeName: e.name, Containers: []corev1.Container{
			{Name: "a", Image: "busybox", Resources: oneGPU}, {Name: "b", Image: "busybox", Resources: oneGPU},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.CoreV1().Pods(ns).Create(ctx, sharePod(ns, "share", e.name, assignment.Assignment{
		GPUs: []int{3}, MemoryBytes: 10 << 30, ComputeMilli: 250, Sharing: assignment.SharingMPS,
	}), metav1.CreateOptions{})
	require.NoError(t, err)

	for _, ids := range [][]string{{uuid(0)}, {uuid(1)}} {
		resp, err := allocateIDs(ctx, whole, ids...)
		require.NoError(t, err, "container with %v", ids)
		require.Len(t, resp.CdiDevices, 1)
	}
	entry := readCheckpoint(t, e).DevicePlugin[string(plain.UID)]
	require.NotNil(t, entry, "one entry for the pod")
	assert.Equal(t, []string{uuid(0), uuid(1)}, entry.DeviceIDs)
	_, err = allocateShare(ctx, share, "gpu-0-slot-0")
	require.NoError(t, err)

	want := map[string]string{"gpu-0": "whole", "gpu-1": "whole", "gpu-2": "", "gpu-3": "shared"}
	wantPods := map[string]string{"gpu-0": string(plain.UID), "gpu-1": string(plain.UID), "gpu-2": "", "gpu-3": ""}
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		held, _ := dpTaints(s)
		return assert.ObjectsAreEqual(want, held) && assert.ObjectsAreEqual(wantPods, dpPods(s))
	})

	// With the unhealthy taint on the same GPU.
	require.NoError(t, e.fake.Remove(3))
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		held, unhealthy := dpTaints(s)
		return assert.ObjectsAreEqual(want, held) && unhealthy["gpu-3"]
	})
	require.NoError(t, e.fake.Recover(3))

	// A claim kube-scheduler might still place there (DRADeviceTaints off)
	// is refused by the ledger, naming the pod.
	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "on-1", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-1", ""),
	}))
	res, err := dra.prepare(ctx, claim)
	require.NoError(t, err)
	assert.Contains(t, res[string(claim.UID)].Error, "held whole by pod deviceplugin-taint/plain (device plugin)")

	// Deleting the pods removes their taints.
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "plain", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	want = map[string]string{"gpu-0": "", "gpu-1": "", "gpu-2": "", "gpu-3": "shared"}
	wantPods = map[string]string{"gpu-0": "", "gpu-1": "", "gpu-2": "", "gpu-3": ""}
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		held, unhealthy := dpTaints(s)
		return assert.ObjectsAreEqual(want, held) && !unhealthy["gpu-3"] && assert.ObjectsAreEqual(wantPods, dpPods(s))
	})
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "share", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		for _, d := range sliceDevices(s) {
			if len(d.Taints) > 0 {
				return false
			}
		}
		return len(s) > 0
	})
	dra.mustPrepare(t, claim)
	dra.mustUnprepare(t, claim)
}

// TestDevicePluginClaimGoneBeforeUnprepare: the controller frees a GPU once
// the API server no longer has its claim, but the kubelet unprepares the
// claim only at the pod's teardown, seconds later. A device-plugin pod
// admitted in between (a share, or whole GPUs) gets the GPU: Allocate, on
// the ledger's conflict, unprepares the claims the API server no longer has
// and retries. A claim still allocated here is never given away.
func TestDevicePluginClaimGoneBeforeUnprepare(t *testing.T) {
	ns := "deviceplugin-race"
	_, client, e := kwokNode(t, "dp-race", "h100-sxm-8", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	d := e.start(t, nil)
	defer d.Stop()
	dra := register(t, e.registrar)
	share, whole := e.startDevicePluginClients(t, d)
	uuid := func(i int) string { return gpu.FakeUUID(e.name, i) }

	// Whole-GPU claims on GPUs 2, 3 and 4, prepared by the kubelet.
	claims := map[int]*resourceapi.ResourceClaim{}
	for _, i := range []int{2, 3, 4} {
		claims[i] = createAllocatedClaim(t, client, drivertest.Claim(ns, fmt.Sprintf("on-%d", i), "", []resourceapi.DeviceRequestAllocationResult{
			drivertest.Result("gpu", e.name, fmt.Sprintf("gpu-%d", i), ""),
		}))
		dra.mustPrepare(t, claims[i])
	}
	// The pods of 2 and 3 are gone, and so are their claims; the kubelet
	// has not unprepared them yet.
	for _, i := range []int{2, 3} {
		require.NoError(t, client.ResourceV1().ResourceClaims(ns).Delete(ctx, claims[i].Name, metav1.DeleteOptions{}))
	}

	oneGPU := corev1.ResourceRequirements{Limits: corev1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("1")}}
	for _, p := range []*corev1.Pod{
		sharePod(ns, "share", e.name, assignment.Assignment{GPUs: []int{2}, MemoryBytes: 10 << 30, ComputeMilli: 250, Sharing: assignment.SharingMPS}),
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whole"}, Spec: corev1.PodSpec{NodeName: e.name, Containers: []corev1.Container{{Name: "c", Image: "busybox", Resources: oneGPU}}}},
	} {
		_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err := allocateShare(ctx, share, "gpu-2-slot-0")
	require.NoError(t, err, "a share on the GPU of a claim gone from the API server")
	_, err = allocateIDs(ctx, whole, uuid(3))
	require.NoError(t, err, "a whole GPU of a claim gone from the API server")
	ck := readCheckpoint(t, e)
	assert.NotContains(t, ck.Claims, string(claims[2].UID))
	assert.NotContains(t, ck.Claims, string(claims[3].UID))
	for _, i := range []int{2, 3} {
		_, err := readSpecErr(e.cdi, string(claims[i].UID))
		assert.True(t, os.IsNotExist(err), "the CDI spec of the gone claim on GPU %d is removed", i)
	}

	// A share on GPU 4, whose claim the API server still has: refused, and
	// the claim keeps its GPU.
	_, err = client.CoreV1().Pods(ns).Create(ctx, sharePod(ns, "share-live", e.name, assignment.Assignment{
		GPUs: []int{4}, MemoryBytes: 10 << 30, ComputeMilli: 250, Sharing: assignment.SharingMPS,
	}), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = allocateShare(ctx, share, "gpu-4-slot-0")
	require.ErrorContains(t, err, "held whole by ResourceClaim "+ns+"/on-4")
	assert.Contains(t, readCheckpoint(t, e).Claims, string(claims[4].UID))
	_, err = readSpecErr(e.cdi, string(claims[4].UID))
	require.NoError(t, err, "the live claim's CDI spec is kept")
	dra.mustUnprepare(t, claims[2], claims[3], claims[4])
}
