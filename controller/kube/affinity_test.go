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
	got, err := terms.spread(pod)
	require.NoError(t, err)
	require.Len(t, got, 1, "ScheduleAnyway is a preference, not used")
	assert.Equal(t, 1, got[0].MaxSkew)
	assert.Equal(t, 3, got[0].MinDomains)
	assert.Equal(t, "zone", terms.topologies()[got[0].Term])
	older := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Labels: map[string]string{"app": "web", "rev": "6"}}}
	assert.Empty(t, terms.matches(older), "matchLabelKeys: another revision is not counted")
	assert.Equal(t, []string{got[0].Term}, terms.matches(pod))
	other := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Labels: pod.Labels}}
	assert.Empty(t, terms.matches(other), "spread counts the pod's namespace only")
}
