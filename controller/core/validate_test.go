package core

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each bad object fails alone: the valid job beside it is still placed,
// the bad job's pending pods wait with a reason naming what is wrong, and
// the problem is reported.
func TestBadObjectFailsAlone(t *testing.T) {
	pending := func(name, q string, r Request) Job {
		return Job{Name: name, Queue: q, Priority: 100, Pods: []Pod{{Name: name, Request: r}}}
	}
	for _, c := range []struct {
		name    string
		queues  []Queue
		terms   map[string]string
		topos   []Topology
		jobs    []Job
		reasons map[string]string // pod → part of its reason
		problem string            // object named in Result.Problems
	}{
		{name: "negative CPU (a wrapped quantity)", jobs: []Job{pending("bad", "q", Request{GPUs: 1, CPU: -9223372036854775000})},
			reasons: map[string]string{"bad": "request: CPU -9223372036854775000 is negative"}, problem: "job bad"},
		{name: "GPU memory above the maximum", jobs: []Job{pending("bad", "q", Request{GPUMemory: math.MaxInt64})},
			reasons: map[string]string{"bad": "request: GPUMemory 9223372036854775807 is above the most a pod may ask"}, problem: "job bad"},
		{name: "GPU count above the maximum", jobs: []Job{pending("bad", "q", Request{GPUs: MaxGPUs + 1})},
			reasons: map[string]string{"bad": "request: GPUs 65537 is above"}, problem: "job bad"},
		{name: "negative other resource", jobs: []Job{pending("bad", "q", Request{Other: map[string]int64{"pods": -1}})},
			reasons: map[string]string{"bad": "request: pods -1 is negative"}, problem: "job bad"},
		{name: "two GPU fields", jobs: []Job{pending("bad", "q", Request{GPUs: 1, GPUMilli: 500})},
			reasons: map[string]string{"bad": "set one of GPUs (1), GPUMilli (500) and GPUMemory (0), not several"}, problem: "job bad"},
		{name: "unknown queue", jobs: []Job{pending("bad", "nope", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "queue nope does not exist"}, problem: "job bad"},
		{name: "invalid queue", queues: []Queue{{Name: "bad-q", Resources: [NumResources]QueueResource{{Quota: 0, Limit: -5, OverQuotaWeight: 1}}}},
			jobs:    []Job{pending("bad", "bad-q", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "queue bad-q is invalid: queue bad-q: gpu limit -5 must be -1 (unlimited) or from 0 to"}, problem: "queue bad-q"},
		{name: "queue under an invalid parent", queues: []Queue{{Name: "bad-p", Resources: [NumResources]QueueResource{{OverQuotaWeight: -1}}}, NewQueue("child", "bad-p")},
			jobs:    []Job{pending("bad", "child", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "queue child: its parent is left out (queue bad-p: gpu over-quota weight -1 must be from 0 to"}, problem: "queue child"},
		{name: "parent loop", queues: []Queue{NewQueue("x", "y"), NewQueue("y", "x")},
			jobs:    []Job{pending("bad", "x", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "parent chain loops"}, problem: "queue x"},
		{name: "unknown parent", queues: []Queue{NewQueue("orphan", "ghost")},
			jobs:    []Job{pending("bad", "orphan", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "queue orphan: parent ghost does not exist"}, problem: "queue orphan"},
		{name: "job in a parent queue", queues: []Queue{NewQueue("org", ""), NewQueue("team", "org")},
			jobs:    []Job{pending("bad", "org", Request{GPUs: 1})},
			reasons: map[string]string{"bad": "queue org is a parent queue"}, problem: "job bad"},
		{name: "unknown disruption", jobs: []Job{{Name: "bad", Queue: "q", Disruption: "some", Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": `job bad: disruption "some" is not "", "single" or "all"`}, problem: "job bad"},
		{name: "gang with one invalid pod", jobs: []Job{{Name: "g", Queue: "q", Pods: []Pod{
			{Name: "g-0", Request: Request{GPUs: 1}}, {Name: "g-1", Request: Request{GPUs: 1, Memory: -1}}}}},
			reasons: map[string]string{"g-1": "request: Memory -1 is negative", "g-0": "its job g cannot be scheduled: pod g-1: request: Memory -1 is negative"}, problem: "job g"},
		{name: "unknown term", jobs: []Job{{Name: "bad", Queue: "q", Pods: []Pod{{Name: "bad", Avoids: []string{"nope"}}}}},
			reasons: map[string]string{"bad": `anti-affinity term "nope" is not in the snapshot's PodTerms`}, problem: "job bad"},
		{name: "term without topology", terms: map[string]string{"t": ""}, jobs: []Job{{Name: "bad", Queue: "q", Pods: []Pod{{Name: "bad", Matches: []string{"t"}}}}},
			reasons: map[string]string{"bad": `anti-affinity term "t" is not in the snapshot's PodTerms`}, problem: "term t"},
		{name: "unknown topology", topos: []Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "net", Required: "zone"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": `job bad: topology "net" does not exist`}, problem: "job bad"},
		{name: "unknown level", topos: []Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc", Required: "block"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": `job bad: topology dc: required level "block" is not one of its levels (zone, example.com/rack, kubernetes.io/hostname)`}, problem: "job bad"},
		{name: "preferred broader than required", topos: []Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc", Required: "example.com/rack", Preferred: "zone"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": "job bad: topology dc: preferred level zone is broader than required level example.com/rack (a gang in one rack is in one zone already)"}, problem: "job bad"},
		{name: "no level", topos: []Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": "job bad: topology dc: neither a required nor a preferred level is set"}, problem: "job bad"},
		{name: "invalid topology", topos: []Topology{{Name: "dc", Levels: []string{"zone", "zone"}}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc", Required: "zone"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": "job bad: topology dc is invalid: topology dc: level zone is listed twice"}, problem: "topology dc"},
		{name: "topology without levels", topos: []Topology{{Name: "dc"}}, jobs: []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc", Required: "zone"}, Pods: []Pod{{Name: "bad", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": "job bad: topology dc is invalid: topology dc has no levels"}, problem: "topology dc"},
		{name: "subgroup of another topology", topos: append([]Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}}, Topology{Name: "nv", Levels: []string{"clique"}}),
			jobs:    []Job{{Name: "bad", Queue: "q", Topology: &TopologyConstraint{Topology: "dc", Required: "zone"}, SubGroups: []SubGroup{{Name: "w", MinMember: 1, Topology: &TopologyConstraint{Topology: "nv", Required: "clique"}}}, Pods: []Pod{{Name: "bad", SubGroup: "w", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": `job bad: subgroup w: topology "nv" is not the job's topology dc`}, problem: "job bad"},
		{name: "subgroup unknown level", topos: []Topology{{Name: "dc", Levels: []string{"zone", "example.com/rack", "kubernetes.io/hostname"}}},
			jobs:    []Job{{Name: "bad", Queue: "q", SubGroups: []SubGroup{{Name: "w", MinMember: 1, Topology: &TopologyConstraint{Topology: "dc", Preferred: "rack"}}}, Pods: []Pod{{Name: "bad", SubGroup: "w", Request: Request{GPUs: 1}}}}},
			reasons: map[string]string{"bad": `job bad: subgroup w: topology dc: preferred level "rack" is not one of its levels`}, problem: "job bad"},
		{name: "job listed twice", jobs: []Job{pending("ok", "q", Request{GPUs: 1})},
			reasons: map[string]string{"ok-again": "job ok is listed twice"}, problem: "job ok"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok := pending("ok", "q", Request{GPUs: 1})
			jobs := append([]Job{ok}, c.jobs...)
			if c.name == "job listed twice" {
				jobs[1].Pods[0].Name = "ok-again"
			}
			snap := &Snapshot{Nodes: []Node{node("a", 2)}, PodTerms: c.terms, Topologies: c.topos, Queues: append([]Queue{queue("q", "", -1, -1, 1)}, c.queues...), Jobs: jobs}
			res, err := Schedule(snap, Config{})
			require.NoError(t, err)
			assert.Equal(t, 1, countBinds(res, "ok"), "the valid job is placed")
			for pod, want := range c.reasons {
				assert.Contains(t, pendingReason(res, pod), want, "reason of %s", pod)
			}
			var objects []string
			for _, p := range res.Problems {
				objects = append(objects, p.Object)
			}
			assert.Contains(t, objects, c.problem)
		})
	}
}

// A placed pod the core cannot schedule by the rules keeps its capacity:
// losing it would offer its GPUs to another pod.
func TestFrozenPodsKeepCapacity(t *testing.T) {
	placed := func(job, q string, r Request, gpus ...int) Job {
		return Job{Name: job, Queue: q, Pods: []Pod{{Name: job, Request: r, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: gpus}}}}
	}
	for _, c := range []struct {
		name string
		bad  Job
		// where the pending 1-GPU pod and the pending 2-GPU pod go
		want map[string]string
		gpu  int // the GPU of node a the 1-GPU pod takes, when on a
	}{
		// Its own GPU (0) stays taken; GPU 1 of a is still offered.
		{name: "job in an unknown queue", bad: placed("bad", "nope", Request{GPUs: 1}, 0), want: map[string]string{"one": "a", "two": "b"}, gpu: 1},
		{name: "fraction in a parent queue", bad: placed("bad", "org", Request{GPUMilli: 100}, 0), want: map[string]string{"one": "a", "two": "b"}, gpu: 1},
		// Unreadable amounts: nothing more goes on its node.
		{name: "negative CPU", bad: placed("bad", "q", Request{GPUs: 1, CPU: -1}, 0), want: map[string]string{"one": "b", "two": ""}},
		{name: "memory above the maximum", bad: placed("bad", "q", Request{Memory: math.MaxInt64}), want: map[string]string{"one": "b", "two": ""}},
		// A GPU the node does not have: the ones it does have are held.
		{name: "unknown GPU", bad: placed("bad", "q", Request{GPUs: 2}, 0, 7), want: map[string]string{"one": "a", "two": "b"}, gpu: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			snap := &Snapshot{Nodes: []Node{node("a", 2), node("b", 2)},
				Queues: []Queue{queue("q", "", -1, -1, 1), NewQueue("org", ""), NewQueue("team", "org")},
				Jobs: []Job{c.bad,
					{Name: "one", Queue: "q", Priority: 100, Pods: []Pod{{Name: "one", Request: Request{GPUs: 1}}}},
					{Name: "two", Queue: "q", Priority: 100, CreatedAt: time.Unix(1, 0), Pods: []Pod{{Name: "two", Request: Request{GPUs: 2}}}}}}
			res, err := Schedule(snap, Config{})
			require.NoError(t, err)
			got := map[string]string{"one": "", "two": ""}
			for _, b := range res.Binds {
				got[b.Pod] = b.Placement.Node
				if b.Pod == "one" && b.Placement.Node == "a" {
					assert.Equal(t, []int{c.gpu}, b.Placement.GPUs)
				}
			}
			assert.Equal(t, c.want, got)
			assert.Empty(t, res.Evictions, "a frozen pod is never a victim")
			require.NotEmpty(t, res.Problems)
			assert.Equal(t, "pod bad", res.Problems[len(res.Problems)-1].Object)
		})
	}
}

// A node's broken GPU is left out; the rest of the node and the cycle go on.
func TestBrokenNodeGPU(t *testing.T) {
	a := node("a", 2)
	a.GPUs[1].Memory = 0
	a.CPU = -5
	b := node("b", 1)
	b.GPUs = append(b.GPUs, b.GPUs[0])
	snap := &Snapshot{Nodes: []Node{a, b, node("b", 4)}, Queues: []Queue{queue("q", "", -1, -1, 1)},
		Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{{Name: "p", Request: Request{GPUs: 1, CPU: 1000}}}}}}
	res, err := Schedule(snap, Config{})
	require.NoError(t, err)
	require.Len(t, res.Binds, 1)
	assert.Equal(t, "b", res.Binds[0].Placement.Node, "node a has no CPU left")
	var all []string
	for _, p := range res.Problems {
		all = append(all, p.Object+": "+p.Reason)
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"node a: CPU -5 is outside", "node a: GPU 1: memory 0 bytes", "node b: GPU index 0 listed twice", "node b: listed twice"} {
		assert.Contains(t, joined, want)
	}
}

// The adapters' checks say what the core would refuse, in its words.
func TestValidateTopology(t *testing.T) {
	dc := Topology{Name: "dc", Levels: []string{"zone", "rack", "kubernetes.io/hostname"}}
	for _, c := range []struct {
		name string
		topo Topology
		c    TopologyConstraint
		want string // "" for no error
	}{
		{name: "valid", topo: dc, c: TopologyConstraint{Topology: "dc", Required: "zone", Preferred: "rack"}},
		{name: "equal levels", topo: dc, c: TopologyConstraint{Topology: "dc", Required: "rack", Preferred: "rack"}},
		{name: "empty topology name", topo: Topology{Levels: []string{"a"}}, c: TopologyConstraint{Topology: "dc", Required: "zone"}, want: "topology has an empty name"},
		{name: "empty level", topo: Topology{Name: "dc", Levels: []string{"zone", ""}}, c: TopologyConstraint{Topology: "dc", Required: "zone"}, want: "topology dc: level 1 is empty"},
		{name: "preferred broader", topo: dc, c: TopologyConstraint{Topology: "dc", Required: "kubernetes.io/hostname", Preferred: "rack"},
			want: "topology dc: preferred level rack is broader than required level kubernetes.io/hostname (a gang in one hostname is in one rack already)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ValidateTopology(c.topo)
			if err == nil {
				err = ValidateTopologyConstraint(c.c, []Topology{c.topo})
			}
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, c.want)
		})
	}
	assert.Equal(t, "zone", levelName("topology.kubernetes.io/zone"))
	assert.Equal(t, "gpu.clique", levelName("nvidia.com/gpu.clique"))
	assert.Equal(t, "rack", levelName("rack"))
}
