// Package kube is the Kubernetes adapter of the scheduling core: it keeps an
// up-to-date picture of the cluster from informers, turns it into the core's
// Snapshot each cycle, and commits the core's decisions (ResourceClaim
// allocations, bindings, evictions, status) back to the API server.
package kube

import (
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

const (
	// SchedulerName is the schedulerName of the pods Tessera schedules.
	SchedulerName = "tessera-scheduler"
	// DriverName is Tessera's DRA driver (internal/draname; kept exported
	// for the tests and tools that name it through this package).
	DriverName = draname.Driver

	// LabelQueue names a pod's leaf queue; no label means DefaultQueue.
	LabelQueue = "tessera.dev/queue"
	// AnnotationPodGroup names the PodGroup (in the pod's namespace) a pod belongs to.
	AnnotationPodGroup = "tessera.dev/pod-group"
	// AnnotationPodSubGroup names the pod's subgroup: one of its
	// PodGroup's spec.subGroups.
	AnnotationPodSubGroup = "tessera.dev/pod-subgroup"
	// AnnotationTopology, AnnotationTopologyRequired and
	// AnnotationTopologyPreferred set a topology constraint (a Topology's
	// name, its required and preferred levels by node label key) on a
	// single pod, or, on a workload's top owner or its pods, on the
	// PodGroup the pod grouper makes: what spec.topology says on a
	// PodGroup (TopologyFromAnnotations).
	AnnotationTopology          = "tessera.dev/topology"
	AnnotationTopologyRequired  = "tessera.dev/topology-required"
	AnnotationTopologyPreferred = "tessera.dev/topology-preferred"
	// AnnotationPreemptible overrides whether a pod's job is preemptible
	// ("true"/"false"); by default jobs below priority 100 are.
	AnnotationPreemptible = "tessera.dev/preemptible"
	// AnnotationGPUFraction, AnnotationGPUMemory and AnnotationGPUSharing
	// are DESIGN.md's annotations for a GPU share without a ResourceClaim
	// (the device-plugin path; fraction.go). AnnotationAssignment is where
	// the commit records, before binding, what such a pod was given. One
	// definition, in internal/assignment, shared with tessera-node.
	AnnotationGPUFraction = assignment.AnnotationGPUFraction
	AnnotationGPUMemory   = assignment.AnnotationGPUMemory
	AnnotationGPUSharing  = assignment.AnnotationGPUSharing
	AnnotationAssignment  = assignment.Annotation
	// ResourceShare is the extended resource of fraction slots (one per
	// annotated pod; the webhook adds it).
	ResourceShare = assignment.ResourceShare
	// DefaultQueue holds pods without a queue label. It exists implicitly
	// (no quota, no limit) when no Queue object of that name does.
	DefaultQueue = "default"

	// The device attributes, capacity and taints tessera-node publishes are
	// internal/draname's; gpusFromSlices and addDevicePluginHeld read them.

	// finalizerDeleteProtection keeps an allocated claim from being deleted
	// while a pod may still use it (kube-scheduler uses the same one).
	finalizerDeleteProtection = "resource.kubernetes.io/delete-protection"

	// externalQueue accounts for GPU capacity held by pods that Tessera does
	// not schedule (kube-scheduler's DRA pods, for example). Its name cannot
	// clash with a Queue object's.
	externalQueue = "<external>"
)

// Sharing modes of the DeviceClasses that ship with Tessera; other classes
// selecting gpu.tessera.dev devices get their mode from their opaque config.
var classSharing = map[string]string{
	draname.ClassExclusive:   "Exclusive",
	draname.ClassMPS:         "MPS",
	draname.ClassTimeSlicing: "TimeSlicing",
}
