package kube

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Names of the pod grouper (controller/grouper), agreed with the scheduler
// and the webhook: one definition for both sides.
const (
	// AnnotationMinMember on a workload's top owner overrides the minimum
	// the pod grouper derives from its spec (a whole number, at least 1).
	AnnotationMinMember = "tessera.dev/min-member"
	// AnnotationPodGrouper: "off" on a top owner opts its pods out of the
	// pod grouper (each pod is a gang of one). On a pod, "off" says the pod
	// is not to be grouped: the grouper writes it on the pods it leaves
	// alone (a Deployment's, a non-indexed Job's), and a user may write it
	// in a pod template.
	AnnotationPodGrouper = "tessera.dev/pod-grouper"
	PodGrouperOff        = "off"
	// LabelGroupedBy marks the PodGroups the pod grouper made (value
	// GroupedByPodGrouper); it manages only those.
	LabelGroupedBy      = "tessera.dev/grouped-by"
	GroupedByPodGrouper = "pod-grouper"
	// LabelNamespaceScheduler: "enabled" on a namespace makes the admission
	// webhook set schedulerName tessera-scheduler on the pods created there.
	LabelNamespaceScheduler   = "tessera.dev/scheduler"
	NamespaceSchedulerEnabled = "enabled"
)

// GroupedKinds are the direct controllers whose pods may belong to a gang
// the pod grouper derives (a Job of an Indexed gang or of a JobSet, a
// LeaderWorkerSet's StatefulSets, the training operators' and KubeRay's
// own pods). A pod of ours controlled by one of them and in no group yet
// waits for the grouper (AwaitsGrouper): bound before its gang's minimum is
// known, it would be placed alone — the partial gang that deadlocks. Pods
// of other controllers (ReplicaSets, DaemonSets, unknown kinds) and bare
// pods are scheduled alone at once, with no write.
var GroupedKinds = map[schema.GroupKind]bool{
	{Group: "batch", Kind: "Job"}:               true,
	{Group: "apps", Kind: "StatefulSet"}:        true,
	{Group: "kubeflow.org", Kind: "PyTorchJob"}: true,
	{Group: "kubeflow.org", Kind: "TFJob"}:      true,
	{Group: "kubeflow.org", Kind: "XGBoostJob"}: true,
	{Group: "kubeflow.org", Kind: "MPIJob"}:     true,
	{Group: "kubeflow.org", Kind: "PaddleJob"}:  true,
	{Group: "kubeflow.org", Kind: "JAXJob"}:     true,
	{Group: "ray.io", Kind: "RayCluster"}:       true,
}

// AwaitsGrouper reports whether a pending pod of ours must wait for the pod
// grouper before it may be scheduled: it names no group (no
// spec.schedulingGroup, no tessera.dev/pod-group), is not opted out
// (tessera.dev/pod-grouper: off), and its controller is one of
// GroupedKinds.
func AwaitsGrouper(pod *v1.Pod) bool {
	if pod.Spec.SchedulerName != SchedulerName || pod.Spec.SchedulingGroup != nil ||
		pod.Annotations[AnnotationPodGroup] != "" || pod.Annotations[AnnotationPodGrouper] == PodGrouperOff {
		return false
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return false
	}
	return GroupedKinds[schema.GroupKind{Group: gv.Group, Kind: ref.Kind}]
}

// awaitingGrouper is why a pending pod of ours is kept out of the core
// until the pod grouper has given it its group (Options.AwaitGrouper), ""
// when it is not. Bound pods are never held: they hold capacity.
func (s *Scheduler) awaitingGrouper(pod *v1.Pod, ours, bound bool) string {
	if !ours || bound || s.opts.AwaitGrouper == nil {
		return ""
	}
	return s.opts.AwaitGrouper(pod)
}
