// Package controller tests tessera-controller's operations on a real control
// plane (etcd, kube-apiserver, KCM, kwok nodes): its RBAC manifests are
// sufficient and least, two replicas never both schedule and fail over
// cleanly, and the metrics and health endpoints answer. The controller runs
// in-process (controller/app, exactly what the command runs) as the
// ServiceAccount the manifests grant to.
package controller

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// saUser is the identity the RBAC manifests grant to, as the API server sees
// a token of that ServiceAccount.
var saUser = framework.ControllerUser

// shared is the package's control plane with kwok, the CRDs, the
// DeviceClasses, namespace tessera-system and the RBAC manifests applied.
var shared = &controlplane.Shared{Kwok: true, Setup: func(cp *controlplane.ControlPlane, t testing.TB) error {
	return setup(context.Background(), cp, t)
}}

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

// cluster returns the package's control plane, started on first use.
func cluster(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	return shared.Get(t)
}

func setup(ctx context.Context, cp *controlplane.ControlPlane, t testing.TB) error {
	client, err := kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		return err
	}
	if err := framework.InstallCRDs(ctx, dyn); err != nil {
		return err
	}
	classes, err := deviceclasses.Load()
	if err != nil {
		return err
	}
	for _, c := range classes {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", c.Name, err)
		}
	}
	for name, value := range map[string]int32{"test-low": 10, "test-high": 90} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("PriorityClass %s: %w", name, err)
		}
	}
	cp.CreateNamespace(t, rbac.Namespace)
	return framework.ApplyControllerRBAC(ctx, client)
}

// forbiddenCounter counts the API server's 403 answers to one identity.
type forbiddenCounter struct {
	n    atomic.Int64
	mu   sync.Mutex
	last []string
}

func (f *forbiddenCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusForbidden {
			f.n.Add(1)
			f.mu.Lock()
			f.last = append(f.last, req.Method+" "+req.URL.Path)
			f.mu.Unlock()
		}
		return resp, err
	})
}

func (f *forbiddenCounter) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.last...)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// saConfig is a client config for the controller's ServiceAccount whose 403
// answers are counted by f.
func saConfig(cp *controlplane.ControlPlane, f *forbiddenCounter) *rest.Config {
	cfg := cp.UserConfig(saUser[0], saUser[1:]...)
	if f != nil {
		cfg.Wrap(f.wrap)
	}
	return cfg
}

// addGPUNode adds a kwok node and publishes a ResourceSlice of gpu.tessera.dev
// for it with n GPUs of 80Gi, as tessera-node would.
func addGPUNode(t *testing.T, cp *controlplane.ControlPlane, name string, n int) {
	t.Helper()
	cp.AddKwokNodeWith(t, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1.NodeStatus{Capacity: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
		}},
	})
	mem := resource.MustParse("80Gi")
	var devices []resourceapi.Device
	for i := range n {
		devices = append(devices, resourceapi.Device{
			Name:                     fmt.Sprintf("gpu-%d", i),
			AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"gpu.tessera.dev/index":       {IntValue: ptr.To(int64(i))},
				"gpu.tessera.dev/productName": {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
				"gpu.tessera.dev/uuid":        {StringValue: ptr.To(fmt.Sprintf("GPU-%s-%d", name, i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(mem.DeepCopy())}},
			},
		})
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu.tessera.dev"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   "gpu.tessera.dev",
			NodeName: ptr.To(name),
			Pool:     resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
	if _, err := cp.Client(t).ResourceV1().ResourceSlices().Create(t.Context(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("publishing the slice of %s: %v", name, err)
	}
}

// createTemplate creates a ResourceClaimTemplate asking for count whole GPUs.
func createTemplate(t *testing.T, client kubernetes.Interface, ns, name string, count int64) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name:    "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
			}}},
		}},
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ResourceClaimTemplate %s: %v", name, err)
	}
}

// gpuPod is a pod for tessera-scheduler with one claim from template.
func gpuPod(ns, name, template string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			SchedulerName:                 "tessera-scheduler",
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []v1.Container{{
				Name: "c", Image: "busybox",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
		},
	}
}

// poll calls cond every 100 ms until it is true, it fails, or timeout.
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// eventually fails the test when cond does not hold within timeout; cond's
// message says what was seen last.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := poll(t.Context(), timeout, func() (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %v (last: %s)", what, timeout, last)
	}
}

// metricValue sums the samples (counter, gauge, or histogram count) of the
// metric family name in reg; -1 when absent.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += sampleValue(m)
		}
		return sum
	}
	return -1
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}
