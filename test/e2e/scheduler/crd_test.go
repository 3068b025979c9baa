package scheduler_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// TestQueueValidation: the API server itself refuses Queues that break what
// can be checked statically (OpenAPI and CEL rules of the CRD).
func TestQueueValidation(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name string
		spec map[string]any
		want string // "" means accepted
	}{
		{"valid", map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "4", "limit": "8"}}}, ""},
		{"unlimited", map[string]any{"resources": map[string]any{"cpu": map[string]any{"quota": "-1", "limit": "-1"}}}, ""},
		{"fractional quota", map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "0.5"}}}, ""},
		{"negative quota", map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "-2"}}}, "quota must be >= 0, or -1 for unlimited"},
		{"limit below quota", map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "4", "limit": "2"}}}, "limit must be >= quota"},
		{"negative weight", map[string]any{"resources": map[string]any{"gpu": map[string]any{"overQuotaWeight": int64(-1)}}}, "should be greater than or equal to 0"},
		{"own parent", map[string]any{"parent": "own-parent"}, "a queue cannot be its own parent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.name
			if name == "own parent" {
				name = "own-parent"
			}
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
				"metadata": map[string]any{"name": sanitize(name)}, "spec": tc.spec,
			}}
			_, err := e.dyn.Resource(kube.QueueGVR).Create(e.ctx, u, metav1.CreateOptions{})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid queue refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("invalid queue accepted; want an error containing %q", tc.want)
			case tc.want != "" && !contains(err.Error(), tc.want):
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func sanitize(s string) string {
	out := []rune{}
	for _, r := range s {
		if r == ' ' {
			r = '-'
		}
		out = append(out, r)
	}
	return string(out)
}
