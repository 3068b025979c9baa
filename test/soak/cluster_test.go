package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// The cluster: 22 GPUs of three sizes (80, 40 and 24 GiB), so memory
// shares land on GPUs where they weigh differently.
var soakNodes = []struct{ name, profile string }{
	{"soak-h100-a", "h100-sxm-8"},
	{"soak-h100-b", "h100-sxm-8"},
	{"soak-a100", "a100-pcie-4"},
	{"soak-l4", "l4-2"},
}

// soakQueues: two teams, and a parent with a limit over two children, one
// of them without quota (its non-preemptible pods can never run: they must
// wait with a reason).
var soakQueues = []struct{ name, parent, quota, limit string }{
	{"team-a", "", "6", "12"},
	{"team-b", "", "4", "8"},
	{"research", "", "4", "6"},
	{"research-x", "research", "2", "-1"},
	{"research-y", "research", "0", "3"},
}

// leafQueues are the queues pods go to.
var leafQueues = []string{"team-a", "team-b", "research-x", "research-y"}

// priorityClasses are the chart's: train is preemptible.
var priorityClasses = map[string]int32{"tessera-train": 50, "tessera-build": 100, "tessera-inference": 125}

// The timings the invariants' windows are derived from.
const (
	staleGangTimeout = 15 * time.Second
	leaseDuration    = framework.ControllerLeaseDuration
	// gangWindow: the stale-gang timeout, plus a few cycles to notice and
	// evict, a failover and a loaded machine.
	gangWindow = staleGangTimeout + 25*time.Second
	// pendingGrace: a new pod's first cycle, after a failover (lease
	// duration) or an API server restart, on a loaded machine.
	pendingGrace = 30 * time.Second
)

// claimTemplates are the ResourceClaimTemplates pods use: name → class,
// count (whole GPUs) and memory (a share).
var claimTemplates = map[string]struct {
	class  string
	count  int64
	memory string
}{
	"whole-1": {deviceclasses.Exclusive, 1, ""},
	"whole-2": {deviceclasses.Exclusive, 2, ""},
	"mps-10":  {deviceclasses.MPS, 1, "10Gi"},
	"mps-20":  {deviceclasses.MPS, 1, "20Gi"},
	"ts-10":   {deviceclasses.TimeSlicing, 1, "10Gi"},
	"ts-20":   {deviceclasses.TimeSlicing, 1, "20Gi"},
}

// cluster is the soak's control plane, nodes and controller replicas.
type cluster struct {
	cp       *controlplane.ControlPlane
	client   kubernetes.Interface
	dyn      dynamic.Interface
	ns       string
	nodes    []*controlplane.Child   // tessera-node per kwok node
	replicas []*framework.Controller // tessera-controller replicas
}

// startCluster brings up everything the soak needs and waits until every
// GPU is published and a controller replica leads.
func startCluster(t *testing.T, ctx context.Context) *cluster {
	t.Helper()
	work := shortDir(t)
	nodeBin := controlplane.GoBinary(t, "./cmd/tessera-node")
	c := &cluster{cp: controlplane.Start(t, controlplane.Options{})}
	c.client = c.cp.Client(t)
	var err error
	if c.dyn, err = dynamic.NewForConfig(c.cp.AdminConfig); err != nil {
		t.Fatal(err)
	}
	if err := c.install(t, ctx); err != nil {
		t.Fatal(err)
	}
	c.cp.StartKwok(t)
	for _, n := range soakNodes {
		node, err := framework.FakeGPUNode(n.name, n.profile, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.cp.AddKwokNodeWith(t, node)
		kubeconfig := c.cp.WriteKubeconfig(t, c.cp.UserConfig("system:node:"+n.name, "system:nodes"))
		// The node's files under a short path: unix sockets are limited
		// to 108 bytes. Its log goes to the control plane's folder.
		c.nodes = append(c.nodes, c.cp.StartChild(t, controlplane.ChildOptions{Name: "tessera-node-" + n.name, Bin: nodeBin,
			Args: framework.FakeTesseraNodeArgs(n.name, n.profile, kubeconfig, filepath.Join(work, n.name))}))
	}
	c.waitSlices(t, ctx)
	for _, name := range []string{"controller-a", "controller-b"} {
		// framework.StartController's leader election: lease 4 s, renew
		// deadline 3 s, retry 0.5 s.
		c.replicas = append(c.replicas, framework.StartController(t, c.cp, framework.ControllerOptions{Name: name,
			Args: []string{"--interval=500ms", "--stale-gang-timeout=" + staleGangTimeout.String()}}))
	}
	c.waitLeader(t, ctx)
	return c
}

// install puts in what the chart would: CRDs, DeviceClasses, priority
// classes, the controller's namespace and RBAC; then the soak's queues,
// namespace and claim templates.
func (c *cluster) install(t *testing.T, ctx context.Context) error {
	if err := framework.InstallCRDs(ctx, c.dyn); err != nil {
		return err
	}
	if err := framework.ApplyDeviceClasses(ctx, c.client); err != nil {
		return err
	}
	for name, value := range priorityClasses {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := c.client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("PriorityClass %s: %w", name, err)
		}
	}
	c.cp.CreateNamespace(t, rbac.Namespace)
	if err := framework.ApplyControllerRBAC(ctx, c.client); err != nil {
		return err
	}
	for _, q := range soakQueues {
		spec := map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": q.quota, "limit": q.limit}}}
		if q.parent != "" {
			spec["parent"] = q.parent
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
			"metadata": map[string]any{"name": q.name}, "spec": spec}}
		if _, err := c.dyn.Resource(kube.QueueGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("Queue %s: %w", q.name, err)
		}
	}
	c.ns = c.cp.CreateNamespace(t, "soak").Name
	for name, tm := range claimTemplates {
		req := resourceapi.ExactDeviceRequest{DeviceClassName: tm.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: tm.count}
		if tm.memory != "" {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{driver.CapacityMemory: resource.MustParse(tm.memory)}}
		}
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}}}
		if _, err := c.client.ResourceV1().ResourceClaimTemplates(c.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("ResourceClaimTemplate %s: %w", name, err)
		}
	}
	return nil
}

// waitSlices waits until every node's GPUs are published.
func (c *cluster) waitSlices(t *testing.T, ctx context.Context) {
	t.Helper()
	want := 0
	for _, n := range soakNodes {
		node, _ := framework.FakeGPUNode(n.name, n.profile, nil)
		q := node.Status.Capacity["nvidia.com/gpu"]
		want += int(q.Value())
	}
	poll(t, ctx, time.Minute, "every GPU published", func() (bool, string) {
		sl, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Spec.Devices)
		}
		return n == want, fmt.Sprintf("%d of %d GPUs", n, want)
	})
}

// waitLeader waits until a replica holds the leader Lease.
func (c *cluster) waitLeader(t *testing.T, ctx context.Context) {
	t.Helper()
	poll(t, ctx, time.Minute, "a controller replica leads", func() (bool, string) {
		l, err := c.client.CoordinationV1().Leases(rbac.Namespace).Get(ctx, app.DefaultLeaseName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return leaseHeld(l), "no holder"
	})
}

func leaseHeld(l *coordinationv1.Lease) bool {
	return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
}

// poll fails t when cond is not true within timeout.
func poll(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %v (last: %s)", what, timeout, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shortDir is a temporary directory with a short path (unix sockets are
// limited to 108 bytes), removed at the end unless the test failed.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tsoak")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("soak files (process logs) kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// TestMain removes the binaries controlplane.GoBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	controlplane.RemoveGoBinaries()
	os.Exit(code)
}
