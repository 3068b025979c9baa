package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

func TestParseDaemonSetRef(t *testing.T) {
	for _, tc := range []struct{ ref, ns, name, err string }{
		{ref: "tessera-system/tessera-node", ns: "tessera-system", name: "tessera-node"},
		{ref: "tessera-node", err: "want <namespace>/<name>"},
		{ref: "/tessera-node", err: "want <namespace>/<name>"},
		{ref: "ns/", err: "want <namespace>/<name>"},
		{ref: "ns/a/b", err: `bad name "a/b"`},
		{ref: "NS/x", err: `bad namespace "NS"`},
	} {
		ns, name, err := parseDaemonSetRef(tc.ref)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.ref)
			continue
		}
		require.NoError(t, err, tc.ref)
		require.Equal(t, [2]string{tc.ns, tc.name}, [2]string{ns, name})
	}
}

func FuzzParseDaemonSetRef(f *testing.F) {
	f.Add("tessera-system/tessera-node")
	f.Add("a//b")
	f.Fuzz(func(t *testing.T, ref string) {
		ns, name, err := parseDaemonSetRef(ref)
		if err != nil {
			if !strings.Contains(err.Error(), "--daemonset") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		if ns+"/"+name != ref {
			t.Fatalf("%q parsed as %q/%q", ref, ns, name)
		}
	})
}

// TestOwnerWatch: on a real API server, tessera-node's own DaemonSet
// present reads as "not uninstalling" (an upgrade), deleted as
// "uninstalling", even once tessera-node may no longer read it; a
// DaemonSet that does not exist fails the start.
func TestOwnerWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the test control plane (TESSERA_BIN_DIR)")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	client := cp.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tessera-system"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = startOwnerWatch(ctx, client, "tessera-system/tessera-node")
	require.ErrorContains(t, err, "reading tessera-node's own DaemonSet")

	labels := map[string]string{"app": "tessera-node"}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "tessera-node", Namespace: "tessera-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}
	_, err = client.AppsV1().DaemonSets("tessera-system").Create(ctx, ds, metav1.CreateOptions{})
	require.NoError(t, err)
	w, err := startOwnerWatch(ctx, client, "tessera-system/tessera-node")
	require.NoError(t, err)
	logger := klog.Background()
	time.Sleep(500 * time.Millisecond) // the watch's first list
	require.False(t, w.uninstalling(logger), "the DaemonSet exists: an upgrade or a restart")

	require.NoError(t, client.AppsV1().DaemonSets("tessera-system").Delete(ctx, "tessera-node", metav1.DeleteOptions{}))
	require.Eventually(t, w.deleted.Load, 10*time.Second, 20*time.Millisecond, "the watch saw the deletion")
	// Without the watch's word, one last read decides (NotFound).
	w2 := &ownerWatch{client: client, namespace: "tessera-system", name: "tessera-node"}
	require.True(t, w2.uninstalling(logger))
}
