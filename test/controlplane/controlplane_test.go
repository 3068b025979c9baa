package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

// TestControlPlane runs the checks that only a real control plane passes, on
// one control plane (kube-scheduler included) to keep the package fast.
func TestControlPlane(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{Scheduler: true})
	client := cp.Client(t)

	t.Run("Version", func(t *testing.T) {
		v, err := client.Discovery().ServerVersion()
		require.NoError(t, err)
		require.Equal(t, controlplane.KubeVersion, v.GitVersion)
	})

	// The Must-show: kube-controller-manager's ResourceClaim controller
	// turns a pod's ResourceClaimTemplate reference into a ResourceClaim
	// owned by the pod. The pod itself stays pending (no driver publishes
	// devices), which does not matter here.
	t.Run("ClaimFromTemplate", func(t *testing.T) {
		ctx := t.Context()
		ns := cp.CreateNamespace(t, "claims").Name
		class := &resourcev1.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: "test.gpu.tessera.dev"},
			Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`},
			}}},
		}
		_, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
		require.NoError(t, err)
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "one-gpu"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{
				Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
					Name:    "gpu",
					Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class.Name},
				}}},
			}},
		}
		_, err = client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{})
		require.NoError(t, err)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "trainer"},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}},
				Containers: []corev1.Container{{
					Name: "main", Image: "busybox",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				}},
			},
		}
		pod, err = client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		require.NoError(t, err)

		var claim *resourcev1.ResourceClaim
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for i := range claims.Items {
				for _, ref := range claims.Items[i].OwnerReferences {
					if ref.Kind == "Pod" && ref.UID == pod.UID && ptr.Deref(ref.Controller, false) {
						claim = &claims.Items[i]
						return true, nil
					}
				}
			}
			return false, nil
		})
		require.NoError(t, err, "kube-controller-manager created no ResourceClaim for the pod")
		require.Equal(t, "gpu", claim.Annotations["resource.kubernetes.io/pod-claim-name"])
		require.Equal(t, class.Name, claim.Spec.Devices.Requests[0].Exactly.DeviceClassName)

		// The controller also records the claim's name in the pod's status.
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, s := range p.Status.ResourceClaimStatuses {
				if s.Name == "gpu" && ptr.Deref(s.ResourceClaimName, "") == claim.Name {
					return true, nil
				}
			}
			return false, nil
		})
		require.NoError(t, err, "pod status does not name claim %s", claim.Name)
	})

	t.Run("RestrictedUserRBAC", func(t *testing.T) {
		ctx := t.Context()
		ns := cp.CreateNamespace(t, "rbac").Name
		restricted, err := kubernetes.NewForConfig(cp.RestrictedConfig)
		require.NoError(t, err)

		_, err = restricted.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		require.True(t, apierrors.IsForbidden(err), "listing pods without a grant: want Forbidden, got %v", err)

		_, err = client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: controlplane.RestrictedUser}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)

		// The RBAC authorizer reads roles through an informer: allow a moment.
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := restricted.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		})
		require.NoError(t, err, "listing pods after the RoleBinding")

		// The grant is exactly what the Role says.
		_, err = restricted.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		require.True(t, apierrors.IsForbidden(err), "listing secrets: want Forbidden, got %v", err)
		_, err = restricted.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		require.True(t, apierrors.IsForbidden(err), "listing pods in another namespace: want Forbidden, got %v", err)
	})

	// A node's identity is limited by the Node authorizer and NodeRestriction.
	t.Run("NodeIdentity", func(t *testing.T) {
		ctx := t.Context()
		nodeClient, err := kubernetes.NewForConfig(cp.UserConfig("system:node:n1", "system:nodes"))
		require.NoError(t, err)
		_, err = nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
		require.NoError(t, err, "a node registers itself")
		_, err = nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, metav1.CreateOptions{})
		require.True(t, apierrors.IsForbidden(err), "a node creates another node: want Forbidden, got %v", err)
		_, err = nodeClient.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
		require.True(t, apierrors.IsForbidden(err), "a node lists secrets: want Forbidden, got %v", err)
		require.NoError(t, client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}))
	})

	// The DRA features Tessera relies on are on: consumable capacity and
	// device taints in ResourceSlices (dropped silently if a gate were
	// off), and the DeviceTaintRule API.
	t.Run("DRAFeatures", func(t *testing.T) {
		ctx := t.Context()
		slice := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "features"},
			Spec: resourcev1.ResourceSliceSpec{
				// Not Tessera's driver, so the pending pod of
				// ClaimFromTemplate does not see this device.
				Driver:   "features.test.tessera.dev",
				Pool:     resourcev1.ResourcePool{Name: "features", ResourceSliceCount: 1},
				AllNodes: ptr.To(true),
				Devices: []resourcev1.Device{{
					Name:                     "gpu-0",
					AllowMultipleAllocations: ptr.To(true),
					Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
						"memory": {
							Value:         resource.MustParse("80Gi"),
							RequestPolicy: &resourcev1.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("80Gi"))},
						},
					},
					Taints: []resourcev1.DeviceTaint{{Key: "gpu.tessera.dev/unhealthy", Effect: resourcev1.DeviceTaintEffectNoSchedule}},
				}},
			},
		}
		got, err := client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
		require.NoError(t, err)
		dev := got.Spec.Devices[0]
		require.True(t, ptr.Deref(dev.AllowMultipleAllocations, false), "allowMultipleAllocations dropped: DRAConsumableCapacity off?")
		require.NotNil(t, dev.Capacity["memory"].RequestPolicy, "capacity requestPolicy dropped: DRAConsumableCapacity off?")
		require.Len(t, dev.Taints, 1, "device taints dropped: DRADeviceTaints off?")

		rule := &resourcev1beta2.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: "drain-gpu-0"},
			Spec: resourcev1beta2.DeviceTaintRuleSpec{
				DeviceSelector: &resourcev1beta2.DeviceTaintSelector{Driver: ptr.To("features.test.tessera.dev"), Device: ptr.To("gpu-0")},
				Taint:          resourcev1beta2.DeviceTaint{Key: "gpu.tessera.dev/drain", Effect: resourcev1beta2.DeviceTaintEffectNoSchedule},
			},
		}
		_, err = client.ResourceV1beta2().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{})
		require.NoError(t, err, "DeviceTaintRule API (resource.k8s.io/v1beta2)")
	})

	t.Run("Kwok", func(t *testing.T) {
		ctx := t.Context()
		cp.StartKwok(t)
		cp.AddKwokNode(t, "kwok-1", map[string]string{"tessera.dev/test": "yes"})
		ns := cp.CreateNamespace(t, "kwok").Name

		node, err := client.CoreV1().Nodes().Get(ctx, "kwok-1", metav1.GetOptions{})
		require.NoError(t, err)
		require.Equal(t, "yes", node.Labels["tessera.dev/test"])

		bound := testPod("bound-by-hand")
		bound.Spec.NodeName = "kwok-1"
		_, err = client.CoreV1().Pods(ns).Create(ctx, bound, metav1.CreateOptions{})
		require.NoError(t, err)
		waitRunning(t, client, ns, bound.Name)

		// kube-scheduler places a pod with no nodeName on the kwok node.
		scheduled := testPod("scheduled")
		scheduled.Spec.NodeSelector = map[string]string{"tessera.dev/test": "yes"}
		_, err = client.CoreV1().Pods(ns).Create(ctx, scheduled, metav1.CreateOptions{})
		require.NoError(t, err)
		p := waitRunning(t, client, ns, scheduled.Name)
		require.Equal(t, "kwok-1", p.Spec.NodeName)

		// Deleting a pod on a kwok node completes (kwok plays the kubelet).
		require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, bound.Name, metav1.DeleteOptions{}))
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().Pods(ns).Get(ctx, bound.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		require.NoError(t, err, "pod on kwok node not deleted")
	})
}

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
}

func waitRunning(t *testing.T, client kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	require.NoError(t, err, "pod %s/%s not Running; last seen: %+v", ns, name, pod)
	return pod
}

// TestNewAndStop checks the TestMain-style API and that Stop leaves nothing
// behind: no process of the recorded PIDs, no working dir. Without KCM, the
// harness itself provides what pods in "default" need.
func TestNewAndStop(t *testing.T) {
	bin := controlplane.BinDir(t)
	t.Setenv(controlplane.EnvKeep, "")
	cp, err := controlplane.New(controlplane.Options{BinDir: bin, NoControllerManager: true}, t.Logf)
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			cp.Stop(true)
		}
	}()

	client, err := kubernetes.NewForConfig(cp.AdminConfig)
	require.NoError(t, err)
	_, err = client.CoreV1().Pods("default").Create(t.Context(), testPod("p"), metav1.CreateOptions{})
	require.NoError(t, err, "pod in default without KCM")

	// A kubeconfig for a child process works for that user.
	path := cp.WriteKubeconfig(t, cp.RestrictedConfig)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), cp.APIServerURL)

	pids := recordedPIDs(t, cp.Dir)
	require.Len(t, pids, 2, "etcd and kube-apiserver")

	// A kube-scheduler started late: its stop ends it, and Stop ends one
	// left running.
	stopSched, err := cp.StartKubeScheduler(t.Context(), "--v=2")
	require.NoError(t, err)
	first := recordedPIDs(t, cp.Dir)["kube-scheduler-1"]
	require.NotZero(t, first, "kube-scheduler-1 pid")
	stopSched()
	require.ErrorIs(t, syscall.Kill(first, 0), syscall.ESRCH, "kube-scheduler-1 still running after its stop")
	_, err = cp.StartKubeScheduler(t.Context())
	require.NoError(t, err)
	pids = recordedPIDs(t, cp.Dir)
	require.Contains(t, pids, "kube-scheduler-2")
	dir := cp.Dir
	cp.Stop(false)
	stopped = true
	for name, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "%s (pid %d) still running", name, pid)
	}
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "dir %s not removed", dir)
}

func recordedPIDs(t *testing.T, dir string) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	require.NoError(t, err)
	pids := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		require.NoError(t, err)
		pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
	}
	return pids
}

// TestStartFailureShowsLog checks that a component that dies at start fails
// the start with its log's tail, and leaves no process behind.
func TestStartFailureShowsLog(t *testing.T) {
	bin := controlplane.BinDir(t)
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
	_, err := controlplane.New(controlplane.Options{BinDir: bin, APIServerArgs: []string{"--no-such-flag"}}, logf)
	require.Error(t, err)
	require.Contains(t, err.Error(), "kube-apiserver exited")
	require.Contains(t, err.Error(), "no-such-flag", "the error carries the log tail")

	// The kept dir is named in the log; its processes are gone.
	var dir string
	for _, l := range logged {
		if _, after, ok := strings.Cut(l, "kept its dir "); ok {
			dir, _, _ = strings.Cut(after, " ")
		}
	}
	require.NotEmpty(t, dir, "kept dir not logged: %q", logged)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for name, pid := range recordedPIDs(t, dir) {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "%s (pid %d) still running", name, pid)
	}
}

// TestRestartAPIServer kills kube-apiserver and starts it again: same URL,
// same data, and the clients made before (the test's own, and
// kube-controller-manager's informers) carry on without being rebuilt.
func TestRestartAPIServer(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := t.Context()
	client := cp.Client(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}, Data: map[string]string{"k": "v"}}
	_, err := client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	url := cp.APIServerURL

	for _, kill := range []bool{true, false} {
		require.NoError(t, cp.StopAPIServer(kill))
		_, err = client.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{})
		require.Error(t, err, "the API server answered while stopped (kill=%v)", kill)
		require.Error(t, cp.StopAPIServer(kill), "stopping a stopped API server must fail")
		require.NoError(t, cp.StartAPIServer(ctx))
		require.Error(t, cp.StartAPIServer(ctx), "starting a running API server must fail")
		require.Equal(t, url, cp.APIServerURL)

		got, err := client.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{})
		require.NoError(t, err, "kill=%v", kill)
		require.Equal(t, "v", got.Data["k"])
	}
	// KCM's informers reconnected: it creates a new namespace's default
	// ServiceAccount (CreateNamespace waits for it).
	cp.CreateNamespace(t, "after-restart")
	// And RestartAPIServer does both steps.
	cp.RestartAPIServer(t, true, 500*time.Millisecond)
	cp.CreateNamespace(t, "after-second-restart")
}
