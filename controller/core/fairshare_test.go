package core

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pendingJob is a job whose pods ask gpus GPUs in total (one GPU each).
func pendingJob(name, q string, gpus int) Job { return job(name, q, 50, gpus, 1, 0) }

func TestFairShare(t *testing.T) {
	type want map[string]int64 // queue → fair share in GPUs (milli when frac)
	cases := []struct {
		name   string
		gpus   int
		queues []Queue
		jobs   []Job
		want   want
	}{
		{"equal weights split evenly", 8,
			[]Queue{queue("a", "", 0, -1, 1), queue("b", "", 0, -1, 1)},
			[]Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 8)}, want{"a": 4000, "b": 4000}},
		{"quota first, rest by weight", 12,
			[]Queue{queue("a", "", 6, -1, 1), queue("b", "", 0, -1, 2)},
			[]Job{pendingJob("ja", "a", 12), pendingJob("jb", "b", 12)}, want{"a": 8000, "b": 4000}},
		{"demand caps, leftover to others", 8,
			[]Queue{queue("a", "", 0, -1, 1), queue("b", "", 0, -1, 1)},
			[]Job{pendingJob("ja", "a", 1), pendingJob("jb", "b", 8)}, want{"a": 1000, "b": 7000}},
		{"limit caps demand", 8,
			[]Queue{queue("a", "", 0, 2, 1), queue("b", "", 0, -1, 1)},
			[]Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 3)}, want{"a": 2000, "b": 3000}},
		{"quotas over capacity scale down", 8,
			[]Queue{queue("a", "", 8, -1, 1), queue("b", "", 8, -1, 1)},
			[]Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 8)}, want{"a": 4000, "b": 4000}},
		{"higher priority takes the rest first", 8,
			[]Queue{queue("a", "", 0, -1, 1), func() Queue { q := queue("b", "", 0, -1, 1); q.Priority = 200; return q }()},
			[]Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 6)}, want{"a": 2000, "b": 6000}},
		{"weight 0 gets nothing over quota", 8,
			[]Queue{queue("a", "", 2, -1, 0), queue("b", "", 0, -1, 1)},
			[]Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 3)}, want{"a": 2000, "b": 3000}},
		{"remainder units go in name order", 1,
			[]Queue{queue("a", "", 0, -1, 1), queue("b", "", 0, -1, 1), queue("c", "", 0, -1, 1)},
			[]Job{pendingJob("ja", "a", 1), pendingJob("jb", "b", 1), pendingJob("jc", "c", 1)}, want{"a": 334, "b": 333, "c": 333}},
		{"three-level tree", 16,
			[]Queue{queue("org", "", 12, -1, 1), queue("research", "org", 8, -1, 1), queue("vision", "research", 2, -1, 1),
				queue("nlp", "research", 2, -1, 3), queue("ops", "org", 0, -1, 1), queue("other", "", 0, -1, 1)},
			[]Job{pendingJob("v", "vision", 16), pendingJob("n", "nlp", 16), pendingJob("o", "ops", 16), pendingJob("x", "other", 16)},
			// root 16: org quota 12, other 0; rest 4 split 2/2 → org 14, other 2.
			// org 14: research 8 + ops 0, rest 6 → 3/3 → research 11, ops 3.
			// research 11: quotas 2 + 2, rest 7 GPUs by weight 1:3 → vision 3.75, nlp 7.25.
			want{"org": 14000, "other": 2000, "research": 11000, "ops": 3000, "vision": 3750, "nlp": 7250}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			snap := &Snapshot{Nodes: nodes("n", 1, tc.gpus), Queues: tc.queues, Jobs: tc.jobs}
			s, err := newSession(snap, Config{})
			require.NoError(t, err)
			s.computeFairShare()
			for q, w := range tc.want {
				assert.Equal(t, w, s.queueByN[q].fairShare[ResGPU], q)
			}
		})
	}
}

func TestFairShareUnlimitedCPUQuotaGetsDemand(t *testing.T) {
	j := pendingJob("ja", "a", 2)
	for i := range j.Pods {
		j.Pods[i].Request.CPU = 3000
	}
	s, err := newSession(&Snapshot{Nodes: nodes("n", 1, 8), Queues: []Queue{queue("a", "", 0, -1, 1)}, Jobs: []Job{j}}, Config{})
	require.NoError(t, err)
	s.computeFairShare()
	assert.Equal(t, int64(6000), s.queueByN["a"].fairShare[ResCPU])
}

// A parent's status sums its subtree's pending requests, as it does what
// is allocated.
func TestQueueStatusParentSumsPending(t *testing.T) {
	snap := &Snapshot{Nodes: []Node{node("a", 1)}, Queues: []Queue{queue("org", "", 1, -1, 1), queue("x", "org", 1, -1, 1), queue("y", "org", 0, -1, 1)}}
	snap.Jobs = []Job{
		{Name: "jx", Queue: "x", Priority: 50, Preemptible: true, Pods: []Pod{{Name: "jx-0", Request: Request{GPUs: 1}}, {Name: "jx-1", Request: Request{GPUs: 1}}}, MinMember: 1},
		{Name: "jy", Queue: "y", Priority: 50, Preemptible: true, Pods: []Pod{{Name: "jy-0", Request: Request{GPUs: 1}}}},
	}
	res := mustSchedule(t, snap, Config{})
	if got := res.Queues["x"].Pending[ResGPU] + res.Queues["y"].Pending[ResGPU]; res.Queues["org"].Pending[ResGPU] != got || got != 3000 {
		t.Errorf("org pending %d, children %d (want 3000: the cycle's start)", res.Queues["org"].Pending[ResGPU], got)
	}
	if res.Queues["org"].Allocated[ResGPU] != res.Queues["x"].Allocated[ResGPU]+res.Queues["y"].Allocated[ResGPU] {
		t.Errorf("org allocated %v", res.Queues["org"].Allocated)
	}
}

// "cannot reclaim" is added to a pending pod's reason only when another
// queue holds something reclaim could take.
func TestCannotReclaimOnlyWhenOthersHold(t *testing.T) {
	for _, tc := range []struct {
		name   string
		others bool
	}{{"alone in the cluster", false}, {"another queue holds GPUs", true}} {
		t.Run(tc.name, func(t *testing.T) {
			snap := &Snapshot{Nodes: []Node{node("a", 2)}, Queues: []Queue{queue("x", "", 0, -1, 1), queue("y", "", 0, -1, 1)}}
			mine := running(job("mine", "x", 50, 2, 1, 0), 0, "a", 0)
			mine.MinMember = 1
			big := job("big", "x", 50, 1, 2, 1)
			snap.Jobs = []Job{mine, big}
			if tc.others {
				snap.Jobs = append(snap.Jobs, running(job("theirs", "y", 50, 1, 1, 0), 0, "a", 1))
				snap.Jobs[0].Pods = snap.Jobs[0].Pods[:1]
			}
			res := mustSchedule(t, snap, Config{DisableConsolidation: true})
			var why string
			for _, p := range res.Pending {
				if p.Pod == "big-0" {
					why = p.Reason
				}
			}
			if got := strings.Contains(why, "cannot reclaim"); got != tc.others {
				t.Errorf("reason %q: says cannot reclaim %v, want %v", why, got, tc.others)
			}
		})
	}
}
