package realgpu

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/sharing"
)

const dpNode = "realgpu-node"

// registrar is the kubelet's Registration service: the device plugins
// serve only once kubelet.sock is there.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
}

func (registrar) Register(context.Context, *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	return &pluginapi.Empty{}, nil
}

// dpPod is a pod bound to the node whose one container asks for count of
// resource, with the controller's assignment.
func dpPod(name, resourceName string, a assignment.Assignment, boundAt time.Time) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{assignment.Annotation: a.String()}},
		Spec: corev1.PodSpec{NodeName: dpNode, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceName(resourceName): *resource.NewQuantity(int64(max(len(a.GPUs), 1)), resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(boundAt),
		}}},
	}
}

// TestDevicePluginShares runs the device-plugin path on the real GPU: two
// pods with MPS share assignments (what tessera-controller writes for
// `tessera.dev/gpu-fraction`/`gpu-memory` pods) are allocated over the
// plugin's real socket, as the kubelet does; a CUDA program started with the
// CDI devices of each Allocate response sees that pod's memory and SM limits,
// both at once, through the one MPS daemon the driver's ledger started. Then
// the shares are released by deleting the pods (the MPS daemon quits, the
// compute mode is restored) and a whole-GPU pod gets the GPU whole.
//
// The pods come from a fake clientset: this check is about the GPU; the
// Kubernetes side of the same path runs against a real kubelet and API
// server in test/e2e/realnode.
func TestDevicePluginShares(t *testing.T) {
	inv, g := realGPU(t)
	probeBinary(t)
	if _, err := exec.LookPath(sharing.DefaultMPSControl); err != nil {
		t.Fatalf("%s not on PATH on a GPU machine: %v", sharing.DefaultMPSControl, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	shares := []struct {
		name    string
		memory  uint64
		compute int64 // milli; the plugin gives computeMilli/10 percent, rounded up
	}{
		{"share-a", 6 * gib, 250},
		{"share-b", 10 * gib, 125},
	}
	now := time.Now()
	client := fake.NewClientset()
	for i, s := range shares {
		a := assignment.Assignment{GPUs: []int{g.Index}, UUIDs: []string{g.UUID}, MemoryBytes: int64(s.memory),
			ComputeMilli: s.compute, Sharing: assignment.SharingMPS}
		_, err := client.CoreV1().Pods("ns").Create(ctx, dpPod(s.name, assignment.ResourceShare, a, now.Add(time.Duration(i-10)*time.Second)), metav1.CreateOptions{})
		require.NoError(t, err)
	}

	dir := drivertest.ShortTempDir(t)
	dpDir, cdiRoot := filepath.Join(dir, "dp"), filepath.Join(dir, "cdi")
	require.NoError(t, os.MkdirAll(dpDir, 0o750))
	bootID := filepath.Join(dir, "boot_id")
	require.NoError(t, os.WriteFile(bootID, []byte("boot\n"), 0o644))
	drv, err := driver.Start(ctx, driver.Options{
		NodeName: dpNode, KubeClient: client, Inventory: inv,
		RegistrarDir: filepath.Join(dir, "reg"), PluginDataDir: filepath.Join(dir, "plugins"),
		CDI:        cdi.Options{Root: cdiRoot},
		MPS:        &sharing.MPSOptions{Root: filepath.Join(dir, "mps"), CheckInterval: 100 * time.Millisecond},
		BootIDPath: bootID,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		// Leave the GPU as found even when an assertion failed half-way.
		for _, p := range drv.PodAllocations() {
			_, _ = drv.ReleasePod(context.Background(), p.UID)
		}
		drv.Stop()
		_ = inv.SetComputeMode(g.UUID, gpu.ComputeModeDefault)
	})

	lis, err := net.Listen("unix", filepath.Join(dpDir, "kubelet.sock"))
	require.NoError(t, err)
	kubelet := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(kubelet, registrar{})
	go func() { _ = kubelet.Serve(lis) }()
	t.Cleanup(kubelet.Stop)
	mgr, err := deviceplugin.Start(ctx, deviceplugin.Options{
		NodeName: dpNode, KubeClient: client, Inventory: inv, Ledger: drv, Dir: dpDir,
		CheckInterval: 50 * time.Millisecond, ResyncInterval: time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(mgr.Stop)
	dial := func(socket string) pluginapi.DevicePluginClient {
		conn, err := grpc.NewClient("unix://"+filepath.Join(dpDir, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return pluginapi.NewDevicePluginClient(conn)
	}
	// The kubelet admits the pods one at a time, oldest first; slot IDs
	// say nothing about the GPU.
	shareSock := dial(deviceplugin.ShareSocket)
	envs := make([][]string, len(shares))
	for i := range shares {
		envs[i] = containerEnv(t, cdiRoot, allocate(t, shareSock, deviceplugin.SlotID(g.Index, i))...)
	}
	assert.Equal(t, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, computeMode(t, inv, g.UUID))
	require.Len(t, drv.PodAllocations(), 2)

	clients := make([]mpsClient, len(shares))
	for i, s := range shares {
		clients[i] = mpsClient{name: s.name, env: envs[i], memory: s.memory, percent: int((s.compute + 9) / 10)}
	}
	checkMPSLimits(t, g, clients)

	// Deleting a pod releases its share; the daemon stays for the other.
	require.NoError(t, client.CoreV1().Pods("ns").Delete(ctx, "share-a", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(drv.PodAllocations()) == 1 }, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, computeMode(t, inv, g.UUID))
	p := runProbe(t, envs[1], shares[1].memory-512*mib, 0)
	assert.Equal(t, "no error", p.Alloc, "the remaining share after its neighbour left")

	// The last share goes: MPS off, the GPU whole again.
	require.NoError(t, client.CoreV1().Pods("ns").Delete(ctx, "share-b", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(drv.PodAllocations()) == 0 }, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return computeMode(t, inv, g.UUID) == nvml.COMPUTEMODE_DEFAULT }, 10*time.Second, 50*time.Millisecond)

	// A whole-GPU pod (nvidia.com/gpu: 1) gets all of it.
	_, err = client.CoreV1().Pods("ns").Create(ctx, dpPod("whole", assignment.DefaultResourceGPU, assignment.Assignment{GPUs: []int{g.Index}, UUIDs: []string{g.UUID}}, time.Now()), metav1.CreateOptions{})
	require.NoError(t, err)
	env := containerEnv(t, cdiRoot, allocate(t, dial(deviceplugin.GPUSocket), g.UUID)...)
	assert.Contains(t, env, cdi.EnvNvidiaVisibleDevices+"="+g.UUID)
	p = runProbe(t, env, 0, 0)
	assert.Equal(t, g.Multiprocessors, p.SMs, "a whole GPU: every SM")
	assert.Greater(t, p.Free, 16*gib)
	t.Logf("whole: %+v", p)
}

// allocate calls Allocate for one container as the kubelet does and returns
// the CDI devices of the answer, retrying while the plugin's pod informer has
// not seen the pod yet (the kubelet retries such a pod too).
func allocate(t *testing.T, c pluginapi.DevicePluginClient, ids ...string) []string {
	t.Helper()
	var out []string
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}, grpc.WaitForReady(true))
		if err != nil {
			t.Logf("Allocate %v: %v", ids, err)
			return false
		}
		for _, d := range resp.ContainerResponses[0].CdiDevices {
			out = append(out, d.Name)
		}
		return len(out) > 0
	}, 20*time.Second, 200*time.Millisecond)
	return out
}
