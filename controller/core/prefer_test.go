package core

import (
	"strings"
	"testing"
)

// Preferences (Pod.Prefers, Pod.NodeScore) decide among the nodes that fit
// before the placement policy does; they never make a node fit.
func TestPreferences(t *testing.T) {
	const host = "kubernetes.io/hostname"
	hostNode := func(name string) Node {
		n := node(name, 8)
		n.Labels = map[string]string{host: name}
		return n
	}
	hosts := []Node{hostNode("a"), hostNode("b"), hostNode("c")}
	// Bin-packing alone puts every replica on a (the fullest after the
	// first), so each case below is decided by the preference.
	replica := func(name string, weight int64) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, Matches: []string{"web"}, Prefers: []PreferredTerm{{Term: "web", Weight: weight}}}
	}
	on := func(name, node string, gpu int) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, Matches: []string{"web"}, Phase: PodRunning, Placement: Placement{Node: node, GPUs: []int{gpu}}}
	}
	prefer := func(name string, scores map[string]int64) Pod {
		return Pod{Name: name, Request: Request{GPUs: 1}, NodeScore: func(n string) int64 { return scores[n] }}
	}
	cases := []placeCase{
		{
			name: "preferred anti-affinity spreads replicas, counting this cycle's", nodes: hosts, terms: map[string]string{"web": host},
			pending: []Pod{replica("r0", -1), replica("r1", -1), replica("r2", -1), replica("r3", -1)},
			// The fourth has no empty domain left: bin-packing among
			// the three tied nodes picks the earliest.
			want: map[string]string{"r0": "a", "r1": "b", "r2": "c", "r3": "a"},
		},
		{
			name: "preferred affinity joins the domain with most matching pods", nodes: hosts, terms: map[string]string{"web": host},
			running: []Pod{on("w0", "a", 0), on("w1", "c", 0), on("w2", "c", 1),
				{Name: "x", Request: Request{GPUs: 4}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{1, 2, 3, 4}}}},
			pending: []Pod{replica("r0", 1)}, // bin-packing: a
			want:    map[string]string{"r0": "c"},
		},
		{
			name: "a preference never makes a node fit", nodes: []Node{hostNode("a"), node("small", 1)}, terms: map[string]string{"web": host},
			running: []Pod{{Name: "big", Request: Request{GPUs: 1}, Phase: PodRunning, Placement: Placement{Node: "small", GPUs: []int{0}}}},
			pending: []Pod{prefer("p", map[string]int64{"small": 100})},
			want:    map[string]string{"p": "a"},
		},
		{
			name: "node score beats bin-packing", nodes: hosts,
			running: []Pod{{Name: "x", Request: Request{GPUs: 4}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0, 1, 2, 3}}}},
			pending: []Pod{prefer("p", map[string]int64{"b": 10, "c": 20})},
			want:    map[string]string{"p": "c"},
		},
		{
			name: "equal preferences: bin-packing decides", nodes: hosts,
			running: []Pod{{Name: "x", Request: Request{GPUs: 4}, Phase: PodRunning, Placement: Placement{Node: "b", GPUs: []int{0, 1, 2, 3}}}},
			pending: []Pod{prefer("p", map[string]int64{"a": 5, "b": 5, "c": 5})},
			want:    map[string]string{"p": "b"},
		},
		{
			name: "negative node score keeps away while others fit", nodes: hosts,
			running: []Pod{{Name: "x", Request: Request{GPUs: 7}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0, 1, 2, 3, 4, 5, 6}}}},
			pending: []Pod{prefer("p", map[string]int64{"a": -1})},
			want:    map[string]string{"p": "b"},
		},
		{
			name: "weights add up across terms and node score", nodes: hosts, terms: map[string]string{"web": host, "db": host},
			running: []Pod{on("w0", "b", 0), {Name: "d0", Request: Request{GPUs: 3}, Matches: []string{"db"}, Phase: PodRunning, Placement: Placement{Node: "c", GPUs: []int{0, 1, 2}}}},
			// near web (+3 on b), away from db (−5 on c), a slight
			// node preference for c (+4): b 3, c −1, a 0; bin-packing
			// alone: c.
			pending: []Pod{{Name: "p", Request: Request{GPUs: 1}, Prefers: []PreferredTerm{{Term: "web", Weight: 3}, {Term: "db", Weight: -5}},
				NodeScore: func(n string) int64 { return map[string]int64{"c": 4}[n] }}},
			want: map[string]string{"p": "b"},
		},
		{
			// Kubernetes' symmetry: the running pod's own terms pull
			// (or push) pods they select, which carry no terms.
			name: "a placed pod attracts the pods its term selects", nodes: hosts, terms: map[string]string{"web": host},
			running: []Pod{
				{Name: "x", Request: Request{GPUs: 4}, Phase: PodRunning, Placement: Placement{Node: "a", GPUs: []int{0, 1, 2, 3}}},
				{Name: "cache", Request: Request{GPUs: 1}, Attracts: []PreferredTerm{{Term: "web", Weight: 5}}, Phase: PodRunning, Placement: Placement{Node: "c", GPUs: []int{0}}},
			},
			pending: []Pod{{Name: "w", Request: Request{GPUs: 1}, Matches: []string{"web"}}, {Name: "other", Request: Request{GPUs: 1}}},
			// w: c (+5), though bin-packing prefers a; other is not
			// selected: a.
			want: map[string]string{"w": "c", "other": "a"},
		},
		{
			name: "a placed pod repels, and placements this cycle count", nodes: hosts, terms: map[string]string{"web": host},
			pending: []Pod{
				{Name: "loner", Request: Request{GPUs: 1}, Attracts: []PreferredTerm{{Term: "web", Weight: -5}}},
				{Name: "w", Request: Request{GPUs: 1}, Matches: []string{"web"}},
			},
			// loner goes first (a); w keeps away from it: b.
			want: map[string]string{"loner": "a", "w": "b"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

func TestPreferencesUnknownTerm(t *testing.T) {
	snap := &Snapshot{Nodes: []Node{node("a", 1)}, Queues: []Queue{NewQueue("q", "")},
		Jobs: []Job{{Name: "j", Queue: "q", Pods: []Pod{{Name: "p", Prefers: []PreferredTerm{{Term: "nope", Weight: 1}}}}}}}
	if why := invalidReason(t, snap, "p"); !strings.Contains(why, `preferred term "nope"`) {
		t.Fatalf("an unknown preferred term: reason %q", why)
	}
	snap.Jobs[0].Pods[0].Prefers, snap.Jobs[0].Pods[0].Attracts = nil, []PreferredTerm{{Term: "nope", Weight: 1}}
	if why := invalidReason(t, snap, "p"); !strings.Contains(why, `attracting term "nope"`) {
		t.Fatalf("an unknown attracting term: reason %q", why)
	}
}
