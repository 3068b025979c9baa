package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

// Hand-written deep copies: the types are small and have no maps, so
// controller-gen would add a build step for little gain.

// DeepCopy returns a deep copy.
func (c *GpuConfig) DeepCopy() *GpuConfig {
	if c == nil {
		return nil
	}
	out := &GpuConfig{TypeMeta: c.TypeMeta, Sharing: c.Sharing.DeepCopy()}
	return out
}

// DeepCopy returns a deep copy.
func (s *GpuSharing) DeepCopy() *GpuSharing {
	if s == nil {
		return nil
	}
	out := &GpuSharing{Strategy: s.Strategy}
	if s.MPS != nil {
		out.MPS = &MPSConfig{}
		if s.MPS.ComputePercent != nil {
			p := *s.MPS.ComputePercent
			out.MPS.ComputePercent = &p
		}
	}
	if s.TimeSlicing != nil {
		t := *s.TimeSlicing
		out.TimeSlicing = &t
	}
	return out
}

// DeepCopyObject makes GpuConfig a runtime.Object, so it can be registered
// in a scheme by code that prefers apimachinery's serializers.
func (c *GpuConfig) DeepCopyObject() runtime.Object { return c.DeepCopy() }
