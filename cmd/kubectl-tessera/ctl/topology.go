package ctl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// topologyView says, for `why`, where a topology constraint put a gang, a
// subgroup or a single pod: the constraint's levels and the domains its
// bound pods are in at the narrowest of them ("rack b2/r2": the values of
// that level's label and every broader one). It reads each node once.
type topologyView struct {
	ctx   context.Context
	c     Clients
	nodes map[string]*v1.Node
}

func newTopologyView(ctx context.Context, c Clients) *topologyView {
	return &topologyView{ctx: ctx, c: c, nodes: map[string]*v1.Node{}}
}

// describe writes a Topology object's constraint (first line with first
// in front, the rest indented by rest) and where pods are; who waits when
// the Topology is missing ("the gang", "the pod").
func (v *topologyView) describe(out io.Writer, first, rest, who string, tc *schedv1.TopologyConstraint, pods []v1.Pod) error {
	var want []string
	for _, l := range []struct{ what, key string }{{"required", tc.Required}, {"preferred", tc.Preferred}} {
		if l.key != "" {
			want = append(want, fmt.Sprintf("%s %s (%s)", l.what, shortLevel(l.key), l.key))
		}
	}
	fmt.Fprintf(out, "%sTopology %s: %s.\n", first, tc.Name, strings.Join(want, ", "))
	u, err := v.c.Dynamic.Resource(kube.TopologyGVR).Get(v.ctx, tc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(out, "%sTopology %s does not exist: %s waits until it does.\n", rest, tc.Name, who)
		return nil
	} else if err != nil {
		return fmt.Errorf("reading Topology %s: %w", tc.Name, err)
	}
	topo := &schedv1.Topology{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, topo); err != nil {
		return fmt.Errorf("Topology %s: %w", tc.Name, err)
	}
	level := tc.Preferred
	if level == "" {
		level = tc.Required
	}
	var levels []string
	for _, l := range topo.Spec.Levels {
		levels = append(levels, l.NodeLabel)
	}
	return v.placed(out, rest, levelsTo(levels, level), pods)
}

// describeUpstream writes an upstream PodGroup's topology keys
// (spec.schedulingConstraints.topology) as the scheduler reads them
// (kube.UpstreamTopology: the first Topology listing the key, else the key
// alone) and where the group's pods are.
func (v *topologyView) describeUpstream(out io.Writer, keys []string, pods []v1.Pod) error {
	switch {
	case len(keys) == 0:
		return nil
	case len(keys) > 1:
		fmt.Fprintf(out, "  Topology: spec.schedulingConstraints.topology has %d constraints; tessera-scheduler supports one.\n", len(keys))
		return nil
	}
	key := keys[0]
	topos, err := v.topologies()
	if err != nil {
		return err
	}
	t := kube.UpstreamTopology(topos, key)
	if hasTopology(topos, t.Name) {
		fmt.Fprintf(out, "  Topology %s: required %s (%s), from spec.schedulingConstraints.\n", t.Name, shortLevel(key), key)
	} else {
		fmt.Fprintf(out, "  Topology: required %s (%s), from spec.schedulingConstraints; no Topology lists the key, so it is the only level.\n", shortLevel(key), key)
	}
	return v.placed(out, "  ", levelsTo(t.Levels, key), pods)
}

// topologies lists the Topology objects as the scheduler's snapshot holds
// them (one that does not decode has no levels).
func (v *topologyView) topologies() ([]core.Topology, error) {
	list, err := v.c.Dynamic.Resource(kube.TopologyGVR).List(v.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Topologies: %w", err)
	}
	var out []core.Topology
	for _, u := range list.Items {
		ct := core.Topology{Name: u.GetName()}
		topo := &schedv1.Topology{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, topo); err == nil {
			for _, l := range topo.Spec.Levels {
				ct.Levels = append(ct.Levels, l.NodeLabel)
			}
		}
		out = append(out, ct)
	}
	return out, nil
}

func hasTopology(topos []core.Topology, name string) bool {
	for _, t := range topos {
		if t.Name == name {
			return true
		}
	}
	return false
}

// levelsTo is levels down to level (all of them when level is not one).
func levelsTo(levels []string, level string) []string {
	for i, l := range levels {
		if l == level {
			return levels[:i+1]
		}
	}
	return levels
}

// placed writes the domains the bound pods are in at the last of keys,
// named by the values of every key: "Placed in rack b2/r2 (4 pods)."
func (v *topologyView) placed(out io.Writer, indent string, keys []string, pods []v1.Pod) error {
	if len(keys) == 0 {
		return nil
	}
	domains := map[string]int{}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		node, err := v.node(p.Spec.NodeName)
		if err != nil {
			return err
		}
		var vals []string
		for _, k := range keys {
			vals = append(vals, dash(node.Labels[k]))
		}
		domains[strings.Join(vals, "/")]++
	}
	if len(domains) == 0 {
		return nil
	}
	level := shortLevel(keys[len(keys)-1])
	var in []string
	for d, n := range domains {
		in = append(in, fmt.Sprintf("%s %s (%s)", level, d, podCount(n)))
	}
	sort.Strings(in)
	fmt.Fprintf(out, "%sPlaced in %s.\n", indent, strings.Join(in, ", "))
	return nil
}

func (v *topologyView) node(name string) (*v1.Node, error) {
	if n, ok := v.nodes[name]; ok {
		return n, nil
	}
	n, err := v.c.Kube.CoreV1().Nodes().Get(v.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", name, err)
	}
	v.nodes[name] = n
	return n, nil
}

// groupPods lists the pods of namespace ns that in says are the group's.
func (v *topologyView) groupPods(ns string, in func(*v1.Pod) bool) ([]v1.Pod, error) {
	list, err := v.c.Kube.CoreV1().Pods(ns).List(v.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	var out []v1.Pod
	for _, p := range list.Items {
		if in(&p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func podCount(n int) string {
	if n == 1 {
		return "1 pod"
	}
	return fmt.Sprintf("%d pods", n)
}

// shortLevel is a level's name in people's words, as the scheduler's
// reasons say it: the last path segment of its label key.
func shortLevel(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }
