package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TopologySpec is one layout of the cluster's network.
type TopologySpec struct {
	// Levels are node label keys, broadest first and the narrowest (often
	// kubernetes.io/hostname) last, e.g. topology.kubernetes.io/zone, a
	// block label, a rack label. A domain of a level is the set of nodes
	// that agree on that label and every broader one; a node without one
	// of them is in no domain of that level.
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(l, self.exists_one(m, m.nodeLabel == l.nodeLabel))",message="each nodeLabel may be listed once"
	Levels []TopologyLevel `json:"levels"`
}

// TopologyLevel is one level of a Topology.
type TopologyLevel struct {
	// NodeLabel is the node label key whose values name this level's
	// domains (a Kubernetes qualified name).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	NodeLabel string `json:"nodeLabel"`
}

// Topology is an ordered list of node label keys that PodGroups name to be
// placed close on the network (PodGroupSpec.Topology).
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ttopo
// +kubebuilder:printcolumn:name="Levels",type=string,JSONPath=`.spec.levels[*].nodeLabel`
type Topology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TopologySpec `json:"spec"`
}

// TopologyList lists topologies.
//
// +kubebuilder:object:root=true
type TopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Topology `json:"items"`
}

// TopologyConstraint keeps a gang's (or a subgroup's) pods close: in one
// domain of the required level or not at all, and in one domain of the
// preferred level when one fits, else in as few as the scheduler finds.
// Levels are given by their node label keys, as the Topology lists them;
// the preferred level may not be broader than the required one.
// +kubebuilder:validation:XValidation:rule="has(self.required) || has(self.preferred)",message="set required, preferred or both"
type TopologyConstraint struct {
	// Name is the Topology (cluster-scoped) whose levels are meant.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Required is the level whose one domain must hold the pods.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Required string `json:"required,omitempty"`
	// Preferred is the level whose one domain should hold the pods.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Preferred string `json:"preferred,omitempty"`
}
