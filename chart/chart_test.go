// Package chart tests the Helm chart in chart/tessera: its copies of the
// CRDs, DeviceClasses and controller RBAC stay in sync with their sources,
// `helm lint` passes, `helm template` renders the objects Tessera needs (DRA
// plugin mounts, least-privilege RBAC, priority classes…), and the rendered
// chart is accepted by a real kube-apiserver, whose admission policy keeps
// tessera-node to its own node's ResourceSlices.
package chart

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/webhook"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

const (
	chartDir  = "tessera"
	namespace = "tessera-system"
)

// synced are the chart's copies and their sources (`make chart-sync`).
var synced = map[string]string{
	"tessera/files/deviceclasses.yaml":          "../driver/deviceclasses/deviceclasses.yaml",
	"tessera/files/controller-rbac.yaml":        "../deploy/rbac/tessera-controller.yaml",
	"tessera/files/controller-shadow-rbac.yaml": "../deploy/rbac/tessera-controller-shadow.yaml",
}

// TestCopiesInSync fails when a copy in the chart drifted from its source.
func TestCopiesInSync(t *testing.T) {
	srcCRDs, err := filepath.Glob("../api/scheduling/crds/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, srcCRDs)
	chartCRDs, err := filepath.Glob("tessera/crds/*.yaml")
	require.NoError(t, err)
	pairs := map[string]string{}
	for k, v := range synced {
		pairs[k] = v
	}
	for _, src := range srcCRDs {
		pairs["tessera/crds/"+filepath.Base(src)] = src
	}
	require.Len(t, chartCRDs, len(srcCRDs), "chart/tessera/crds holds other files than api/scheduling/crds: run `make chart-sync`")
	for copyPath, src := range pairs {
		want, err := os.ReadFile(src)
		require.NoError(t, err)
		got, err := os.ReadFile(copyPath)
		require.NoError(t, err, "run `make chart-sync`")
		if !bytes.Equal(got, want) {
			t.Errorf("chart/%s differs from %s: run `make chart-sync`", copyPath, strings.TrimPrefix(src, "../"))
		}
	}
}

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm returns the helm binary: $TESSERA_HELM, or built (once, cached under
// _cache/) by hack/tools/helm/build.sh. Under -short it is only used when
// already given.
func helm(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TESSERA_HELM"); p != "" {
		return p
	}
	if testing.Short() {
		t.Skip("needs helm (built from its Go module, minutes cold); set TESSERA_HELM or run without -short")
	}
	helmOnce.Do(func() {
		out, err := exec.Command("../hack/tools/helm/build.sh").Output()
		if err != nil {
			helmErr = fmt.Errorf("hack/tools/helm/build.sh: %w", err)
			return
		}
		helmPath = strings.TrimSpace(string(out))
	})
	require.NoError(t, helmErr)
	return helmPath
}

func runHelm(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s\n%s%s", strings.Join(args, " "), out, stderr.String())
	return string(out)
}

// valueFiles are the values files the chart must render with: the
// defaults and the kind demo's.
var valueFiles = []string{"", "../demo/kind/values.yaml"}

func TestHelmLint(t *testing.T) {
	for _, vf := range valueFiles {
		args := []string{"lint", "--strict", chartDir}
		if vf != "" {
			args = append(args, "-f", vf)
		}
		out := runHelm(t, args...)
		require.Contains(t, out, "0 chart(s) failed", out)
	}
}

// render runs helm template and decodes every object (CRDs included).
func render(t *testing.T, args ...string) []runtime.Object {
	t.Helper()
	out := runHelm(t, append([]string{"template", "tessera", chartDir, "--namespace", namespace, "--include-crds"}, args...)...)
	var objs []runtime.Object
	for _, doc := range strings.Split(out, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		require.NoError(t, utilyaml.Unmarshal([]byte(doc), &u.Object), doc)
		if len(u.Object) == 0 {
			continue
		}
		typed, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil && runtime.IsNotRegisteredError(err) {
			objs = append(objs, u) // CRDs and custom resources
			continue
		}
		require.NoError(t, err, doc)
		objs = append(objs, typed)
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func find[T runtime.Object](objs []runtime.Object, name string) T {
	var zero T
	for _, o := range objs {
		if x, ok := o.(T); ok {
			if m, err := meta(o); err == nil && m.GetName() == name {
				return x
			}
		}
	}
	return zero
}

func meta(o runtime.Object) (metav1.Object, error) {
	if m, ok := o.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("%T has no metadata", o)
}

func TestHelmTemplateDefaults(t *testing.T) {
	objs := render(t)

	// DeviceClasses: exactly driver/deviceclasses.
	want, err := deviceclasses.Load()
	require.NoError(t, err)
	for _, dc := range want {
		got := find[*resourceapi.DeviceClass](objs, dc.Name)
		require.NotNil(t, got, "DeviceClass %s", dc.Name)
		require.Equal(t, dc.Spec, got.Spec, "DeviceClass %s", dc.Name)
	}

	// PriorityClasses of DESIGN.md.
	for name, value := range map[string]int32{"tessera-train": 50, "tessera-build": 100, "tessera-inference": 125} {
		pc := find[*schedulingv1.PriorityClass](objs, name)
		require.NotNil(t, pc, "PriorityClass %s", name)
		require.Equal(t, value, pc.Value, name)
		require.False(t, pc.GlobalDefault)
	}

	// CRDs and the default Queue.
	for _, n := range []string{"queues.scheduling.tessera.dev", "podgroups.scheduling.tessera.dev", "topologies.scheduling.tessera.dev", "default"} {
		require.NotNil(t, find[*unstructured.Unstructured](objs, n), n)
	}

	// tessera-node: privileged DRA plugin with the kubelet's plugin dirs.
	ds := find[*appsv1.DaemonSet](objs, "tessera-node")
	require.NotNil(t, ds)
	pod := ds.Spec.Template.Spec
	require.Equal(t, "tessera-node", pod.ServiceAccountName)
	require.False(t, pod.HostPID, "the MPS daemons, which need it, run in tessera-mps")
	require.False(t, pod.HostIPC)
	c := pod.Containers[0]
	require.True(t, ptr.Deref(c.SecurityContext.Privileged, false))
	hostPaths := map[string]string{} // mountPath → host path
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				hostPaths[m.MountPath] = v.HostPath.Path
			}
		}
	}
	for _, p := range []string{"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/device-plugins", "/var/run/cdi", "/dev", "/run/tessera/mps"} {
		require.Equal(t, p, hostPaths[p], "host path %s mounted at the same place; mounts: %v", p, hostPaths)
	}
	require.Equal(t, "/", hostPaths["/driver-root"], "real mode mounts the driver root")
	require.Contains(t, c.Args, "--kubelet-plugin-dir=/var/lib/kubelet/plugins/gpu.tessera.dev")
	require.Contains(t, c.Args, "--kubelet-registrar-dir=/var/lib/kubelet/plugins_registry")
	require.Contains(t, c.Args, "--driver-root=/driver-root")
	require.Contains(t, c.Args, "--device-plugin=true")
	require.Contains(t, c.Args, "--device-plugin-dir=/var/lib/kubelet/device-plugins")
	require.Contains(t, c.Args, "--gpu-resource-name=nvidia.com/gpu")
	require.Contains(t, c.Args, "--share-slots=10")
	require.Equal(t, "spec.nodeName", c.Env[0].ValueFrom.FieldRef.FieldPath)
	require.Equal(t, "NODE_NAME", c.Env[0].Name)

	require.Contains(t, c.Args, "--mps-supervisor=/run/tessera/mps/supervisor.sock")

	// tessera-mps: the MPS daemons outside tessera-node's container, not
	// replaced by upgrades, with no API access.
	mps := find[*appsv1.DaemonSet](objs, "tessera-mps")
	require.NotNil(t, mps)
	require.Equal(t, appsv1.OnDeleteDaemonSetStrategyType, mps.Spec.UpdateStrategy.Type)
	mpod := mps.Spec.Template.Spec
	require.False(t, ptr.Deref(mpod.AutomountServiceAccountToken, true))
	require.True(t, mpod.HostPID)
	require.True(t, mpod.HostIPC)
	require.Equal(t, pod.NodeSelector, mpod.NodeSelector, "on the nodes tessera-node runs on")
	require.Equal(t, pod.Tolerations, mpod.Tolerations)
	mc := mpod.Containers[0]
	require.Equal(t, c.Image, mc.Image)
	require.Equal(t, []string{"mps-supervisor", "--mps-root=/run/tessera/mps", "--mps-control=/driver-root/usr/bin/nvidia-cuda-mps-control", "-v=0"}, mc.Args)
	require.True(t, ptr.Deref(mc.SecurityContext.Privileged, false), "real MPS daemons open the GPUs")
	require.Nil(t, mc.Resources.Limits, "no memory limit: an OOM kill takes every MPS client down")
	require.Equal(t, "/run/tessera/mps", mpod.Volumes[0].HostPath.Path)
	require.Equal(t, "/run/tessera/mps", mc.VolumeMounts[0].MountPath)
	require.Nil(t, find[*appsv1.DaemonSet](render(t, "--set", "node.sharing.mps=false"), "tessera-mps"), "no MPS, no supervisor")

	// tessera-node RBAC: least privilege.
	nodeRole := find[*rbacv1.ClusterRole](objs, "tessera-node")
	require.NotNil(t, nodeRole)
	require.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	}, nodeRole.Rules)

	// tessera-controller: 2 leader-elected replicas, RBAC of deploy/rbac.
	dep := find[*appsv1.Deployment](objs, "tessera-controller")
	require.NotNil(t, dep)
	require.Equal(t, int32(2), *dep.Spec.Replicas)
	cc := dep.Spec.Template.Spec.Containers[0]
	require.Contains(t, cc.Args, "--leader-elect=true")
	require.Contains(t, cc.Args, "--leader-elect-namespace="+namespace)
	require.Contains(t, cc.Args, "--metrics-bind-address=:8080")
	require.Equal(t, rbac.ServiceAccount, dep.Spec.Template.Spec.ServiceAccountName)
	require.NotNil(t, find[*corev1.ServiceAccount](objs, rbac.ServiceAccount))
	src := decodeAll(t, rbac.ControllerYAML)
	require.Equal(t, find[*rbacv1.ClusterRole](src, "tessera-controller").Rules, find[*rbacv1.ClusterRole](objs, "tessera-controller").Rules)
	require.Equal(t, find[*rbacv1.Role](src, "tessera-controller-leader-election").Rules, find[*rbacv1.Role](objs, "tessera-controller-leader-election").Rules)
	crb := find[*rbacv1.ClusterRoleBinding](objs, "tessera-controller")
	require.Equal(t, namespace, crb.Subjects[0].Namespace)
	// The assignment policy, as deploy/rbac ships it, bound with Deny.
	vap := find[*admissionregistrationv1.ValidatingAdmissionPolicy](objs, "tessera-gpu-assignment")
	require.NotNil(t, vap)
	require.Equal(t, find[*admissionregistrationv1.ValidatingAdmissionPolicy](src, "tessera-gpu-assignment").Spec, vap.Spec)
	vapb := find[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](objs, "tessera-gpu-assignment")
	require.NotNil(t, vapb)
	require.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, vapb.Spec.ValidationActions)

	// Metrics Services.
	for _, n := range []string{"tessera-controller-metrics", "tessera-node-metrics"} {
		require.NotNil(t, find[*corev1.Service](objs, n), n)
	}
}

func TestHelmTemplateValues(t *testing.T) {
	objs := render(t, "--namespace", "gpu", "-f", "../demo/kind/values.yaml",
		"--set", "controller.replicas=1", "--set", "controller.leaderElection.leaseName=my-lease",
		"--set", "node.sharing.mode=MPS", "--set", "priorityClasses.create=false",
		"--set", "node.devicePlugin.enabled=false")
	ds := find[*appsv1.DaemonSet](objs, "tessera-node")
	c := ds.Spec.Template.Spec.Containers[0]
	require.Contains(t, c.Args, "--device-plugin=false")
	require.NotContains(t, c.Args, "--device-plugin-dir=/var/lib/kubelet/device-plugins")
	for _, m := range c.VolumeMounts {
		require.NotEqual(t, "device-plugins", m.Name, "no device-plugin directory without the device plugin")
	}
	for _, r := range find[*rbacv1.ClusterRole](objs, "tessera-node").Rules {
		require.NotContains(t, r.Resources, "pods", "no pod access without the device plugin")
	}
	require.Contains(t, c.Args, "--fake-gpus=h100-sxm-8")
	// Fake GPUs: tessera-node unprivileged too, no /dev, read-only root.
	require.False(t, ptr.Deref(c.SecurityContext.Privileged, false))
	require.False(t, ptr.Deref(c.SecurityContext.AllowPrivilegeEscalation, true))
	require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	require.True(t, ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false))
	for _, m := range c.VolumeMounts {
		require.NotEqual(t, "/dev", m.MountPath, "no device nodes with fake GPUs")
	}
	require.Contains(t, c.Args, "--daemonset=gpu/tessera-node", "tessera-node watches its own DaemonSet (uninstall cleanup)")
	require.Equal(t, []string{"tessera-node"}, find[*rbacv1.Role](objs, "tessera-node").Rules[0].ResourceNames)
	require.Contains(t, c.Args, "--sharing-mode=MPS")
	require.NotContains(t, c.Args, "--driver-root=/driver-root")
	require.Empty(t, ds.Spec.Template.Spec.NodeSelector)
	// Fake GPUs: the supervisor runs the built-in stand-in, unprivileged.
	mc := find[*appsv1.DaemonSet](objs, "tessera-mps").Spec.Template.Spec.Containers[0]
	require.Contains(t, mc.Args, "--fake")
	require.False(t, ptr.Deref(mc.SecurityContext.Privileged, false))
	require.Equal(t, []corev1.Capability{"ALL"}, mc.SecurityContext.Capabilities.Drop)
	require.Len(t, mc.VolumeMounts, 1, "only the MPS root")
	dep := find[*appsv1.Deployment](objs, "tessera-controller")
	require.Equal(t, int32(1), *dep.Spec.Replicas)
	require.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--leader-elect-lease-name=my-lease")
	role := find[*rbacv1.Role](objs, "tessera-controller-leader-election")
	require.Equal(t, "gpu", role.Namespace)
	// The assignment policy names the release's controller identity.
	vap := find[*admissionregistrationv1.ValidatingAdmissionPolicy](objs, "tessera-gpu-assignment")
	require.Equal(t, `request.userInfo.username == "system:serviceaccount:gpu:tessera-controller"`, vap.Spec.Variables[0].Expression)
	require.Equal(t, []string{"my-lease"}, role.Rules[1].ResourceNames)
	require.Nil(t, find[*schedulingv1.PriorityClass](objs, "tessera-train"))

	// One value names the whole-GPU resource for both programs.
	objs = render(t, "--set", "gpuResourceName=example.com/gpu")
	require.Contains(t, find[*appsv1.DaemonSet](objs, "tessera-node").Spec.Template.Spec.Containers[0].Args, "--gpu-resource-name=example.com/gpu")
	require.Contains(t, find[*appsv1.Deployment](objs, "tessera-controller").Spec.Template.Spec.Containers[0].Args, "--gpu-resource-name=example.com/gpu")
}

func decodeAll(t *testing.T, data []byte) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, doc := range strings.Split(string(data), "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		o, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		require.NoError(t, err)
		out = append(out, o)
	}
	return out
}

// releaseAPIServer starts an API server (no controller manager) with the
// release namespace, a context for the test's calls to it and an admin
// client.
func releaseAPIServer(t *testing.T) (context.Context, *controlplane.ControlPlane, kubernetes.Interface) {
	t.Helper()
	cp := controlplane.Start(t, controlplane.Options{NoControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	client := cp.Client(t)
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return ctx, cp, client
}

// serviceAccountConfig is the admin's config impersonating the release's
// ServiceAccount name as a token of it authenticates, with extra (the
// node a pod-bound token names).
func serviceAccountConfig(cp *controlplane.ControlPlane, name string, extra map[string][]string) *rest.Config {
	cfg := rest.CopyConfig(cp.AdminConfig)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		Extra:    extra,
	}
	return cfg
}

// TestChartOnAPIServer creates every rendered object on a real API server
// (CRDs first, as helm does), so schema errors show, and checks that the
// admission policies keep tessera-node to its own node's ResourceSlices
// and to the clique label of its own Node.
func TestChartOnAPIServer(t *testing.T) {
	helm(t)
	ctx, cp, client := releaseAPIServer(t)

	out := runHelm(t, "template", "tessera", chartDir, "--namespace", namespace, "--include-crds", "-f", "../demo/kind/values.yaml")
	createRendered(ctx, t, cp, out)

	// tessera-node's identity, as a pod-bound token on node n1 carries it.
	nodeClient, err := kubernetes.NewForConfig(serviceAccountConfig(cp, "tessera-node",
		map[string][]string{"authentication.kubernetes.io/node-name": {"n1"}}))
	require.NoError(t, err)
	slice := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-gpu.tessera.dev-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: "gpu.tessera.dev", NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "gpu-0"}},
			},
		}
	}
	// The policy takes effect once the API server has loaded it.
	require.Eventually(t, func() bool {
		_, err := nodeClient.ResourceV1().ResourceSlices().Create(ctx, slice("n2"), metav1.CreateOptions{})
		return err != nil && strings.Contains(err.Error(), "may only write ResourceSlices of its own node")
	}, 30*time.Second, 250*time.Millisecond, "tessera-node writing another node's slice is denied")
	own, err := nodeClient.ResourceV1().ResourceSlices().Create(ctx, slice("n1"), metav1.CreateOptions{})
	require.NoError(t, err, "tessera-node writes its own node's slice")
	_, err = nodeClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = nodeClient.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "tessera-node cannot read secrets: %v", err)
	require.NoError(t, nodeClient.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}))
	checkCliqueLabelPolicy(ctx, t, client, nodeClient)

	// The controller's identity can take its Lease in the release namespace.
	ctrlClient, err := kubernetes.NewForConfig(serviceAccountConfig(cp, "tessera-controller", nil))
	require.NoError(t, err)
	_, err = ctrlClient.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = ctrlClient.CoordinationV1().Leases(namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tessera-controller"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// Only the controller's identity writes the assignment annotation.
	// (No kube-controller-manager here: the namespace's default
	// ServiceAccount, which pod admission looks up, is made by hand.)
	_, err = client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: namespace},
		Spec: corev1.PodSpec{SchedulerName: "nobody", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	forged := pod.DeepCopy()
	forged.Annotations = map[string]string{assignment.Annotation: `{"gpus":[0]}`}
	require.Eventually(t, func() bool {
		_, err := client.CoreV1().Pods(namespace).Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "annotation "+assignment.Annotation+" is written by tessera-controller only")
	}, 30*time.Second, 250*time.Millisecond, "an admin creating a pod with the assignment is denied")
	_, err = client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	patch := []byte(`{"metadata":{"annotations":{"` + assignment.Annotation + `":"{\"gpus\":[0]}"}}}`)
	_, err = ctrlClient.CoreV1().Pods(namespace).Patch(ctx, "p", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err, "the controller writes the assignment")
	_, err = ctrlClient.CoreV1().Pods(namespace).Patch(ctx, "p", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{})
	require.ErrorContains(t, err, "tessera-controller may change only the annotation "+assignment.Annotation)
}

// checkCliqueLabelPolicy: tessera-node on n1 (nodeClient) may set and
// remove the clique label of its own Node, and nothing else: not the
// label on another Node, not another label, not the Node's spec.
func checkCliqueLabelPolicy(ctx context.Context, t *testing.T, admin, nodeClient kubernetes.Interface) {
	t.Helper()
	for _, n := range []string{"n1", "n2"} {
		_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"rack": "r1"}}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	labels := func(kv string) []byte { return []byte(`{"metadata":{"labels":{` + kv + `}}}`) }
	patch := func(node string, body []byte) error {
		_, err := nodeClient.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
	clique := `"` + draname.LabelClique + `":`
	// The policy takes effect once the API server has loaded it.
	require.Eventually(t, func() bool {
		_, err := nodeClient.CoreV1().Nodes().Patch(ctx, "n2", types.MergePatchType, labels(clique+`"u.1"`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "may only label its own Node")
	}, 30*time.Second, 250*time.Millisecond, "tessera-node labelling another Node is denied")
	for _, c := range []struct {
		name, node string
		body       []byte
		deny       string // "" when allowed
	}{
		{name: "another node's clique", node: "n2", body: labels(clique + `"u.1"`), deny: "tessera-node on node 'n1' may only label its own Node, not 'n2'"},
		{name: "own clique", node: "n1", body: labels(clique + `"u.1"`)},
		{name: "own clique changed", node: "n1", body: labels(clique + `"u.2"`)},
		{name: "another label", node: "n1", body: labels(`"rack":"r2"`), deny: "tessera-node may change only the " + draname.LabelClique + " label of its Node"},
		{name: "a new label", node: "n1", body: labels(`"gpu":"yes"`), deny: "may change only the " + draname.LabelClique},
		{name: "clique and another label", node: "n1", body: labels(clique + `"u.3","rack":"r2"`), deny: "may change only the " + draname.LabelClique},
		{name: "an annotation", node: "n1", body: []byte(`{"metadata":{"annotations":{"a":"b"}}}`), deny: "may change only the " + draname.LabelClique},
		{name: "the spec", node: "n1", body: []byte(`{"spec":{"unschedulable":true}}`), deny: "may change only the " + draname.LabelClique},
		{name: "own clique removed", node: "n1", body: labels(clique + `null`)},
	} {
		err := patch(c.node, c.body)
		if c.deny == "" {
			require.NoError(t, err, "tessera-node on n1: %s", c.name)
			continue
		}
		require.ErrorContains(t, err, c.deny, "tessera-node on n1: %s", c.name)
	}
	n1, err := admin.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"rack": "r1"}, n1.Labels, "only the allowed patches took effect")
	// An admin is not bound by it.
	_, err = admin.CoreV1().Nodes().Patch(ctx, "n2", types.MergePatchType, labels(`"rack":"r2"`), metav1.PatchOptions{})
	require.NoError(t, err)
}

// TestKindDemoScript checks the kind demo's script parses (it runs where
// Docker is; see demo/kind/README.md).
func TestKindDemoScript(t *testing.T) {
	out, err := exec.Command("bash", "-n", "../demo/kind/run.sh").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// It fails loudly when a pod does not run: no command's failure is
	// swallowed, and the fraction pods are waited for.
	script, err := os.ReadFile("../demo/kind/run.sh")
	require.NoError(t, err)
	for i, line := range strings.Split(string(script), "\n") {
		require.NotRegexp(t, `\|\|\s*(true|:)\s*$`, line, "run.sh line %d hides a failure", i+1)
	}
	require.Contains(t, string(script), "wait --for=condition=Ready pod -l app=chat")
	require.Contains(t, string(script), "set -euo pipefail")
}

// createRendered creates every object of a `helm template` output on the
// API server, CRDs first and served, with strict field validation.
func createRendered(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, out string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	require.NoError(t, err)
	var docs []*unstructured.Unstructured
	for _, doc := range strings.Split(out, "\n---") {
		u := &unstructured.Unstructured{}
		require.NoError(t, utilyaml.Unmarshal([]byte(doc), &u.Object))
		if len(u.Object) > 0 {
			docs = append(docs, u)
		}
	}
	// CRDs first and established, then the rest (as helm installs).
	slices.SortStableFunc(docs, func(a, b *unstructured.Unstructured) int {
		ac, bc := a.GetKind() == "CustomResourceDefinition", b.GetKind() == "CustomResourceDefinition"
		switch {
		case ac && !bc:
			return -1
		case bc && !ac:
			return 1
		}
		return 0
	})
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.AdminConfig)))
	for _, u := range docs {
		gvk := u.GroupVersionKind()
		var ri dynamic.ResourceInterface
		require.Eventually(t, func() bool {
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				mapper.Reset()
				return false
			}
			ri = dyn.Resource(m.Resource)
			if m.Scope.Name() == "namespace" {
				ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
			}
			return true
		}, 30*time.Second, 200*time.Millisecond, "API for %s", gvk)
		_, err := ri.Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"})
		require.NoError(t, err, "creating %s %s", gvk.Kind, u.GetName())
	}
}

// TestHelmTemplateWebhook checks the admission webhook's objects: the
// configuration sends only annotated pods (the expression of
// controller/webhook.MatchCondition), fails closed, skips the release's
// namespace and kube-system, and trusts a CA that signed the served
// certificate for the Service's name; the controller serves it from the
// mounted Secret. Disabled, none of it renders.
func TestHelmTemplateWebhook(t *testing.T) {
	objs := render(t)
	cfg := find[*admissionregistrationv1.MutatingWebhookConfiguration](objs, "tessera-controller")
	require.NotNil(t, cfg)
	require.Len(t, cfg.Webhooks, 2)
	w := cfg.Webhooks[0]
	require.Equal(t, []admissionregistrationv1.MatchCondition{{Name: "fraction-annotations", Expression: webhook.MatchCondition}}, w.MatchConditions)
	require.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy)
	require.Equal(t, admissionregistrationv1.SideEffectClassNone, *w.SideEffects)
	require.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, w.Rules[0].Operations)
	require.Equal(t, []string{"pods"}, w.Rules[0].Resources)
	require.Equal(t, []string{namespace, "kube-system"}, w.NamespaceSelector.MatchExpressions[0].Values)
	svc := w.ClientConfig.Service
	require.NotNil(t, svc)
	require.Equal(t, webhook.Path, *svc.Path)
	require.NotNil(t, find[*corev1.Service](objs, svc.Name))

	secret := find[*corev1.Secret](objs, "tessera-controller-webhook-tls")
	require.NotNil(t, secret)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(w.ClientConfig.CABundle))
	block, _ := pem.Decode(secret.Data["tls.crt"])
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: svc.Name + "." + namespace + ".svc"})
	require.NoError(t, err, "the served certificate is trusted for the Service's name")

	// The namespace opt-in: pods created in a labelled namespace that name
	// no scheduler (ScheduleMatchCondition), CREATE only, failing closed.
	opt := cfg.Webhooks[1]
	require.Equal(t, []admissionregistrationv1.MatchCondition{{Name: "default-scheduler", Expression: webhook.ScheduleMatchCondition}}, opt.MatchConditions)
	require.Equal(t, webhook.ScheduleNamespaceSelector, opt.NamespaceSelector.MatchLabels)
	require.Equal(t, []string{namespace, "kube-system"}, opt.NamespaceSelector.MatchExpressions[0].Values)
	require.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, opt.Rules[0].Operations)
	require.Equal(t, admissionregistrationv1.Fail, *opt.FailurePolicy)
	require.Equal(t, webhook.SchedulePath, *opt.ClientConfig.Service.Path)
	require.Equal(t, w.ClientConfig.CABundle, opt.ClientConfig.CABundle)
	noOpt := render(t, "--set", "controller.webhook.namespaceOptIn.enabled=false")
	require.Len(t, find[*admissionregistrationv1.MutatingWebhookConfiguration](noOpt, "tessera-controller").Webhooks, 1)

	dep := find[*appsv1.Deployment](objs, "tessera-controller")
	pod := dep.Spec.Template.Spec
	require.Contains(t, pod.Containers[0].Args, "--webhook-addr=:9443")
	require.Contains(t, pod.Containers[0].Args, "--webhook-cert-dir=/etc/tessera/webhook")
	require.Contains(t, pod.Containers[0].Args, "--gpu-resource-name=nvidia.com/gpu")
	require.Equal(t, "tessera-controller-webhook-tls", pod.Volumes[0].Secret.SecretName)

	off := render(t, "--set", "controller.webhook.enabled=false")
	require.Nil(t, find[*admissionregistrationv1.MutatingWebhookConfiguration](off, "tessera-controller"))
	require.Nil(t, find[*corev1.Secret](off, "tessera-controller-webhook-tls"))
	require.NotContains(t, find[*appsv1.Deployment](off, "tessera-controller").Spec.Template.Spec.Containers[0].Args, "--webhook-addr=:9443")
}

// TestHelmLeaderElectionOff: without the Lease nothing fences a commit, so
// the chart refuses several replicas and replaces a single one by
// Recreate (a rolling update would run two at once).
func TestHelmLeaderElectionOff(t *testing.T) {
	cmd := exec.Command(helm(t), "template", "tessera", chartDir, "--namespace", namespace, "--set", "controller.leaderElection.enabled=false")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "two replicas without leader election must not render")
	require.Contains(t, string(out), "controller.replicas > 1 needs controller.leaderElection.enabled=true")

	objs := render(t, "--set", "controller.leaderElection.enabled=false", "--set", "controller.replicas=1")
	dep := find[*appsv1.Deployment](objs, "tessera-controller")
	require.Equal(t, appsv1.RecreateDeploymentStrategyType, dep.Spec.Strategy.Type)
	require.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--leader-elect=false")
	dep = find[*appsv1.Deployment](render(t), "tessera-controller")
	require.NotEqual(t, appsv1.RecreateDeploymentStrategyType, dep.Spec.Strategy.Type)
}

// TestHelmTemplateMonitoring: the Prometheus Operator and Grafana objects
// render only when asked. ServiceMonitors select the metrics Services by
// the labels those carry and their port; PodMonitors select the pods; the
// PrometheusRule holds exactly the groups of files/prometheus-rules.yaml
// (the plain rule file) with a "for" overridden by value; the dashboard
// ConfigMap holds dashboards/tessera.json byte for byte under the sidecar's
// label. Contradictory values are refused with a message naming them.
func TestHelmTemplateMonitoring(t *testing.T) {
	kinds := func(objs []runtime.Object) map[string][]string {
		out := map[string][]string{}
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok && u.GetAPIVersion() == "monitoring.coreos.com/v1" {
				out[u.GetKind()] = append(out[u.GetKind()], u.GetName())
			}
		}
		return out
	}
	off := render(t)
	require.Empty(t, kinds(off), "nothing of the operator by default")
	require.Nil(t, find[*corev1.ConfigMap](off, "tessera-dashboard"))

	objs := render(t, "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
		"--set", "monitoring.prometheusRule.for.TesseraQueueStarvedBelowQuota=30m", "--set", "monitoring.grafanaDashboard.enabled=true",
		"--set", "monitoring.grafanaDashboard.folder=GPUs", "--set", "monitoring.labels.release=kps")
	require.Equal(t, map[string][]string{"ServiceMonitor": {"tessera-controller", "tessera-node"}, "PrometheusRule": {"tessera"}}, kinds(objs))
	for _, name := range []string{"tessera-controller", "tessera-node"} {
		sm := find[*unstructured.Unstructured](objs, name)
		require.Equal(t, "kps", sm.GetLabels()["release"])
		svc := find[*corev1.Service](objs, name+"-metrics")
		require.NotNil(t, svc)
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		for k, v := range sel {
			require.Equal(t, v, svc.Labels[k], "ServiceMonitor %s selects Service %s by %s", name, svc.Name, k)
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		require.Len(t, eps, 1)
		require.Equal(t, svc.Spec.Ports[0].Name, eps[0].(map[string]any)["port"])
	}

	rule := find[*unstructured.Unstructured](objs, "tessera")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	plain, err := os.ReadFile("tessera/files/prometheus-rules.yaml")
	require.NoError(t, err)
	var file struct {
		Groups []any `json:"groups"`
	}
	require.NoError(t, utilyaml.Unmarshal(plain, &file))
	starved := file.Groups[0].(map[string]any)["rules"].([]any)[0].(map[string]any)
	require.Equal(t, "TesseraQueueStarvedBelowQuota", starved["alert"])
	require.Equal(t, "15m", starved["for"])
	starved["for"] = "30m" // the one change the value asked for
	require.Equal(t, file.Groups, groups, "the PrometheusRule holds the plain file's groups")

	cm := find[*corev1.ConfigMap](objs, "tessera-dashboard")
	require.NotNil(t, cm)
	require.Equal(t, "1", cm.Labels["grafana_dashboard"])
	require.Equal(t, "GPUs", cm.Annotations["grafana_folder"])
	dash, err := os.ReadFile("tessera/dashboards/tessera.json")
	require.NoError(t, err)
	require.JSONEq(t, string(dash), cm.Data["tessera.json"])
	require.Equal(t, strings.TrimSpace(string(dash)), cm.Data["tessera.json"])

	pods := render(t, "--set", "monitoring.podMonitor.enabled=true", "--set", "node.metrics.service=false", "--set", "controller.metrics.service=false")
	require.Equal(t, map[string][]string{"PodMonitor": {"tessera-controller", "tessera-node"}}, kinds(pods))
	pm := find[*unstructured.Unstructured](pods, "tessera-node")
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	ds := find[*appsv1.DaemonSet](pods, "tessera-node")
	for k, v := range sel {
		require.Equal(t, v, ds.Spec.Template.Labels[k], "PodMonitor selects tessera-node's pods by %s", k)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true"}, "choose one"},
		{[]string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "node.metrics.service=false"}, "needs the tessera-node metrics Service (node.metrics.service=true)"},
		{[]string{"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.for.TesseraTypo=5m"}, `monitoring.prometheusRule.for names "TesseraTypo", which is not an alert`},
	} {
		cmd := exec.Command(helm(t), append([]string{"template", "tessera", chartDir, "--namespace", namespace}, tc.args...)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%v must not render", tc.args)
		require.Contains(t, string(out), tc.want)
	}
}

// TestHelmLintMonitoring: helm lint passes with every monitoring object on.
func TestHelmLintMonitoring(t *testing.T) {
	out := runHelm(t, "lint", "--strict", chartDir, "--set", "monitoring.serviceMonitor.enabled=true",
		"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.grafanaDashboard.enabled=true")
	require.Contains(t, out, "0 chart(s) failed", out)
}

// TestHelmShadow: controller.shadow.enabled runs one replica with --shadow
// as tessera-shadow, under the shadow RBAC (read-only plus its Lease), with
// no webhook; a usage coefficient above 0 is refused.
func TestHelmShadow(t *testing.T) {
	objs := render(t, "--set", "controller.shadow.enabled=true", "--set", "controller.shadow.namespaces={ml,research}",
		"--set", "controller.shadow.selector=team=a")
	dep := find[*appsv1.Deployment](objs, "tessera-controller")
	require.NotNil(t, dep)
	require.Equal(t, int32(1), *dep.Spec.Replicas)
	require.Equal(t, "tessera-shadow", dep.Spec.Template.Spec.ServiceAccountName)
	require.Nil(t, dep.Spec.Template.Spec.Affinity, "one replica: no anti-affinity")
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--shadow", "--shadow-namespaces=ml,research", "--shadow-selector=team=a", "--leader-elect-lease-name=tessera-shadow"} {
		require.Contains(t, args, want)
	}
	for _, a := range args {
		require.NotContains(t, a, "--webhook-addr", "shadow mode serves no webhook")
	}
	require.Nil(t, find[*rbacv1.ClusterRole](objs, "tessera-controller"), "the scheduling ClusterRole is not rendered")
	role := find[*rbacv1.ClusterRole](objs, "tessera-shadow")
	require.NotNil(t, role)
	for _, r := range role.Rules {
		reviews := slices.Equal(r.Resources, []string{"tokenreviews"}) || slices.Equal(r.Resources, []string{"subjectaccessreviews"})
		for _, v := range r.Verbs {
			if reviews && v == "create" {
				continue // the debug server's TokenReviews and SubjectAccessReviews
			}
			require.Contains(t, []string{"get", "list", "watch"}, v, "shadow ClusterRole rule %v", r)
		}
	}
	require.NotNil(t, find[*rbacv1.ClusterRole](objs, "tessera-shadow-reader"), "the report's reader role")
	pf := find[*rbacv1.Role](objs, "tessera-shadow-portforward")
	require.NotNil(t, pf, "the report's port-forward role")
	require.Equal(t, namespace, pf.Namespace)
	lease := find[*rbacv1.Role](objs, "tessera-shadow-leader-election")
	require.NotNil(t, lease)
	require.Equal(t, namespace, lease.Namespace)
	require.Nil(t, find[*admissionregistrationv1.MutatingWebhookConfiguration](objs, "tessera-controller"))

	// Another release namespace: the shadow manifests follow it.
	other := runHelm(t, "template", "tessera", chartDir, "--namespace", "gpu-sched", "--set", "controller.shadow.enabled=true")
	require.NotContains(t, stripComments(other), "tessera-system")
	require.Contains(t, other, "name: tessera-shadow\n  namespace: gpu-sched")

	cmd := exec.Command(helm(t), "template", "tessera", chartDir, "--namespace", namespace, "--set", "controller.shadow.enabled=true", "--set", "controller.usage.coefficient=1")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "keeps no usage history")
}

// TestChartShadowOnAPIServer: the chart in shadow mode applies on a real
// API server, and its identity reads pods and takes its Lease in the
// release namespace but may not bind, evict or write events.
func TestChartShadowOnAPIServer(t *testing.T) {
	helm(t)
	ctx, cp, _ := releaseAPIServer(t)
	out := runHelm(t, "template", "tessera", chartDir, "--namespace", namespace, "--include-crds", "--set", "controller.shadow.enabled=true")
	createRendered(ctx, t, cp, out)

	sa, err := kubernetes.NewForConfig(serviceAccountConfig(cp, "tessera-shadow", nil))
	require.NoError(t, err)
	_, err = sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = sa.CoordinationV1().Leases(namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tessera-shadow"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = sa.CoordinationV1().Leases(namespace).Get(ctx, "tessera-shadow", metav1.GetOptions{})
	require.NoError(t, err)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	err = sa.CoreV1().Pods(namespace).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}, dry)
	require.True(t, apierrors.IsForbidden(err), "bind: %v", err)
	_, err = sa.CoreV1().Events(namespace).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e"}, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: namespace}}, dry)
	require.True(t, apierrors.IsForbidden(err), "event: %v", err)
	_, err = sa.CoordinationV1().Leases(namespace).Get(ctx, "tessera-controller", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "the scheduling controller's Lease: %v", err)
}
