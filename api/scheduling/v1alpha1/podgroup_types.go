package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodGroupPhase summarizes where a gang stands.
// +kubebuilder:validation:Enum=Pending;Scheduled;Running;Failed
type PodGroupPhase string

const (
	// PodGroupPending: fewer than minMember pods are placed, or fewer than
	// some subgroup's minMember.
	PodGroupPending PodGroupPhase = "Pending"
	// PodGroupScheduled: at least minMember pods are bound, and each
	// subgroup's minMember.
	PodGroupScheduled PodGroupPhase = "Scheduled"
	// PodGroupRunning: at least minMember pods are running, and each
	// subgroup's minMember.
	PodGroupRunning PodGroupPhase = "Running"
	// PodGroupFailed: the gang was evicted (for example, stale below minMember).
	PodGroupFailed PodGroupPhase = "Failed"
)

// Condition types of a PodGroup.
const (
	// PodGroupConditionScheduled is True once minMember pods are placed; its
	// reason and message say why not otherwise.
	PodGroupConditionScheduled = "Scheduled"
)

// PodGroupSpec describes a gang: pods annotated tessera.dev/pod-group: NAME.
// +kubebuilder:validation:XValidation:rule="!has(self.topology) || !has(self.subGroups) || self.subGroups.all(g, !has(g.topology) || g.topology.name == self.topology.name)",message="a subgroup's topology must name the group's topology"
type PodGroupSpec struct {
	// MinMember is how many pods must be placed together, all or none.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=1
	MinMember int32 `json:"minMember,omitempty"`
	// SubGroups are parts of the gang with minimums of their own (a JobSet's
	// replicated jobs, a LeaderWorkerSet's leader and workers, prefill and
	// decode): the gang holds only when each has at least its minMember
	// placed, and the group minMember in total. A pod names its subgroup
	// with the annotation tessera.dev/pod-subgroup; pods that name none
	// count for the total only.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	SubGroups []PodSubGroup `json:"subGroups,omitempty"`
	// Queue is the leaf queue the gang runs in; empty means the pods' label
	// tessera.dev/queue, or "default".
	// +optional
	Queue string `json:"queue,omitempty"`
	// PriorityClassName gives the gang's priority; empty means the pods' own.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// Topology keeps the gang inside one domain of a level of a Topology
	// (required) or as close as it fits (preferred).
	// +optional
	Topology *TopologyConstraint `json:"topology,omitempty"`
}

// PodSubGroup is one part of a gang: see PodGroupSpec.SubGroups.
type PodSubGroup struct {
	// Name is what pods give in their tessera.dev/pod-subgroup annotation:
	// a DNS label, unique in the group.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// MinMember is how many of the pods naming this subgroup must be placed
	// together, with the rest of the gang.
	// +kubebuilder:validation:Minimum=1
	MinMember int32 `json:"minMember"`
	// Topology keeps this subgroup's pods in one domain (inside the
	// group's, when the group has one); it names the group's Topology.
	// +optional
	Topology *TopologyConstraint `json:"topology,omitempty"`
}

// PodGroupStatus is what the scheduler observed about a gang.
type PodGroupStatus struct {
	// +optional
	Phase PodGroupPhase `json:"phase,omitempty"`
	// Scheduled counts the group's pods that are bound to a node.
	// +optional
	Scheduled int32 `json:"scheduled,omitempty"`
	// Running counts the group's pods that are running.
	// +optional
	Running int32 `json:"running,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodGroup is a gang of pods placed all-or-nothing.
//
// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=tpg
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="MinMember",type=integer,JSONPath=`.spec.minMember`
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.spec.queue`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Scheduled",type=integer,JSONPath=`.status.scheduled`
type PodGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PodGroupSpec `json:"spec,omitempty"`
	// +optional
	Status PodGroupStatus `json:"status,omitempty"`
}

// PodGroupList lists pod groups.
//
// +kubebuilder:object:root=true
type PodGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodGroup `json:"items"`
}
