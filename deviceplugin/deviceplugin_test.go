package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/sharing"
)

const nodeName = "dp-node"

// fakeKubelet is the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv *grpc.Server
	mu  sync.Mutex
	reg []*pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reg = append(k.reg, r)
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*pluginapi.RegisterRequest(nil), k.reg...)
}

// startKubelet serves a fresh kubelet.sock in dir (replacing any old one, as
// a restarted kubelet does).
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	k := &fakeKubelet{srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	t.Cleanup(k.srv.Stop)
	return k
}

// env is a tessera-node in this process: the DRA driver (the ledger) on a
// fake API server and the device plugins on a fake kubelet.
type env struct {
	dir, dpDir, cdiRoot string
	fake                *gpu.Fake
	client              kubernetes.Interface
	drv                 *driver.Driver
	mgr                 *Manager
	kubelet             *fakeKubelet
	record              string
	reg                 *prometheus.Registry
}

// metric is the value of a counter or gauge with the given labels, 0 when absent.
func (e *env) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func newEnv(t *testing.T, pods ...*corev1.Pod) *env {
	t.Helper()
	dir := drivertest.ShortTempDir(t)
	e := &env{dir: dir, dpDir: filepath.Join(dir, "dp"), cdiRoot: filepath.Join(dir, "cdi"), reg: prometheus.NewRegistry()}
	require.NoError(t, os.MkdirAll(e.dpDir, 0o750))
	f, err := gpu.NewFake("h100-sxm-8", nodeName, gpu.WithHealthProbeInterval(20*time.Millisecond), gpu.WithRecoveryQuietPeriod(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	e.fake = f
	client := fake.NewClientset()
	for _, p := range pods {
		_, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	e.client = client
	bootID := filepath.Join(dir, "boot_id")
	require.NoError(t, os.WriteFile(bootID, []byte("boot\n"), 0o644))
	control, record := drivertest.MPSStandIn(t, dir)
	e.record = record
	e.drv, err = driver.Start(context.Background(), driver.Options{
		NodeName: nodeName, KubeClient: client, Inventory: f,
		RegistrarDir: filepath.Join(dir, "reg"), PluginDataDir: filepath.Join(dir, "plugins"),
		CDI:        cdi.Options{Root: e.cdiRoot, Fake: true},
		MPS:        &sharing.MPSOptions{Control: control, Root: filepath.Join(dir, "mps"), Env: []string{drivertest.RecordEnv + "=" + record}},
		BootIDPath: bootID,
		Registerer: e.reg,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, p := range e.drv.PodAllocations() {
			_, _ = e.drv.ReleasePod(context.Background(), p.UID)
		}
		e.drv.Stop()
	})
	e.kubelet = startKubelet(t, e.dpDir)
	e.startPlugins(t)
	return e
}

func (e *env) startPlugins(t *testing.T) {
	t.Helper()
	m, err := Start(context.Background(), Options{
		NodeName: nodeName, KubeClient: e.client, Inventory: e.fake, Ledger: e.drv,
		Dir: e.dpDir, CheckInterval: 20 * time.Millisecond, ResyncInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(m.Stop)
	e.mgr = m
}

func (e *env) dial(t *testing.T, socket string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.dpDir, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// waitRegistered waits until the kubelet got n registrations of each plugin.
func waitRegistered(t *testing.T, k *fakeKubelet, n int) []*pluginapi.RegisterRequest {
	t.Helper()
	require.Eventually(t, func() bool { return len(k.registrations()) >= 2*n }, 10*time.Second, 10*time.Millisecond)
	return k.registrations()
}

// pod is a pod bound to the node whose container requests count of
// resource, with an assignment annotation (raw, when not empty).
func pod(name, resourceName string, count int64, a *assignment.Assignment, raw string, boundAt time.Time) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceName(resourceName): *resource.NewQuantity(count, resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(boundAt),
		}}},
	}
	if a != nil {
		p.Annotations[assignment.Annotation] = a.String()
	}
	if raw != "" {
		p.Annotations[assignment.Annotation] = raw
	}
	return p
}

func uuid(i int) string { return gpu.FakeUUID(nodeName, i) }

func TestRegisterListAndWatchHealth(t *testing.T) {
	e := newEnv(t)
	regs := waitRegistered(t, e.kubelet, 1)
	byRes := map[string]*pluginapi.RegisterRequest{}
	for _, r := range regs {
		byRes[r.ResourceName] = r
	}
	require.Contains(t, byRes, "nvidia.com/gpu")
	require.Contains(t, byRes, "tessera.dev/gpu-share")
	assert.Equal(t, pluginapi.Version, byRes["nvidia.com/gpu"].Version)
	assert.Equal(t, GPUSocket, byRes["nvidia.com/gpu"].Endpoint)
	assert.True(t, byRes["nvidia.com/gpu"].Options.GetPreferredAllocationAvailable)
	assert.Equal(t, ShareSocket, byRes["tessera.dev/gpu-share"].Endpoint)
	assert.False(t, byRes["tessera.dev/gpu-share"].Options.GetPreferredAllocationAvailable)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	whole, err := e.dial(t, GPUSocket).ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	share, err := e.dial(t, ShareSocket).ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)

	health := func(devs []*pluginapi.Device) map[string]string {
		out := map[string]string{}
		for _, d := range devs {
			out[d.ID] = d.Health
		}
		return out
	}
	w, err := whole.Recv()
	require.NoError(t, err)
	require.Len(t, w.Devices, 8)
	assert.Equal(t, uuid(0), w.Devices[0].ID)
	assert.Equal(t, pluginapi.Healthy, w.Devices[5].Health)
	require.NotNil(t, w.Devices[5].Topology, "NUMA node known")
	assert.Equal(t, int64(1), w.Devices[5].Topology.Nodes[0].ID)
	s, err := share.Recv()
	require.NoError(t, err)
	require.Len(t, s.Devices, 80, "10 slots per GPU")
	assert.Equal(t, pluginapi.Healthy, health(s.Devices)["gpu-3-slot-9"])

	// A critical XID: GPU 3 and all its slots turn Unhealthy.
	require.NoError(t, e.fake.InjectXID(3, 48))
	w, err = whole.Recv()
	require.NoError(t, err)
	assert.Equal(t, pluginapi.Unhealthy, health(w.Devices)[uuid(3)])
	assert.Equal(t, pluginapi.Healthy, health(w.Devices)[uuid(2)])
	s, err = share.Recv()
	require.NoError(t, err)
	for slot := range 10 {
		assert.Equal(t, pluginapi.Unhealthy, health(s.Devices)[SlotID(3, slot)])
	}
	assert.Equal(t, pluginapi.Healthy, health(s.Devices)["gpu-4-slot-0"])

	// Recovery: Healthy again.
	require.NoError(t, e.fake.Recover(3))
	w, err = whole.Recv()
	require.NoError(t, err)
	assert.Equal(t, pluginapi.Healthy, health(w.Devices)[uuid(3)])
	s, err = share.Recv()
	require.NoError(t, err)
	assert.Equal(t, pluginapi.Healthy, health(s.Devices)["gpu-3-slot-0"])

	// A GPU that falls off the bus is reported, nothing crashes.
	require.NoError(t, e.fake.Remove(6))
	w, err = whole.Recv()
	require.NoError(t, err)
	assert.Equal(t, pluginapi.Unhealthy, health(w.Devices)[uuid(6)])
}

func TestKubeletRestart(t *testing.T) {
	e := newEnv(t)
	waitRegistered(t, e.kubelet, 1)

	// The kubelet restarts: a new kubelet.sock, and it removes the plugins'
	// sockets.
	e.kubelet.srv.Stop()
	require.NoError(t, os.Remove(filepath.Join(e.dpDir, GPUSocket)))
	require.NoError(t, os.Remove(filepath.Join(e.dpDir, ShareSocket)))
	k2 := startKubelet(t, e.dpDir)
	regs := waitRegistered(t, k2, 1)
	names := []string{regs[0].ResourceName, regs[1].ResourceName}
	assert.ElementsMatch(t, []string{"nvidia.com/gpu", "tessera.dev/gpu-share"}, names)

	// The plugin serves again on its socket.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts, err := e.dial(t, GPUSocket).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	require.NoError(t, err)
	assert.True(t, opts.GetPreferredAllocationAvailable)

	// Only kubelet.sock replaced (sockets kept): registers again too.
	k3 := startKubelet(t, e.dpDir)
	waitRegistered(t, k3, 1)
	// The round is counted after its last registration reached the kubelet.
	assert.Eventually(t, func() bool { return e.mgr.Registrations() >= 3 }, 5*time.Second, 10*time.Millisecond)
}

// TestRegisteredFollowsKubelet: Registered (tessera_node_plugin_registered
// {plugin="deviceplugin"}, alerted on by the chart) is true once both
// plugins registered, false while kubelet.sock is gone, and true again when
// a new kubelet's socket appears and the plugins register with it.
func TestRegisteredFollowsKubelet(t *testing.T) {
	e := newEnv(t)
	waitRegistered(t, e.kubelet, 1)
	require.Eventually(t, e.mgr.Registered, 5*time.Second, 10*time.Millisecond, "registered with the first kubelet")

	e.kubelet.srv.Stop() // closing the listener unlinks kubelet.sock
	_ = os.Remove(filepath.Join(e.dpDir, "kubelet.sock"))
	require.Eventually(t, func() bool { return !e.mgr.Registered() }, 5*time.Second, 10*time.Millisecond, "not registered without a kubelet")

	k2 := startKubelet(t, e.dpDir)
	waitRegistered(t, k2, 1)
	require.Eventually(t, e.mgr.Registered, 5*time.Second, 10*time.Millisecond, "registered with the new kubelet")
}

func allocate(ctx context.Context, c pluginapi.DevicePluginClient, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

func specEnv(t *testing.T, cdiRoot, uid string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cdiRoot, "gpu.tessera.dev-claim_"+uid+".json"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\"") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.ContainsAny(k, " {}:,") && k != "" {
			out[k] = v
		}
	}
	return out
}

func TestAllocate(t *testing.T) {
	const gi = int64(1) << 30
	now := time.Now()
	share := &assignment.Assignment{GPUs: []int{3}, UUIDs: []string{uuid(3)}, MemoryBytes: 20 * gi, ComputeMilli: 250, Sharing: assignment.SharingMPS}
	whole := &assignment.Assignment{GPUs: []int{4, 5}}
	e := newEnv(t,
		pod("share", assignment.ResourceShare, 1, share, "", now.Add(-time.Minute)),
		pod("younger-share", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{3}, MemoryBytes: 70 * gi, ComputeMilli: 800, Sharing: assignment.SharingMPS}, "", now),
		pod("whole", "nvidia.com/gpu", 2, whole, "", now),
		pod("plain", "nvidia.com/gpu", 1, nil, "", now), // no annotation: bound by another scheduler
	)
	waitRegistered(t, e.kubelet, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, wc := e.dial(t, ShareSocket), e.dial(t, GPUSocket)

	// The oldest share pod gets the first share.
	resp, err := allocate(ctx, sc, "gpu-0-slot-0")
	require.NoError(t, err)
	require.Len(t, resp.CdiDevices, 1)
	assert.True(t, strings.HasPrefix(resp.CdiDevices[0].Name, "gpu.tessera.dev/claim=uid-share_"), resp.CdiDevices[0].Name)
	env := specEnv(t, e.cdiRoot, "uid-share")
	assert.Equal(t, uuid(3)+"=20480M", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	assert.Equal(t, "25", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
	assert.Equal(t, "MPS", env["TESSERA_SHARING"])
	assert.Equal(t, []string{"start_" + uuid(3)}, drivertest.Record(t, e.record))
	entries := e.drv.PodAllocations()
	require.Len(t, entries, 1)
	assert.Equal(t, "uid-share", entries[0].UID)
	assert.Equal(t, []string{"gpu-0-slot-0"}, entries[0].DeviceIDs)

	// The next share pod does not fit next to it: refused naming the holder.
	_, err = allocate(ctx, sc, "gpu-0-slot-1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pod ns/younger-share refused on gpu-3")
	assert.Contains(t, err.Error(), "pod ns/share (device plugin)")

	// Whole GPUs: the preferred allocation is the assignment's GPUs.
	all := make([]string, 8)
	for i := range all {
		all[i] = uuid(i)
	}
	pref, err := wc.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: all, AllocationSize: 2,
	}}})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{uuid(4), uuid(5)}, pref.ContainerResponses[0].DeviceIDs)
	// Without a pod of that size: NVLink best effort, of the size asked.
	pref, err = wc.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: all, MustIncludeDeviceIDs: []string{uuid(7)}, AllocationSize: 4,
	}}})
	require.NoError(t, err)
	assert.Len(t, pref.ContainerResponses[0].DeviceIDs, 4)
	assert.Contains(t, pref.ContainerResponses[0].DeviceIDs, uuid(7))

	// A whole GPU the share holds is refused; the assigned ones are not.
	_, err = allocate(ctx, wc, uuid(3), uuid(5))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "pod ns/share (device plugin)")
	resp, err = allocate(ctx, wc, uuid(4), uuid(5))
	require.NoError(t, err)
	require.Len(t, resp.CdiDevices, 2)
	env = specEnv(t, e.cdiRoot, "uid-whole")
	assert.Equal(t, "Exclusive", env["TESSERA_SHARING"])

	// A pod without an assignment gets whole GPUs as NVIDIA's device
	// plugin would give them: the kubelet's.
	resp, err = allocate(ctx, wc, uuid(0))
	require.NoError(t, err)
	require.Len(t, resp.CdiDevices, 1)
	assert.True(t, strings.HasPrefix(resp.CdiDevices[0].Name, "gpu.tessera.dev/claim=uid-plain_"), resp.CdiDevices[0].Name)
	assert.Equal(t, uuid(0), specEnv(t, e.cdiRoot, "uid-plain")["NVIDIA_VISIBLE_DEVICES"])

	// No pod left awaiting whole GPUs.
	_, err = allocate(ctx, wc, uuid(1))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no pod bound to node dp-node awaits nvidia.com/gpu (a container requesting 1, in a pod whose GPUs are not all allocated yet)")

	shareLabels := map[string]string{"resource": assignment.ResourceShare}
	assert.Equal(t, 1.0, e.metric(t, "tessera_node_deviceplugin_allocations_total", shareLabels))
	assert.Equal(t, 1.0, e.metric(t, "tessera_node_deviceplugin_refusals_total", map[string]string{"resource": assignment.ResourceShare, "reason": "conflict"}))
	assert.Equal(t, 1.0, e.metric(t, "tessera_node_deviceplugin_refusals_total", map[string]string{"resource": "nvidia.com/gpu", "reason": "no_pod"}))
	assert.Equal(t, 2.0, e.metric(t, "tessera_node_deviceplugin_pods", map[string]string{"resource": "nvidia.com/gpu"}))
	assert.Equal(t, float64(20<<30), e.metric(t, "tessera_node_gpu_memory_allocated_bytes", map[string]string{"gpu": "gpu-3"}))
	assert.Equal(t, float64(80<<30), e.metric(t, "tessera_node_gpu_memory_allocated_bytes", map[string]string{"gpu": "gpu-4"}))

	// Deleting the pod releases its GPU: the younger share now fits.
	require.NoError(t, e.client.CoreV1().Pods("ns").Delete(ctx, "share", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(e.drv.PodAllocations()) == 2 }, 10*time.Second, 20*time.Millisecond)
	_, err = os.Stat(filepath.Join(e.cdiRoot, "gpu.tessera.dev-claim_uid-share.json"))
	assert.True(t, os.IsNotExist(err), "CDI spec removed")
	_, err = allocate(ctx, sc, "gpu-0-slot-1")
	require.NoError(t, err)
	assert.Equal(t, 1.0, e.metric(t, "tessera_node_deviceplugin_releases_total", shareLabels))

	// A finished pod releases too.
	w, err := e.client.CoreV1().Pods("ns").Get(ctx, "whole", metav1.GetOptions{})
	require.NoError(t, err)
	w.Status.Phase = corev1.PodSucceeded
	_, err = e.client.CoreV1().Pods("ns").UpdateStatus(ctx, w, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(e.drv.PodAllocations()) == 2 }, 10*time.Second, 20*time.Millisecond)
	var uids []string
	for _, p := range e.drv.PodAllocations() {
		uids = append(uids, p.UID)
	}
	assert.Equal(t, []string{"uid-plain", "uid-younger-share"}, uids)
}

// TestAllocateContainers: the kubelet calls Allocate once per container.
// A pod's later containers find the same pod while its entry holds fewer
// GPUs than the pod requests in all, and their GPUs join its entry; an init
// container's GPUs reused by the app container are answered from the entry.
func TestAllocateContainers(t *testing.T) {
	now := time.Now()
	gpus := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	multi := pod("multi", "nvidia.com/gpu", 1, nil, "", now.Add(-time.Minute))
	multi.Spec.Containers = append(multi.Spec.Containers, corev1.Container{Name: "c2", Resources: gpus(2)})
	withInit := pod("init", "nvidia.com/gpu", 2, &assignment.Assignment{GPUs: []int{6, 7}}, "", now)
	withInit.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: gpus(2)}}
	e := newEnv(t, multi, withInit)
	waitRegistered(t, e.kubelet, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := e.dial(t, GPUSocket)
	names := func(r *pluginapi.ContainerAllocateResponse) []string {
		var out []string
		for _, d := range r.CdiDevices {
			out = append(out, d.Name)
		}
		return out
	}
	entry := func(uid string) driver.PodCheckpoint {
		for _, p := range e.drv.PodAllocations() {
			if p.UID == uid {
				return p
			}
		}
		return driver.PodCheckpoint{}
	}

	for _, step := range []struct {
		name    string
		ids     []string
		wantErr string
		// wantPod's entry holds wantHeld afterwards; the answer names the
		// GPUs asked for only.
		wantPod  string
		wantHeld []string
	}{
		{"first container", []string{uuid(0)}, "", "uid-multi", []string{uuid(0)}},
		{"second container, the older of two pods awaiting 2", []string{uuid(1), uuid(2)}, "", "uid-multi", []string{uuid(0), uuid(1), uuid(2)}},
		{"the pod is fully allocated", []string{uuid(3)}, "no pod bound to node dp-node awaits nvidia.com/gpu", "uid-multi", []string{uuid(0), uuid(1), uuid(2)}},
		{"init container", []string{uuid(6), uuid(7)}, "", "uid-init", []string{uuid(6), uuid(7)}},
		{"app container reusing the init container's GPUs", []string{uuid(7), uuid(6)}, "", "uid-init", []string{uuid(6), uuid(7)}},
	} {
		t.Run(step.name, func(t *testing.T) {
			resp, err := allocate(ctx, wc, step.ids...)
			if step.wantErr != "" {
				require.ErrorContains(t, err, step.wantErr)
			} else {
				require.NoError(t, err)
				got := names(resp)
				require.Len(t, got, len(step.ids))
				for i, id := range step.ids {
					assert.True(t, slices.ContainsFunc(got, func(n string) bool { return strings.HasSuffix(n, "_"+id) }), "answer %v names %s", got, step.ids[i])
				}
			}
			assert.Equal(t, step.wantHeld, entry(step.wantPod).DeviceIDs)
		})
	}
	assert.Len(t, e.drv.PodAllocations(), 2, "one entry per pod")
	assert.Equal(t, float64(80<<30), e.metric(t, "tessera_node_gpu_memory_allocated_bytes", map[string]string{"gpu": "gpu-2"}))

	// The pod's deletion releases the GPUs of all its containers.
	require.NoError(t, e.client.CoreV1().Pods("ns").Delete(ctx, "multi", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(e.drv.PodAllocations()) == 1 }, 10*time.Second, 20*time.Millisecond)
	for _, g := range []string{"gpu-0", "gpu-1", "gpu-2"} {
		assert.Zero(t, e.metric(t, "tessera_node_gpu_memory_allocated_bytes", map[string]string{"gpu": g}), g)
	}
}

func TestAllocateErrors(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		resource string
		ids      []string
		want     string
	}{
		{"malformed annotation", pod("bad", assignment.ResourceShare, 1, nil, `{"gpus":[1],"sharing":"MPS"}`, now), ShareSocket, []string{"gpu-1-slot-0"},
			"pod ns/bad: annotation tessera.dev/gpu-assignment: a share needs memoryBytes > 0"},
		{"not JSON", pod("bad", assignment.ResourceShare, 1, nil, `half`, now), ShareSocket, []string{"gpu-1-slot-0"},
			"is not valid JSON"},
		{"GPU index not on the node", pod("far", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{12}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingTimeSlicing}, "", now),
			ShareSocket, []string{"gpu-1-slot-0"}, "names GPU index 12, which node dp-node does not have"},
		{"UUID mismatch", pod("moved", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{2}, UUIDs: []string{"GPU-elsewhere"}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", now),
			ShareSocket, []string{"gpu-1-slot-0"}, "says GPU 2 is GPU-elsewhere, but on node dp-node it is " + uuid(2)},
		{"count differs", pod("two", "nvidia.com/gpu", 2, &assignment.Assignment{GPUs: []int{1, 2}}, "", now),
			GPUSocket, []string{uuid(1)}, "no pod bound to node dp-node awaits nvidia.com/gpu"},
		{"a share pod is not a whole-GPU pod", pod("s", "nvidia.com/gpu", 1, &assignment.Assignment{GPUs: []int{1}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", now),
			GPUSocket, []string{uuid(1)}, "no pod bound to node dp-node awaits nvidia.com/gpu"},
		{"no pod", nil, ShareSocket, []string{"gpu-1-slot-0"},
			"no pod bound to node dp-node awaits tessera.dev/gpu-share with a tessera.dev/gpu-assignment annotation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*corev1.Pod
			if tc.pod != nil {
				pods = append(pods, tc.pod)
			}
			e := newEnv(t, pods...)
			waitRegistered(t, e.kubelet, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := allocate(ctx, e.dial(t, tc.resource), tc.ids...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, e.drv.PodAllocations())
		})
	}
}

func TestAllocateShareOnUnhealthyGPU(t *testing.T) {
	e := newEnv(t, pod("s", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{6}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", time.Now()))
	waitRegistered(t, e.kubelet, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := e.dial(t, ShareSocket).ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	require.NoError(t, e.fake.InjectXID(6, 79))
	_, err = stream.Recv() // the health change is known
	require.NoError(t, err)
	_, err = allocate(ctx, e.dial(t, ShareSocket), "gpu-0-slot-0")
	require.ErrorContains(t, err, "pod ns/s: its assigned GPU 6 ("+uuid(6)+") is unhealthy")
	assert.Empty(t, e.drv.PodAllocations())

	require.NoError(t, e.fake.Recover(6))
	_, err = stream.Recv()
	require.NoError(t, err)
	_, err = allocate(ctx, e.dial(t, ShareSocket), "gpu-0-slot-0")
	require.NoError(t, err)
}

// TestPodOrder: the oldest binding wins; equal binding times go by creation.
func TestPodOrder(t *testing.T) {
	t0 := time.Now().Truncate(time.Second)
	a := pod("a", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{1}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", t0)
	b := pod("b", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{2}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", t0)
	c := pod("c", assignment.ResourceShare, 1, &assignment.Assignment{GPUs: []int{3}, MemoryBytes: 1 << 30, ComputeMilli: 100, Sharing: assignment.SharingMPS}, "", t0.Add(-time.Second))
	a.CreationTimestamp = metav1.NewTime(t0.Add(-time.Minute))
	b.CreationTimestamp = metav1.NewTime(t0.Add(-2 * time.Minute))
	m := &Manager{opts: Options{NodeName: nodeName, Ledger: noLedger{}}}
	p := &plugin{m: m, resource: assignment.ResourceShare}
	got, malformed := p.filter([]*corev1.Pod{a, b, c}, nil, 1)
	assert.Empty(t, malformed)
	var names []string
	for _, x := range got {
		names = append(names, x.pod.Name)
	}
	assert.Equal(t, []string{"c", "b", "a"}, names)
}

type noLedger struct{ Ledger }

func (noLedger) PodAllocations() []driver.PodCheckpoint { return nil }

// TestReconcileAtStart: entries of pods that went away while tessera-node
// was down are released when the device plugin starts; others stay.
func TestReconcileAtStart(t *testing.T) {
	now := time.Now()
	kept := pod("kept", "nvidia.com/gpu", 1, &assignment.Assignment{GPUs: []int{1}}, "", now)
	e := newEnv(t, kept)
	e.mgr.Stop() // tessera-node down: the pod "gone" is deleted meanwhile
	ctx := context.Background()
	_, err := e.drv.AllocatePod(ctx, driver.PodRequest{UID: "uid-kept", Namespace: "ns", Name: "kept", Resource: "nvidia.com/gpu", GPUs: []string{uuid(1)}})
	require.NoError(t, err)
	_, err = e.drv.AllocatePod(ctx, driver.PodRequest{UID: "uid-gone", Namespace: "ns", Name: "gone", Resource: "nvidia.com/gpu", GPUs: []string{uuid(2)}})
	require.NoError(t, err)
	require.Len(t, e.drv.PodAllocations(), 2)
	e.startPlugins(t)
	got := e.drv.PodAllocations()
	require.Len(t, got, 1, "released at start, before serving")
	assert.Equal(t, "uid-kept", got[0].UID)
}

// TestWholeGPUsHeldByClaims: a GPU a ResourceClaim holds, whole or in part,
// leaves the kubelet's allocatable of whole GPUs (reported Unhealthy) and
// the preferred allocations, and comes back when the claim goes; the share
// slots stay, since a share's GPU comes from its assignment.
func TestWholeGPUsHeldByClaims(t *testing.T) {
	e := newEnv(t, pod("whole", "nvidia.com/gpu", 1, nil, "", time.Now()))
	waitRegistered(t, e.kubelet, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.dial(t, GPUSocket)
	whole, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	unhealthy := func() []string {
		t.Helper()
		w, err := whole.Recv()
		require.NoError(t, err)
		var out []string
		for _, d := range w.Devices {
			if d.Health == pluginapi.Unhealthy {
				out = append(out, d.ID)
			}
		}
		return out
	}
	assert.Empty(t, unhealthy())

	excl := drivertest.Claim("ns", "excl", "uid-excl", []resourceapi.DeviceRequestAllocationResult{drivertest.Result("gpu", nodeName, "gpu-2", "")}, drivertest.Strategy("Exclusive"))
	half := drivertest.Claim("ns", "half", "uid-half", []resourceapi.DeviceRequestAllocationResult{drivertest.Result("gpu", nodeName, "gpu-4", "40Gi")}, drivertest.Strategy("MPS"))
	res, err := e.drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{excl, half})
	require.NoError(t, err)
	for uid, r := range res {
		require.NoError(t, r.Err, uid)
	}
	assert.ElementsMatch(t, []string{uuid(2), uuid(4)}, unhealthy())

	all := make([]string, 8)
	for i := range all {
		all[i] = uuid(i)
	}
	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: all, AllocationSize: 6,
	}}})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{uuid(0), uuid(1), uuid(3), uuid(5), uuid(6), uuid(7)}, pref.ContainerResponses[0].DeviceIDs)

	// A whole-GPU device-plugin pod's own GPUs are the kubelet's business:
	// they stay Healthy.
	_, err = allocate(ctx, c, uuid(7))
	require.NoError(t, err)
	_, err = e.drv.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: excl.UID}, {UID: half.UID}})
	require.NoError(t, err)
	assert.Empty(t, unhealthy())
}
