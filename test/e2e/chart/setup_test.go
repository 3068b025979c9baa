package chart

import (
	"bytes"
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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/images"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/realnode"
)

const (
	release   = "tessera"
	namespace = "tessera-system"
	chartDir  = "../../../chart/tessera"
	// registry is the image name prefix of the test builds (never pulled).
	registry = "tessera.local"
)

// env is one cluster with the chart installed on its real node.
type env struct {
	cp         *controlplane.ControlPlane
	node       *realnode.Node
	client     kubernetes.Interface
	helm       string
	helmHome   string
	valuesFile string // the test's values with this cluster's addresses
	auditLog   string // the API server's audit log: port-forward requests only
}

// setup starts the control plane (kube-scheduler, KCM) with the API server
// on every address and webhook calls routed to endpoints (the node has no
// kube-proxy), the real node, and imports two builds of the images.
func setup(t *testing.T) *env {
	helm := os.Getenv("TESSERA_HELM")
	if helm == "" {
		t.Skip("needs helm built from its Go module: set TESSERA_HELM=$(hack/tools/helm/build.sh) (make test does)")
	}
	if testing.Short() {
		t.Skip("real node (kubelet + containerd) skipped with -short")
	}
	began := time.Now()
	auditDir := t.TempDir()
	policy, auditLog := filepath.Join(auditDir, "audit-policy.yaml"), filepath.Join(auditDir, "audit.log")
	require.NoError(t, os.WriteFile(policy, []byte(auditPolicy), 0o600))
	cp := controlplane.Start(t, controlplane.Options{
		Scheduler: true,
		APIServerArgs: []string{
			// Which transport each port-forward took (debug_test.go).
			"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-mode=blocking",
			// Pods reach the API server on the node's address: no
			// kube-proxy serves the kubernetes Service's ClusterIP here.
			"--bind-address=0.0.0.0",
			// The API server calls webhooks at their Service's endpoint
			// (the pod IP on the node's bridge), not its ClusterIP.
			"--enable-aggregator-routing=true",
		},
	})
	node := realnode.Start(t, cp, realnode.Options{
		// Every NodePrepareResources/NodeUnprepareResources call in the
		// kubelet's log, for the upgrade check.
		KubeletArgs: []string{"--vmodule=dra_plugin=4"},
	})
	e := &env{cp: cp, node: node, client: cp.Client(t), helm: helm, helmHome: t.TempDir(), auditLog: auditLog}
	// Runs before the node's teardown: GPU pods go while tessera-node can
	// still unprepare their claims, then the release (else the DaemonSet
	// recreates its pod while the node deletes it).
	t.Cleanup(func() { e.cleanup(t) })
	for _, tag := range []string{tagV1, tagV2} {
		for _, tar := range buildImages(t, tag) {
			require.NoError(t, node.ImportImage(tar))
		}
	}
	e.valuesFile = e.writeValues(t)
	t.Logf("cluster, node and images ready in %s", time.Since(began).Round(100*time.Millisecond))
	return e
}

// cleanup deletes the test's pods and uninstalls the release, if a
// failed phase left them.
func (e *env) cleanup(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{"team-a", "team-b"} {
		_ = e.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		left := 0
		for _, ns := range []string{"team-a", "team-b"} {
			if l, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
				left += len(l.Items)
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	if out, err := e.runHelm("status", release, "--namespace", namespace); err == nil && strings.Contains(out, "STATUS") {
		if _, err := e.runHelm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}
}

// Image tags of the two builds: install, then upgrade.
const (
	tagV1 = "e2e-1"
	tagV2 = "e2e-2"
)

// writeValues writes the values that depend on this cluster: where pods
// find the API server, and the CDI directory the node's containerd reads.
func (e *env) writeValues(t *testing.T) string {
	host := strings.TrimPrefix(e.cp.AdminConfig.Host, "https://")
	_, port, ok := strings.Cut(host, ":")
	require.True(t, ok, "API server address %q has no port", e.cp.AdminConfig.Host)
	apiEnv := []map[string]string{
		{"name": "KUBERNETES_SERVICE_HOST", "value": e.node.IP},
		{"name": "KUBERNETES_SERVICE_PORT", "value": port},
	}
	v := map[string]any{
		"node": map[string]any{
			"cdiRoot":  e.node.CDIDir,
			"extraEnv": apiEnv,
		},
		"controller": map[string]any{"extraEnv": apiEnv},
	}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "cluster-values.json")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

// runHelm runs helm against the cluster and returns its output.
func (e *env) runHelm(args ...string) (string, error) {
	cmd := exec.Command(e.helm, append(args, "--kubeconfig", e.cp.KubeconfigPath)...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(e.helmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(e.helmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(e.helmHome, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// helmValues are the values arguments of an install or upgrade to tag.
func (e *env) helmValues(tag string, extra ...string) []string {
	args := []string{"-f", "testdata/values.yaml", "-f", e.valuesFile,
		"--set", "image.registry=" + registry,
		"--set", "image.node.tag=" + tag,
		"--set", "image.controller.tag=" + tag}
	return append(args, extra...)
}

// buildImages builds both images for tag with internal/images (as
// `make images` does, for this machine's platform only) and returns their
// OCI archives.
func buildImages(t *testing.T, tag string) []string {
	res, err := images.Build(context.Background(), images.Options{
		RepoDir:   "../../..",
		CacheDir:  os.Getenv("TESSERA_CACHE"), // empty: the repo's _cache
		OutDir:    filepath.Join(t.TempDir(), tag),
		Registry:  registry,
		Version:   tag,
		Platforms: []string{images.HostPlatform()},
	})
	require.NoError(t, err, "building the images")
	var out []string
	for _, img := range res.Images {
		var size int64
		for _, p := range img.Platforms {
			size += p.Size
		}
		t.Logf("image %s: %.1f MB", img.Ref, float64(size)/1e6)
		out = append(out, img.Archive)
	}
	return out
}

// pods lists the release's pods of one program (app.kubernetes.io/name).
func (e *env) pods(t *testing.T, app string) []corev1.Pod {
	list, err := e.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + app})
	require.NoError(t, err)
	return list.Items
}

func ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describe says what a pod is doing and what it logged, for failures.
func (e *env) describe(t *testing.T, p *corev1.Pod) string {
	return realnode.DescribePod(e.client, p.Namespace, p.Name, p) + "\nlogs:\n" + tailLines(e.logs(p.Namespace, p.Name), 30)
}

// logs returns a pod's logs, or why they could not be read.
func (e *env) logs(ns, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := e.client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(logs of %s/%s: %v)", ns, name, err)
	}
	return string(b)
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
