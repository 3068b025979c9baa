package kube

import (
	"testing"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// TestGroupPhase: a PodGroup's phase counts its subgroups, not only its
// total: a gang of leader 1 + workers 3 (minMember 1) whose leader is gone
// neither runs nor is scheduled, however many workers run.
func TestGroupPhase(t *testing.T) {
	lws := schedv1.PodGroupSpec{MinMember: 1, SubGroups: []schedv1.PodSubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 3}}}
	plain := schedv1.PodGroupSpec{MinMember: 2}
	tests := []struct {
		name      string
		spec      schedv1.PodGroupSpec
		js        core.JobStatus
		running   int32
		runningIn map[string]int32
		want      schedv1.PodGroupPhase
	}{
		{"plain, all running", plain, core.JobStatus{Placed: 2}, 2, map[string]int32{"": 2}, schedv1.PodGroupRunning},
		{"plain, placed, not running yet", plain, core.JobStatus{Placed: 2}, 0, nil, schedv1.PodGroupScheduled},
		{"plain, one placed", plain, core.JobStatus{Placed: 1, BelowMinMember: true}, 1, map[string]int32{"": 1}, schedv1.PodGroupPending},
		{"subgroups, all running", lws, core.JobStatus{Placed: 4}, 4, map[string]int32{"leader": 1, "workers": 3}, schedv1.PodGroupRunning},
		{"subgroups, leader gone", lws, core.JobStatus{Placed: 3, BelowMinMember: true}, 3, map[string]int32{"workers": 3}, schedv1.PodGroupPending},
		{"subgroups, leader placed, not running", lws, core.JobStatus{Placed: 4}, 3, map[string]int32{"workers": 3}, schedv1.PodGroupScheduled},
		{"subgroups, a worker short", lws, core.JobStatus{Placed: 3, BelowMinMember: true}, 3, map[string]int32{"leader": 1, "workers": 2}, schedv1.PodGroupPending},
		{"pods naming no subgroup count for the total only", lws, core.JobStatus{Placed: 4, BelowMinMember: true}, 4, map[string]int32{"": 4}, schedv1.PodGroupPending},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := groupPhase(tc.spec, tc.js, tc.running, tc.runningIn); got != tc.want {
				t.Fatalf("phase %s, want %s", got, tc.want)
			}
		})
	}
}
