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
		{"schedule", map[string]any{"preemptMinRuntime": "10m", "reclaimMinRuntime": "1h30m", "preemptionDelay": "5m", "schedule": []any{
			map[string]any{"days": []any{"Mon-Fri"}, "start": "09:00", "end": "17:00", "timeZone": "America/New_York", "resources": map[string]any{"gpu": map[string]any{"quota": "4"}}},
			map[string]any{"start": "22:00", "end": "24:00"}}}, ""},
		{"window end is start", map[string]any{"schedule": []any{map[string]any{"start": "09:00", "end": "09:00"}}}, "end must differ from start"},
		{"window hour 25", map[string]any{"schedule": []any{map[string]any{"start": "09:00", "end": "25:00"}}}, "spec.schedule[0].end"},
		{"window day", map[string]any{"schedule": []any{map[string]any{"days": []any{"Mon Fri"}, "start": "09:00", "end": "17:00"}}}, "spec.schedule[0].days[0]"},
		{"negative min runtime", map[string]any{"reclaimMinRuntime": "-5m"}, "spec.reclaimMinRuntime"},
		{"min runtime not a duration", map[string]any{"preemptionDelay": "soon"}, "spec.preemptionDelay"},
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
