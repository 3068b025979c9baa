package ctl

import (
	"context"
	"fmt"
	"io"
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
		return nil // its topology annotations go to the PodGroup the grouper makes
	default:
		fmt.Fprintln(out, "Group: none, scheduled alone.")
	}
	return describePodTopology(ctx, c, pod, out)
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
	return describeGroupTopology(ctx, c, pg, out)
}

// describeGroupTopology writes the topology constraints of a Tessera
// PodGroup and of its subgroups, and the domains their bound pods are in.
func describeGroupTopology(ctx context.Context, c Clients, pg *schedv1.PodGroup, out io.Writer) error {
	constrained := pg.Spec.Topology != nil
	for _, sg := range pg.Spec.SubGroups {
		constrained = constrained || sg.Topology != nil
	}
	if !constrained {
		return nil
	}
	v := newTopologyView(ctx, c)
	pods, err := v.groupPods(pg.Namespace, func(p *v1.Pod) bool { return p.Annotations[kube.AnnotationPodGroup] == pg.Name })
	if err != nil {
		return err
	}
	if pg.Spec.Topology != nil {
		if err := v.describe(out, "  ", "  ", "the gang", pg.Spec.Topology, pods); err != nil {
			return err
		}
	}
	for _, sg := range pg.Spec.SubGroups {
		if sg.Topology == nil {
			continue
		}
		var in []v1.Pod
		for _, p := range pods {
			if p.Annotations[kube.AnnotationPodSubGroup] == sg.Name {
				in = append(in, p)
			}
		}
		if err := v.describe(out, "  Subgroup "+sg.Name+": ", "    ", "the gang", sg.Topology, in); err != nil {
			return err
		}
	}
	return nil
}

// describePodTopology writes the topology annotations of a pod scheduled
// alone, as the scheduler reads them, and its domain.
func describePodTopology(ctx context.Context, c Clients, pod *v1.Pod, out io.Writer) error {
	tc, err := kube.TopologyFromAnnotations(pod.Annotations)
	if err != nil {
		fmt.Fprintf(out, "  Topology: %v; the pod waits until that is fixed.\n", err)
		return nil
	}
	if tc == nil {
		return nil
	}
	return newTopologyView(ctx, c).describe(out, "  ", "  ", "the pod", tc, []v1.Pod{*pod})
}

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
	sc := pg.Spec.SchedulingConstraints
	if sc == nil || len(sc.Topology) == 0 {
		return nil
	}
	var keys []string
	for _, t := range sc.Topology {
		keys = append(keys, t.Key)
	}
	v := newTopologyView(ctx, c)
	pods, err := v.groupPods(ns, func(p *v1.Pod) bool {
		g := p.Spec.SchedulingGroup
		return g != nil && g.PodGroupName != nil && *g.PodGroupName == name
	})
	if err != nil {
		return err
	}
	return v.describeUpstream(out, keys, pods)
}

// ownerWords names a pod's controller: "Job llama".
func ownerWords(pod *v1.Pod) string {
	if o := metav1.GetControllerOfNoCopy(pod); o != nil {
		return o.Kind + " " + o.Name
	}
	return "owner"
}
