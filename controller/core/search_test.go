package core

import "testing"

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
