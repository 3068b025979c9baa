package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

const gi = int64(1) << 30

// node builds a node with n GPUs of 80Gi on one NVLink domain.
func node(name string, n int) Node {
	nd := Node{Name: name, CPU: 64000, Memory: 512 * gi}
	for i := 0; i < n; i++ {
		nd.GPUs = append(nd.GPUs, GPU{Index: i, Memory: 80 * gi, Model: "H100", NVLinkDomain: "nv0"})
	}
	return nd
}

func nodes(prefix string, count, gpus int) []Node {
	var out []Node
	for i := 0; i < count; i++ {
		out = append(out, node(fmt.Sprintf("%s-%d", prefix, i), gpus))
	}
	return out
}

// queue builds a leaf or parent queue with a GPU quota/limit/weight.
func queue(name, parent string, quota, limit, weight int64) Queue {
	q := NewQueue(name, parent)
	if quota > 0 {
		quota *= 1000
	}
	if limit > 0 {
		limit *= 1000
	}
	q.Resources[ResGPU] = QueueResource{Quota: quota, Limit: limit, OverQuotaWeight: weight}
	return q
}

// job builds a job of count pods of gpus GPUs each; running pods are placed
// on the given nodes, one pod per entry, on consecutive free GPUs.
func job(name, q string, prio int32, count, gpus int, created int) Job {
	j := Job{Name: name, Queue: q, Priority: prio, Preemptible: true, CreatedAt: time.Unix(int64(created), 0)}
	for i := 0; i < count; i++ {
		j.Pods = append(j.Pods, Pod{Name: fmt.Sprintf("%s-%d", name, i), Request: Request{GPUs: gpus}, Phase: PodPending})
	}
	return j
}

// running marks pod i of j as running on node at GPUs.
func running(j Job, i int, node string, gpus ...int) Job {
	j.Pods[i].Phase = PodRunning
	j.Pods[i].Placement = Placement{Node: node, GPUs: gpus}
	return j
}

// fillNodes places every pod of j (one GPU each) onto the nodes in order.
func fillNodes(j Job, ns []Node) Job {
	k := 0
	for _, n := range ns {
		for g := range n.GPUs {
			if k == len(j.Pods) {
				return j
			}
			j = running(j, k, n.Name, g)
			k++
		}
	}
	return j
}

func mustSchedule(t interface {
	Fatalf(string, ...any)
	Helper()
}, s *Snapshot, cfg Config) *Result {
	t.Helper()
	r, err := Schedule(s, cfg)
	if err != nil {
		t.Fatalf("schedule: %v", err)
	}
	if len(r.Problems) > 0 {
		t.Fatalf("schedule: the snapshot has problems: %v", r.Problems)
	}
	return r
}

// invalidReason schedules a snapshot whose pod is invalid and returns the
// reason it waits with; the cycle itself must not fail.
func invalidReason(t *testing.T, s *Snapshot, pod string) string {
	t.Helper()
	r, err := Schedule(s, Config{})
	if err != nil {
		t.Fatalf("schedule: one invalid pod failed the cycle: %v", err)
	}
	if len(r.Problems) == 0 {
		t.Fatalf("schedule: no problem reported for the invalid pod %s", pod)
	}
	return pendingReason(r, pod)
}

func countBinds(r *Result, jobName string) int {
	n := 0
	for _, b := range r.Binds {
		if b.Job == jobName {
			n++
		}
	}
	return n
}

func countEvictions(r *Result, jobName string) int {
	n := 0
	for _, e := range r.Evictions {
		if e.Job == jobName {
			n++
		}
	}
	return n
}

func pendingReason(r *Result, pod string) string {
	for _, p := range r.Pending {
		if p.Pod == pod {
			return p.Reason
		}
	}
	return ""
}

// placeCase is a table row of the placement tests: nodes, running pods
// (one job), pending pods (each its own job, older first), and where each
// pending pod must go ("" for pending) and why it waits.
type placeCase struct {
	name    string
	nodes   []Node
	terms   map[string]string // Snapshot.PodTerms
	running []Pod
	pending []Pod
	want    map[string]string
	reason  map[string]string
}

// run schedules one cycle in one queue without quota or limit and checks
// the placements and reasons.
func (c placeCase) run(t *testing.T) {
	t.Helper()
	snap := &Snapshot{Nodes: c.nodes, PodTerms: c.terms, Queues: []Queue{queue("q", "", -1, -1, 1)}}
	if len(c.running) > 0 {
		snap.Jobs = append(snap.Jobs, Job{Name: "old", Queue: "q", Priority: 100, Pods: c.running})
	}
	for i, p := range c.pending {
		snap.Jobs = append(snap.Jobs, Job{Name: p.Name, Queue: "q", Priority: 100, CreatedAt: time.Unix(int64(i), 0), Pods: []Pod{p}})
	}
	res := mustSchedule(t, snap, Config{})
	got := map[string]string{}
	for _, p := range c.pending {
		got[p.Name] = ""
	}
	for _, b := range res.Binds {
		got[b.Pod] = b.Placement.Node
	}
	assert.Equal(t, c.want, got)
	for pod, want := range c.reason {
		assert.Equal(t, want, pendingReason(res, pod), "reason of %s", pod)
	}
}
