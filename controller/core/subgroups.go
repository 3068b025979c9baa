package core

import (
	"fmt"
	"strings"
)

// Subgroups (Job.SubGroups): parts of a gang with minimums of their own.
// The gang holds when the job has minMember pods placed and each subgroup
// its own minimum; every rule that reads "short of minMember" reads this.
// Jobs without subgroups take the paths they took before (no allocation).

// subState is one subgroup of a job, live.
type subState struct {
	name string
	idx  int
	// min is the declared minimum: never clamped to the pods naming it.
	min    int
	placed int
	// topo is SubGroup.Topology resolved; nil for none.
	topo *topoReq
}

// subGroupsProblem says why a job's subgroups cannot be taken as given
// ("" when they can): each needs a name, unique in the job, and a minimum
// of at least 1.
func subGroupsProblem(j *Job) string {
	seen := make(map[string]bool, len(j.SubGroups))
	for i, g := range j.SubGroups {
		switch {
		case g.Name == "":
			return fmt.Sprintf("job %s: subgroup %d has an empty name", j.Name, i)
		case seen[g.Name]:
			return fmt.Sprintf("job %s: subgroup %s is listed twice", j.Name, g.Name)
		case g.MinMember < 1:
			return fmt.Sprintf("job %s: subgroup %s: minMember %d must be at least 1", j.Name, g.Name, g.MinMember)
		}
		seen[g.Name] = true
	}
	return ""
}

// newSubs builds a job's subgroup states (nil without subgroups).
func (s *session) newSubs(j *Job) []*subState {
	if len(j.SubGroups) == 0 {
		return nil
	}
	out := make([]*subState, len(j.SubGroups))
	for i, g := range j.SubGroups {
		out[i] = &subState{name: g.Name, idx: i, min: g.MinMember, topo: s.resolveTopo(g.Topology)}
	}
	return out
}

// subOf finds the subgroup a pod names. A pending pod that names one its
// job does not have is invalid; a placed one counts for the job only (its
// group may have been edited under it), so it is not frozen for it.
func subOf(j *jobState, p *Pod) (*subState, error) {
	if p.SubGroup == "" {
		return nil, nil
	}
	for _, g := range j.subs {
		if g.name == p.SubGroup {
			return g, nil
		}
	}
	if !isPending(p) {
		return nil, nil
	}
	if len(j.subs) == 0 {
		return nil, fmt.Errorf("names subgroup %q, but gang %s has no subgroups", p.SubGroup, j.name)
	}
	return nil, fmt.Errorf("names subgroup %q, which gang %s does not have (its subgroups: %s)", p.SubGroup, j.name, subNames(j.subs))
}

func subNames(subs []*subState) string {
	names := make([]string, len(subs))
	for i, g := range subs {
		names[i] = g.name
	}
	return strings.Join(names, ", ")
}

// subDeficit is how many pods the job's subgroups lack in all.
func (j *jobState) subDeficit() int {
	d := 0
	for _, g := range j.subs {
		d += max(0, g.min-g.placed)
	}
	return d
}

// short says whether the job is short of its gang: fewer than minMember
// placed, or a subgroup below its minimum (allocate places it all or
// nothing, and job order puts it first).
func (j *jobState) short() bool { return j.placed < j.minMember || j.subDeficit() > 0 }

// belowMin says whether a job with placed pods is below its gang for the
// stale-gang rule (its declared minMember, gangMin) or in a subgroup.
func (j *jobState) belowMin() bool {
	return j.placed > 0 && (j.placed < j.gangMin() || j.subDeficit() > 0)
}

// holdsWithout says whether the job's gang still holds once v is evicted:
// minMember placed, and every subgroup at its minimum. When it does not,
// the evicting actions take the whole gang.
func (j *jobState) holdsWithout(v *podState) bool {
	if j.placed-1 < j.minMember {
		return false
	}
	for _, g := range j.subs {
		left := g.placed
		if v.sub == g {
			left--
		}
		if left < g.min {
			return false
		}
	}
	return true
}

// pickSet takes n pods of c, in c's order: first the pods each subgroup
// lacks, then the rest in order. nil when c cannot give every subgroup what
// it lacks, or has fewer than n pods.
func pickSet(j *jobState, c []*podState, n int) []*podState {
	if len(c) < n {
		return nil
	}
	if j.subDeficit() == 0 {
		return c[:n]
	}
	need := make([]int, len(j.subs))
	for i, g := range j.subs {
		need[i] = max(0, g.min-g.placed)
	}
	taken := make([]bool, len(c))
	count := 0
	for i, p := range c {
		if p.sub != nil && need[p.sub.idx] > 0 {
			need[p.sub.idx]--
			taken[i] = true
			count++
		}
	}
	for _, k := range need {
		if k > 0 || count > n {
			return nil
		}
	}
	for i := range c {
		if count == n {
			break
		}
		if !taken[i] {
			taken[i] = true
			count++
		}
	}
	out := make([]*podState, 0, n)
	for i, p := range c {
		if taken[i] {
			out = append(out, p)
		}
	}
	return out
}

// lacking filters c to the pods of subgroups still short of their minimum,
// or returns c when none is.
func lacking(j *jobState, c []*podState) []*podState {
	if j.subDeficit() == 0 {
		return c
	}
	var out []*podState
	for _, p := range c {
		if p.sub != nil && p.sub.placed < p.sub.min {
			out = append(out, p)
		}
	}
	return out
}

// subReach says why j, with pending pods c, cannot give some subgroup its
// minimum ("" when it can): the pods that name it are too few.
func subReach(j *jobState, c []*podState) string {
	for _, g := range j.subs {
		have := g.placed
		for _, p := range c {
			if p.sub == g {
				have++
			}
		}
		if have >= g.min {
			continue
		}
		if have == 0 {
			return fmt.Sprintf("gang %s: subgroup %s needs %s; no pod names it (annotation tessera.dev/pod-subgroup)", j.name, g.name, plural(g.min, "pod"))
		}
		return fmt.Sprintf("gang %s: subgroup %s needs %s; only %d exist", j.name, g.name, plural(g.min, "pod"), have)
	}
	return ""
}

// gangWants says what the gang needs, for reasons: "4 pods", or with
// subgroups "4 pods (subgroups leader 1, workers 3)": the more of its
// minMember and its subgroups' minimums together.
func (j *jobState) gangWants() string {
	if len(j.subs) == 0 {
		return plural(j.minMember, "pod")
	}
	parts := make([]string, len(j.subs))
	sum := 0
	for i, g := range j.subs {
		parts[i] = fmt.Sprintf("%s %d", g.name, g.min)
		sum += g.min
	}
	return fmt.Sprintf("%s (subgroups %s)", plural(max(j.minMember, sum), "pod"), strings.Join(parts, ", "))
}

// podLabel names a pod in a reason, with its subgroup when it has one.
func podLabel(p *podState) string {
	if p.sub != nil {
		return fmt.Sprintf("pod %s (subgroup %s)", p.name, p.sub.name)
	}
	return "pod " + p.name
}

// subsBelow names the subgroups below their minimum, for the stale-gang
// reason: "subgroup workers: 1 of its minMember 2 placed".
func (j *jobState) subsBelow() string {
	var parts []string
	for _, g := range j.subs {
		if g.placed < g.min {
			parts = append(parts, fmt.Sprintf("subgroup %s: %d of its minMember %d placed", g.name, g.placed, g.min))
		}
	}
	return strings.Join(parts, "; ")
}

// subSearch prepares the gang search for subgroups: what each subgroup
// lacks (need, by index; lack in all) and, per position i of pods, how
// many pods after it name its subgroup with another key (the ones still
// there when pods[i] and those like it are left out). nil without
// subgroups.
func subSearch(j *jobState, pods []*podState, key func(*podState) string) (need []int, lack int, spare []int) {
	if j.subs == nil {
		return nil, 0, nil
	}
	need = make([]int, len(j.subs))
	for i, g := range j.subs {
		need[i] = max(0, g.min-g.placed)
		lack += need[i]
	}
	spare = make([]int, len(pods))
	for i, p := range pods {
		if p.sub == nil {
			continue
		}
		k := key(p)
		for _, q := range pods[i+1:] {
			if q.sub == p.sub && key(q) != k {
				spare[i]++
			}
		}
	}
	return need, lack, spare
}
