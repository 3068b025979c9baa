package kube

// Topology-aware gangs: Topology objects (scheduling.tessera.dev), the
// topology of a PodGroup, of its subgroups and of a single pod's
// annotations, and the one key of an upstream PodGroup's
// schedulingConstraints.topology, all become the core's Topology and
// TopologyConstraint. The core checks the constraints against the
// topologies and says why a job waits (unknown topology or level, a
// preferred level broader than the required one).

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// TopologyGVR serves the Topology objects (cluster-scoped).
var TopologyGVR = schema.GroupVersionResource{Group: schedv1.GroupName, Version: "v1alpha1", Resource: "topologies"}

// upstreamTopologyPrefix names the one-level topology made for an upstream
// PodGroup's key that no Topology lists; a Topology object's name (a DNS
// subdomain) cannot contain the colon, so the two never clash.
const upstreamTopologyPrefix = "scheduling.k8s.io:"

// TopologyFromAnnotations reads a topology constraint from annotations
// (AnnotationTopology and its levels): nil when none of them is set. The
// error names the annotation and what is wrong; whether the Topology and
// its levels exist is the core's check, each cycle.
func TopologyFromAnnotations(ann map[string]string) (*schedv1.TopologyConstraint, error) {
	name, hasName := ann[AnnotationTopology]
	req, hasReq := ann[AnnotationTopologyRequired]
	pref, hasPref := ann[AnnotationTopologyPreferred]
	if !hasName && !hasReq && !hasPref {
		return nil, nil
	}
	name, req, pref = strings.TrimSpace(name), strings.TrimSpace(req), strings.TrimSpace(pref)
	switch {
	case name == "":
		return nil, fmt.Errorf("annotation %s must name a Topology when %s or %s is set", AnnotationTopology, AnnotationTopologyRequired, AnnotationTopologyPreferred)
	case req == "" && pref == "":
		return nil, fmt.Errorf("annotation %s: %q needs a level in %s or %s", AnnotationTopology, name, AnnotationTopologyRequired, AnnotationTopologyPreferred)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("annotation %s: %q is not a Topology name: %s", AnnotationTopology, name, strings.Join(errs, "; "))
	}
	for _, l := range []struct{ ann, key string }{{AnnotationTopologyRequired, req}, {AnnotationTopologyPreferred, pref}} {
		if l.key == "" {
			continue
		}
		if errs := validation.IsQualifiedName(l.key); len(errs) > 0 {
			return nil, fmt.Errorf("annotation %s: %q is not a node label key: %s", l.ann, l.key, strings.Join(errs, "; "))
		}
	}
	return &schedv1.TopologyConstraint{Name: name, Required: req, Preferred: pref}, nil
}

// constraintOf is the core's form of an API constraint (nil for nil).
func constraintOf(c *schedv1.TopologyConstraint) *core.TopologyConstraint {
	if c == nil {
		return nil
	}
	return &core.TopologyConstraint{Topology: c.Name, Required: c.Required, Preferred: c.Preferred}
}

// readTopologies adds the Topology objects to the snapshot, sorted by
// name. One that cannot be decoded is added without levels under its
// name, so the jobs naming it wait saying it is invalid rather than
// missing.
func (b *snapshotBuild) readTopologies() {
	for _, obj := range b.s.topologyInformer.GetStore().List() {
		t, err := fromUnstructured[schedv1.Topology](obj)
		if err != nil {
			if m, ok := obj.(metav1.Object); ok {
				b.snap.Topologies = append(b.snap.Topologies, core.Topology{Name: m.GetName()})
			}
			continue
		}
		ct := core.Topology{Name: t.Name}
		for _, l := range t.Spec.Levels {
			ct.Levels = append(ct.Levels, l.NodeLabel)
		}
		b.snap.Topologies = append(b.snap.Topologies, ct)
	}
	slices.SortFunc(b.snap.Topologies, func(a, c core.Topology) int { return strings.Compare(a.Name, c.Name) })
}

// UpstreamTopology is the topology an upstream PodGroup's topology key is
// read against: the first Topology by name that lists the key as a level,
// else a one-level topology of the key alone, named
// "scheduling.k8s.io:<key>". The scheduler and `kubectl tessera why` both
// resolve the key through it.
func UpstreamTopology(topologies []core.Topology, key string) core.Topology {
	var found *core.Topology
	for i, t := range topologies {
		if !strings.HasPrefix(t.Name, upstreamTopologyPrefix) && slices.Contains(t.Levels, key) && (found == nil || t.Name < found.Name) {
			found = &topologies[i]
		}
	}
	if found != nil {
		return *found
	}
	return core.Topology{Name: upstreamTopologyPrefix + key, Levels: []string{key}}
}

// upstreamTopology turns an upstream PodGroup's topology key into a
// required constraint on UpstreamTopology, adding the one-level topology
// of the key to the snapshot once when no Topology lists it.
func (b *snapshotBuild) upstreamTopology(key string) *core.TopologyConstraint {
	t := UpstreamTopology(b.snap.Topologies, key)
	if !slices.ContainsFunc(b.snap.Topologies, func(c core.Topology) bool { return c.Name == t.Name }) {
		b.snap.Topologies = append(b.snap.Topologies, t)
	}
	return &core.TopologyConstraint{Topology: t.Name, Required: key}
}
