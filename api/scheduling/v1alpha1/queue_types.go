package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Unlimited is the quota or limit value that means "no bound".
const Unlimited = "-1"

// ResourceQuota bounds one resource of a queue. Quantities are in the
// resource's own units: GPUs (fractions allowed, e.g. "0.5"), CPU cores, bytes.
//
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || string(self.quota) == '-1' || !quantity(string(self.quota)).isLessThan(quantity('0'))",message="quota must be >= 0, or -1 for unlimited"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || string(self.limit) == '-1' || !quantity(string(self.limit)).isLessThan(quantity('0'))",message="limit must be >= 0, or -1 for none"
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !has(self.limit) || string(self.limit) == '-1' || (string(self.quota) != '-1' && quantity(string(self.limit)).compareTo(quantity(string(self.quota))) >= 0)",message="limit must be >= quota when both are set"
type ResourceQuota struct {
	// Quota is the guaranteed amount; 0 means none and -1 unlimited.
	// Defaults: 0 for gpu, -1 for cpu and memory.
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
	// Limit is a hard cap; -1 (the default) means none.
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// OverQuotaWeight is this queue's share, among siblings of equal priority,
	// of what is left once every quota is served. 0 takes nothing over quota.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	// +optional
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueResources holds the per-resource bounds of a queue.
type QueueResources struct {
	// +optional
	GPU *ResourceQuota `json:"gpu,omitempty"`
	// +optional
	CPU *ResourceQuota `json:"cpu,omitempty"`
	// +optional
	Memory *ResourceQuota `json:"memory,omitempty"`
}

// QueueSpec is what an administrator sets on a queue.
type QueueSpec struct {
	// Parent is the name of the parent queue; empty for a top-level queue.
	// Only leaf queues (queues no other queue names as parent) hold workloads.
	// +optional
	Parent string `json:"parent,omitempty"`
	// Priority orders sibling queues when over-quota resources are handed out
	// and when jobs are ordered. Higher first.
	// +kubebuilder:default=100
	// +optional
	Priority *int32 `json:"priority,omitempty"`
	// Resources bounds gpu, cpu and memory.
	// +optional
	Resources QueueResources `json:"resources,omitempty"`
	// Schedule lists time windows that override resources while they
	// hold: the first window that holds wins, and what it leaves out is
	// the queue's own (DESIGN.md, "Quota schedules").
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Schedule []QueueWindow `json:"schedule,omitempty"`
	// PreemptMinRuntime: a pod of this queue is not preempted before it
	// has run this long. Unset: the parent queue's (none at the top).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +optional
	PreemptMinRuntime *metav1.Duration `json:"preemptMinRuntime,omitempty"`
	// ReclaimMinRuntime: a pod of this queue is not reclaimed by another
	// queue before it has run this long. Unset: the parent queue's.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +optional
	ReclaimMinRuntime *metav1.Duration `json:"reclaimMinRuntime,omitempty"`
	// PreemptionDelay: a job of this queue may not evict anyone before it
	// is this old (from its creation). Unset: the parent queue's.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +optional
	PreemptionDelay *metav1.Duration `json:"preemptionDelay,omitempty"`
}

// QueueWindow is one window of a queue's schedule: read on the wall clock
// of its time zone, from start to end on each of its days (an end at or
// before the start crosses midnight).
//
// +kubebuilder:validation:XValidation:rule="self.start != self.end",message="end must differ from start (00:00 to 24:00 is a whole day)"
type QueueWindow struct {
	// Days of the week: Mon, Tue, … (three letters at least of the English
	// name, any case) or ranges like Mon-Fri; none means every day.
	// +kubebuilder:validation:MaxItems=7
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z]{3,9}(-[A-Za-z]{3,9})?$`
	// +listType=atomic
	// +optional
	Days []string `json:"days,omitempty"`
	// Start is a wall-clock time HH:MM.
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	// +kubebuilder:validation:MaxLength=5
	Start string `json:"start"`
	// End is a wall-clock time HH:MM, or 24:00.
	// +kubebuilder:validation:Pattern=`^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$`
	// +kubebuilder:validation:MaxLength=5
	End string `json:"end"`
	// TimeZone is an IANA zone name (Europe/Berlin); default UTC.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	TimeZone string `json:"timeZone,omitempty"`
	// Resources override the queue's while the window holds. The same
	// fields as spec.resources; checked by the controller, not by CEL
	// rules (a list of windows each with their quantity rules is past the
	// API server's CEL cost budget): a window that breaks them makes the
	// queue unusable, with the reason, as any unreadable Queue.
	// +optional
	Resources WindowResources `json:"resources,omitempty"`
}

// WindowResources are a window's overrides: QueueResources without their
// CEL rules.
type WindowResources struct {
	// +optional
	GPU *WindowQuota `json:"gpu,omitempty"`
	// +optional
	CPU *WindowQuota `json:"cpu,omitempty"`
	// +optional
	Memory *WindowQuota `json:"memory,omitempty"`
}

// WindowQuota is ResourceQuota's fields for a window; what it leaves out is
// the queue's own.
type WindowQuota struct {
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueResourceStatus is one resource's figures for a queue.
type QueueResourceStatus struct {
	// FairShare is what the queue is entitled to this cycle.
	FairShare resource.Quantity `json:"fairShare"`
	// Allocated is what the queue's pods hold now.
	Allocated resource.Quantity `json:"allocated"`
	// Pending is what the queue's waiting pods ask for.
	Pending resource.Quantity `json:"pending"`
	// Usage is the queue's recent usage: what its pods held over the
	// controller's usage window, in resource-seconds (GPU-seconds,
	// CPU-seconds, byte-seconds of memory) decayed by the usage half-life
	// (a parent's is its subtree's); absent without a usage history.
	// +optional
	Usage *resource.Quantity `json:"usage,omitempty"`
}

// QueueStatus is what the scheduler observed about a queue.
type QueueStatus struct {
	// Resources maps gpu, cpu and memory to their figures.
	// +optional
	Resources map[string]QueueResourceStatus `json:"resources,omitempty"`
	// RunningPods and PendingPods count pods of the queue (leaf queues, or
	// summed over the subtree for a parent).
	// +optional
	RunningPods int32 `json:"runningPods,omitempty"`
	// +optional
	PendingPods int32 `json:"pendingPods,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Queue is a node in the tree of queues that share the cluster's GPUs.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=tq
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Parent",type=string,JSONPath=`.spec.parent`
// +kubebuilder:printcolumn:name="GPU quota",type=string,JSONPath=`.spec.resources.gpu.quota`
// +kubebuilder:printcolumn:name="GPU fair share",type=string,JSONPath=`.status.resources.gpu.fairShare`
// +kubebuilder:printcolumn:name="GPU allocated",type=string,JSONPath=`.status.resources.gpu.allocated`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.parent) || self.spec.parent != self.metadata.name",message="a queue cannot be its own parent"
type Queue struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec QueueSpec `json:"spec,omitempty"`
	// +optional
	Status QueueStatus `json:"status,omitempty"`
}

// QueueList lists queues.
//
// +kubebuilder:object:root=true
type QueueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Queue `json:"items"`
}
