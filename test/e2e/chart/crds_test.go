package chart

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/crdapply"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

const (
	// queueCRD is the CRD the upgrade's chart changes.
	queueCRD = "queues.scheduling.tessera.dev"
	// probeField is the field the upgrade's chart adds to Queue's spec.
	probeField = "upgradeProbe"
)

func (e *env) dynamic(t *testing.T) dynamic.Interface {
	dyn, err := dynamic.NewForConfig(e.cp.AdminConfig)
	require.NoError(t, err)
	return dyn
}

// preCreateCRDs creates the chart's CRDs before the install, as an admin
// with `kubectl apply` would (another field manager): the install must
// work on a cluster that already has them, and its hook takes them over.
func (e *env) preCreateCRDs(t *testing.T) {
	crds, err := crdapply.ReadDir(filepath.Join(chartDir, "crds"))
	require.NoError(t, err)
	for _, c := range crds {
		_, err := e.dynamic(t).Resource(crdResource).Apply(context.Background(), c.GetName(), c, metav1.ApplyOptions{FieldManager: "kubectl"})
		require.NoError(t, err)
	}
}

// crdManagers is who applied the CRD, by field manager.
func (e *env) crdManagers(t *testing.T, name string) []string {
	got, err := e.dynamic(t).Resource(crdResource).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	var out []string
	for _, m := range got.GetManagedFields() {
		out = append(out, m.Manager)
	}
	return out
}

// changedChart copies the chart with one field added to Queue's CRD: the
// chart an upgrade with a CRD change goes to.
func changedChart(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "tessera")
	require.NoError(t, os.CopyFS(dir, os.DirFS(chartDir)))
	path := filepath.Join(dir, "crds", "scheduling.tessera.dev_queues.yaml")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	crds, err := crdapply.Parse(path, data)
	require.NoError(t, err)
	require.Len(t, crds, 1)
	versions, _, err := unstructured.NestedSlice(crds[0].Object, "spec", "versions")
	require.NoError(t, err)
	for _, v := range versions {
		require.NoError(t, unstructured.SetNestedField(v.(map[string]any), map[string]any{"type": "string"},
			"schema", "openAPIV3Schema", "properties", "spec", "properties", probeField))
	}
	require.NoError(t, unstructured.SetNestedSlice(crds[0].Object, versions, "spec", "versions"))
	out, err := yaml.Marshal(crds[0].Object)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, out, 0o644))
	return dir
}

// servedField says whether the API server's Queue CRD has the probe field
// in every version's schema.
func (e *env) servedField(t *testing.T) bool {
	got, err := e.dynamic(t).Resource(crdResource).Get(context.Background(), queueCRD, metav1.GetOptions{})
	require.NoError(t, err)
	versions, _, _ := unstructured.NestedSlice(got.Object, "spec", "versions")
	for _, v := range versions {
		if _, ok, _ := unstructured.NestedMap(v.(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", probeField); !ok {
			return false
		}
	}
	return len(versions) > 0
}

// hookLeftovers are the CRD hook's objects still there (none once it
// succeeded).
func (e *env) hookLeftovers(t *testing.T) []string {
	ctx := context.Background()
	var left []string
	if _, err := e.client.BatchV1().Jobs(namespace).Get(ctx, "tessera-crds", metav1.GetOptions{}); err == nil {
		left = append(left, "Job")
	}
	if _, err := e.client.CoreV1().ConfigMaps(namespace).Get(ctx, "tessera-crds", metav1.GetOptions{}); err == nil {
		left = append(left, "ConfigMap")
	}
	if _, err := e.client.RbacV1().ClusterRoles().Get(ctx, "tessera-crds", metav1.GetOptions{}); err == nil {
		left = append(left, "ClusterRole")
	}
	return left
}
