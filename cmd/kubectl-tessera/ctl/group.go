package ctl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// describeGroup writes the gang a pod belongs to, and its state: Kubernetes'
// own PodGroup (spec.schedulingGroup) first, then Tessera's
// (tessera.dev/pod-group, hand-written or made by the pod grouper), as the
// scheduler reads them.
func describeGroup(ctx context.Context, c Clients, pod *v1.Pod, out io.Writer) error {
	if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		return describeUpstreamGroup(ctx, c, pod.Namespace, *sg.PodGroupName, out)
	}
	name := pod.Annotations[kube.AnnotationPodGroup]
	switch {
	case name != "":
		return describeTesseraGroup(ctx, c, pod, name, out)
	case pod.Annotations[kube.AnnotationPodGrouper] == kube.PodGrouperOff:
		fmt.Fprintln(out, "Group: none, scheduled alone (tessera.dev/pod-grouper: off).")
	case kube.AwaitsGrouper(pod):
		fmt.Fprintf(out, "Group: not yet known; the pod grouper is working out the gang of its %s.\n", ownerWords(pod))
	default:
		fmt.Fprintln(out, "Group: none, scheduled alone.")
	}
	return nil
}

func describeTesseraGroup(ctx context.Context, c Clients, pod *v1.Pod, name string, out io.Writer) error {
	u, err := c.Dynamic.Resource(kube.PodGroupGVR).Namespace(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(out, "Group: PodGroup %s/%s does not exist (yet); its pods wait whole until it does.\n", pod.Namespace, name)
		return nil
	} else if err != nil {
		return fmt.Errorf("reading PodGroup %s/%s: %w", pod.Namespace, name, err)
	}
	pg := &schedv1.PodGroup{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pg); err != nil {
		return fmt.Errorf("PodGroup %s/%s: %w", pod.Namespace, name, err)
	}
	made := "written by hand"
	if pg.Labels[kube.LabelGroupedBy] == kube.GroupedByPodGrouper {
		made = "made by the pod grouper"
		if o := metav1.GetControllerOfNoCopy(pg); o != nil {
			made += " for " + o.Kind + " " + o.Name
		} else if len(pg.OwnerReferences) > 0 {
			made += " for " + pg.OwnerReferences[0].Kind + " " + pg.OwnerReferences[0].Name
		}
	}
	fmt.Fprintf(out, "Group: PodGroup %s/%s (%s): %d pods must start together", pg.Namespace, pg.Name, made, max(pg.Spec.MinMember, 1))
	if len(pg.Spec.SubGroups) > 0 {
		var subs []string
		for _, sg := range pg.Spec.SubGroups {
			subs = append(subs, fmt.Sprintf("%s ≥ %d", sg.Name, sg.MinMember))
		}
		fmt.Fprintf(out, "; subgroups %s", strings.Join(subs, ", "))
	}
	if sub := pod.Annotations[kube.AnnotationPodSubGroup]; sub != "" {
		fmt.Fprintf(out, "; this pod is in subgroup %s", sub)
	}
	fmt.Fprintf(out, ".\n  State: phase %s, %d scheduled, %d running.\n", dash(string(pg.Status.Phase)), pg.Status.Scheduled, pg.Status.Running)
	if cond := meta.FindStatusCondition(pg.Status.Conditions, schedv1.PodGroupConditionScheduled); cond != nil {
		fmt.Fprintf(out, "  %s=%s (%s): %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	if pg.Spec.Topology != nil {
		return describeTopology(ctx, c, pg, out)
	}
	return nil
}

// describeTopology writes a gang's topology constraint and the domains
// its bound pods are in, at the constraint's narrowest level ("rack
// b2/r2": the values of that level's label and every broader one).
func describeTopology(ctx context.Context, c Clients, pg *schedv1.PodGroup, out io.Writer) error {
	tc := pg.Spec.Topology
	var want []string
	for _, l := range []struct{ what, key string }{{"required", tc.Required}, {"preferred", tc.Preferred}} {
		if l.key != "" {
			want = append(want, fmt.Sprintf("%s %s (%s)", l.what, shortLevel(l.key), l.key))
		}
	}
	fmt.Fprintf(out, "  Topology %s: %s.\n", tc.Name, strings.Join(want, ", "))
	u, err := c.Dynamic.Resource(kube.TopologyGVR).Get(ctx, tc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(out, "  Topology %s does not exist: the gang waits until it does.\n", tc.Name)
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
	var keys []string
	for _, l := range topo.Spec.Levels {
		keys = append(keys, l.NodeLabel)
		if l.NodeLabel == level {
			break
		}
	}
	pods, err := c.Kube.CoreV1().Pods(pg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	domains := map[string]int{}
	for _, p := range pods.Items {
		if p.Annotations[kube.AnnotationPodGroup] != pg.Name || p.Spec.NodeName == "" {
			continue
		}
		node, err := c.Kube.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", p.Spec.NodeName, err)
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
	var in []string
	for d, n := range domains {
		in = append(in, fmt.Sprintf("%s %s (%d pods)", shortLevel(level), d, n))
	}
	sort.Strings(in)
	fmt.Fprintf(out, "  Placed in %s.\n", strings.Join(in, ", "))
	return nil
}

// shortLevel is a level's name in people's words, as the scheduler's
// reasons say it: the last path segment of its label key.
func shortLevel(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }

func describeUpstreamGroup(ctx context.Context, c Clients, ns, name string, out io.Writer) error {
	pg, err := c.Kube.SchedulingV1beta1().PodGroups(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(out, "Group: PodGroup %s/%s (scheduling.k8s.io) not found: not created yet, or the API is not served here.\n", ns, name)
		return nil
	case err != nil:
		return fmt.Errorf("reading PodGroup %s/%s (scheduling.k8s.io): %w", ns, name, err)
	}
	policy := "basic: each pod on its own"
	if g := pg.Spec.SchedulingPolicy.Gang; g != nil {
		policy = fmt.Sprintf("gang: %d pods must start together", g.MinCount)
	}
	fmt.Fprintf(out, "Group: PodGroup %s/%s (scheduling.k8s.io/v1beta1), %s.\n", ns, name, policy)
	var conds []string
	for _, cond := range pg.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s (%s)", cond.Type, cond.Status, cond.Reason))
	}
	if len(conds) > 0 {
		fmt.Fprintf(out, "  Conditions: %s\n", strings.Join(conds, ", "))
	}
	return nil
}

// ownerWords names a pod's controller: "Job llama".
func ownerWords(pod *v1.Pod) string {
	if o := metav1.GetControllerOfNoCopy(pod); o != nil {
		return o.Kind + " " + o.Name
	}
	return "owner"
}
