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
