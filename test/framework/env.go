package framework

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// Env is the environment the scheduling e2e packages (test/e2e/grouper,
// scheduler, workloads) share: a real control plane with kwok, Tessera's
// CRDs and DeviceClasses, and one test namespace. Each package wraps it in
// its own env with the helpers only it needs.
type Env struct {
	T      *testing.T
	Ctx    context.Context
	CP     *controlplane.ControlPlane
	Client kubernetes.Interface
	Dyn    dynamic.Interface
	// NS is the test namespace (EnvOptions.Namespace).
	NS string
}

// EnvOptions say how NewEnv sets the control plane up.
type EnvOptions struct {
	ControlPlane controlplane.Options
	// Namespace is the test namespace to create.
	Namespace string
	// ControllerRBAC creates rbac.Namespace and applies deploy/rbac's
	// manifests, for tessera-controller running as its ServiceAccount.
	ControllerRBAC bool
}

// NewEnv starts the control plane with kwok, installs the CRDs and the
// DeviceClasses (and the RBAC, when asked) and creates the namespace. It
// skips the test under -short. Its context ends after the test's later
// cleanups have run, so a tessera-node or scheduler they stop still has it.
func NewEnv(t *testing.T, opts EnvOptions) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real control plane (etcd, kube-apiserver, kube-controller-manager, kwok); skipped with -short")
	}
	cp := controlplane.Start(t, opts.ControlPlane)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &Env{T: t, Ctx: ctx, CP: cp, Client: cp.Client(t)}
	var err error
	if e.Dyn, err = dynamic.NewForConfig(cp.AdminConfig); err != nil {
		t.Fatal(err)
	}
	if err := InstallCRDs(ctx, e.Dyn); err != nil {
		t.Fatal(err)
	}
	if err := ApplyDeviceClasses(ctx, e.Client); err != nil {
		t.Fatal(err)
	}
	if opts.ControllerRBAC {
		cp.CreateNamespace(t, rbac.Namespace)
		if err := ApplyControllerRBAC(ctx, e.Client); err != nil {
			t.Fatal(err)
		}
	}
	cp.StartKwok(t)
	e.NS = cp.CreateNamespace(t, opts.Namespace).Name
	return e
}

// Eventually is Eventually for the env's test.
func (e *Env) Eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.T.Helper()
	Eventually(e.T, what, timeout, cond)
}

// Background runs run (a scheduler, a controller) on a context of the
// env's until the returned stop is called or the test ends, whichever comes
// first; an error it returns fails the test, named by what. stop waits for
// run to return and may be called more than once.
func (e *Env) Background(what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			e.T.Errorf("%s: %v", what, err)
		}
	}()
	stop = func() { cancel(); <-done }
	e.T.Cleanup(stop)
	return stop
}

// NodeOptions say how AddGPUNode and StartTesseraNode make a node.
type NodeOptions struct {
	// Extra resources in the kwok node's capacity and allocatable, e.g.
	// the device plugin's, which a kubelet would report.
	Extra  corev1.ResourceList
	Taints []corev1.Taint
	// LabelClique has tessera-node label its Node with the GPUs' clique.
	LabelClique bool
	// GPU are options of the fake GPUs.
	GPU []gpu.Option
}

// AddGPUNode adds a kwok node (64 CPUs, 512Gi, 110 pods, plus o.Extra)
// with a tessera-node of fake GPUs of profile in-process, and waits for
// its slices. It returns the node's driver, whose ledger tests may use as
// the device plugin would.
func (e *Env) AddGPUNode(name, profile string, o NodeOptions) *driver.Driver {
	e.T.Helper()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110"),
	}
	maps.Copy(capacity, o.Extra)
	e.CP.AddKwokNodeWith(e.T, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: o.Taints},
		Status:     corev1.NodeStatus{Capacity: capacity},
	})
	return e.StartTesseraNode(name, profile, o)
}

// StartTesseraNode runs tessera-node in-process (fake GPUs of profile) for
// the kwok node name until the test ends, and waits for its slices.
func (e *Env) StartTesseraNode(name, profile string, o NodeOptions) *driver.Driver {
	t := e.T
	t.Helper()
	inv, err := gpu.NewFake(profile, name, o.GPU...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d, err := driver.Start(e.Ctx, driver.Options{
		NodeName:      name,
		KubeClient:    e.Client,
		Inventory:     inv,
		RegistrarDir:  filepath.Join(dir, "registry"),
		PluginDataDir: filepath.Join(dir, "plugin"),
		CDI:           cdi.Options{Root: filepath.Join(dir, "cdi"), Fake: true},
		LabelClique:   o.LabelClique,
	})
	if err != nil {
		t.Fatalf("starting tessera-node for %s: %v", name, err)
	}
	t.Cleanup(d.Stop)
	devs, _ := inv.Devices()
	e.WaitDevices(name, len(devs), 30*time.Second)
	return d
}

// WaitDevices waits until the ResourceSlices of node publish want devices.
func (e *Env) WaitDevices(node string, want int, timeout time.Duration) {
	e.T.Helper()
	e.Eventually("the GPUs of "+node+" published", timeout, func() (bool, string) {
		sl, err := e.Client.ResourceV1().ResourceSlices().List(e.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Spec.Devices)
		}
		return n == want, fmt.Sprintf("%d of %d devices published", n, want)
	})
}

// CreateQueue creates the cluster-scoped Queue name with spec.
func (e *Env) CreateQueue(name string, spec map[string]any) {
	e.T.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
	if _, err := e.Dyn.Resource(kube.QueueGVR).Create(e.Ctx, u, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating Queue %s: %v", name, err)
	}
}

// Pod returns a pod of the namespace, nil when it does not exist.
func (e *Env) Pod(name string) *corev1.Pod {
	e.T.Helper()
	p, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.T.Fatal(err)
	}
	return p
}

// WaitBound waits for each pod of the namespace named to be bound.
func (e *Env) WaitBound(timeout time.Duration, names ...string) {
	e.T.Helper()
	for _, n := range names {
		e.Eventually("pod "+n+" bound", timeout, func() (bool, string) {
			p := e.Pod(n)
			if p == nil {
				return false, "gone"
			}
			return p.Spec.NodeName != "", PendingReason(p)
		})
	}
}

// LivePods lists the namespace's pods matching selector that are not being
// deleted, by name.
func (e *Env) LivePods(selector string) []corev1.Pod {
	e.T.Helper()
	l, err := e.Client.CoreV1().Pods(e.NS).List(e.Ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		e.T.Fatalf("listing pods %q: %v", selector, err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}
