package grouper

import (
	"testing"

	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// TestTopologyOf: the highest owner's topology annotations win, else the
// pod's (its template's); a malformed one names its object.
func TestTopologyOf(t *testing.T) {
	owner := func(kind, name string, ann map[string]string) link {
		u := &unstructured.Unstructured{}
		u.SetNamespace("ns")
		u.SetName(name)
		u.SetAnnotations(ann)
		return link{gk: schema.GroupKind{Group: "batch", Kind: kind}, obj: u}
	}
	rack := map[string]string{kube.AnnotationTopology: "dc", kube.AnnotationTopologyRequired: "example.com/rack"}
	block := map[string]string{kube.AnnotationTopology: "dc", kube.AnnotationTopologyPreferred: "example.com/block"}
	bad := map[string]string{kube.AnnotationTopologyRequired: "example.com/rack"}
	pod := func(ann map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: ann}}
	}
	for _, c := range []struct {
		name  string
		pod   *v1.Pod
		chain []link
		want  *schedv1.TopologyConstraint
		err   string
	}{
		{name: "none", pod: pod(nil), chain: []link{owner("Job", "j", nil), owner("CronJob", "c", nil)}},
		{name: "the pod's", pod: pod(block), chain: []link{owner("Job", "j", nil)},
			want: &schedv1.TopologyConstraint{Name: "dc", Preferred: "example.com/block"}},
		{name: "the top owner's over the pod's and a lower owner's", pod: pod(block),
			chain: []link{owner("Job", "j", block), owner("CronJob", "c", rack)},
			want:  &schedv1.TopologyConstraint{Name: "dc", Required: "example.com/rack"}},
		{name: "a malformed owner annotation", pod: pod(nil), chain: []link{owner("Job", "j", bad)},
			err: "Job ns/j: annotation tessera.dev/topology must name a Topology"},
		{name: "a malformed pod annotation", pod: pod(bad), chain: []link{owner("Job", "j", nil)},
			err: "pod ns/p: annotation tessera.dev/topology must name a Topology"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := topologyOf(c.pod, c.chain)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
	require.Equal(t, map[string]any{"name": "dc", "required": "example.com/rack"}, topologySpec(&schedv1.TopologyConstraint{Name: "dc", Required: "example.com/rack"}))
}
