package kube

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// TestGangWords: a grouper's gang that places nothing is told in the
// workload's words; a hand-written PodGroup's, or a gang partly placed,
// keeps the core's reason alone.
func TestGangWords(t *testing.T) {
	group := func(name string, grouped bool) *schedv1.PodGroup {
		g := &schedv1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"}}
		if grouped {
			g.Labels = map[string]string{LabelGroupedBy: GroupedByPodGrouper}
			g.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "llama"}}
		}
		return g
	}
	pods := func(job string, n, gpus int, placed int) []core.Pod {
		var out []core.Pod
		for i := range n {
			p := core.Pod{Name: job + string(rune('a'+i)), Request: core.Request{GPUs: gpus}, Phase: core.PodPending}
			if i < placed {
				p.Phase, p.Placement = core.PodRunning, core.Placement{Node: "n1", GPUs: []int{2 * i, 2*i + 1}}
			}
			out = append(out, p)
		}
		return out
	}
	tests := []struct {
		name    string
		group   *schedv1.PodGroup
		placed  int
		blocker bool
		want    string
	}{
		{name: "grouper's gang, 6 free", group: group("job-llama", true), blocker: true,
			want: "job team-a/llama: 4 pods × 2 GPUs must start together; 6 GPUs are free — core"},
		{name: "grouper's gang, all free", group: group("job-llama", true),
			want: "job team-a/llama: 4 pods × 2 GPUs must start together; 8 GPUs are free — core"},
		{name: "hand-written PodGroup", group: group("mine", false), want: "core"},
		{name: "partly placed", group: group("job-llama", true), placed: 1, want: "core"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpus := make([]core.GPU, 8)
			for i := range gpus {
				gpus[i].Index = i
			}
			snap := &core.Snapshot{Nodes: []core.Node{{Name: "n1", GPUs: gpus}}}
			job := core.Job{Name: "team-a/g", MinMember: 4, Pods: pods("p", 4, 2, tc.placed)}
			snap.Jobs = append(snap.Jobs, job)
			if tc.blocker {
				snap.Jobs = append(snap.Jobs, core.Job{Name: "team-a/b", Pods: []core.Pod{{Name: "b", Phase: core.PodRunning,
					Placement: core.Placement{Node: "n1", GPUs: []int{6, 7}}}}})
			}
			idx := &cycleIndex{jobs: map[string]*jobRef{"team-a/g": {group: tc.group}}}
			res := &core.Result{Jobs: map[string]core.JobStatus{"team-a/g": {Placed: tc.placed}}}
			res.Pending = []core.PendingPod{{Pod: "pd", Job: "team-a/g", Reason: "core"}}
			gangWords(snap, idx, res)
			if got := res.Pending[0].Reason; got != tc.want {
				t.Fatalf("reason %q, want %q", got, tc.want)
			}
			gangWords(snap, idx, res) // idempotent
			if strings.Count(res.Pending[0].Reason, "must start together") > 1 {
				t.Fatalf("said twice: %q", res.Pending[0].Reason)
			}
		})
	}
}
