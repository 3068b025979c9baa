package scheduler_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// auditPolicy logs every request of shadow mode's identity (metadata only)
// and nothing else.
var auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["` + framework.ShadowUser[0] + `"]
- level: None
`

// TestShadowMode: kube-scheduler schedules a mixed workload (DRA claims and
// a device-plugin pod); tessera-controller --shadow runs beside it as its
// shadow ServiceAccount with exactly deploy/rbac's shadow manifests. The
// API server's audit log shows it wrote nothing but its Lease, every write
// of the scheduler is forbidden to it, and its report (endpoint, metrics,
// kubectl tessera shadow) is what the workload implies.
func TestShadowMode(t *testing.T) {
	dir := t.TempDir()
	policy, auditLog := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	require.NoError(t, os.WriteFile(policy, []byte(auditPolicy), 0o600))
	e := newEnvWith(t, controlplane.Options{Scheduler: true, APIServerArgs: []string{
		"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-mode=blocking"}})
	e.CP.CreateNamespace(t, rbac.Namespace)
	require.NoError(t, framework.ApplyShadowRBAC(e.Ctx, e.Client))
	e.shadowWorkload()

	debugAddr, err := framework.FreeAddr()
	require.NoError(t, err)
	c := framework.StartController(t, e.CP, framework.ControllerOptions{Name: "tessera-shadow", User: framework.ShadowUser,
		Args: []string{"--shadow", "--shadow-namespaces=" + e.NS, "--debug-bind-address=" + debugAddr}})
	c.WaitLeader(t, 60*time.Second)
	reader := e.serviceAccountToken("shadow-reader")
	e.bindClusterRole(app.ShadowReaderRole, "shadow-reader")
	var rep kube.ShadowReport
	e.eventually("a shadow report of 6 pods", 60*time.Second, func() (bool, string) {
		r, err := readShadow(debugAddr, reader)
		if err != nil {
			return false, err.Error()
		}
		rep = *r
		return rep.Pods == 6, fmt.Sprintf("%d pods", rep.Pods)
	})
	e.checkShadowReport(&rep)
	e.checkShadowOutputs(c, debugAddr, reader, &rep)
	e.checkShadowRefusals(c, debugAddr, reader)
	// Let it run a while, then read what it wrote.
	time.Sleep(2 * time.Second)
	checkAuditedWrites(t, auditLog)
	e.checkShadowForbidden()
	for _, n := range []string{"big", "small", "dp", "t1", "t2"} {
		require.NotEmpty(t, e.pod(n).Spec.NodeName, "%s still bound where kube-scheduler put it", n)
	}
	require.Empty(t, e.pod("wide").Spec.NodeName, "wide still pending")
}

// shadowWorkload: nodes n1 and n2 of four GPUs and n3 of two GPUs for the
// device plugin only (tainted); kube-scheduler places, in namespace work
// (no Queue: a queue of its own) big (3 GPUs, 48 of 64 CPUs, pinned to n1),
// then small (1 GPU; it spreads: n2, the least used), dp (2 GPUs through
// the device plugin: n3, where the test then plays the kubelet's
// Allocate); in queue team-b (limit 1 GPU) t1 and t2 (1 GPU each: n2 again)
// — and cannot place wide (2 GPUs: one free on each of n1 and n2).
func (e *env) shadowWorkload() {
	t := e.T
	e.createQueue("team-b", "", "1", "1", 100)
	e.addGPUNode("n1", "a100-pcie-4")
	e.addGPUNode("n2", "a100-pcie-4")
	dpOnly := v1.Taint{Key: "dp-only", Effect: v1.TaintEffectNoSchedule}
	d := e.addGPUNodeWith("n3", "l4-2", v1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("2")}, dpOnly)
	kubeSched := v1.DefaultSchedulerName
	e.createPod(podSpec{name: "big", scheduler: kubeSched, cpu: "48", claim: &gpuClaim{count: 3}, nodeSelector: map[string]string{"kubernetes.io/hostname": "n1"}})
	e.waitBound("big")
	e.createPod(podSpec{name: "small", scheduler: kubeSched, cpu: "1", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "dp", scheduler: kubeSched, cpu: "1", tolerate: "dp-only", limits: v1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("2")}})
	e.waitBound("small", "dp")
	e.createPod(podSpec{name: "t1", scheduler: kubeSched, queue: "team-b", cpu: "1", claim: &gpuClaim{}})
	e.waitBound("t1")
	e.createPod(podSpec{name: "t2", scheduler: kubeSched, queue: "team-b", cpu: "1", claim: &gpuClaim{}})
	e.waitBound("t2")
	for n, want := range map[string]string{"big": "n1", "small": "n2", "dp": "n3", "t1": "n2", "t2": "n2"} {
		require.Equal(t, want, e.pod(n).Spec.NodeName, "kube-scheduler's placement of %s", n)
	}
	p := e.pod("dp")
	uuids, _ := e.sliceGPUs("n3")
	_, err := d.AllocatePod(e.Ctx, driver.PodRequest{UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
		Resource: assignment.DefaultResourceGPU, DeviceIDs: []string{uuids[0], uuids[1]}, GPUs: []string{uuids[0], uuids[1]}})
	require.NoError(t, err)
	e.waitDPTaint("n3", "gpu-1", "whole")
	e.createPod(podSpec{name: "wide", scheduler: kubeSched, cpu: "1", claim: &gpuClaim{count: 2}})
	e.eventually("kube-scheduler cannot place wide", 60*time.Second, func() (bool, string) {
		r := pendingReason(e.pod("wide"))
		return strings.HasPrefix(r, "Unschedulable"), r
	})
	t.Logf("kube-scheduler placed big n1, small n2, dp n3, t1 n2, t2 n2; wide pending")
}

// readShadow GETs the report from the debug server with a bearer token.
func readShadow(addr, token string) (*kube.ShadowReport, error) {
	status, body, err := getDebug(addr, app.ShadowPath, token)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", app.ShadowPath, status, body)
	}
	var rep kube.ShadowReport
	return &rep, json.Unmarshal([]byte(body), &rep)
}

// checkShadowReport: from the start Tessera gives team-b (furthest below
// its fair share) its one GPU first, packed on n1 beside big; small and
// wide go to n2, dp to n3; t2 waits for team-b's limit. Fair shares: work
// asks 8 GPUs of 10 and gets them; team-b is capped at 1. A takeover now
// reclaims one of team-b's two GPUs on n2 for wide.
func (e *env) checkShadowReport(rep *kube.ShadowReport) {
	t, ns := e.T, e.NS
	q := func(n string) string { return ns + "/" + n }
	assert.Equal(t, 5, rep.Running)
	assert.Equal(t, 1, rep.Pending)
	assert.Equal(t, 5, rep.WouldPlace)
	assert.Equal(t, 3, rep.Agree, "big, small and dp where they run")
	assert.Equal(t, []kube.ShadowMove{{Pod: q("t1"), Queue: "team-b", Actual: "n2", Tessera: "n1"}}, rep.Moved)
	assert.Equal(t, []kube.ShadowMove{{Pod: q("wide"), Queue: ns, Tessera: "n2"}}, rep.WouldStart)
	if assert.Len(t, rep.LeftPending, 1) {
		assert.Equal(t, q("t2"), rep.LeftPending[0].Pod)
		assert.Equal(t, "n2", rep.LeftPending[0].Actual)
		assert.Contains(t, rep.LeftPending[0].Reason, "limit")
	}
	assert.Empty(t, rep.StillPending)
	work, b := rep.Queues[ns], rep.Queues["team-b"]
	assert.Equal(t, []int64{8000, 8000, 6000}, []int64{work.FairShareGPUMilli, work.WouldAllocateGPUMilli, work.AllocatedGPUMilli},
		"work: fair share, would allocate, holds now (big 3, small 1, dp 2 by the node's record)")
	assert.Equal(t, []int64{1000, 1000, 2000}, []int64{b.FairShareGPUMilli, b.WouldAllocateGPUMilli, b.AllocatedGPUMilli}, "team-b")
	if assert.Len(t, rep.Takeover.Evictions, 1) {
		ev := rep.Takeover.Evictions[0]
		assert.Equal(t, "reclaim", string(ev.Action))
		assert.Contains(t, []string{q("t1"), q("t2")}, ev.Pod)
	}
	if assert.Len(t, rep.Takeover.Binds, 1) {
		assert.Equal(t, q("wide"), rep.Takeover.Binds[0].Pod)
		assert.Equal(t, "n2", rep.Takeover.Binds[0].Node)
	}
}

// checkShadowOutputs: the metrics and kubectl tessera shadow (as a user
// bound to the reader role, straight at the debug server) say the same.
func (e *env) checkShadowOutputs(c *framework.Controller, debugAddr, reader string, rep *kube.ShadowReport) {
	t := e.T
	for name, want := range map[string]float64{"tessera_shadow_pods": float64(6 + 5 + 1 + 5 + 3 + 1 + 1 + 1),
		"tessera_shadow_takeover_evictions": 1} {
		got, err := c.Metric(name)
		require.NoError(t, err)
		assert.Equal(t, want, got, name)
	}
	var table, js bytes.Buffer
	cl := e.userClients(reader)
	direct := []string{"shadow", "--address", debugAddr, "--insecure-skip-tls-verify"}
	require.NoError(t, ctl.Run(e.Ctx, cl, direct, &table))
	t.Logf("kubectl tessera shadow:\n%s", table.String())
	for _, want := range []string{"6 pods of other schedulers (5 running, 1 pending)", "Tessera would place 5; 3 on the node they run on, 1 elsewhere",
		e.NS + "/t1", "pending: ", "evict (reclaim)", "bind (reclaim)"} {
		assert.Contains(t, table.String(), want)
	}
	require.NoError(t, ctl.Run(e.Ctx, cl, append(direct, "-o", "json"), &js))
	var back kube.ShadowReport
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, rep.Pods, back.Pods)
}

// checkShadowRefusals: the report is not on the unauthenticated metrics
// address; the debug server refuses a caller without a token (401) and one
// without the reader role (403 naming it, and the plugin's error too);
// without --address the plugin finds the leader by the tessera-shadow
// Lease, telling a user without the port-forward Role to bind it.
func (e *env) checkShadowRefusals(c *framework.Controller, debugAddr, reader string) {
	t := e.T
	resp, err := http.Get("http://" + c.MetricsAddr + "/shadow")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the metrics address serves no report")
	nobody := e.serviceAccountToken("shadow-nobody")
	for _, tc := range []struct {
		name, token string
		status      int
		body        string
	}{
		{"no token", "", http.StatusUnauthorized, "bearer token"},
		{"a user without the role", nobody, http.StatusForbidden, app.ShadowReaderRole},
	} {
		status, body, err := getDebug(debugAddr, app.ShadowPath, tc.token)
		require.NoError(t, err)
		if status != tc.status || !strings.Contains(body, tc.body) {
			t.Errorf("%s: got %d %q, want %d naming %q", tc.name, status, body, tc.status, tc.body)
		}
	}
	err = ctl.Run(e.Ctx, e.userClients(nobody), []string{"shadow", "--address", debugAddr, "--insecure-skip-tls-verify"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bind the ClusterRole "+app.ShadowReaderRole) {
		t.Errorf("kubectl tessera shadow without the role: want an error naming %s, got %v", app.ShadowReaderRole, err)
	}
	noAddr := []string{"shadow", "--controller-namespace", rbac.Namespace}
	err = ctl.Run(e.Ctx, e.userClients(reader), noAddr, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bind the Role tessera-shadow-portforward in "+rbac.Namespace) {
		t.Errorf("kubectl tessera shadow without the port-forward Role: want an error naming it, got %v", err)
	}
	// With the Role, the plugin reads the shadow Lease and forwards to its
	// holder's pod (a process here, no pod: the port-forward fails there).
	e.bindRole(rbac.Namespace, "tessera-shadow-portforward", "shadow-reader")
	pod, _, _ := strings.Cut(c.Identity(), "_")
	e.eventually("a port-forward to the Lease holder's pod", 30*time.Second, func() (bool, string) {
		err := ctl.Run(e.Ctx, e.userClients(reader), noAddr, io.Discard)
		return err != nil && strings.Contains(err.Error(), "port-forward to pod "+rbac.Namespace+"/"+pod), fmt.Sprint(err)
	})
}

// auditEvent is what checkAuditedWrites reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// checkAuditedWrites: every write shadow mode's identity sent (allowed or
// not) is to its Lease — it writes no events either — but for the debug
// server's TokenReviews and SubjectAccessReviews (questions to the API
// server that store nothing); it did write its Lease, read pods and ask
// those reviews, so the log does record it.
func checkAuditedWrites(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	writes := map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}
	var leaseWrites, podReads, reviews int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditEvent
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		if ev.User.Username != framework.ShadowUser[0] || ev.ObjectRef == nil {
			continue
		}
		r := ev.ObjectRef
		if !writes[ev.Verb] {
			if r.Resource == "pods" && (ev.Verb == "list" || ev.Verb == "watch") {
				podReads++
			}
			continue
		}
		switch {
		case r.Resource == "leases" && r.Namespace == rbac.Namespace && (r.Name == rbac.ShadowLease || ev.Verb == "create"):
			leaseWrites++
		case ev.Verb == "create" && (r.Resource == "tokenreviews" || r.Resource == "subjectaccessreviews") && r.Namespace == "":
			reviews++
		default:
			t.Errorf("shadow mode wrote %s %s/%s %s/%s (status %v)", ev.Verb, r.Resource, r.Subresource, r.Namespace, r.Name, ev.ResponseStatus)
		}
	}
	require.NoError(t, sc.Err())
	assert.Positive(t, leaseWrites, "the log records the shadow identity's Lease writes")
	assert.Positive(t, podReads, "the log records the shadow identity's pod reads")
	assert.Positive(t, reviews, "the debug server asked the API server about its callers")
	t.Logf("audit log: %d Lease writes, %d pod lists/watches, %d token and access reviews by %s, no other write", leaseWrites, podReads, reviews, framework.ShadowUser[0])
}

// checkShadowForbidden: shadow mode's identity may not do any write of the
// scheduler: bind, evict, patch a pod or its status, write a claim's
// status, a Queue's or PodGroup's status, create a PodGroup, an event or
// the usage ConfigMap, or touch the scheduling controller's Lease.
func (e *env) checkShadowForbidden() {
	t, ctx, ns := e.T, e.Ctx, e.NS
	cfg := e.CP.UserConfig(framework.ShadowUser[0], framework.ShadowUser[1:]...)
	cfg.UserAgent = "shadow-e2e-probe"
	sa, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	wide, t1 := e.pod("wide"), e.pod("t1")
	claim := e.claimOf("t1")
	checks := map[string]error{}
	checks["bind"] = sa.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "wide", UID: wide.UID}, Target: v1.ObjectReference{Kind: "Node", Name: "n2"}}, dry)
	checks["evict"] = sa.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "t1", Namespace: ns}, DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
	_, checks["patch a pod"] = sa.CoreV1().Pods(ns).Patch(ctx, "t1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	_, checks["pod status"] = sa.CoreV1().Pods(ns).UpdateStatus(ctx, t1, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	checks["delete a pod"] = sa.CoreV1().Pods(ns).Delete(ctx, "t1", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	_, checks["claim status"] = sa.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	_, checks["claim"] = sa.ResourceV1().ResourceClaims(ns).Update(ctx, claim, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	q, err := e.Dyn.Resource(kube.QueueGVR).Get(ctx, "team-b", metav1.GetOptions{})
	require.NoError(t, err)
	_, checks["queue status"] = dyn.Resource(kube.QueueGVR).UpdateStatus(ctx, q, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	pg := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "g", "namespace": ns}, "spec": map[string]any{"minMember": int64(1)}}}
	_, checks["create a PodGroup"] = dyn.Resource(kube.PodGroupGVR).Namespace(ns).Create(ctx, pg, dry)
	_, checks["event"] = sa.CoreV1().Events(ns).Create(ctx, &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: ns}, InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "t1", Namespace: ns}}, dry)
	_, checks["usage ConfigMap"] = sa.CoreV1().ConfigMaps(rbac.Namespace).Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kube.DefaultUsageConfigMap}}, dry)
	_, checks["the controller's Lease"] = sa.CoordinationV1().Leases(rbac.Namespace).Get(ctx, "tessera-controller", metav1.GetOptions{})
	for what, err := range checks {
		assert.Error(t, err, what)
		if err != nil {
			assert.Contains(t, err.Error(), "forbidden", what)
		}
	}
}
