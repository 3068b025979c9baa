package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Required pod anti-affinity: a pod that avoids a term never shares a
// topology domain with a pod that matches it, in either direction, counting
// pods placed earlier in the same cycle.
func TestAntiAffinity(t *testing.T) {
	const host = "kubernetes.io/hostname"
	labeled := func(name string, labels map[string]string) Node {
		n := node(name, 8)
		n.Labels = labels
		return n
	}
	hosts := []Node{labeled("a", map[string]string{host: "a"}), labeled("b", map[string]string{host: "b"})}
	replica := func(name string) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, Matches: []string{"web"}, Avoids: []string{"web"}}
	}
	cases := []placeCase{
		{
			name: "replicas one per node", nodes: hosts, terms: map[string]string{"web": host},
			pending: []Pod{replica("r0"), replica("r1"), replica("r2")},
			want:    map[string]string{"r0": "a", "r1": "b", "r2": ""},
			reason:  map[string]string{"r2": "every node it could use runs a pod it must be kept apart from (required pod anti-affinity)"},
		},
		{
			name: "a running pod's term keeps a matching pod away", nodes: hosts, terms: map[string]string{"db": host},
			running: []Pod{{Name: "guard", Request: Request{GPUs: 1}, Avoids: []string{"db"}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0}}}},
			// Bin-packing alone would put it beside guard on a.
			pending: []Pod{{Name: "db-0", Request: Request{GPUs: 1}, Matches: []string{"db"}}},
			want:    map[string]string{"db-0": "b"},
		},
		{
			name: "zones", terms: map[string]string{"web": zone},
			nodes:   []Node{labeled("a", map[string]string{zone: "z1"}), labeled("b", map[string]string{zone: "z1"}), labeled("c", map[string]string{zone: "z2"})},
			pending: []Pod{replica("r0"), replica("r1"), replica("r2")},
			want:    map[string]string{"r0": "a", "r1": "c", "r2": ""},
		},
		{
			name: "a node without the label is in no domain", terms: map[string]string{"web": zone},
			nodes:   []Node{labeled("a", nil)},
			pending: []Pod{replica("r0"), replica("r1")},
			want:    map[string]string{"r0": "a", "r1": "a"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}

}

// Preemption can clear a conflict: the only node runs a lower-priority pod
// the preemptor must be kept apart from; it is evicted and the bind waits
// for it to be gone.
func TestAntiAffinityPreempt(t *testing.T) {
	n := node("a", 8)
	n.Labels = map[string]string{"kubernetes.io/hostname": "a"}
	snap := &Snapshot{Nodes: []Node{n}, PodTerms: map[string]string{"t": "kubernetes.io/hostname"}, Queues: []Queue{queue("q", "", -1, -1, 1)}}
	snap.Jobs = []Job{
		{Name: "low", Queue: "q", Priority: 10, Preemptible: true, Pods: []Pod{{Name: "low", Request: Request{GPUs: 1}, Matches: []string{"t"},
			Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0}}}}},
		{Name: "high", Queue: "q", Priority: 90, Preemptible: true, Pods: []Pod{{Name: "high", Request: Request{GPUs: 1}, Avoids: []string{"t"}}}},
	}
	res := mustSchedule(t, snap, Config{})
	require.Len(t, res.Evictions, 1)
	assert.Equal(t, "low", res.Evictions[0].Pod)
	require.Len(t, res.Binds, 1)
	assert.True(t, res.Binds[0].Pipelined)
}

func TestAntiAffinityUnknownTerm(t *testing.T) {
	snap := &Snapshot{Nodes: []Node{node("a", 1)}, Queues: []Queue{NewQueue("q", "")},
		Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{{Name: "p", Avoids: []string{"nope"}}}}}}
	assert.Contains(t, invalidReason(t, snap, "p"), `anti-affinity term "nope" is not in the snapshot's PodTerms`)
}

const zone = "topology.kubernetes.io/zone"

// zoned is an 8-GPU node in zone z (no zone label when z is "").
func zoned(name, z string) Node {
	n := node(name, 8)
	if z != "" {
		n.Labels = map[string]string{zone: z}
	}
	return n
}

// Required pod affinity: a pod runs only in a domain where a pod it needs
// runs; the first of a group that needs itself may go anywhere with the
// label.
func TestPodAffinity(t *testing.T) {
	running := func(name, node string, matches ...string) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, Matches: matches, Phase: PodRunning, Placement: Placement{Node: node, GPUs: []int{0}}}
	}
	cases := []placeCase{
		{
			name:  "near the pod it needs, against bin-packing",
			nodes: []Node{zoned("a", "z1"), zoned("b", "z2")},
			// b is fuller, so bin-packing alone would pick it.
			running: []Pod{running("cache", "a", "cache"), running("other-0", "b"), {Name: "other-1", Request: Request{GPUs: 1}, Phase: PodRunning, Placement: Placement{Node: "b", GPUs: []int{1}}}},
			pending: []Pod{{Name: "reader", Request: Request{GPUs: 1}, Needs: []string{"cache"}}},
			want:    map[string]string{"reader": "a"},
		},
		{
			name:  "the first of a group anywhere, the rest near it",
			nodes: []Node{zoned("a", "z1"), zoned("b", "z2")},
			pending: []Pod{
				{Name: "w0", Request: Request{GPUs: 8}, Matches: []string{"grp"}, Needs: []string{"grp"}},
				{Name: "w1", Request: Request{GPUs: 8}, Matches: []string{"grp"}, Needs: []string{"grp"}},
			},
			want:   map[string]string{"w0": "a", "w1": ""},
			reason: map[string]string{"w1": "needs 8 free GPUs on one node; the most free on any node is 0; 1 node ruled out by required pod (anti-)affinity"},
		},
		{
			name:    "nodes without the label never qualify",
			nodes:   []Node{zoned("a", "")},
			running: []Pod{running("cache", "a", "cache")},
			pending: []Pod{{Name: "reader", Request: Request{GPUs: 1}, Needs: []string{"cache"}}},
			want:    map[string]string{"reader": ""},
			reason:  map[string]string{"reader": "no node it could use is in a domain with the pods it must run near (required pod affinity)"},
		},
		{
			name:    "no pod to be near, and not one of the group: waits",
			nodes:   []Node{zoned("a", "z1")},
			pending: []Pod{{Name: "reader", Request: Request{GPUs: 1}, Needs: []string{"cache"}}},
			want:    map[string]string{"reader": ""},
		},
	}
	for _, c := range cases {
		if c.terms == nil {
			c.terms = map[string]string{"cache": zone, "grp": zone}
		}
		t.Run(c.name, c.run)
	}

}

// Topology spread (DoNotSchedule): a pod joins a domain only while the
// pods the term selects stay within maxSkew of the emptiest domain it could
// use.
func TestTopologySpread(t *testing.T) {
	replica := func(name string, minDomains int) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, Matches: []string{"web"}, Spread: []SpreadConstraint{{Term: "web", MaxSkew: 1, MinDomains: minDomains}}}
	}
	cases := []placeCase{
		{
			name:  "across zones against bin-packing",
			nodes: []Node{zoned("a", "z1"), zoned("b", "z1"), zoned("c", "z2")},
			// Bin-packing alone would put all three on a.
			pending: []Pod{replica("r0", 0), replica("r1", 0), replica("r2", 0), replica("r3", 0)},
			want:    map[string]string{"r0": "a", "r1": "c", "r2": "a", "r3": "c"},
		},
		{
			name:    "nodes without the label are out",
			nodes:   []Node{zoned("a", "")},
			pending: []Pod{replica("r0", 0)},
			want:    map[string]string{"r0": ""},
			reason:  map[string]string{"r0": "every node it could use would break its topology spread (maxSkew)"},
		},
		{
			name:    "fewer domains than minDomains: the fewest counts as 0",
			nodes:   []Node{zoned("a", "z1"), zoned("c", "z2")},
			pending: []Pod{replica("r0", 3), replica("r1", 3), replica("r2", 3)},
			want:    map[string]string{"r0": "a", "r1": "c", "r2": ""},
		},
	}
	for _, c := range cases {
		if c.terms == nil {
			c.terms = map[string]string{"web": zone}
		}
		t.Run(c.name, c.run)
	}

	snap := &Snapshot{Nodes: []Node{node("a", 1)}, PodTerms: map[string]string{"web": zone}, Queues: []Queue{NewQueue("q", "")},
		Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{{Name: "p", Spread: []SpreadConstraint{{Term: "web", MaxSkew: 0}}}}}}}
	assert.Contains(t, invalidReason(t, snap, "p"), `spread term "web": maxSkew 0 must be at least 1`)
}
