package kube

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tessera-gpu/tessera/controller/core"
)

func upstreamPG(spec schedulingv1beta1.PodGroupSpec) *schedulingv1beta1.PodGroup {
	return &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: spec}
}

func gangPolicy(n int32) schedulingv1beta1.PodGroupSchedulingPolicy {
	return schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: n}}
}

func TestReadUpstreamGroup(t *testing.T) {
	never, lower, odd := schedulingv1beta1.PreemptNever, schedulingv1beta1.PreemptLowerPriority, schedulingv1beta1.PreemptionPolicy("Sometimes")
	all := &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}
	single := &schedulingv1beta1.DisruptionMode{Single: &schedulingv1beta1.SingleDisruptionMode{}}
	for _, c := range []struct {
		name string
		spec schedulingv1beta1.PodGroupSpec
		want upstreamGroup
		err  string
	}{
		{name: "gang, default disruption single", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(4)},
			want: upstreamGroup{minMember: 4, disruption: core.DisruptionSingle}},
		{name: "basic is one by one", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}, DisruptionMode: single},
			want: upstreamGroup{minMember: 1, disruption: core.DisruptionSingle}},
		{name: "all, priority, never", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), DisruptionMode: all, Priority: new(int32(500)), PriorityClassName: "high", PreemptionPolicy: &never},
			want: upstreamGroup{minMember: 2, disruption: core.DisruptionAll, priority: new(int32(500)), priorityClass: "high", neverEvicts: new(true)}},
		{name: "preempt lower priority", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(1), PreemptionPolicy: &lower},
			want: upstreamGroup{minMember: 1, disruption: core.DisruptionSingle, neverEvicts: new(false)}},
		{name: "minCount 0", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(0)},
			err: "PodGroup ns/g (scheduling.k8s.io): spec.schedulingPolicy.gang.minCount 0 must be at least 1"},
		{name: "no policy", spec: schedulingv1beta1.PodGroupSpec{}, err: "spec.schedulingPolicy sets neither basic nor gang"},
		{name: "both policies", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}, Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 1}}},
			err: "spec.schedulingPolicy sets both basic and gang"},
		{name: "shared claims refused", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), ResourceClaims: []schedulingv1beta1.PodGroupResourceClaim{{Name: "shared", ResourceClaimName: new("c")}}},
			err: `spec.resourceClaims (claims shared by the group's pods, "shared" first) are not supported by tessera-scheduler`},
		{name: "composite refused", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), ParentCompositePodGroupName: new("top")},
			err: `spec.parentCompositePodGroupName "top": CompositePodGroups are not supported`},
		{name: "topology key read", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "example.com/rack"}}}},
			want: upstreamGroup{minMember: 2, disruption: core.DisruptionSingle, topologyKey: "example.com/rack"}},
		{name: "two topology keys", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "rack"}, {Key: "zone"}}}},
			err: `spec.schedulingConstraints.topology has 2 constraints; one is supported`},
		{name: "bad topology key", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "not a key"}}}},
			err: `spec.schedulingConstraints.topology key "not a key" is not a node label key`},
		{name: "empty disruption", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), DisruptionMode: &schedulingv1beta1.DisruptionMode{}},
			err: "spec.disruptionMode sets neither single nor all"},
		{name: "both disruptions", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), DisruptionMode: &schedulingv1beta1.DisruptionMode{Single: single.Single, All: all.All}},
			err: "spec.disruptionMode sets both single and all"},
		{name: "unknown preemption policy", spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: gangPolicy(2), PreemptionPolicy: &odd},
			err: `spec.preemptionPolicy "Sometimes" is not PreemptLowerPriority or Never`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := readUpstreamGroup(upstreamPG(c.spec))
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				require.True(t, strings.HasPrefix(err.Error(), "PodGroup ns/g (scheduling.k8s.io): spec."), err.Error())
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// FuzzReadUpstreamGroup feeds PodGroups decoded from fuzzed JSON (as the
// informer decodes what the API server sends): what is accepted is a valid
// gang for the core, an error names the group and a spec field.
func FuzzReadUpstreamGroup(f *testing.F) {
	for _, s := range []string{
		// As the Job controller (WorkloadWithJob) creates it.
		`{"apiVersion":"scheduling.k8s.io/v1beta1","kind":"PodGroup","metadata":{"name":"train-pg","namespace":"team-a"},"spec":{"workloadRef":{"workloadName":"train","templateName":"job"},"schedulingPolicy":{"gang":{"minCount":4}},"disruptionMode":{"all":{}},"priority":0}}`,
		`{"metadata":{"name":"g","namespace":"ns"},"spec":{"schedulingPolicy":{"basic":{}}}}`,
		`{"metadata":{"name":"g","namespace":"ns"},"spec":{"schedulingPolicy":{"gang":{"minCount":8}},"schedulingConstraints":{"topology":[{"key":"example.com/rack"}]}}}`,
		`{"metadata":{"name":"g","namespace":"ns"},"spec":{"schedulingPolicy":{"gang":{"minCount":-2147483648}},"preemptionPolicy":"Never","priorityClassName":"x"}}`,
		`{"metadata":{"name":"g","namespace":"ns"},"spec":{"schedulingPolicy":{"gang":{"minCount":2}},"resourceClaims":[{"name":"c","resourceClaimTemplateName":"t"}]}}`,
		`{"metadata":{"name":"g","namespace":"ns"},"spec":{"schedulingPolicy":{"gang":{"minCount":2},"basic":{}},"disruptionMode":{"single":{},"all":{}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var pg schedulingv1beta1.PodGroup
		if json.Unmarshal(raw, &pg) != nil {
			return // the client refuses it before the informer has it
		}
		got, err := readUpstreamGroup(&pg)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "PodGroup "+pg.Namespace+"/"+pg.Name+" (scheduling.k8s.io): spec.") {
				t.Fatalf("error %q does not name the group and a field", err)
			}
			return
		}
		pol := pg.Spec.SchedulingPolicy
		switch {
		case got.minMember < 1:
			t.Fatalf("minMember %d from %+v", got.minMember, pg.Spec)
		case pol.Gang != nil && got.minMember != int(pol.Gang.MinCount):
			t.Fatalf("minMember %d, minCount %d", got.minMember, pol.Gang.MinCount)
		case pol.Basic != nil && got.minMember != 1:
			t.Fatalf("basic read as minMember %d", got.minMember)
		case got.disruption != core.DisruptionSingle && got.disruption != core.DisruptionAll:
			t.Fatalf("disruption %q", got.disruption)
		case len(pg.Spec.ResourceClaims) > 0:
			t.Fatalf("shared claims accepted: %+v", pg.Spec.ResourceClaims)
		case got.topologyKey != "" && len(validation.IsQualifiedName(got.topologyKey)) > 0:
			t.Fatalf("topology key %q accepted", got.topologyKey)
		}
	})
}

func TestUpstreamConditions(t *testing.T) {
	cond := func(typ string, st metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason}
	}
	const initially, disrupted = schedulingv1beta1.PodGroupInitiallyScheduled, schedulingv1beta1.DisruptionTarget
	for _, c := range []struct {
		name                string
		have                []metav1.Condition
		min, bound, evicted int
		pending             string
		want                []metav1.Condition // type, status, reason
		changed             bool
	}{
		{name: "pending", min: 4, pending: "gang needs 4 pods; only 2 fit",
			want: []metav1.Condition{cond(initially, metav1.ConditionFalse, "Unschedulable")}, changed: true},
		{name: "pending, unchanged", have: []metav1.Condition{{Type: initially, Status: metav1.ConditionFalse, Reason: "Unschedulable", Message: "x"}}, min: 4, pending: "x",
			want: []metav1.Condition{cond(initially, metav1.ConditionFalse, "Unschedulable")}},
		{name: "scheduled", have: []metav1.Condition{cond(initially, metav1.ConditionFalse, "Unschedulable")}, min: 4, bound: 4,
			want: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}, changed: true},
		{name: "scheduled is terminal", have: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}, min: 4, bound: 1, pending: "again",
			want: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}},
		{name: "whole group evicted", have: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}, min: 2, bound: 3, evicted: 3,
			want: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled"), cond(disrupted, metav1.ConditionTrue, "PreemptionByScheduler")}, changed: true},
		{name: "one member of a single group evicted", have: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}, min: 2, bound: 3, evicted: 1,
			want: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled")}},
		{name: "runs again", have: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled"), cond(disrupted, metav1.ConditionTrue, "PreemptionByScheduler")}, min: 2, bound: 2,
			want: []metav1.Condition{cond(initially, metav1.ConditionTrue, "Scheduled"), cond(disrupted, metav1.ConditionFalse, "Rescheduled")}, changed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pg := upstreamPG(schedulingv1beta1.PodGroupSpec{})
			pg.Status.Conditions = c.have
			got, changed := upstreamConditions(pg, c.min, c.bound, c.evicted, "reclaimed", c.pending)
			require.Equal(t, c.changed, changed)
			require.Len(t, got, len(c.want))
			for i, w := range c.want {
				require.Equal(t, [3]string{w.Type, string(w.Status), w.Reason}, [3]string{got[i].Type, string(got[i].Status), got[i].Reason})
			}
		})
	}
}
