package core

import (
	"fmt"
	"testing"
	"time"
)

// The gang search runs when the greedy pass fails and stops at the cycle's
// budget: on benchSearchSnapshot every gang's search fails, and together
// they spend the whole budget and no more.
func TestSearchStopsAtTheCycleBudget(t *testing.T) {
	s, err := newSession(benchSearchSnapshot(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	s.computeFairShare()
	s.buildVictimOrder()
	s.allocate()
	if s.searchLeft != 0 {
		t.Fatalf("search budget left %d, want 0 (spent, not overdrawn)", s.searchLeft)
	}
	for _, j := range s.jobs {
		if j.name[0] == 'g' && j.placed != 0 {
			t.Fatalf("gang %s placed %d pods; none fit", j.name, j.placed)
		}
	}
}

// Nodes alike in state and in the labels a gang can see are one branch of
// the search, whatever other labels they carry: every real node has its own
// kubernetes.io/hostname, and counting it made no two nodes alike, so a
// failing gang spent many times the search it needs.
func TestSearchTreatsAlikeNodesAsOne(t *testing.T) {
	spent := func(labelled bool) int {
		// As benchSearchSnapshot, small: four nodes have room for one
		// pod of the gang each (alike), so its five pods never fit.
		snap := &Snapshot{Nodes: nodes("n", 12, 8), Queues: []Queue{queue("a", "", 0, -1, 1)}}
		for i := range snap.Nodes {
			n := &snap.Nodes[i]
			n.CPU = 48000
			if labelled {
				n.Labels = map[string]string{"kubernetes.io/hostname": n.Name, "rack": "r1"}
			}
			cpu := int64(24000)
			if i%3 == 0 {
				cpu = 8000
			}
			snap.Jobs = append(snap.Jobs, Job{Name: fmt.Sprintf("r%02d", i), Queue: "a", CreatedAt: time.Unix(int64(i), 0),
				Pods: []Pod{{Name: fmt.Sprintf("r%02d", i), Request: Request{GPUs: 4, CPU: cpu}, Phase: PodRunning, Placement: Placement{Node: n.Name, GPUs: []int{0, 1, 2, 3}}}}})
		}
		g := Job{Name: "g", Queue: "a", Priority: 50, Preemptible: true, CreatedAt: time.Unix(100, 0)}
		for k := 0; k < 5; k++ {
			g.Pods = append(g.Pods, Pod{Name: fmt.Sprintf("g-%d", k), Request: Request{GPUs: 1, CPU: 30000}})
		}
		snap.Jobs = append(snap.Jobs, g)
		s, err := newSession(snap, Config{})
		if err != nil {
			t.Fatal(err)
		}
		s.computeFairShare()
		s.buildVictimOrder()
		left := s.searchLeft
		s.allocate()
		return left - s.searchLeft
	}
	plain, labelled := spent(false), spent(true)
	t.Logf("spent %d plain, %d labelled", plain, labelled)
	if plain == 0 || labelled != plain {
		t.Fatalf("search spent %d with hostname labels, %d without; want the same (and some)", labelled, plain)
	}
}
