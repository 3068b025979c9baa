package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/internal/promnames"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// The chart's Grafana dashboard and alert rules (files people deploy).
const (
	dashboardFile = "../../../chart/tessera/dashboards/tessera.json"
	rulesFile     = "../../../chart/tessera/files/prometheus-rules.yaml"
)

// chartQueries are the metric names the dashboard's panels and variables and
// the alert rules read.
func chartQueries(t *testing.T) []promnames.Use {
	t.Helper()
	dash, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	uses, err := promnames.FromDashboard(dash)
	require.NoError(t, err, dashboardFile)
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	ruleUses, err := promnames.FromRules(rules)
	require.NoError(t, err, rulesFile)
	for i := range uses {
		uses[i].Where = "dashboard " + uses[i].Where
	}
	for i := range ruleUses {
		ruleUses[i].Where = "rules " + ruleUses[i].Where
	}
	return append(uses, ruleUses...)
}

// scrapeNames reads a /metrics page: its sample names, and the page.
func scrapeNames(addr string) (map[string]bool, string, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", err
	}
	names, err := promnames.Exposed(bytes.NewReader(page))
	return names, string(page), err
}

// sample finds the value of the sample line that starts with series.
func sample(page, series string) string {
	for _, l := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestMonitoringSeriesEmitted: every metric the chart's Grafana dashboard
// and its Prometheus alert rules query is exposed on /metrics by
// tessera-controller or tessera-node, both run as the programs people
// deploy, on a real control plane, after what the figures describe
// happened once: the controller led and scheduled a cycle with a Queue of
// a GPU quota; tessera-node registered its DRA plugin and device plugins
// with a kubelet and prepared and unprepared an MPS claim. A panel or alert
// naming a metric nobody emits fails here, with where it is. On the way it
// checks the figures the alerts rely on: the plugin gauges go from 0 to 1
// when the kubelet registers the plugins, and a queue's quota is exported.
func TestMonitoringSeriesEmitted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real control plane and both programs; skipped with -short")
	}
	uses := chartQueries(t)
	require.NotEmpty(t, uses)

	// A control plane of its own: the controller's RBAC brings the
	// assignment admission policy, which the package's other tests (writing
	// assignments as the admin) must not meet.
	cp := controlplane.Start(t, controlplane.Options{})
	cp.StartKwok(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	require.NoError(t, err)
	require.NoError(t, framework.InstallCRDs(ctx, dyn))
	classes, err := deviceclasses.Load()
	require.NoError(t, err)
	for _, dc := range classes {
		_, err := client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	cp.CreateNamespace(t, rbac.Namespace)
	require.NoError(t, framework.ApplyControllerRBAC(ctx, client))
	queue := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": "team-a"},
		"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "2"}}},
	}}
	_, err = dyn.Resource(kube.QueueGVR).Create(ctx, queue, metav1.CreateOptions{})
	require.NoError(t, err)
	ctrl := framework.StartController(t, cp, framework.ControllerOptions{Name: "monitoring"})

	// tessera-node, the binary, on a kwok node, with a kubelet's
	// device-plugin socket and its MPS stand-in.
	e := newNodeEnv(t, "mon-h100", "h100-sxm-8")
	cp.AddKwokNode(t, e.name, nil)
	ns := cp.CreateNamespace(t, "monitoring").Name
	k := e.startDevicePluginKubelet(t)
	p := e.spawn(t, cp.KubeconfigPath, nil)
	p.waitOutput(t, "Serving metrics and health", time.Minute)
	m := regexp.MustCompile(`"Serving metrics and health" address="([^"]+)"`).FindStringSubmatch(p.out.String())
	require.NotNil(t, m, "tessera-node's metrics address in its log:\n%s", p.out)
	nodeAddr := m[1]

	// Before the kubelet calls, the DRA plugin is not registered: what
	// TesseraPluginNotRegistered fires on.
	_, page, err := scrapeNames(nodeAddr)
	require.NoError(t, err)
	require.Equal(t, "0", sample(page, `tessera_node_plugin_registered{plugin="dra"}`), "DRA plugin before registration")
	dra := register(t, e.registrar)
	e.shareClient(t, k) // the device plugins registered with the kubelet
	claim := createAllocatedClaim(t, client, drivertest.Claim(ns, "mps", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-2", "20Gi"),
	}, drivertest.Strategy("MPS")))
	dra.mustPrepare(t, claim)
	dra.mustUnprepare(t, claim)

	// Every series the chart reads is exposed by one of them, once the
	// controller has led a cycle (queue figures appear at its first commit).
	var missing []promnames.Use
	var nodePage, ctrlPage string
	framework.Eventually(t, "every series of the dashboard and alerts exposed", time.Minute, func() (bool, string) {
		nodeNames, np, err := scrapeNames(nodeAddr)
		if err != nil {
			return false, "tessera-node: " + err.Error()
		}
		ctrlNames, cpage, err := scrapeNames(ctrl.MetricsAddr)
		if err != nil {
			return false, "tessera-controller: " + err.Error()
		}
		nodePage, ctrlPage = np, cpage
		missing = promnames.Missing(uses, nodeNames, ctrlNames)
		return len(missing) == 0, fmt.Sprintf("not emitted by tessera-controller or tessera-node: %v", missing)
	})
	require.Equal(t, "1", sample(nodePage, `tessera_node_plugin_registered{plugin="dra"}`), "DRA plugin after the kubelet registered it")
	require.Equal(t, "1", sample(nodePage, `tessera_node_plugin_registered{plugin="deviceplugin"}`), "device plugins after registering with the kubelet")
	require.Equal(t, "2", sample(ctrlPage, `tessera_queue_quota{queue="team-a",resource="gpu"}`), "the queue's GPU quota")
	require.Equal(t, "1", sample(ctrlPage, "tessera_leader"))
	t.Logf("%d uses of %d metrics, all emitted", len(uses), len(names(uses)))
}

func names(uses []promnames.Use) map[string]bool {
	out := map[string]bool{}
	for _, u := range uses {
		out[u.Metric] = true
	}
	return out
}
