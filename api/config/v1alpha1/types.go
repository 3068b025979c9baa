// Package v1alpha1 is the opaque driver configuration of the gpu.tessera.dev
// DRA driver: the GpuConfig object that DeviceClasses and ResourceClaims carry
// in `config[].opaque.parameters`. It names how a GPU is shared (Exclusive,
// MPS or TimeSlicing) and the knobs of each mode.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/internal/draname"
)

const (
	// GroupName is the API group of the opaque config: the DRA driver's
	// name (internal/draname, the one definition both sides use).
	GroupName = draname.Driver
	// Version is this API version.
	Version = "v1alpha1"
	// Kind is the only kind of this API.
	Kind = "GpuConfig"
)

// SchemeGroupVersion is gpu.tessera.dev/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// APIVersion is the apiVersion string a GpuConfig must carry.
var APIVersion = SchemeGroupVersion.String()

// SharingStrategy names how a GPU is shared between claims.
type SharingStrategy string

const (
	// Exclusive gives the claim the whole GPU (one claim per GPU).
	Exclusive SharingStrategy = "Exclusive"
	// MPS shares the GPU through one CUDA MPS daemon, with per-claim memory
	// and compute limits.
	MPS SharingStrategy = "MPS"
	// TimeSlicing shares the GPU by time slices; memory is not enforced.
	TimeSlicing SharingStrategy = "TimeSlicing"
)

// Strategies lists the valid strategies, in documentation order.
var Strategies = []SharingStrategy{Exclusive, MPS, TimeSlicing}

// TimeSliceInterval is the GPU's compute time-slice length for time-sliced sharing.
// The values mirror gpu.TimeSliceInterval.
type TimeSliceInterval string

const (
	IntervalDefault TimeSliceInterval = "Default"
	IntervalShort   TimeSliceInterval = "Short"
	IntervalMedium  TimeSliceInterval = "Medium"
	IntervalLong    TimeSliceInterval = "Long"
)

// Intervals lists the valid intervals.
var Intervals = []TimeSliceInterval{IntervalDefault, IntervalShort, IntervalMedium, IntervalLong}

// GpuConfig is the opaque configuration of a gpu.tessera.dev device.
//
// Example:
//
//	apiVersion: gpu.tessera.dev/v1alpha1
//	kind: GpuConfig
//	sharing:
//	  strategy: MPS
//	  mps:
//	    computePercent: 30
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing says how the GPU is shared. Nil means Exclusive.
	Sharing *GpuSharing `json:"sharing,omitempty"`
}

// GpuSharing is the sharing section of a GpuConfig.
type GpuSharing struct {
	// Strategy is Exclusive, MPS or TimeSlicing. Empty means Exclusive.
	Strategy SharingStrategy `json:"strategy,omitempty"`
	// MPS holds MPS settings; only allowed with strategy MPS.
	MPS *MPSConfig `json:"mps,omitempty"`
	// TimeSlicing holds time-slicing settings; only allowed with strategy TimeSlicing.
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`
}

// MPSConfig holds the MPS settings of a claim.
type MPSConfig struct {
	// ComputePercent caps the claim's share of the GPU's streaming
	// multiprocessors (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), 1..100. Nil means
	// in proportion to the claim's share of the GPU's memory.
	ComputePercent *int32 `json:"computePercent,omitempty"`
}

// TimeSlicingConfig holds the time-slicing settings of a claim.
type TimeSlicingConfig struct {
	// Interval is Default, Short, Medium or Long. Empty means Default.
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// NewGpuConfig returns a GpuConfig with its type meta set and the given strategy.
func NewGpuConfig(strategy SharingStrategy) *GpuConfig {
	return &GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		Sharing:  &GpuSharing{Strategy: strategy},
	}
}

// NewMPSConfig returns a defaulted MPS GpuConfig. A computePercent of 0
// leaves the SM share to follow the claim's share of the GPU's memory.
func NewMPSConfig(computePercent int32) *GpuConfig {
	c := NewGpuConfig(MPS)
	if computePercent > 0 {
		c.Sharing.MPS = &MPSConfig{ComputePercent: &computePercent}
	}
	c.Default()
	return c
}

// NewTimeSlicingConfig returns a defaulted TimeSlicing GpuConfig with the
// given interval (empty: Default).
func NewTimeSlicingConfig(interval TimeSliceInterval) *GpuConfig {
	c := NewGpuConfig(TimeSlicing)
	c.Sharing.TimeSlicing = &TimeSlicingConfig{Interval: interval}
	c.Default()
	return c
}

// DefaultGpuConfig is the config of a device that has none: exclusive.
func DefaultGpuConfig() *GpuConfig {
	c := NewGpuConfig(Exclusive)
	c.Default()
	return c
}

// Strategy returns the sharing strategy, Exclusive when unset.
func (c *GpuConfig) Strategy() SharingStrategy {
	if c == nil || c.Sharing == nil || c.Sharing.Strategy == "" {
		return Exclusive
	}
	return c.Sharing.Strategy
}

// ComputePercent returns the configured MPS compute percentage, or 0 when
// unset (then it follows the memory share).
func (c *GpuConfig) ComputePercent() int32 {
	if c == nil || c.Sharing == nil || c.Sharing.MPS == nil || c.Sharing.MPS.ComputePercent == nil {
		return 0
	}
	return *c.Sharing.MPS.ComputePercent
}

// Interval returns the time-slice interval, Default when unset.
func (c *GpuConfig) Interval() TimeSliceInterval {
	if c == nil || c.Sharing == nil || c.Sharing.TimeSlicing == nil || c.Sharing.TimeSlicing.Interval == "" {
		return IntervalDefault
	}
	return c.Sharing.TimeSlicing.Interval
}
