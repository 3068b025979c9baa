// Package v1alpha1 holds Tessera's scheduling API: Queue and Topology
// (cluster-scoped) and PodGroup (namespaced) in scheduling.tessera.dev/v1alpha1.
//
// +kubebuilder:object:generate=true
// +groupName=scheduling.tessera.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of Tessera's scheduling objects.
const GroupName = "scheduling.tessera.dev"

// SchemeGroupVersion is group version used to register these objects.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource takes an unqualified resource and returns a Group qualified GroupResource.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &Queue{}, &QueueList{}, &PodGroup{}, &PodGroupList{}, &Topology{}, &TopologyList{})
	metav1AddToGroupVersion(scheme)
	return nil
}
