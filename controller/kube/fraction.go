package kube

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
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
		if len(mem) > maxQuantityText {
			return req, true, fmt.Errorf("annotation %s: %d characters are not an amount of memory (e.g. \"20Gi\")", AnnotationGPUMemory, len(mem))
		}
		if e, big := longExponent(mem); big && e > 0 {
			return req, true, fmt.Errorf("annotation %s: %q is more memory than any GPU has; the most Tessera accepts is %s", AnnotationGPUMemory, mem, maxQuantityString(unitBytes, core.MaxAmount))
		} else if big {
			return req, true, fmt.Errorf("annotation %s: %q is not a positive amount of memory of at least a byte (e.g. \"20Gi\")", AnnotationGPUMemory, mem)
		}
		q, err := resource.ParseQuantity(mem)
		if err != nil || q.Sign() <= 0 {
			return req, true, fmt.Errorf("annotation %s: %q is not a positive amount of memory (e.g. \"20Gi\")", AnnotationGPUMemory, mem)
		}
		// Checked, not q.Value(): that wraps above 2^63 ("1e19" read as 0).
		if req.GPUMemory, err = readAmount(q, unitBytes, core.MaxAmount); err != nil {
			return core.Request{}, true, fmt.Errorf("annotation %s: %q is more memory than any GPU has; the most Tessera accepts is %s", AnnotationGPUMemory, mem, maxQuantityString(unitBytes, core.MaxAmount))
		}
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

// ErrNoShareSlot is the reason of an annotated pod without the share slot
// (the admission webhook adds the slot on CREATE, so it does not deny a
// pod for it then).
var ErrNoShareSlot = errors.New("asks for a GPU share through annotations, but no container asks for the " + ResourceShare +
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
		return req, true, ErrNoShareSlot
	case has && share > 1:
		return req, true, fmt.Errorf("asks for %d %s; an annotated pod takes one share slot (%s: 1)", share, ResourceShare, ResourceShare)
	case has:
		return frac, true, nil
	case share > 0:
		return req, true, fmt.Errorf("asks for %s without annotation %s or %s saying how much of a GPU", ResourceShare, AnnotationGPUFraction, AnnotationGPUMemory)
	case whole > 0 && claims:
		return req, true, fmt.Errorf("asks for %d %s and for GPUs through ResourceClaims; ask in one way only", whole, gpuResource)
	case whole > core.MaxGPUs:
		return req, true, fmt.Errorf("asks for %d %s; the most Tessera accepts is %d", whole, gpuResource, core.MaxGPUs)
	case whole > 0:
		return core.Request{GPUs: int(whole)}, true, nil
	}
	return req, false, nil
}

// PodAdmissionError is why tessera-scheduler would refuse a pod that asks
// for GPUs through the device plugin (the fraction annotations, the share
// slot, whole GPUs), judged from the pod alone: its resources (podResources)
// and annotations (devicePluginRequest), checked in the order and with the
// words the pod would wait with. Its claims are the scheduler's to look up.
// nil when it would not refuse the pod for these. The admission webhook
// denies with it, so the two never disagree.
func PodAdmissionError(pod *v1.Pod) error {
	_, _, other, err := podResources(pod)
	if err != nil {
		return err
	}
	_, _, err = devicePluginRequest(pod.Annotations, other, assignment.DefaultResourceGPU, false)
	return err
}

// maxQuantityText bounds the length of a quantity written in an
// annotation: ParseQuantity's cost grows with the scale a long mantissa
// implies ("0.000…1" with many zeros), as with a long exponent.
const maxQuantityText = 64

// longExponent reports whether s, a quantity as written, has a decimal
// exponent of more than three digits, and its sign: resource.ParseQuantity
// takes seconds on "1e-9999999" (it rounds to nano units through a power
// of ten of that size), so such a value is judged from its text.
func longExponent(s string) (sign int, long bool) {
	i := strings.LastIndexAny(s, "eE")
	if i < 0 || i == len(s)-1 {
		return 0, false // no exponent, or the suffix E (exa)
	}
	exp := s[i+1:]
	sign = 1
	switch exp[0] {
	case '-':
		sign, exp = -1, exp[1:]
	case '+':
		exp = exp[1:]
	}
	exp = strings.TrimLeft(exp, "0")
	if len(exp) <= 3 || strings.Trim(exp, "0123456789") != "" {
		return 0, false
	}
	return sign, true
}
