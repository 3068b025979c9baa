package kube

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
)

// podTerms turns the required podAntiAffinity and podAffinity terms of the
// snapshot's pods into the core's named terms (core.Snapshot.PodTerms
// and core.Pod.Matches/Avoids/Needs). A term is named by everything that
// decides which pods it selects and how far apart it keeps them, so alike
// terms of many pods (the replicas of one Deployment) are one term.
type podTerms struct {
	byName map[string]*podTerm
	names  []string // sorted
	// nsLabels returns a namespace's labels (nil when unknown).
	nsLabels func(ns string) map[string]string
}

type podTerm struct {
	name       string
	topology   string
	namespaces []string        // the union with nsSelector; own namespace when both are unset
	nsSelector labels.Selector // nil when unset
	selector   labels.Selector // nil selects nothing
}

func newPodTerms(nsLabels func(string) map[string]string) *podTerms {
	return &podTerms{byName: map[string]*podTerm{}, nsLabels: nsLabels}
}

// ownTerms are the terms a pod carries, or why they could not be read.
type ownTerms struct {
	avoids, needs []string
	spread        []core.SpreadConstraint
	prefers       []core.PreferredTerm
	// attracts: the pod's pull on the pods its terms select (core.Pod.Attracts).
	attracts []core.PreferredTerm
	err      error
}

// scheduleAnywayWeight is what one pod in a domain weighs against a
// ScheduleAnyway spread constraint: a preferred anti-affinity term of the
// least weight Kubernetes allows.
const scheduleAnywayWeight = 1

// hardAffinityWeight is the pull of a placed pod's required affinity term on
// the pods it selects, as kube-scheduler's default hardPodAffinityWeight.
const hardAffinityWeight = 1

// collectTerms registers the terms of the pods the snapshot considers and
// returns, per pod that has any, its own.
func collectTerms(pods []*v1.Pod, nsLabels func(string) map[string]string) (*podTerms, map[types.UID]ownTerms) {
	terms := newPodTerms(nsLabels)
	own := map[types.UID]ownTerms{}
	for _, pod := range pods {
		if !considered(pod) {
			continue
		}
		anti, aff := affinityTerms(pod)
		preferAnti, preferAff := preferredTerms(pod)
		if len(anti)+len(aff)+len(preferAnti)+len(preferAff)+len(pod.Spec.TopologySpreadConstraints) == 0 {
			continue
		}
		var o ownTerms
		if o.avoids, o.err = terms.add(pod, anti); o.err == nil {
			if o.needs, o.err = terms.add(pod, aff); o.err == nil {
				if o.spread, o.prefers, o.err = terms.spread(pod); o.err == nil {
					var soft []core.PreferredTerm
					if soft, o.err = terms.addPreferred(pod, preferAff, preferAnti); o.err == nil {
						o.prefers, o.attracts = merge(o.prefers, soft), merge(nil, soft)
						for _, name := range o.needs {
							o.attracts = addPreference(o.attracts, name, hardAffinityWeight)
						}
						sortTerms(o.attracts)
					}
				}
			}
		}
		own[pod.UID] = o
	}
	return terms, own
}

// affinityTerms returns the pod's required anti-affinity and affinity terms.
func affinityTerms(pod *v1.Pod) (anti, affinity []v1.PodAffinityTerm) {
	a := pod.Spec.Affinity
	if a == nil {
		return nil, nil
	}
	if a.PodAntiAffinity != nil {
		anti = a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	if a.PodAffinity != nil {
		affinity = a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return anti, affinity
}

// preferredTerms returns the pod's preferred anti-affinity and affinity
// terms.
func preferredTerms(pod *v1.Pod) (anti, affinity []v1.WeightedPodAffinityTerm) {
	a := pod.Spec.Affinity
	if a == nil {
		return nil, nil
	}
	if a.PodAntiAffinity != nil {
		anti = a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	if a.PodAffinity != nil {
		affinity = a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	}
	return anti, affinity
}

// addPreferred registers the pod's preferred terms and returns them,
// affinity with its weight and anti-affinity with the weight negated; alike
// terms of one pod add up.
func (t *podTerms) addPreferred(pod *v1.Pod, affinity, anti []v1.WeightedPodAffinityTerm) ([]core.PreferredTerm, error) {
	var prefers []core.PreferredTerm
	for _, kind := range []struct {
		what  string
		sign  int64
		terms []v1.WeightedPodAffinityTerm
	}{{"preferred pod affinity", 1, affinity}, {"preferred pod anti-affinity", -1, anti}} {
		for i := range kind.terms {
			names, err := t.add(pod, []v1.PodAffinityTerm{kind.terms[i].PodAffinityTerm})
			if err != nil {
				return nil, fmt.Errorf("%s term %d: %w", kind.what, i, err)
			}
			prefers = addPreference(prefers, names[0], kind.sign*int64(kind.terms[i].Weight))
		}
	}
	sortTerms(prefers)
	return prefers, nil
}

// merge adds the weights of more to into (alike terms add up), sorted.
func merge(into, more []core.PreferredTerm) []core.PreferredTerm {
	for _, p := range more {
		into = addPreference(into, p.Term, p.Weight)
	}
	sortTerms(into)
	return into
}

func sortTerms(ts []core.PreferredTerm) {
	slices.SortFunc(ts, func(a, b core.PreferredTerm) int { return strings.Compare(a.Term, b.Term) })
}

func addPreference(prefers []core.PreferredTerm, term string, weight int64) []core.PreferredTerm {
	if i := slices.IndexFunc(prefers, func(p core.PreferredTerm) bool { return p.Term == term }); i >= 0 {
		prefers[i].Weight += weight
		return prefers
	}
	return append(prefers, core.PreferredTerm{Term: term, Weight: weight})
}

// add registers the pod's terms and returns their names.
func (t *podTerms) add(pod *v1.Pod, terms []v1.PodAffinityTerm) ([]string, error) {
	var names []string
	for i := range terms {
		term := &terms[i]
		pt := &podTerm{topology: term.TopologyKey, namespaces: slices.Clone(term.Namespaces)}
		if term.NamespaceSelector == nil && len(pt.namespaces) == 0 {
			pt.namespaces = []string{pod.Namespace}
		}
		slices.Sort(pt.namespaces)
		var err error
		if term.NamespaceSelector != nil {
			if pt.nsSelector, err = metav1.LabelSelectorAsSelector(term.NamespaceSelector); err != nil {
				return nil, fmt.Errorf("pod affinity term %d: namespaceSelector: %w", i, err)
			}
		}
		if term.LabelSelector != nil {
			if pt.selector, err = metav1.LabelSelectorAsSelector(term.LabelSelector); err != nil {
				return nil, fmt.Errorf("pod affinity term %d: labelSelector: %w", i, err)
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s|%s|", pt.topology, strings.Join(pt.namespaces, ","))
		if pt.nsSelector != nil {
			b.WriteString("ns:" + pt.nsSelector.String())
		}
		b.WriteString("|")
		if pt.selector != nil {
			b.WriteString("sel:" + pt.selector.String())
		}
		pt.name = b.String()
		if _, ok := t.byName[pt.name]; !ok {
			t.byName[pt.name] = pt
			t.names = append(t.names, pt.name)
		}
		if !slices.Contains(names, pt.name) {
			names = append(names, pt.name)
		}
	}
	return names, nil
}

// matches returns the names of the terms that select the pod.
func (t *podTerms) matches(pod *v1.Pod) []string {
	var out []string
	podLabels := labels.Set(pod.Labels)
	for _, name := range t.names {
		pt := t.byName[name]
		if pt.selector == nil || !pt.selector.Matches(podLabels) {
			continue
		}
		if !slices.Contains(pt.namespaces, pod.Namespace) &&
			(pt.nsSelector == nil || !pt.nsSelector.Matches(labels.Set(t.nsLabels(pod.Namespace)))) {
			continue
		}
		out = append(out, name)
	}
	return out
}

// spread registers the pod's topology spread constraints as terms (the
// pod's namespace; matchLabelKeys folded into the selector with the pod's
// values) and returns them for the core: DoNotSchedule ones as
// constraints, ScheduleAnyway ones as preferences for the domains with the
// fewest selected pods.
func (t *podTerms) spread(pod *v1.Pod) ([]core.SpreadConstraint, []core.PreferredTerm, error) {
	var out []core.SpreadConstraint
	var prefers []core.PreferredTerm
	for i := range pod.Spec.TopologySpreadConstraints {
		c := &pod.Spec.TopologySpreadConstraints[i]
		sel := c.LabelSelector.DeepCopy()
		if sel != nil && len(c.MatchLabelKeys) > 0 {
			for _, key := range c.MatchLabelKeys {
				if v, ok := pod.Labels[key]; ok {
					sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: key, Operator: metav1.LabelSelectorOpIn, Values: []string{v}})
				}
			}
		}
		names, err := t.add(pod, []v1.PodAffinityTerm{{TopologyKey: c.TopologyKey, LabelSelector: sel, Namespaces: []string{pod.Namespace}}})
		if err != nil {
			return nil, nil, fmt.Errorf("topology spread constraint %d: %w", i, err)
		}
		if c.WhenUnsatisfiable != v1.DoNotSchedule {
			prefers = addPreference(prefers, names[0], -scheduleAnywayWeight)
			continue
		}
		minDomains := 1
		if c.MinDomains != nil {
			minDomains = int(*c.MinDomains)
		}
		out = append(out, core.SpreadConstraint{Term: names[0], MaxSkew: int(c.MaxSkew), MinDomains: minDomains})
	}
	return out, prefers, nil
}

// topologies maps every term to its topology label, for core.Snapshot.
func (t *podTerms) topologies() map[string]string {
	if len(t.names) == 0 {
		return nil
	}
	out := make(map[string]string, len(t.names))
	for name, pt := range t.byName {
		out[name] = pt.topology
	}
	return out
}

// preferNoScheduleWeight is what each PreferNoSchedule taint that a pod
// does not tolerate costs a node: as much as the heaviest preferred node
// affinity term gains, so the two weigh alike.
const preferNoScheduleWeight = 100

// nodePreference builds a pod's core.Pod.NodeScore: the weights of its
// preferred node affinity terms that a node matches, less
// preferNoScheduleWeight per PreferNoSchedule taint of the node it does
// not tolerate. nil when neither applies (the core's fast path).
func nodePreference(pod *v1.Pod, idx *cycleIndex) func(node string) int64 {
	var preferred *nodeaffinity.PreferredSchedulingTerms
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
		// Only invalid terms fail, and the API server refuses those.
		p, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		if err == nil {
			preferred = p
		}
	}
	if preferred == nil && !idx.preferNoSchedule {
		return nil
	}
	tolerations := pod.Spec.Tolerations
	return func(name string) int64 {
		n := idx.nodes[name]
		if n == nil {
			return 0
		}
		var score int64
		if preferred != nil {
			score = preferred.Score(n)
		}
		for i := range n.Spec.Taints {
			t := &n.Spec.Taints[i]
			if t.Effect == v1.TaintEffectPreferNoSchedule && !slices.ContainsFunc(tolerations, func(tol v1.Toleration) bool {
				return tol.ToleratesTaint(klog.Background(), t, true)
			}) {
				score -= preferNoScheduleWeight
			}
		}
		return score
	}
}
