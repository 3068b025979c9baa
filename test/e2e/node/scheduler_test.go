package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
)

// gpuClaim is a claim for one device of class on the GPU of a given index,
// with memory ("" = none asked: the whole GPU).
func gpuClaim(ns, name, class string, index int, memory string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{
		DeviceClassName: class,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["gpu.tessera.dev"].index == %d`, index),
		}}},
	}
	if memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
	}
}

// withConfig adds a claim-level opaque GpuConfig.
func withConfig(c *resourceapi.ResourceClaim, params string) *resourceapi.ResourceClaim {
	c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "gpu.tessera.dev", Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	})
	return c
}

// podFor is a pod using claim, kept to node by a required node affinity:
// the package's other tests leave GPU nodes of their own, which
// kube-scheduler could otherwise pick.
func podFor(ns, name, claim, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
					Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node},
				}}}},
			}}},
			Containers: []corev1.Container{{
				Name: "c", Image: "busybox",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
		},
	}
}

func waitAllocated(t testing.TB, client kubernetes.Interface, ns, name string, timeout time.Duration) *resourceapi.ResourceClaim {
	t.Helper()
	var got *resourceapi.ResourceClaim
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		c, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = c
		return c.Status.Allocation != nil, nil
	})
	require.NoError(t, err, "claim %s/%s not allocated", ns, name)
	return got
}

// TestStockSchedulerAndPrepare: kube-scheduler allocates whole-GPU and
// 40 GiB MPS claims from the published slices (consumable capacity), refuses
// a third 40 GiB claim on the same 80 GiB GPU, and NodePrepareResources over
// the registered socket writes the right CDI specs for exclusive, MPS and
// time-sliced claims.
func TestStockSchedulerAndPrepare(t *testing.T) {
	ns := "sched"
	_, client, e := kwokNode(t, "sched-h100", "h100-sxm-8", ns)
	ctx := context.Background()

	reg := prometheus.NewRegistry()
	d := e.start(t, reg)
	defer d.Stop()
	k := register(t, e.registrar)
	waitSlices(t, client, e.name, time.Minute, func(s []resourceapi.ResourceSlice) bool { return len(sliceDevices(s)) == 8 })
	srv := httptest.NewServer(d.HTTPHandler(reg))
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
	}

	claims := []*resourceapi.ResourceClaim{
		gpuClaim(ns, "whole", deviceclasses.Exclusive, 1, ""),
		gpuClaim(ns, "mps-1", deviceclasses.MPS, 0, "40Gi"),
		gpuClaim(ns, "mps-2", deviceclasses.MPS, 0, "40Gi"),
		withConfig(gpuClaim(ns, "ts", deviceclasses.TimeSlicing, 2, "16Gi"),
			`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"timeSlicing":{"interval":"Long"}}}`),
	}
	for _, cl := range claims {
		_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, cl, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = client.CoreV1().Pods(ns).Create(ctx, podFor(ns, "pod-"+cl.Name, cl.Name, e.name), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	allocated := map[string]*resourceapi.ResourceClaim{}
	for _, cl := range claims {
		allocated[cl.Name] = waitAllocated(t, client, ns, cl.Name, time.Minute)
		res := allocated[cl.Name].Status.Allocation.Devices.Results
		require.Len(t, res, 1)
		assert.Equal(t, e.name, res[0].Pool)
	}
	whole := allocated["whole"].Status.Allocation.Devices.Results[0]
	assert.Equal(t, "gpu-1", whole.Device)
	assert.Equal(t, int64(80<<30), ptrValue(whole.ConsumedCapacity["memory"]), "a claim without memory takes the whole GPU")
	for _, name := range []string{"mps-1", "mps-2"} {
		r := allocated[name].Status.Allocation.Devices.Results[0]
		assert.Equal(t, "gpu-0", r.Device)
		assert.Equal(t, int64(40<<30), ptrValue(r.ConsumedCapacity["memory"]))
		assert.NotNil(t, r.ShareID)
	}

	// A third 40 GiB MPS claim on gpu-0 does not fit.
	third := gpuClaim(ns, "mps-3", deviceclasses.MPS, 0, "40Gi")
	_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, third, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.CoreV1().Pods(ns).Create(ctx, podFor(ns, "pod-mps-3", "mps-3", e.name), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "pod-mps-3", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				t.Logf("third MPS pod: %s", cond.Message)
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the third 40Gi claim must not be scheduled")
	got, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, "mps-3", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Nil(t, got.Status.Allocation)

	// The kubelet prepares the claims of the scheduled pods.
	res := k.mustPrepare(t, allocated["whole"], allocated["mps-1"], allocated["mps-2"], allocated["ts"])
	gpus, err := e.fake.Devices()
	require.NoError(t, err)
	uuid := func(i int) string { return gpus[i].UUID }

	for name, dev := range map[string]string{"whole": "gpu-1", "mps-1": "gpu-0", "mps-2": "gpu-0", "ts": "gpu-2"} {
		cl := allocated[name]
		r := res[string(cl.UID)]
		require.Len(t, r.Devices, 1, name)
		assert.Equal(t, dev, r.Devices[0].DeviceName, name)
		assert.Equal(t, e.name, r.Devices[0].PoolName, name)
		require.Len(t, r.Devices[0].CdiDeviceIds, 1, name)
		assert.True(t, strings.HasPrefix(r.Devices[0].CdiDeviceIds[0], cdi.Kind+"="+string(cl.UID)+"_gpu_"), r.Devices[0].CdiDeviceIds[0])
	}

	env := envOf(t, readSpec(t, e.cdi, string(allocated["whole"].UID)))
	assert.Equal(t, uuid(1), env[cdi.EnvNvidiaVisibleDevices])
	assert.Equal(t, "Exclusive", env[cdi.EnvSharing])
	assert.NotContains(t, env, cdi.EnvMPSMemLimit)

	for _, name := range []string{"mps-1", "mps-2"} {
		env := envOf(t, readSpec(t, e.cdi, string(allocated[name].UID)))
		assert.Equal(t, uuid(0), env[cdi.EnvNvidiaVisibleDevices], name)
		assert.Equal(t, "MPS", env[cdi.EnvSharing], name)
		assert.Equal(t, uuid(0)+"=40960M", env[cdi.EnvMPSMemLimit], name)
		assert.Equal(t, "50", env[cdi.EnvMPSThreadPercentage], name)
		assert.Equal(t, cdi.ContainerMPSPipeDir, env[cdi.EnvMPSPipeDir], name)
	}
	assert.Equal(t, []string{"start_" + uuid(0)}, drivertest.Record(t, e.record), "one MPS daemon for gpu-0")
	assert.Equal(t, gpu.ComputeModeExclusiveProcess, e.fake.ComputeMode(0))

	env = envOf(t, readSpec(t, e.cdi, string(allocated["ts"].UID)))
	assert.Equal(t, uuid(2), env[cdi.EnvNvidiaVisibleDevices])
	assert.Equal(t, "TimeSlicing", env[cdi.EnvSharing])
	assert.Equal(t, "Long", env[cdi.EnvTimeSliceInterval], "the claim's config merges over the class's")
	assert.Equal(t, gpu.TimeSliceLong, e.fake.TimeSlice(2), "interval set through NVML")
	assert.Equal(t, "17179869184", env[cdi.EnvGPUMemory])

	// Metrics follow the checkpoint.
	metrics := scrape(t, srv.URL)
	assert.Contains(t, metrics, "tessera_node_prepared_claims 4")
	assert.Contains(t, metrics, `tessera_node_gpu_memory_allocated_bytes{gpu="gpu-0",uuid="`+uuid(0)+`"} 8.589934592e+10`)
	assert.Contains(t, metrics, `tessera_node_gpu_memory_allocated_bytes{gpu="gpu-1",uuid="`+uuid(1)+`"} 8.589934592e+10`)
	assert.Contains(t, metrics, `tessera_node_gpu_memory_allocated_bytes{gpu="gpu-2",uuid="`+uuid(2)+`"} 1.7179869184e+10`)
	assert.Contains(t, metrics, "tessera_node_mps_daemons 1")
	assert.Contains(t, metrics, `tessera_node_prepare_duration_seconds_count{operation="prepare"} 4`)

	// Unprepare: specs go, the MPS daemon quits with the last MPS claim.
	k.mustUnprepare(t, allocated["mps-1"])
	assert.Len(t, drivertest.Record(t, e.record), 1)
	k.mustUnprepare(t, allocated["mps-2"], allocated["whole"], allocated["ts"])
	assert.Equal(t, []string{"start_" + uuid(0), "quit_" + uuid(0)}, drivertest.Record(t, e.record))
	assert.Equal(t, gpu.ComputeModeDefault, e.fake.ComputeMode(0))
	assert.Equal(t, gpu.TimeSliceDefault, e.fake.TimeSlice(2))
	metrics = scrape(t, srv.URL)
	assert.Contains(t, metrics, "tessera_node_prepared_claims 0")
	assert.Contains(t, metrics, "tessera_node_mps_daemons 0")
	for _, cl := range allocated {
		_, err := readSpecErr(e.cdi, string(cl.UID))
		assert.Error(t, err, "spec of %s removed", cl.Name)
	}
}

func scrape(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func ptrValue(q resource.Quantity) int64 { return q.Value() }
