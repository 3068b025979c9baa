package chart

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tessera-gpu/tessera/internal/crdapply"
)

// TestHelmTemplateCRDHook: the CRD hook applies exactly the chart's crds/
// files (kept equal to api/scheduling/crds by TestCopiesInSync), may touch
// only their CRDs, runs before the release's objects change on install and
// upgrade, and is gone with crds.upgrade=false.
func TestHelmTemplateCRDHook(t *testing.T) {
	objs := render(t)
	cm := find[*corev1.ConfigMap](objs, "tessera-crds")
	require.NotNil(t, cm)
	files, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		require.Equal(t, string(data), cm.Data[filepath.Base(f)]+"\n", "the hook's copy of %s", f)
		crds, err := crdapply.Parse(f, data)
		require.NoError(t, err)
		for _, c := range crds {
			names = append(names, c.GetName())
		}
	}
	require.Len(t, cm.Data, len(files))
	role := find[*rbacv1.ClusterRole](objs, "tessera-crds")
	require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"},
		ResourceNames: names, Verbs: []string{"get", "create", "patch"}}}, role.Rules)
	job := find[*batchv1.Job](objs, "tessera-crds")
	require.NotNil(t, job)
	require.Equal(t, "pre-install,pre-upgrade", job.Annotations["helm.sh/hook"])
	require.Equal(t, []string{"apply-crds", "--dir=/crds"}, job.Spec.Template.Spec.Containers[0].Args)
	require.Equal(t, "tessera-crds", job.Spec.Template.Spec.ServiceAccountName)
	for _, o := range []interface{ GetAnnotations() map[string]string }{cm, role, job, find[*corev1.ServiceAccount](objs, "tessera-crds"), find[*rbacv1.ClusterRoleBinding](objs, "tessera-crds")} {
		require.Equal(t, "before-hook-creation,hook-succeeded", o.GetAnnotations()["helm.sh/hook-delete-policy"])
	}

	off := render(t, "--set", "crds.upgrade=false")
	require.Nil(t, find[*batchv1.Job](off, "tessera-crds"))
	require.Nil(t, find[*rbacv1.ClusterRole](off, "tessera-crds"))
}
