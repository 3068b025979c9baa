package grouper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
)

// plan is what the grouper does with one pod.
type plan struct {
	// alone: the pod is marked tessera.dev/pod-grouper: off.
	alone bool
	// group: the PodGroup it joins, owned by owner.
	group     string
	owner     link
	min       int32
	subGroups []SubGroup
	subGroup  string
	queue     string
	// topology is the group's spec.topology, from the topology
	// annotations (topologyOf); nil for none.
	topology *schedv1.TopologyConstraint
}

// plan works out a pod's group from its owners (chain, controller first).
// The highest owner carrying tessera.dev/pod-grouper: off or
// tessera.dev/min-member decides; the group comes from the highest owner
// whose kind has a derivation (a TrainJob's from its JobSet).
func (g *Grouper) plan(pod *v1.Pod, chain []link) (plan, error) {
	top := chain[len(chain)-1]
	var override int64
	for i := len(chain) - 1; i >= 0; i-- {
		ann := chain[i].obj.GetAnnotations()
		if ann[kube.AnnotationPodGrouper] == kube.PodGrouperOff {
			return plan{alone: true}, nil
		}
		if v, ok := ann[kube.AnnotationMinMember]; ok && override == 0 {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil || n < 1 || n > maxMembers {
				return plan{}, fmt.Errorf("%s %s/%s: annotation %s: %q is not a whole number of pods between 1 and %d",
					chain[i].gk.Kind, chain[i].obj.GetNamespace(), chain[i].obj.GetName(), kube.AnnotationMinMember, v, maxMembers)
			}
			override = n
		}
	}
	gi := -1
	for i := len(chain) - 1; i >= 0 && gi < 0; i-- {
		if chain[i].info.derive != nil {
			gi = i
		}
	}
	if gi < 0 {
		return plan{alone: true}, nil
	}
	o := chain[gi]
	d, err := o.info.derive(o.obj.Object, pod.Labels)
	if err != nil {
		return plan{}, fmt.Errorf("%s %s/%s: %w", o.gk.Kind, o.obj.GetNamespace(), o.obj.GetName(), err)
	}
	if override > 0 {
		// The user's number: one gang of that many, no parts.
		d = decision{suffix: d.suffix, min: override}
	}
	d.subGroups, d.subGroup = validSubGroups(d.subGroups, d.subGroup)
	p := plan{group: groupName(o.info.prefix, o.obj.GetName(), d.suffix), owner: o,
		min: int32(max(d.min, 1)), subGroups: d.subGroups, subGroup: d.subGroup}
	if d.alone {
		if _, err := g.groups.ByNamespace(pod.Namespace).Get(p.group); err != nil {
			return plan{alone: true}, nil
		}
		// Its owner had a gang before (a Job scaled from one): its pods
		// stay in that group, which now needs one.
		p.min, p.subGroups, p.subGroup = 1, nil, ""
	}
	p.queue = g.queueOf(pod, top)
	if p.topology, err = topologyOf(pod, chain); err != nil {
		return plan{}, err
	}
	return p, nil
}

// topologyOf is the gang's topology constraint: the highest owner's
// topology annotations, else the pod's own (its template's); an owner
// naming no tessera.dev/topology* annotation is skipped. A malformed one
// is the pod's reason to wait, naming the object.
func topologyOf(pod *v1.Pod, chain []link) (*schedv1.TopologyConstraint, error) {
	for i := len(chain) - 1; i >= 0; i-- {
		c, err := kube.TopologyFromAnnotations(chain[i].obj.GetAnnotations())
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", chain[i].gk.Kind, chain[i].obj.GetNamespace(), chain[i].obj.GetName(), err)
		}
		if c != nil {
			return c, nil
		}
	}
	c, err := kube.TopologyFromAnnotations(pod.Annotations)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return c, nil
}

// validSubGroups keeps subgroups the PodGroup CRD accepts (at most
// maxSubGroups, each name a DNS label): otherwise the gang has none, and
// the pod no subgroup — all or nothing, so no subgroup a pod names is
// missing from its group.
func validSubGroups(subs []SubGroup, sub string) ([]SubGroup, string) {
	if len(subs) > maxSubGroups {
		return nil, ""
	}
	known := false
	for _, g := range subs {
		if len(validation.IsDNS1123Label(g.Name)) > 0 {
			return nil, ""
		}
		known = known || g.Name == sub
	}
	if !known {
		sub = ""
	}
	return subs, sub
}

// queueOf is a pod's queue: its label, else its top owner's, else its
// namespace's tessera.dev/queue label; "" leaves it to the scheduler.
func (g *Grouper) queueOf(pod *v1.Pod, top link) string {
	if q := pod.Labels[kube.LabelQueue]; q != "" {
		return q
	}
	if q := top.obj.GetLabels()[kube.LabelQueue]; q != "" {
		return q
	}
	if ns, err := g.nsLister.Get(pod.Namespace); err == nil {
		return ns.Labels[kube.LabelQueue]
	}
	return ""
}

// groupName is "<prefix>-<owner>[-<suffix>]", cut to a valid name with a
// hash of the whole when too long.
func groupName(prefix, owner, suffix string) string {
	n := prefix + "-" + owner
	if suffix != "" {
		n += "-" + suffix
	}
	const maxLen = 253
	if len(n) <= maxLen {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	h := hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(n[:maxLen-11], "-.") + "-" + h
}

// apply makes the PodGroup (or brings its minimum up to date) and then
// annotates the pod: in this order, so the scheduler never sees a pod
// naming a group it cannot find for long.
func (g *Grouper) apply(ctx context.Context, pod *v1.Pod, p plan) error {
	if p.alone {
		return g.annotate(ctx, pod, map[string]any{kube.AnnotationPodGrouper: kube.PodGrouperOff})
	}
	if err := g.ensureGroup(ctx, pod, p); err != nil {
		return err
	}
	if pod.Annotations[kube.AnnotationPodGroup] == p.group {
		return nil
	}
	ann := map[string]any{kube.AnnotationPodGroup: p.group}
	if p.subGroup != "" {
		ann[kube.AnnotationPodSubGroup] = p.subGroup
	}
	return g.annotate(ctx, pod, ann)
}

// annotate merges annotations into the pod, with its UID as precondition
// (one API write per pod).
func (g *Grouper) annotate(ctx context.Context, pod *v1.Pod, ann map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": ann}})
	if err != nil {
		return err
	}
	_, err = g.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("annotating the pod: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Grouped pod", "pod", klog.KObj(pod), "annotations", ann)
	return nil
}

// ensureGroup creates the PodGroup, or updates its minimum and subgroups
// when the owner changed (scaled). A PodGroup of that name that the
// grouper did not make is left alone, and the pod waits saying so.
func (g *Grouper) ensureGroup(ctx context.Context, pod *v1.Pod, p plan) error {
	client := g.opts.Dynamic.Resource(kube.PodGroupGVR).Namespace(pod.Namespace)
	spec := map[string]any{"minMember": int64(p.min)}
	if len(p.subGroups) > 0 {
		var sgs []any
		for _, s := range p.subGroups {
			sgs = append(sgs, map[string]any{"name": s.Name, "minMember": int64(s.MinMember)})
		}
		spec["subGroups"] = sgs
	}
	if t := p.topology; t != nil {
		spec["topology"] = topologySpec(t)
	}
	if obj, err := g.groups.ByNamespace(pod.Namespace).Get(p.group); err == nil {
		cur, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("PodGroup %s/%s: unexpected %T in the cache", pod.Namespace, p.group, obj)
		}
		return g.updateGroup(ctx, cur, spec)
	}
	spec["queue"] = p.queue
	if pod.Spec.PriorityClassName != "" {
		spec["priorityClassName"] = pod.Spec.PriorityClassName
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": schedv1.SchemeGroupVersion.String(), "kind": "PodGroup",
		"metadata": map[string]any{"name": p.group, "namespace": pod.Namespace},
		"spec":     spec,
	}}
	u.SetLabels(map[string]string{kube.LabelGroupedBy: kube.GroupedByPodGrouper})
	// Owned by the workload: garbage-collected with it. Not a controller
	// reference and no blockOwnerDeletion (that needs update on the
	// owner's finalizers, which the grouper is not granted).
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: p.owner.obj.GetAPIVersion(), Kind: p.owner.gk.Kind, Name: p.owner.obj.GetName(), UID: p.owner.obj.GetUID(),
	}})
	_, err := client.Create(ctx, u, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Made a moment ago (not in our cache yet), or someone else's.
		got, gerr := client.Get(ctx, p.group, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("reading PodGroup %s/%s: %w", pod.Namespace, p.group, gerr)
		}
		if got.GetLabels()[kube.LabelGroupedBy] != kube.GroupedByPodGrouper {
			return fmt.Errorf("PodGroup %s/%s exists and was not made by the pod grouper; rename it, or name it in the pods' %s annotation",
				pod.Namespace, p.group, kube.AnnotationPodGroup)
		}
		return g.updateGroup(ctx, got, spec)
	case err != nil:
		return fmt.Errorf("creating PodGroup %s/%s: %w", pod.Namespace, p.group, err)
	}
	klog.FromContext(ctx).Info("Created PodGroup", "podGroup", klog.KRef(pod.Namespace, p.group), "owner", p.owner.gk.Kind+"/"+p.owner.obj.GetName(), "minMember", p.min)
	return nil
}

// topologySpec is spec.topology as the dynamic client writes it.
func topologySpec(t *schedv1.TopologyConstraint) map[string]any {
	m := map[string]any{"name": t.Name}
	if t.Required != "" {
		m["required"] = t.Required
	}
	if t.Preferred != "" {
		m["preferred"] = t.Preferred
	}
	return m
}

// updateGroup writes spec (minMember, subGroups, topology) when it differs.
func (g *Grouper) updateGroup(ctx context.Context, cur *unstructured.Unstructured, spec map[string]any) error {
	same := true
	for k, v := range spec {
		old, _, _ := unstructured.NestedFieldNoCopy(cur.Object, "spec", k)
		a, _ := json.Marshal(old)
		b, _ := json.Marshal(v)
		same = same && string(a) == string(b)
	}
	// A field the owner no longer asks for is removed (null in the patch).
	for _, k := range []string{"subGroups", "topology"} {
		if _, had, _ := unstructured.NestedFieldNoCopy(cur.Object, "spec", k); had && spec[k] == nil {
			same = false
			spec[k] = nil
		}
	}
	if same {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return err
	}
	_, err = g.opts.Dynamic.Resource(kube.PodGroupGVR).Namespace(cur.GetNamespace()).Patch(ctx, cur.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("updating PodGroup %s/%s: %w", cur.GetNamespace(), cur.GetName(), err)
	}
	klog.FromContext(ctx).Info("Updated PodGroup", "podGroup", klog.KObj(cur), "spec", spec)
	return nil
}
