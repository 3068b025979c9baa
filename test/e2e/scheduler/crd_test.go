package scheduler_test

import (
	"fmt"
	"testing"
	"time"

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
			_, err := e.Dyn.Resource(kube.QueueGVR).Create(e.Ctx, u, metav1.CreateOptions{})
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

// TestQuotaWindowSwitches: a Queue's schedule window switches its quota at
// the boundary without a restart, and reclaim follows within a few cycles.
// team-b's own GPU quota is 0 (fair share 2 of 8 beside team-a's quota 4);
// from the next whole minute a window gives it 4, so it reclaims 2 more.
func TestQuotaWindowSwitches(t *testing.T) {
	e := newEnv(t)
	e.twoTeamsOnOneNode()
	now := time.Now().UTC()
	start := now.Truncate(time.Minute).Add(time.Minute)
	if start.Sub(now) < 25*time.Second {
		start = start.Add(time.Minute) // room to see the state before it
	}
	u, err := e.Dyn.Resource(kube.QueueGVR).Get(e.Ctx, "team-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{"priority": int64(100), "resources": map[string]any{"gpu": map[string]any{"quota": "0"}},
		"schedule": []any{map[string]any{"start": start.Format("15:04"), "end": start.Add(10 * time.Minute).Format("15:04"), "timeZone": "UTC",
			"resources": map[string]any{"gpu": map[string]any{"quota": "4"}}}}}
	if err := unstructured.SetNestedField(u.Object, spec, "spec"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Dyn.Resource(kube.QueueGVR).Update(e.Ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var b []string
	for i := 0; i < 4; i++ {
		b = append(b, fmt.Sprintf("b-%d", i))
		e.createPod(podSpec{name: b[i], queue: "team-b", priority: "tessera-train", claim: &gpuClaim{}})
	}
	bound := func() int {
		n := 0
		for _, name := range b {
			if p := e.pod(name); p != nil && p.Spec.NodeName != "" {
				n++
			}
		}
		return n
	}
	e.eventually("team-b's 2 before the window", 20*time.Second, func() (bool, string) {
		return bound() == 2, fmt.Sprintf("%d bound", bound())
	})
	time.Sleep(time.Until(start) - 2*time.Second)
	if n := bound(); n != 2 {
		t.Fatalf("before the window at %s: team-b has %d pods bound, want 2", start.Format("15:04"), n)
	}
	e.eventually("team-b's 4 once the window holds", time.Until(start)+20*time.Second, func() (bool, string) {
		return bound() == 4, fmt.Sprintf("%d bound", bound())
	})
	e.checkNoDoubleAllocation()
}
