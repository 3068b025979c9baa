package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestPodTerms(t *testing.T) {
	nsLabels := map[string]map[string]string{"team-a": {"team": "a"}, "team-b": {"team": "b"}}
	terms := newPodTerms(func(ns string) map[string]string { return nsLabels[ns] })
	sel := func(kv ...string) *metav1.LabelSelector {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return &metav1.LabelSelector{MatchLabels: m}
	}
	owner := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "team-a"}}
	own, err := terms.add(owner, []v1.PodAffinityTerm{
		{TopologyKey: "kubernetes.io/hostname", LabelSelector: sel("app", "web")},                                              // own namespace
		{TopologyKey: "kubernetes.io/hostname", LabelSelector: sel("app", "web")},                                              // the same term again
		{TopologyKey: "zone", LabelSelector: sel("app", "db"), NamespaceSelector: &metav1.LabelSelector{}},                     // every namespace
		{TopologyKey: "zone", LabelSelector: sel("app", "db"), NamespaceSelector: sel("team", "b"), Namespaces: []string{"x"}}, // team b, and x
		{TopologyKey: "zone"}, // no selector: selects nothing
	})
	require.NoError(t, err)
	require.Len(t, own, 4, "alike terms are one")
	pod := func(ns string, labels map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: labels}}
	}
	assert.Equal(t, []string{own[0]}, terms.matches(pod("team-a", map[string]string{"app": "web"})))
	assert.Empty(t, terms.matches(pod("team-b", map[string]string{"app": "web"})), "another namespace")
	assert.ElementsMatch(t, []string{own[1], own[2]}, terms.matches(pod("team-b", map[string]string{"app": "db"})))
	assert.Equal(t, []string{own[1]}, terms.matches(pod("team-a", map[string]string{"app": "db"})))
	assert.ElementsMatch(t, []string{own[1], own[2]}, terms.matches(pod("x", map[string]string{"app": "db"})))
	topo := terms.topologies()
	assert.Equal(t, "kubernetes.io/hostname", topo[own[0]])
	assert.Equal(t, "zone", topo[own[3]])

	_, err = terms.add(owner, []v1.PodAffinityTerm{{TopologyKey: "zone", LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sometimes"}}}}})
	assert.ErrorContains(t, err, "pod affinity term 0: labelSelector")
}

func TestSpreadTerms(t *testing.T) {
	terms := newPodTerms(func(string) map[string]string { return nil })
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Labels: map[string]string{"app": "web", "rev": "7"}}}
	pod.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{
		{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, MatchLabelKeys: []string{"rev"}, MinDomains: ptr.To(int32(3))},
		{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: v1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{}},
	}
	got, prefers, err := terms.spread(pod)
	require.NoError(t, err)
	require.Len(t, got, 1, "ScheduleAnyway is a preference, not a constraint")
	assert.Equal(t, 1, got[0].MaxSkew)
	assert.Equal(t, 3, got[0].MinDomains)
	assert.Equal(t, "zone", terms.topologies()[got[0].Term])
	require.Len(t, prefers, 1)
	assert.Equal(t, int64(-scheduleAnywayWeight), prefers[0].Weight, "ScheduleAnyway: fewer selected pods is better")
	assert.Equal(t, "kubernetes.io/hostname", terms.topologies()[prefers[0].Term])
	older := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Labels: map[string]string{"app": "web", "rev": "6"}}}
	assert.Equal(t, []string{prefers[0].Term}, terms.matches(older), "matchLabelKeys: another revision is not counted by the zone constraint")
	assert.ElementsMatch(t, []string{got[0].Term, prefers[0].Term}, terms.matches(pod))
	other := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Labels: pod.Labels}}
	assert.Empty(t, terms.matches(other), "spread counts the pod's namespace only")
}

func TestPreferredTerms(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", UID: "u1", Labels: map[string]string{"app": "web"}}, Spec: v1.PodSpec{SchedulerName: SchedulerName}}
	web := v1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}
	cache := v1.PodAffinityTerm{TopologyKey: "zone", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cache"}}}
	pod.Spec.Affinity = &v1.Affinity{
		PodAntiAffinity: &v1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: web}}},
		PodAffinity:     &v1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{{Weight: 30, PodAffinityTerm: cache}, {Weight: 20, PodAffinityTerm: web}}},
	}
	terms, own := collectTerms([]*v1.Pod{pod}, func(string) map[string]string { return nil })
	o := own[pod.UID]
	require.NoError(t, o.err)
	assert.Empty(t, o.avoids)
	assert.Empty(t, o.needs)
	byTopology := map[string]int64{}
	for _, p := range o.prefers {
		byTopology[terms.topologies()[p.Term]] = p.Weight
	}
	// The same term as anti-affinity (−100) and affinity (+20) adds up.
	assert.Equal(t, map[string]int64{"kubernetes.io/hostname": -80, "zone": 30}, byTopology)
	// Placed, the pod pulls the pods its terms select by the same weights
	// (Kubernetes' symmetry), and by 1 for a required affinity term; a
	// ScheduleAnyway spread constraint is the pod's own and pulls nobody.
	pod.Spec.Affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = []v1.PodAffinityTerm{
		{TopologyKey: "rack", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
	pod.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "region", WhenUnsatisfiable: v1.ScheduleAnyway,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	terms, own = collectTerms([]*v1.Pod{pod}, func(string) map[string]string { return nil })
	o = own[pod.UID]
	require.NoError(t, o.err)
	attracts, prefers := map[string]int64{}, map[string]int64{}
	for _, p := range o.attracts {
		attracts[terms.topologies()[p.Term]] = p.Weight
	}
	for _, p := range o.prefers {
		prefers[terms.topologies()[p.Term]] = p.Weight
	}
	assert.Equal(t, map[string]int64{"kubernetes.io/hostname": -80, "zone": 30, "rack": 1}, attracts)
	assert.Equal(t, map[string]int64{"kubernetes.io/hostname": -80, "zone": 30, "region": -scheduleAnywayWeight}, prefers)
	pod.Spec.Affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, pod.Spec.TopologySpreadConstraints = nil, nil

	pod.Spec.Affinity.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector = &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sometimes"}}}
	_, own = collectTerms([]*v1.Pod{pod}, func(string) map[string]string { return nil })
	assert.ErrorContains(t, own[pod.UID].err, "preferred pod affinity term 0: pod affinity term 0: labelSelector")
}

func TestNodePreference(t *testing.T) {
	zoneA := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"zone": "a"}}}
	busy := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "busy", Labels: map[string]string{"zone": "b"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "busy", Effect: v1.TaintEffectPreferNoSchedule}, {Key: "hard", Effect: v1.TaintEffectNoSchedule}}}}
	idx := &cycleIndex{nodes: map[string]*v1.Node{"a": zoneA, "busy": busy}}
	preferA := &v1.Affinity{NodeAffinity: &v1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{
		{Weight: 30, Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "zone", Operator: v1.NodeSelectorOpIn, Values: []string{"a"}}}}},
		{Weight: 5, Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "zone", Operator: v1.NodeSelectorOpExists}}}},
	}}}
	tolerateBusy := []v1.Toleration{{Key: "busy", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectPreferNoSchedule}}
	tests := []struct {
		name             string
		affinity         *v1.Affinity
		tolerations      []v1.Toleration
		preferNoSchedule bool
		want             map[string]int64 // nil: no NodeScore at all
	}{
		{"nothing to prefer (no node has a PreferNoSchedule taint)", nil, nil, false, nil},
		{"preferred node affinity adds the weights of the terms a node matches", preferA, nil, true, map[string]int64{"a": 35, "busy": 5 - preferNoScheduleWeight, "gone": 0}},
		{"an untolerated PreferNoSchedule taint costs its weight", nil, nil, true, map[string]int64{"a": 0, "busy": -preferNoScheduleWeight}},
		{"a tolerated one costs nothing; NoSchedule is Feasible's business", preferA, tolerateBusy, true, map[string]int64{"a": 35, "busy": 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx.preferNoSchedule = tt.preferNoSchedule
			pod := &v1.Pod{Spec: v1.PodSpec{Affinity: tt.affinity, Tolerations: tt.tolerations}}
			score := nodePreference(pod, idx)
			if tt.want == nil {
				assert.Nil(t, score)
				return
			}
			require.NotNil(t, score)
			for node, want := range tt.want {
				assert.Equal(t, want, score(node), node)
			}
		})
	}
}
