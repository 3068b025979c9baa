// Package scale measures tessera-scheduler against kube-scheduler on the same
// cluster in the same run: 500 kwok nodes × 8 fake GPUs filled with 4,000
// one-GPU DRA pods, and the API server's own write ceiling on this machine.
// It runs on demand (make scale), not in make test.
package scale

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

const writers = 32

func TestScale(t *testing.T) {
	if os.Getenv("TESSERA_SCALE") == "" {
		t.Skip("scale run on demand: set TESSERA_SCALE=1 (make scale); it takes minutes and the whole machine")
	}
	nodes := envInt("TESSERA_SCALE_NODES", 500)
	pods := envInt("TESSERA_SCALE_PODS", 4000)
	cp := controlplane.Start(t, controlplane.Options{
		// KCM's garbage collector and resourceclaim controller keep up.
		ControllerManagerArgs: []string{"--kube-api-qps=1000", "--kube-api-burst=2000"},
		APIServerArgs:         []string{"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"},
	})
	cfg := rest.CopyConfig(cp.AdminConfig)
	cfg.QPS, cfg.Burst = 10000, 20000
	client := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if err := framework.InstallCRDs(ctx, dyn); err != nil {
		t.Fatal(err)
	}
	if err := framework.ApplyDeviceClasses(ctx, client); err != nil {
		t.Fatal(err)
	}
	cp.StartKwok(t)
	ns := cp.CreateNamespace(t, "scale").Name

	start := time.Now()
	createNodes(t, ctx, client, nodes)
	t.Logf("%d kwok nodes with 8 fake GPUs each, Ready and published, in %v", nodes, time.Since(start).Round(time.Millisecond))

	// 1. The API server's write ceiling: pod creates/s and bindings/s from
	// 32 concurrent writers, with no scheduler involved.
	creates, binds := ceiling(t, ctx, client, ns, pods, nodes)
	t.Logf("API server ceiling (%d writers): %.0f pod creates/s, %.0f bindings/s", writers, creates, binds)

	// 2. tessera-scheduler fills the cluster.
	tessera := fill(t, ctx, client, ns, "tessera", kube.SchedulerName, pods, func() func() {
		sched, err := kube.New(kube.Options{Client: client, Dynamic: dyn, Interval: 200 * time.Millisecond, Core: core.Config{}, Workers: 64})
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = sched.Run(sctx) }()
		return func() { stop(); <-done }
	})
	t.Logf("tessera-scheduler: %d pods in %v = %.0f pods/s", pods, tessera.Round(time.Millisecond), float64(pods)/tessera.Seconds())
	clear(t, ctx, client, ns)

	// 3. kube-scheduler fills the same cluster.
	kubeSched := fill(t, ctx, client, ns, "kube", v1.DefaultSchedulerName, pods, func() func() {
		return startKubeScheduler(t, cp)
	})
	t.Logf("kube-scheduler:    %d pods in %v = %.0f pods/s", pods, kubeSched.Round(time.Millisecond), float64(pods)/kubeSched.Seconds())

	tp := float64(pods) / tessera.Seconds()
	kp := float64(pods) / kubeSched.Seconds()
	// A scheduled DRA pod costs 3 writes (claim finalizer, claim status, binding).
	t.Logf("RESULT nodes=%d pods=%d tessera=%.0f pods/s (%.1fs) kube-scheduler=%.0f pods/s (%.1fs) ratio=%.2fx ceiling: creates=%.0f/s bindings=%.0f/s tessera-writes=%.0f%% of binding ceiling",
		nodes, pods, tp, tessera.Seconds(), kp, kubeSched.Seconds(), tp/kp, creates, binds, 100*3*tp/binds)
}

func createNodes(t *testing.T, ctx context.Context, client kubernetes.Interface, n int) {
	parallel(n, func(i int) error {
		name := fmt.Sprintf("kwok-%04d", i)
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Annotations: map[string]string{controlplane.KwokAnnotation: controlplane.KwokAnnotationValue},
				Labels:      map[string]string{"kubernetes.io/hostname": name, controlplane.KwokNodeLabel: controlplane.KwokNodeLabelValue},
			},
			Status: v1.NodeStatus{
				Capacity:  v1.ResourceList{v1.ResourceCPU: resource.MustParse("128"), v1.ResourceMemory: resource.MustParse("1Ti"), v1.ResourcePods: resource.MustParse("110")},
				Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: fmt.Sprintf("10.254.%d.%d", i/250, i%250+1)}},
			},
		}
		node.Status.Allocatable = node.Status.Capacity
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
		// What tessera-node publishes for this node, built by its own code.
		fake, err := gpu.NewFake("h100-sxm-8", name)
		if err != nil {
			return err
		}
		devs, err := fake.Devices()
		if err != nil {
			return err
		}
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu.tessera.dev"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver.DriverName,
				NodeName: &name,
				Pool:     resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
				Devices:  driver.BuildDevices(devs, nil, ""),
			},
		}
		_, err = client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
		return err
	}, t)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range list.Items {
			ok := len(n.Spec.Taints) == 0
			for _, c := range n.Status.Conditions {
				if c.Type == v1.NodeReady && c.Status != v1.ConditionTrue {
					ok = false
				}
			}
			if ok && len(n.Status.Conditions) > 0 {
				ready++
			}
		}
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d nodes Ready and untainted", ready, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ceiling measures pod creates/s and bindings/s with 32 writers.
func ceiling(t *testing.T, ctx context.Context, client kubernetes.Interface, ns string, pods, nodes int) (float64, float64) {
	start := time.Now()
	parallel(pods, func(i int) error {
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ceiling-%d", i), Namespace: ns, Labels: map[string]string{"app": "ceiling"}},
			Spec:       v1.PodSpec{SchedulerName: "nobody", Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
		}
		_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	}, t)
	creates := float64(pods) / time.Since(start).Seconds()
	start = time.Now()
	parallel(pods, func(i int) error {
		return client.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ceiling-%d", i)},
			Target:     v1.ObjectReference{Kind: "Node", Name: fmt.Sprintf("kwok-%04d", i%nodes)},
		}, metav1.CreateOptions{})
	}, t)
	binds := float64(pods) / time.Since(start).Seconds()
	clear(t, ctx, client, ns)
	return creates, binds
}

// fill creates one claim and one pod per GPU-pod (32 writers, no scheduler
// running), then starts the scheduler and returns the time from its start
// to the last pod bound: the same measure for both schedulers, informer sync
// included.
func fill(t *testing.T, ctx context.Context, client kubernetes.Interface, ns, prefix, scheduler string, pods int, start func() (stop func())) time.Duration {
	created := time.Now()
	parallel(pods, func(i int) error {
		name := fmt.Sprintf("%s-%d", prefix, i)
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: deviceclasses.Exclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}}},
		}
		if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return err
		}
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": prefix}},
			Spec: v1.PodSpec{
				SchedulerName:  scheduler,
				Containers:     []v1.Container{{Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
				ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
				Tolerations:    []v1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: v1.TolerationOpExists}},
			},
		}
		_, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	}, t)
	t.Logf("%s: %d claims and pods created in %v", prefix, pods, time.Since(created).Round(time.Millisecond))

	begin := time.Now()
	stop := start()
	defer stop()
	deadline := begin.Add(15 * time.Minute)
	for {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + prefix, ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		bound := 0
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if bound >= pods {
			return time.Since(begin)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: only %d of %d pods bound after 15 minutes", prefix, bound, pods)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startKubeScheduler runs the harness's kube-scheduler with its client's
// rate limit raised, so it is not throttled. The time it takes to start
// counts, as tessera-scheduler's informer sync does.
func startKubeScheduler(t *testing.T, cp *controlplane.ControlPlane) func() {
	stop, err := cp.StartKubeScheduler(context.Background(), "--kube-api-qps=10000", "--kube-api-burst=20000")
	if err != nil {
		t.Fatal(err)
	}
	return stop
}

// clear deletes every pod and claim of ns (32 writers; a DeleteCollection
// of thousands of pods outlives the API server's request timeout) and waits
// until they are gone.
func clear(t *testing.T, ctx context.Context, client kubernetes.Interface, ns string) {
	zero := int64(0)
	pl, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	parallel(len(pl.Items), func(i int) error {
		err := client.CoreV1().Pods(ns).Delete(ctx, pl.Items[i].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}, t)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pl, err1 := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		cl, err2 := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err1 == nil && err2 == nil && len(pl.Items) == 0 && len(cl.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s not cleared", ns)
		}
		if err1 == nil && len(pl.Items) == 0 && err2 == nil {
			// Pods are gone: drop the claims, with the delete-protection
			// finalizer that allocated claims carry.
			parallel(len(cl.Items), func(i int) error {
				c := cl.Items[i]
				if len(c.Finalizers) > 0 {
					c.Finalizers = nil
					if _, err := client.ResourceV1().ResourceClaims(ns).Update(ctx, &c, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
						return err
					}
				}
				err := client.ResourceV1().ResourceClaims(ns).Delete(ctx, c.Name, metav1.DeleteOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			}, t)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func parallel(n int, f func(int) error, t *testing.T) {
	var wg sync.WaitGroup
	var next atomic.Int64
	var firstErr atomic.Value
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		t.Errorf("writer: %v", err)
	}
}
