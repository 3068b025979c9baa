package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// subJob builds a gang with subgroups: one pod of gpus GPUs per entry of
// subs (the subgroup it names, "" for none), named name-0, name-1, …
func subJob(name string, minMember int, groups []SubGroup, gpus int, subs ...string) Job {
	j := Job{Name: name, Queue: "q", Priority: 50, Preemptible: true, MinMember: minMember, SubGroups: groups}
	for i, s := range subs {
		j.Pods = append(j.Pods, Pod{Name: fmt.Sprintf("%s-%d", name, i), SubGroup: s, Request: Request{GPUs: gpus}, Phase: PodPending})
	}
	return j
}

func subSnap(jobs ...Job) *Snapshot {
	return &Snapshot{Nodes: []Node{node("a", 8)}, Queues: []Queue{queue("q", "", -1, -1, 1)}, Jobs: jobs}
}

// What the snapshot cannot take as given about subgroups fails alone, with
// a reason naming it; the valid job beside it is placed.
func TestSubGroupsBadInput(t *testing.T) {
	lw := []SubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 2}}
	for _, c := range []struct {
		name    string
		job     Job
		reasons map[string]string // pod → part of its reason
		problem bool              // reported in Result.Problems
	}{
		{name: "pod names an unknown subgroup", job: subJob("g", 0, lw, 1, "leader", "workers", "worker"),
			reasons: map[string]string{
				"g-2": `names subgroup "worker", which gang g does not have (its subgroups: leader, workers)`,
				"g-0": `its job g cannot be scheduled: pod g-2: names subgroup "worker"`,
			}, problem: true},
		{name: "pod names a subgroup of a gang without any", job: subJob("g", 0, nil, 1, "", "workers"),
			reasons: map[string]string{"g-1": `names subgroup "workers", but gang g has no subgroups`}, problem: true},
		{name: "subgroup no pod names", job: subJob("g", 0, lw, 1, "leader", "leader"),
			reasons: map[string]string{"g-0": "gang g: subgroup workers needs 2 pods; no pod names it (annotation tessera.dev/pod-subgroup)"}},
		{name: "subgroup short of pods", job: subJob("g", 0, lw, 1, "leader", "workers"),
			reasons: map[string]string{"g-1": "gang g: subgroup workers needs 2 pods; only 1 exist"}},
		{name: "subgroup listed twice", job: subJob("g", 0, []SubGroup{{Name: "w", MinMember: 1}, {Name: "w", MinMember: 1}}, 1, "w"),
			reasons: map[string]string{"g-0": "job g: subgroup w is listed twice"}, problem: true},
		{name: "subgroup minimum 0", job: subJob("g", 0, []SubGroup{{Name: "w", MinMember: 0}}, 1, "w"),
			reasons: map[string]string{"g-0": "job g: subgroup w: minMember 0 must be at least 1"}, problem: true},
		{name: "subgroup without a name", job: subJob("g", 0, []SubGroup{{MinMember: 1}}, 1, ""),
			reasons: map[string]string{"g-0": "job g: subgroup 0 has an empty name"}, problem: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok := subJob("ok", 0, nil, 1, "")
			res, err := Schedule(subSnap(ok, c.job), Config{})
			require.NoError(t, err)
			assert.Equal(t, 1, countBinds(res, "ok"), "the valid job is placed")
			assert.Equal(t, 0, countBinds(res, "g"), "no pod of the gang is placed")
			for pod, want := range c.reasons {
				assert.Contains(t, pendingReason(res, pod), want, "reason of %s", pod)
			}
			var objects []string
			for _, p := range res.Problems {
				objects = append(objects, p.Object)
			}
			if c.problem {
				assert.Contains(t, objects, "job g")
			} else {
				assert.Empty(t, objects)
			}
		})
	}
}

// A placed pod naming a subgroup its gang no longer has (the PodGroup was
// edited) counts for the job only: it is not frozen, and its pending
// siblings are still scheduled.
func TestSubGroupsPlacedPodOfUnknownSubgroup(t *testing.T) {
	j := subJob("g", 2, []SubGroup{{Name: "w", MinMember: 1}}, 1, "gone", "w")
	j = running(j, 0, "a", 0)
	res := mustSchedule(t, subSnap(j), Config{})
	assert.Empty(t, res.Problems)
	assert.Equal(t, 1, countBinds(res, "g"), "g-1 joins the running pod")
	assert.Equal(t, 2, res.Jobs["g"].Placed)
	assert.False(t, res.Jobs["g"].BelowMinMember)
}

// JobStatus.BelowMinMember (the adapter's stale-gang clock) counts a
// subgroup below its minimum, even with the job's minMember placed; a
// subgroup at its minimum is not below.
func TestSubGroupsBelowMinMember(t *testing.T) {
	lw := []SubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 2}}
	for _, c := range []struct {
		name    string
		running []int
		below   bool
	}{
		{name: "workers without their leader", running: []int{1, 2}, below: true},
		{name: "leader and one worker", running: []int{0, 1}, below: true},
		{name: "leader and two workers", running: []int{0, 1, 2}, below: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The node holds the running pods only: no pending pod joins them.
			j := subJob("g", 2, lw, 1, "leader", "workers", "workers", "workers")
			for k, i := range c.running {
				j = running(j, i, "a", k)
			}
			snap := subSnap(j)
			snap.Nodes = []Node{node("a", len(c.running))}
			res := mustSchedule(t, snap, Config{StaleGangTimeout: -1})
			assert.Equal(t, c.below, res.Jobs["g"].BelowMinMember)
		})
	}
}

// The stale-gang eviction names the subgroup below its minimum.
func TestSubGroupsStaleReason(t *testing.T) {
	j := subJob("g", 2, []SubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 2}}, 1, "leader", "workers", "workers")
	j.Pods[0].Request.GPUs = 8
	j = running(running(j, 1, "a", 0), 2, "a", 1)
	now := time.Unix(1000, 0)
	j.BelowMinMemberSince = now.Add(-2 * time.Minute)
	snap := subSnap(j)
	snap.Now = now
	res := mustSchedule(t, snap, Config{})
	require.Len(t, res.Evictions, 2)
	assert.Equal(t, ActionStaleGang, res.Evictions[0].Action)
	assert.Contains(t, res.Evictions[0].Reason, "gang g below its minimum for 2m0s (subgroup leader: 0 of its minMember 1 placed)")
}

// A gang whose subgroups ask more than its minMember places what the
// subgroups need: the two conditions add up, none is refused.
func TestSubGroupsAboveMinMember(t *testing.T) {
	j := subJob("g", 1, []SubGroup{{Name: "x", MinMember: 2}, {Name: "y", MinMember: 2}}, 2, "x", "x", "y", "y", "y")
	// 8 GPUs hold 4 pods: x 2 and y 2, then none beyond.
	res := mustSchedule(t, subSnap(j), Config{})
	assert.Equal(t, 4, countBinds(res, "g"))
	// 6 GPUs free: the 4 pods the subgroups need do not fit, and nothing is placed.
	f := subJob("f", 0, nil, 2, "")
	f = running(f, 0, "a", 0, 1)
	res = mustSchedule(t, subSnap(f, j), Config{})
	assert.Equal(t, 0, countBinds(res, "g"))
	assert.Contains(t, pendingReason(res, "g-0"), "gang g needs 4 pods (subgroups x 2, y 2); only 3 fit")
}

// The gang search never completes a set that leaves a subgroup below its
// minimum: here the leader (subgroup s0) can never pass its queue's memory
// limit, so the greedy set fails, and the search must not place three
// workers alone (found by the property test, seed 1928: the search
// returned at n pods before checking what the subgroups lacked).
func TestSubGroupsSearchNeverPlacesWithoutASubgroup(t *testing.T) {
	q := queue("q", "", -1, -1, 1)
	q.Resources[ResMemory].Limit = 8 * gi
	j := subJob("g", 1, []SubGroup{{Name: "s0", MinMember: 1}, {Name: "s1", MinMember: 2}}, 1, "s0", "s1", "s1", "s1")
	j.Pods[0].Request = Request{CPU: 1000, Memory: 32 * gi}
	snap := &Snapshot{Nodes: []Node{node("a", 8)}, Queues: []Queue{q}, Jobs: []Job{j}}
	res := mustSchedule(t, snap, Config{})
	assert.Equal(t, 0, countBinds(res, "g"), "no worker runs without its leader")
	assert.Contains(t, pendingReason(res, "g-0"), "queue q would exceed its limit")
}
