package chart

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/debugapi"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// The chart's roles for the snapshot's users (deploy/rbac).
var (
	snapshotReaderRole = debugapi.Snapshot.ReaderRole
	portForwardRole    = debugapi.Snapshot.PortForwardRole
)

// debugUserNS holds the ServiceAccounts the test's users are.
const debugUserNS = "default"

// waitingPod waits for ever: its claim asks for a GPU model the node does
// not have (a CEL selector), so the snapshot's cycle has a reason for it.
var waitingPod = examplePod{ns: "team-b", name: "wants-b200"}

// testSnapshot runs `kubectl tessera snapshot` (the plugin's binary, with a
// kubeconfig holding only a user's token) the way an admin does: the plugin
// reads the leader from the Lease and port-forwards, through the API server
// and the real kubelet and containerd, to the controller pod's debug port.
// A user bound to the chart's tessera-snapshot-reader and
// tessera-snapshot-portforward and nothing else gets it over WebSocket; one
// whose Role allows only SPDY's POST gets it after the WebSocket upgrade is
// refused (the fallback); without the Role, and with the Lease readable but
// no pods/portforward, the plugin's error names the Role. The audit log
// says which transport each took. The file parses and replays (kube.Replay)
// to the controller's own decisions: the running example pods, one waiting.
func testSnapshot(t *testing.T, e *env) {
	e.createWaitingPod(t)
	defer e.deletePods(t, []examplePod{waitingPod})
	file := filepath.Join(t.TempDir(), "cluster.yaml")

	// No grant in tessera-system: the Lease cannot be read.
	nobody := e.debugUser(t, "snapshot-nobody", snapshotReaderRole)
	out, err := e.plugin(t, nobody, "snapshot", "-o", file)
	require.Error(t, err, "snapshot without the port-forward Role: %s", out)
	require.Contains(t, out, "bind the Role "+portForwardRole+" in "+namespace)
	// The Lease readable but no pods/portforward: both transports are
	// refused, and the error names the Role.
	leaseRule := rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"},
		Resources: []string{"leases"}, ResourceNames: []string{debugapi.Snapshot.Lease}, Verbs: []string{"get"}}
	e.createRole(t, "lease-only", leaseRule)
	e.bindRole(t, "lease-only", "snapshot-nobody")
	framework.Eventually(t, "the port-forward refused, naming the Role", time.Minute, func() (bool, string) {
		out, err := e.plugin(t, nobody, "snapshot", "-o", file)
		return err != nil && strings.Contains(out, "needs pods/portforward there: the Role "+portForwardRole), out
	})

	// create but not get on pods/portforward: the WebSocket upgrade (a GET)
	// is refused, SPDY's POST allowed.
	e.createRole(t, "spdy-only", leaseRule, rbacv1.PolicyRule{APIGroups: []string{""},
		Resources: []string{"pods/portforward"}, Verbs: []string{"create"}})
	spdy := e.debugUser(t, "snapshot-spdy", snapshotReaderRole)
	e.bindRole(t, "spdy-only", "snapshot-spdy")
	e.fetchSnapshot(t, spdy, file)
	require.Equal(t, []string{"get 403", "create 101"}, lastTwo(e.portForwards(t, "snapshot-spdy")),
		"the SPDY-only user's port-forwards (verb, code): WebSocket refused, then SPDY")

	// The chart's roles and nothing else: over WebSocket.
	user := e.debugUser(t, "snapshot-user", snapshotReaderRole)
	e.bindRole(t, portForwardRole, "snapshot-user")
	e.fetchSnapshot(t, user, file)
	pf := e.portForwards(t, "snapshot-user")
	require.Equal(t, "get 101", pf[len(pf)-1], "the chart Role's user's port-forwards (verb, code): %v", pf)
	e.checkReplay(t, file)

	// Nothing listens on the pod's port: the tunnel only says EOF, the
	// error names --port.
	out, err = e.plugin(t, user, "snapshot", "--port", "8444", "-o", file)
	require.Error(t, err, "snapshot --port 8444: %s", out)
	require.Contains(t, out, "a port-forward to port 8444 of the leader pod (is it served there? --port")
}

// fetchSnapshot runs `kubectl tessera snapshot -o file` until it succeeds
// (RBAC takes a moment to see a new binding).
func (e *env) fetchSnapshot(t *testing.T, kubeconfig, file string) {
	start := time.Now()
	framework.Eventually(t, "kubectl tessera snapshot through the port-forward", time.Minute, func() (bool, string) {
		out, err := e.plugin(t, kubeconfig, "snapshot", "-o", file)
		return err == nil, out
	})
	t.Logf("kubectl tessera snapshot through the port-forward: %s", time.Since(start).Round(10*time.Millisecond))
}

func lastTwo(s []string) []string {
	if len(s) < 2 {
		return s
	}
	return s[len(s)-2:]
}

// auditEvent is what portForwards reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	AuditID string `json:"auditID"`
	Verb    string `json:"verb"`
	User    struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// auditPolicy logs the port-forward requests (metadata only).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources: [{group: "", resources: ["pods/portforward"]}]
- level: None
`

// portForwards are a ServiceAccount's port-forward requests in the audit
// log, in order: "verb code" (get: the WebSocket upgrade, create: SPDY's).
func (e *env) portForwards(t *testing.T, sa string) []string {
	data, err := os.ReadFile(e.auditLog)
	require.NoError(t, err)
	user := "system:serviceaccount:" + debugUserNS + ":" + sa
	var order []string
	last := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var ev auditEvent
		if line == "" || json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.User.Username != user || ev.ObjectRef == nil || ev.ObjectRef.Subresource != "portforward" || ev.ResponseStatus == nil {
			continue
		}
		if _, seen := last[ev.AuditID]; !seen {
			order = append(order, ev.AuditID)
		}
		last[ev.AuditID] = fmt.Sprintf("%s %d", ev.Verb, ev.ResponseStatus.Code)
	}
	out := make([]string, 0, len(order))
	for _, id := range order {
		out = append(out, last[id])
	}
	return out
}

// checkReplay parses the snapshot, checks it is this cluster's (the node,
// the running example pods, the waiting pod with a reason) and that the
// replay's decisions are the controller's.
func (e *env) checkReplay(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	d, err := kube.ParseDump(data)
	require.NoError(t, err, "the plugin's file parses")
	require.NotNil(t, d.Decisions, "the snapshot holds the cycle's decisions")
	bound := map[string]string{}
	for _, p := range d.Objects.Pods {
		bound[p.Namespace+"/"+p.Name] = p.Spec.NodeName
	}
	for _, p := range sharingPods {
		require.Equal(t, e.node.Name, bound[p.ns+"/"+p.name], "%s/%s in the snapshot, on the real node", p.ns, p.name)
	}
	reason := ""
	for _, p := range d.Decisions.Pending {
		if p.Pod == waitingPod.ns+"/"+waitingPod.name {
			reason = p.Reason
		}
	}
	require.NotEmpty(t, reason, "the snapshot's cycle says why %s/%s waits: %+v", waitingPod.ns, waitingPod.name, d.Decisions.Pending)
	got, err := kube.Replay(context.Background(), d)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%+v", d.Decisions), fmt.Sprintf("%+v", got), "the replay's decisions are the controller's")
	t.Logf("snapshot: %d bytes, %d nodes, %d pods, %d claims; replay agrees: %d binds, %d evictions, %d pending (%s: %q)",
		len(data), len(d.Objects.Nodes), len(d.Objects.Pods), len(d.Objects.ResourceClaims),
		len(got.Binds), len(got.Evictions), len(got.Pending), waitingPod.name, reason)
}

// createWaitingPod creates waitingPod and its claim template.
func (e *env) createWaitingPod(t *testing.T) {
	ctx := context.Background()
	tmpl := gpuTemplate(waitingPod.ns, "b200", `device.attributes["gpu.tessera.dev"].productName == "NVIDIA B200"`)
	_, err := e.client.ResourceV1().ResourceClaimTemplates(waitingPod.ns).Create(ctx, tmpl, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = e.client.CoreV1().Pods(waitingPod.ns).Create(ctx, e.gpuPod(waitingPod, "tessera-scheduler", tmpl.Name), metav1.CreateOptions{})
	require.NoError(t, err)
}

// gpuTemplate is a claim template for one whole GPU of Tessera's class,
// with a CEL selector when cel is not "".
func gpuTemplate(ns, name, cel string) *resourceapi.ResourceClaimTemplate {
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: driverName}
	if cel != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	}
	return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}}
}

// gpuPod is a pod of scheduler ("" for kube-scheduler) with a claim from
// template that prints what its CDI edits gave it (as runPods reads it); a
// tessera-scheduler pod's queue is its namespace.
func (e *env) gpuPod(p examplePod, scheduler, template string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.ns},
		Spec: corev1.PodSpec{SchedulerName: scheduler,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}},
			Containers: []corev1.Container{{Name: "c", Image: e.node.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", `env | grep -E "^(NVIDIA|CUDA|TESSERA)" | sort; sleep 1000000`},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
	if scheduler == "tessera-scheduler" {
		pod.Labels = map[string]string{"tessera.dev/queue": p.ns}
	}
	return pod
}

// debugUser creates a ServiceAccount in debugUserNS bound to clusterRole
// and returns the path of a kubeconfig that holds only a token of it, as a
// user's would.
func (e *env) debugUser(t *testing.T, name, clusterRole string) string {
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: debugUserNS}}
	_, err := e.client.CoreV1().ServiceAccounts(debugUserNS).Create(ctx, sa, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := e.client.CoreV1().ServiceAccounts(debugUserNS).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	require.NoError(t, err)
	e.bindClusterRole(t, clusterRole, name)
	return e.cp.WriteKubeconfig(t, &rest.Config{Host: e.cp.AdminConfig.Host, BearerToken: tr.Status.Token})
}

// plugin runs the kubectl-tessera binary with a kubeconfig and returns its
// output (stdout and stderr).
func (e *env) plugin(t *testing.T, kubeconfig string, args ...string) (string, error) {
	bin := controlplane.GoBinary(t, "./cmd/kubectl-tessera")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}

func (e *env) bindClusterRole(t *testing.T, role, sa string) {
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: debugUserNS}}}
	_, err := e.client.RbacV1().ClusterRoleBindings().Create(context.Background(), b, metav1.CreateOptions{})
	require.NoError(t, err)
}

// bindRole binds a Role of the release's namespace to a ServiceAccount.
func (e *env) bindRole(t *testing.T, role, sa string) {
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + role, Namespace: namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: debugUserNS}}}
	_, err := e.client.RbacV1().RoleBindings(namespace).Create(context.Background(), b, metav1.CreateOptions{})
	require.NoError(t, err)
}

// createRole creates a test-made Role in the release's namespace.
func (e *env) createRole(t *testing.T, name string, rules ...rbacv1.PolicyRule) {
	r := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: rules}
	_, err := e.client.RbacV1().Roles(namespace).Create(context.Background(), r, metav1.CreateOptions{})
	require.NoError(t, err)
}
