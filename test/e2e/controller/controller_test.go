package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// replica is one in-process tessera-controller.
type replica struct {
	c         *app.Controller
	forbidden *forbiddenCounter
	cancel    context.CancelFunc
	done      chan error

	mu      sync.Mutex
	started []time.Time // when it began leading
	stopped []time.Time // when it stopped leading
}

// startReplica runs a controller as the controller's ServiceAccount with
// leader election on the manifests' Lease and fast test timings.
func startReplica(t *testing.T, cp *controlplane.ControlPlane, id string, mutate func(*app.Config)) *replica {
	t.Helper()
	r := &replica{forbidden: &forbiddenCounter{}, done: make(chan error, 1)}
	cfg := app.Config{
		RestConfig:      saConfig(cp, r.forbidden),
		Interval:        200 * time.Millisecond,
		LeaderElect:     true,
		LeaseNamespace:  rbac.Namespace,
		LeaseName:       app.DefaultLeaseName,
		Identity:        id,
		LeaseDuration:   4 * time.Second,
		RenewDeadline:   3 * time.Second,
		RetryPeriod:     500 * time.Millisecond,
		ReleaseOnCancel: true,
		MetricsAddr:     "127.0.0.1:0",
		HealthAddr:      "127.0.0.1:0",
		OnLeading: func(on bool) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if on {
				r.started = append(r.started, time.Now())
			} else {
				r.stopped = append(r.stopped, time.Now())
			}
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := app.New(cfg)
	if err != nil {
		t.Fatalf("controller %s: %v", id, err)
	}
	r.c = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// stop ends the replica and waits for it; it returns Run's error.
func (r *replica) stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("controller did not stop within 30s")
	}
}

func (r *replica) leadTimes() (started, stopped []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.started...), append([]time.Time(nil), r.stopped...)
}

func (r *replica) binds(t *testing.T) float64 {
	return metricValue(t, r.c.Registry(), "tessera_binds_total")
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// claimOf returns the ResourceClaim generated for the pod (nil before KCM
// made it).
func claimOf(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) *resourceapi.ResourceClaim {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err == nil {
			return c
		}
	}
	return nil
}

// boundWithClaim says whether the pod is bound and its claim allocated and
// reserved for it.
func boundWithClaim(ctx context.Context, client kubernetes.Interface, ns, name string) (bool, string) {
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	if pod.Spec.NodeName == "" {
		why := "pod not bound"
		for _, c := range pod.Status.Conditions {
			if c.Type == v1.PodScheduled {
				why += fmt.Sprintf(" (PodScheduled=%s %s: %s)", c.Status, c.Reason, c.Message)
			}
		}
		if c := claimOf(ctx, client, pod); c != nil {
			why += fmt.Sprintf("; claim %s allocated=%v reservedFor=%d finalizers=%v", c.Name, c.Status.Allocation != nil, len(c.Status.ReservedFor), c.Finalizers)
		}
		return false, why
	}
	c := claimOf(ctx, client, pod)
	if c == nil {
		return false, "no claim"
	}
	if c.Status.Allocation == nil {
		return false, "claim not allocated"
	}
	for _, r := range c.Status.ReservedFor {
		if r.UID == pod.UID {
			return true, ""
		}
	}
	return false, "claim not reserved for the pod"
}

var (
	queueGVR    = kube.QueueGVR
	podGroupGVR = kube.PodGroupGVR
)

func createUnstructured(t *testing.T, dyn dynamic.Interface, obj map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: obj}
	gvr := queueGVR
	ri := dynamic.ResourceInterface(dyn.Resource(gvr))
	if u.GetKind() == "PodGroup" {
		ri = dyn.Resource(podGroupGVR).Namespace(u.GetNamespace())
	}
	if _, err := ri.Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestRBACSufficient runs the controller as its ServiceAccount with exactly
// deploy/rbac/tessera-controller.yaml and makes it use every permission:
// leader Lease, binding, claim finalizer, allocation and reservedFor
// (resourceclaims/binding), a volume claim's selected node, eviction (a
// preemption), PodScheduled=False on a pod that cannot fit, events, Queue
// and PodGroup status. No request may be refused. The metrics and health endpoints are checked on the way.
func TestRBACSufficient(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := cp.CreateNamespace(t, "rbac").Name
	t.Cleanup(func() { deletePods(t, client, ns) })
	addGPUNode(t, cp, "rbac-node", 1)
	createTemplate(t, client, ns, "one-gpu", 1)
	createTemplate(t, client, ns, "two-gpus", 2)
	createUnstructured(t, dyn, map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": "rbac-team"},
		"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "1"}}},
	})
	createUnstructured(t, dyn, map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "high", "namespace": ns},
		"spec":     map[string]any{"minMember": int64(1), "queue": "rbac-team"},
	})

	r := startReplica(t, cp, "rbac-replica", nil)
	eventually(t, "leading", 30*time.Second, func() (bool, string) { return r.c.IsLeader(), "not leader" })

	pod := func(name, template, priority string, group bool) *v1.Pod {
		p := gpuPod(ns, name, template)
		p.Labels = map[string]string{kube.LabelQueue: "rbac-team"}
		p.Spec.PriorityClassName = priority
		if group {
			p.Annotations = map[string]string{kube.AnnotationPodGroup: "high"}
		}
		return p
	}
	// The first pod also mounts a volume its provisioner creates on the
	// pod's node (the controller names the node on the claim), and one
	// served by a pre-created volume (the controller binds the volume to
	// the claim: persistentvolumes update).
	claimOfClass := func(claim, class, provisioner string) {
		t.Helper()
		if _, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: provisioner,
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.StorageV1().StorageClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
		})
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns},
			Spec: v1.PersistentVolumeClaimSpec{
				StorageClassName: &class, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claimOfClass("scratch", "rbac-first-consumer", "example.com/tessera-test")
	claimOfClass("nvme", "rbac-local", "kubernetes.io/no-provisioner")
	pvName := ns + "-local"
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: v1.PersistentVolumeSpec{
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, StorageClassName: "rbac-local",
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/nvme"}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
				{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{"rbac-node"}}}}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	low := pod("low", "one-gpu", "test-low", false)
	low.Spec.Volumes = []v1.Volume{
		{Name: "scratch", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "scratch"}}},
		{Name: "nvme", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "nvme"}}},
	}
	start := time.Now()
	if _, err := client.CoreV1().Pods(ns).Create(ctx, low, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "low bound with its claim", 60*time.Second, func() (bool, string) { return boundWithClaim(ctx, client, ns, "low") })
	t.Logf("first pod bound with its claim after %v", time.Since(start).Round(time.Millisecond))
	if c, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "scratch", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if got := c.Annotations["volume.kubernetes.io/selected-node"]; got != "rbac-node" {
		t.Errorf("volume claim scratch: selected-node %q, want rbac-node", got)
	}
	if pv, err := client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != "nvme" || pv.Spec.ClaimRef.Namespace != ns {
		t.Errorf("volume %s: claimRef %+v, want %s/nvme", pvName, pv.Spec.ClaimRef, ns)
	}

	// A higher-priority pod of the same queue preempts it (pods/eviction),
	// then takes the GPU.
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod("high", "one-gpu", "test-high", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "high bound with its claim after preempting low", 90*time.Second, func() (bool, string) {
		return boundWithClaim(ctx, client, ns, "high")
	})
	_, err = client.CoreV1().Pods(ns).Get(ctx, "low", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("low should have been evicted: %v", err)
	}

	// A pod that cannot fit waits with the reason.
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod("big", "two-gpus", "test-low", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "big pending with a reason", 60*time.Second, func() (bool, string) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
				t.Logf("big: %s: %s", c.Reason, c.Message)
				return true, ""
			}
		}
		return false, "no PodScheduled=False"
	})
	// A device-plugin pod (nvidia.com/gpu) on a node whose device plugin
	// advertises it: the controller writes its assignment annotation
	// before binding it (pods patch).
	addGPUNode(t, cp, "rbac-dp-node", 1)
	dpNode, err := client.CoreV1().Nodes().Get(ctx, "rbac-dp-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dpNode.Status.Capacity[assignment.DefaultResourceGPU] = resource.MustParse("1")
	dpNode.Status.Allocatable[assignment.DefaultResourceGPU] = resource.MustParse("1")
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, dpNode, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dp := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dp"},
		Spec: v1.PodSpec{SchedulerName: kube.SchedulerName, TerminationGracePeriodSeconds: ptr.To(int64(0)), Containers: []v1.Container{{
			Name: "c", Image: "busybox",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("1")}},
		}}},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, dp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "dp bound with its assignment", 60*time.Second, func() (bool, string) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "dp", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		a, ok, err := assignment.Of(p.Annotations)
		return p.Spec.NodeName == "rbac-dp-node" && ok && err == nil && len(a.GPUs) == 1,
			fmt.Sprintf("node %q, assignment %q (%v)", p.Spec.NodeName, p.Annotations[assignment.Annotation], err)
	})
	eventually(t, "Queue and PodGroup status", 30*time.Second, func() (bool, string) {
		q, err := dyn.Resource(queueGVR).Get(ctx, "rbac-team", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if _, ok, _ := unstructured.NestedMap(q.Object, "status", "resources"); !ok {
			return false, "queue has no status.resources"
		}
		pg, err := dyn.Resource(podGroupGVR).Namespace(ns).Get(ctx, "high", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if phase, _, _ := unstructured.NestedString(pg.Object, "status", "phase"); phase == "" {
			return false, "podgroup has no status.phase"
		}
		return true, ""
	})
	eventually(t, "events written", 30*time.Second, func() (bool, string) {
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			if e.Source.Component == kube.SchedulerName || e.ReportingController == kube.SchedulerName {
				reasons[e.Reason] = true
			}
		}
		return reasons["Scheduled"] && reasons["FailedScheduling"], fmt.Sprintf("reasons %v", reasons)
	})

	reg := r.c.Registry()
	if n := metricValue(t, reg, "tessera_api_errors_total"); n != 0 {
		t.Errorf("tessera_api_errors_total = %v, want 0", n)
	}
	if n := metricValue(t, reg, "tessera_bind_failures_total"); n != 0 {
		t.Errorf("tessera_bind_failures_total = %v, want 0", n)
	}
	if n := metricValue(t, reg, "tessera_evictions_total"); n < 1 {
		t.Errorf("tessera_evictions_total = %v, want ≥ 1", n)
	}
	if n := r.binds(t); n < 2 {
		t.Errorf("tessera_binds_total = %v, want ≥ 2", n)
	}

	t.Run("Endpoints", func(t *testing.T) {
		code, body := httpGet(t, "http://"+r.c.MetricsAddr()+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d", code)
		}
		for _, want := range []string{
			"tessera_leader 1", "tessera_binds_total", "tessera_evictions_total{reason=",
			"tessera_cycle_duration_seconds_bucket", "tessera_action_duration_seconds_bucket",
			`tessera_queue_fair_share{queue="rbac-team",resource="gpu"}`, `tessera_queue_allocated{queue="rbac-team",resource="gpu"} 1`,
			"tessera_pending_pods 1", "tessera_api_errors_total 0", "go_goroutines", "process_cpu_seconds_total",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := httpGet(t, "http://"+r.c.HealthAddr()+path); code != http.StatusOK {
				t.Errorf("%s: %d %s", path, code, body)
			}
		}
	})

	if err := r.stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	if n := r.forbidden.n.Load(); n != 0 {
		t.Fatalf("%d requests were Forbidden: %v", n, r.forbidden.requests())
	}
}

// TestRBACLeast checks that the controller's identity cannot do what it does
// not need.
func TestRBACLeast(t *testing.T) {
	cp := cluster(t)
	ctx := t.Context()
	ns := cp.CreateNamespace(t, "least").Name
	sa, err := kubernetes.NewForConfig(saConfig(cp, nil))
	if err != nil {
		t.Fatal(err)
	}
	addGPUNode(t, cp, "least-node", 1)
	checks := map[string]error{}
	_, checks["get secrets"] = sa.CoreV1().Secrets(ns).Get(ctx, "any", metav1.GetOptions{})
	_, checks["list secrets"] = sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	checks["delete nodes"] = sa.CoreV1().Nodes().Delete(ctx, "least-node", metav1.DeleteOptions{})
	_, checks["create pods"] = sa.CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "p", "none"), metav1.CreateOptions{})
	_, checks["create resourceclaims"] = sa.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	checks["delete resourceslices"] = sa.ResourceV1().ResourceSlices().Delete(ctx, "least-node-gpu.tessera.dev", metav1.DeleteOptions{})
	_, checks["get configmaps"] = sa.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	// The usage history's ConfigMap is the only one of its own namespace
	// it may read or write.
	_, checks["get another configmap of its namespace"] = sa.CoreV1().ConfigMaps(rbac.Namespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	_, checks["list configmaps of its namespace"] = sa.CoreV1().ConfigMaps(rbac.Namespace).List(ctx, metav1.ListOptions{})
	_, checks["list leases in kube-system"] = sa.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{})
	for what, err := range checks {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: want Forbidden, got %v", what, err)
		}
	}
	// Sanity: the identity does have its own grants.
	if _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("listing pods: %v", err)
	}
	if _, err := sa.CoreV1().Nodes().Get(ctx, "least-node", metav1.GetOptions{}); err != nil {
		t.Errorf("getting a node: %v", err)
	}
}

// deletePods removes a namespace's pods at once and waits, so the next test's
// controllers do not schedule them.
func deletePods(t *testing.T, client kubernetes.Interface, ns string) {
	ctx := context.Background()
	_ = client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	_ = poll(ctx, 30*time.Second, func() (bool, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
}

// deviceKey names one device of one pool.
type deviceKey struct{ driver, pool, device string }

// checkAllocations checks every claim in the cluster: no device is given to
// more claims than its memory holds (whole-GPU claims take all of it), each
// allocated claim in ns is reserved for exactly one existing pod bound to
// the claim's node, and every bound pod in ns has its claim allocated.
func checkAllocations(t *testing.T, client kubernetes.Interface, ns string, perDevice resource.Quantity) {
	t.Helper()
	ctx := t.Context()
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[deviceKey]int64{}
	users := map[deviceKey][]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			k := deviceKey{r.Driver, r.Pool, r.Device}
			mem := perDevice.Value()
			if q, ok := r.ConsumedCapacity["memory"]; ok {
				mem = q.Value()
			}
			used[k] += mem
			users[k] = append(users[k], c.Namespace+"/"+c.Name)
		}
	}
	for k, m := range used {
		if m > perDevice.Value() {
			t.Errorf("device %v over-allocated (%d bytes) to %v", k, m, users[k])
		}
	}
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[string]*v1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		byUID[string(p.UID)] = p
		if p.Spec.NodeName == "" {
			continue
		}
		c := claimOf(ctx, client, p)
		if c == nil || c.Status.Allocation == nil {
			t.Errorf("pod %s is bound to %s without an allocated claim", p.Name, p.Spec.NodeName)
		}
	}
	for _, c := range claims.Items {
		if c.Namespace != ns || c.Status.Allocation == nil {
			continue
		}
		if len(c.Status.ReservedFor) != 1 {
			t.Errorf("claim %s reserved for %d consumers, want 1", c.Name, len(c.Status.ReservedFor))
			continue
		}
		p := byUID[string(c.Status.ReservedFor[0].UID)]
		if p == nil {
			t.Errorf("claim %s reserved for a pod that does not exist", c.Name)
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Pool != p.Spec.NodeName {
				t.Errorf("claim %s has %s/%s but its pod runs on %q", c.Name, r.Pool, r.Device, p.Spec.NodeName)
			}
		}
	}
}
