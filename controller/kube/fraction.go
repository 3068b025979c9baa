package kube

import (
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// fractionAnnotations says why a pod that asks for a GPU share through
// annotations (tessera.dev/gpu-fraction or tessera.dev/gpu-memory, with
// tessera.dev/gpu-sharing) waits: a malformed annotation is named with its
// value; a well-formed one needs the device-plugin path, which this version
// does not have. Scheduling such a pod as if it asked for no GPU would hand
// it a node without one, so it waits instead, saying how to ask today.
// "" when the pod carries none of them.
func fractionAnnotations(pod *v1.Pod) string {
	frac, hasFrac := pod.Annotations[AnnotationGPUFraction]
	mem, hasMem := pod.Annotations[AnnotationGPUMemory]
	sharing, hasSharing := pod.Annotations[AnnotationGPUSharing]
	if !hasFrac && !hasMem && !hasSharing {
		return ""
	}
	switch {
	case hasFrac && hasMem:
		return fmt.Sprintf("annotations %s and %s: give one, not both", AnnotationGPUFraction, AnnotationGPUMemory)
	case hasFrac:
		f, err := strconv.ParseFloat(frac, 64)
		if err != nil || !(f > 0 && f < 1) {
			return fmt.Sprintf("annotation %s: %q is not a fraction between 0 and 1 (e.g. \"0.5\")", AnnotationGPUFraction, frac)
		}
	case hasMem:
		q, err := resource.ParseQuantity(mem)
		if err != nil || q.Sign() <= 0 {
			return fmt.Sprintf("annotation %s: %q is not a positive amount of memory (e.g. \"20Gi\")", AnnotationGPUMemory, mem)
		}
	default:
		return fmt.Sprintf("annotation %s without %s or %s: it says how to share a GPU, not how much of one", AnnotationGPUSharing, AnnotationGPUFraction, AnnotationGPUMemory)
	}
	class := "mps.gpu.tessera.dev"
	switch sharing {
	case "", "mps":
	case "timeslice":
		class = "timeslice.gpu.tessera.dev"
	default:
		return fmt.Sprintf("annotation %s: %q is not mps or timeslice", AnnotationGPUSharing, sharing)
	}
	return fmt.Sprintf("asks for a GPU share through annotations, which need the device-plugin path that this version of Tessera does not serve; "+
		"ask with a ResourceClaim of DeviceClass %s that requests capacity memory instead (demo/examples/04-team-a-inference.yaml)", class)
}
