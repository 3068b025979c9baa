package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestFractionAnnotations(t *testing.T) {
	cases := []struct {
		name string
		ann  map[string]string
		want string // a part of the reason; "" for none
	}{
		{"none", map[string]string{"other": "x"}, ""},
		{"fraction", map[string]string{AnnotationGPUFraction: "0.5"}, "DeviceClass mps.gpu.tessera.dev"},
		{"memory, time-sliced", map[string]string{AnnotationGPUMemory: "20Gi", AnnotationGPUSharing: "timeslice"}, "DeviceClass timeslice.gpu.tessera.dev"},
		{"not a number", map[string]string{AnnotationGPUFraction: "half"}, `annotation tessera.dev/gpu-fraction: "half" is not a fraction between 0 and 1`},
		{"whole", map[string]string{AnnotationGPUFraction: "1"}, `"1" is not a fraction between 0 and 1`},
		{"NaN", map[string]string{AnnotationGPUFraction: "NaN"}, `"NaN" is not a fraction`},
		{"bad memory", map[string]string{AnnotationGPUMemory: "lots"}, `annotation tessera.dev/gpu-memory: "lots" is not a positive amount of memory`},
		{"both", map[string]string{AnnotationGPUFraction: "0.5", AnnotationGPUMemory: "20Gi"}, "give one, not both"},
		{"sharing alone", map[string]string{AnnotationGPUSharing: "mps"}, "annotation tessera.dev/gpu-sharing without"},
		{"bad sharing", map[string]string{AnnotationGPUFraction: "0.25", AnnotationGPUSharing: "mig"}, `"mig" is not mps or timeslice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fractionAnnotations(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: c.ann}})
			if c.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Contains(t, got, c.want)
		})
	}
}
