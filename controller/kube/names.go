// Package kube is the Kubernetes adapter of the scheduling core: it keeps an
// up-to-date picture of the cluster from informers, turns it into the core's
// Snapshot each cycle, and commits the core's decisions (ResourceClaim
// allocations, bindings, evictions, status) back to the API server.
package kube

import "github.com/tessera-gpu/tessera/internal/assignment"

const (
	// SchedulerName is the schedulerName of the pods Tessera schedules.
	SchedulerName = "tessera-scheduler"
	// DriverName is Tessera's DRA driver.
	DriverName = "gpu.tessera.dev"

	// LabelQueue names a pod's leaf queue; no label means DefaultQueue.
	LabelQueue = "tessera.dev/queue"
	// AnnotationPodGroup names the PodGroup (in the pod's namespace) a pod belongs to.
	AnnotationPodGroup = "tessera.dev/pod-group"
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

	// Device attributes and capacity published by tessera-node.
	attrIndex        = DriverName + "/index"
	attrProductName  = DriverName + "/productName"
	attrNVLinkDomain = DriverName + "/nvlinkDomain"
	attrUUID         = DriverName + "/uuid"
	capacityMemory   = "memory"

	// taintDevicePlugin is the device taint tessera-node puts on a GPU its
	// device plugin holds, value taintWhole or taintShared. It keeps kube-scheduler's claims off the GPU; the
	// controller knows these pods by their assignment, so the key does not
	// make a GPU unusable here (see gpusFromSlices, addDevicePluginHeld).
	taintDevicePlugin = assignment.TaintDevicePlugin
	taintWhole        = assignment.TaintWhole
	taintShared       = assignment.TaintShared
	// attrDevicePluginPod is, on a GPU held whole by a device-plugin pod,
	// that pod's UID: the node's record of what the kubelet gave it.
	attrDevicePluginPod = assignment.AttrDevicePluginPod

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
	"gpu.tessera.dev":           "Exclusive",
	"mps.gpu.tessera.dev":       "MPS",
	"timeslice.gpu.tessera.dev": "TimeSlicing",
}
