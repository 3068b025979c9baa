package crdapply

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/api/scheduling/crds"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct{ name, data, err string }{
		{name: "two CRDs", data: "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: a.x.io}\n---\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: b.x.io}\n"},
		{name: "not a CRD", data: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n", err: `document 1 is "v1" "ConfigMap"`},
		{name: "old version", data: "apiVersion: apiextensions.k8s.io/v1beta1\nkind: CustomResourceDefinition\nmetadata: {name: a}\n", err: "want apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{name: "no name", data: "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n", err: "without metadata.name"},
		{name: "bad YAML", data: "apiVersion: [\n", err: "f.yaml: document 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse("f.yaml", []byte(tc.data))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, 2)
		})
	}
	_, err := ReadDir(t.TempDir())
	require.ErrorContains(t, err, "no CustomResourceDefinition in")
}

func FuzzParse(f *testing.F) {
	data, err := crds.FS.ReadFile("scheduling.tessera.dev_queues.yaml")
	require.NoError(f, err)
	f.Add(data)
	f.Add([]byte("apiVersion: v1\nkind: X\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse("f.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "f.yaml") {
				t.Fatalf("error %q does not name the source", err)
			}
			return
		}
		for _, u := range got {
			if u.GetKind() != "CustomResourceDefinition" || u.GetName() == "" {
				t.Fatalf("accepted %v", u.Object)
			}
		}
	})
}

// TestApply: on a real API server, CRDs created by someone else (as Helm's
// crds/ does at install) are taken over and changed by the apply; a field
// added to a schema is served afterwards.
func TestApply(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the test control plane (TESSERA_BIN_DIR)")
	}
	cp := startControlPlane(t)
	dyn, err := dynamic.NewForConfig(cp)
	require.NoError(t, err)
	ctx := context.Background()
	dir := t.TempDir()
	ents, err := crds.FS.ReadDir(".")
	require.NoError(t, err)
	for _, e := range ents {
		data, err := crds.FS.ReadFile(e.Name())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644))
	}
	orig, err := ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, orig, len(ents)) // every CRD of api/scheduling/crds
	for _, c := range orig {
		_, err := dyn.Resource(crdResource).Create(ctx, c, metav1.CreateOptions{FieldManager: "helm"})
		require.NoError(t, err)
	}
	// The new chart's CRD has one more field.
	changed := orig[1].DeepCopy()
	require.Equal(t, "queues.scheduling.tessera.dev", changed.GetName())
	addField(t, changed, "upgradeProbe")
	require.NoError(t, Apply(ctx, dyn, []*unstructured.Unstructured{orig[0], changed}, time.Minute))
	got, err := dyn.Resource(crdResource).Get(ctx, changed.GetName(), metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, hasField(got, "upgradeProbe"), "the added field reached the API server")
	require.True(t, established(got))
}

// addField adds an optional string property to spec of every version.
func addField(t *testing.T, crd *unstructured.Unstructured, name string) {
	versions, _, err := unstructured.NestedSlice(crd.Object, "spec", "versions")
	require.NoError(t, err)
	for _, v := range versions {
		require.NoError(t, unstructured.SetNestedField(v.(map[string]any), map[string]any{"type": "string"},
			"schema", "openAPIV3Schema", "properties", "spec", "properties", name))
	}
	require.NoError(t, unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"))
}

func hasField(crd *unstructured.Unstructured, name string) bool {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if _, ok, _ := unstructured.NestedMap(v.(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", name); !ok {
			return false
		}
	}
	return len(versions) > 0
}
