package kube

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/controller/core"
)

// FractionRequest reads DESIGN.md's fraction annotations
// (tessera.dev/gpu-fraction or tessera.dev/gpu-memory, with
// tessera.dev/gpu-sharing): the share of one GPU they ask for, as the
// core's request (GPUMilli or GPUMemory, and Sharing). has is false when the
// annotations carry none of them; err names a malformed annotation and its
// value. The admission webhook denies a pod with the same message.
func FractionRequest(annotations map[string]string) (req core.Request, has bool, err error) {
	frac, hasFrac := annotations[AnnotationGPUFraction]
	mem, hasMem := annotations[AnnotationGPUMemory]
	sharing, hasSharing := annotations[AnnotationGPUSharing]
	if !hasFrac && !hasMem && !hasSharing {
		return req, false, nil
	}
	switch {
	case hasFrac && hasMem:
		return req, true, fmt.Errorf("annotations %s and %s: give one, not both", AnnotationGPUFraction, AnnotationGPUMemory)
	case hasFrac:
		f, err := strconv.ParseFloat(frac, 64)
		if err != nil || !(f > 0 && f < 1) {
			return req, true, fmt.Errorf("annotation %s: %q is not a fraction between 0 and 1 (e.g. \"0.5\")", AnnotationGPUFraction, frac)
		}
		// The core counts GPUs in thousandths.
		req.GPUMilli = int64(math.Round(f * 1000))
		if req.GPUMilli < 1 || req.GPUMilli > 999 {
			return req, true, fmt.Errorf("annotation %s: %q rounds to %d thousandths of a GPU; give a fraction from 0.001 to 0.999", AnnotationGPUFraction, frac, req.GPUMilli)
		}
	case hasMem:
		q, err := resource.ParseQuantity(mem)
		if err != nil || q.Sign() <= 0 {
			return req, true, fmt.Errorf("annotation %s: %q is not a positive amount of memory (e.g. \"20Gi\")", AnnotationGPUMemory, mem)
		}
		req.GPUMemory = q.Value()
	default:
		return req, true, fmt.Errorf("annotation %s without %s or %s: it says how to share a GPU, not how much of one", AnnotationGPUSharing, AnnotationGPUFraction, AnnotationGPUMemory)
	}
	switch sharing {
	case "", "mps":
		req.Sharing = core.SharingMPS
	case "timeslice":
		req.Sharing = core.SharingTimeSlice
	default:
		return core.Request{}, true, fmt.Errorf("annotation %s: %q is not mps or timeslice", AnnotationGPUSharing, sharing)
	}
	return req, true, nil
}

// errNoShareSlot is the reason of an annotated pod without the share slot.
var errNoShareSlot = errors.New("asks for a GPU share through annotations, but no container asks for the " + ResourceShare +
	" resource the device plugin hands the share out through: add " + ResourceShare + ": 1 to a container's limits, " +
	"or install Tessera's admission webhook (the chart's webhook.enabled), which adds it")

// devicePluginRequest works out what a pod asks of GPUs through the device
// plugin: a share of one GPU through the fraction annotations (with one
// tessera.dev/gpu-share slot), or whole GPUs through gpuResource
// (nvidia.com/gpu by default). other is the pod's other resources
// (podResources), claims whether its ResourceClaims ask for Tessera GPUs.
// dp is false for a pod that uses neither; err says why a pod cannot be
// placed as it asks (the reason it waits with).
func devicePluginRequest(annotations map[string]string, other map[string]int64, gpuResource string, claims bool) (req core.Request, dp bool, err error) {
	share := other[ResourceShare]
	whole := other[gpuResource]
	frac, has, err := FractionRequest(annotations)
	switch {
	case err != nil:
		return req, true, err
	case has && claims:
		return req, true, fmt.Errorf("asks for a GPU share through annotations and for GPUs through ResourceClaims; ask in one way only")
	case has && whole > 0:
		return req, true, fmt.Errorf("asks for a GPU share through annotations and for %d %s; ask for a share or for whole GPUs, not both", whole, gpuResource)
	case has && share == 0:
		return req, true, errNoShareSlot
	case has && share > 1:
		return req, true, fmt.Errorf("asks for %d %s; an annotated pod takes one share slot (%s: 1)", share, ResourceShare, ResourceShare)
	case has:
		return frac, true, nil
	case share > 0:
		return req, true, fmt.Errorf("asks for %s without annotation %s or %s saying how much of a GPU", ResourceShare, AnnotationGPUFraction, AnnotationGPUMemory)
	case whole > 0 && claims:
		return req, true, fmt.Errorf("asks for %d %s and for GPUs through ResourceClaims; ask in one way only", whole, gpuResource)
	case whole > 0:
		return core.Request{GPUs: int(whole)}, true, nil
	}
	return req, false, nil
}
