// Package assignment is the contract between tessera-controller and
// tessera-node for pods that get GPUs through the device-plugin path
// (extended resources) rather than through ResourceClaims: the user-facing
// annotations and resource names, and the assignment annotation in which the
// controller records, before binding, which GPUs of the node (and how much
// of each) the pod was given. The device plugin reads it in Allocate, since
// the kubelet tells a device plugin nothing about the pod it allocates for.
package assignment

import (
	"encoding/json"
	"fmt"
	"slices"
)

const (
	// AnnotationGPUFraction asks for a share of one GPU ("0.5"); its memory
	// share is the same fraction of the GPU it lands on.
	AnnotationGPUFraction = "tessera.dev/gpu-fraction"
	// AnnotationGPUMemory asks for a share of one GPU given as memory ("20Gi").
	AnnotationGPUMemory = "tessera.dev/gpu-memory"
	// AnnotationGPUSharing is how the share is enforced: mps (default) or timeslice.
	AnnotationGPUSharing = "tessera.dev/gpu-sharing"

	// Annotation holds the controller's Assignment (JSON). It is written
	// before the pod is bound and never changed afterwards. Trust: only
	// tessera-controller's identity may write it (the
	// tessera-gpu-assignment admission policy, deploy/rbac), and the
	// controller reads it only on a pod that asks for what it assigns (as
	// many GPUs of the GPU resource; a share: ResourceShare and a fraction
	// annotation). For whole GPUs the node's record (draname.AttrDevicePluginPod)
	// wins over it.
	Annotation = "tessera.dev/gpu-assignment"

	// ResourceShare is the extended resource of fraction slots: a pod that
	// asks for a share through the annotations holds one slot (the webhook
	// adds the limit). Slots only make the kubelet call the device plugin;
	// which GPU and how much of it come from the assignment.
	ResourceShare = "tessera.dev/gpu-share"
	// DefaultResourceGPU is the default extended resource of whole GPUs.
	DefaultResourceGPU = "nvidia.com/gpu"

	// The device taint and attribute by which tessera-node marks the GPUs
	// its device plugin holds are DRA names: internal/draname.
)

// Sharing modes of a share, as written in the assignment.
const (
	SharingMPS         = "MPS"
	SharingTimeSlicing = "TimeSlicing"
)

// Assignment is what the controller gave a device-plugin pod on its node.
type Assignment struct {
	// GPUs are device indices on the node (the ResourceSlice's
	// gpu.tessera.dev/index), ascending.
	GPUs []int `json:"gpus"`
	// UUIDs of the same GPUs, when known, so the node can tell that the GPU
	// at an index is still the one the controller saw.
	UUIDs []string `json:"uuids,omitempty"`
	// MemoryBytes is, for a share, the GPU memory it may use; 0 for whole GPUs.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// ComputeMilli is, for a share, its compute share (1..999); 0 for whole GPUs.
	ComputeMilli int64 `json:"computeMilli,omitempty"`
	// Sharing is SharingMPS or SharingTimeSlicing for a share, "" for whole GPUs.
	Sharing string `json:"sharing,omitempty"`
}

// IsShare reports whether the assignment is a share of one GPU.
func (a Assignment) IsShare() bool { return a.Sharing != "" }

// Validate says what is wrong with an assignment, or nil.
func (a Assignment) Validate() error {
	if len(a.GPUs) == 0 {
		return fmt.Errorf("no GPUs")
	}
	if !slices.IsSorted(a.GPUs) || len(slices.Compact(slices.Clone(a.GPUs))) != len(a.GPUs) {
		return fmt.Errorf("GPUs %v are not ascending and distinct", a.GPUs)
	}
	for _, g := range a.GPUs {
		if g < 0 {
			return fmt.Errorf("GPU index %d is negative", g)
		}
	}
	if len(a.UUIDs) != 0 && len(a.UUIDs) != len(a.GPUs) {
		return fmt.Errorf("%d UUIDs for %d GPUs", len(a.UUIDs), len(a.GPUs))
	}
	switch a.Sharing {
	case "":
		if a.MemoryBytes != 0 || a.ComputeMilli != 0 {
			return fmt.Errorf("memoryBytes or computeMilli set without a sharing mode")
		}
	case SharingMPS, SharingTimeSlicing:
		if len(a.GPUs) != 1 {
			return fmt.Errorf("a share is of one GPU, got %d", len(a.GPUs))
		}
		if a.MemoryBytes <= 0 {
			return fmt.Errorf("a share needs memoryBytes > 0, got %d", a.MemoryBytes)
		}
		if a.ComputeMilli < 1 || a.ComputeMilli > 999 {
			return fmt.Errorf("a share needs computeMilli in 1..999, got %d", a.ComputeMilli)
		}
	default:
		return fmt.Errorf("sharing %q is not %s or %s", a.Sharing, SharingMPS, SharingTimeSlicing)
	}
	return nil
}

// String is the annotation's value.
func (a Assignment) String() string {
	b, _ := json.Marshal(a) // plain fields: cannot fail
	return string(b)
}

// Parse reads and validates an annotation value; the error names the
// annotation and what is wrong, for events and logs.
func Parse(value string) (Assignment, error) {
	var a Assignment
	if err := json.Unmarshal([]byte(value), &a); err != nil {
		return a, fmt.Errorf("annotation %s: %q is not valid JSON: %w", Annotation, value, err)
	}
	if err := a.Validate(); err != nil {
		return a, fmt.Errorf("annotation %s: %w", Annotation, err)
	}
	return a, nil
}

// Of returns the pod's assignment from its annotations: ok is false when it
// has none; err says what is wrong with a malformed one.
func Of(annotations map[string]string) (a Assignment, ok bool, err error) {
	v, ok := annotations[Annotation]
	if !ok {
		return a, false, nil
	}
	a, err = Parse(v)
	return a, true, err
}
