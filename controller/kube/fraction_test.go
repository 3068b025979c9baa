package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/core"
)

func TestFractionRequest(t *testing.T) {
	cases := []struct {
		name    string
		ann     map[string]string
		has     bool
		want    core.Request
		wantErr string // a part of the error; "" for none
	}{
		{name: "none", ann: map[string]string{"other": "x"}},
		{name: "fraction", ann: map[string]string{AnnotationGPUFraction: "0.5"}, has: true, want: core.Request{GPUMilli: 500, Sharing: core.SharingMPS}},
		{name: "fraction rounds to thousandths", ann: map[string]string{AnnotationGPUFraction: "0.3333"}, has: true, want: core.Request{GPUMilli: 333, Sharing: core.SharingMPS}},
		{name: "memory, time-sliced", ann: map[string]string{AnnotationGPUMemory: "20Gi", AnnotationGPUSharing: "timeslice"}, has: true, want: core.Request{GPUMemory: 20 << 30, Sharing: core.SharingTimeSlice}},
		{name: "explicit mps", ann: map[string]string{AnnotationGPUFraction: "0.25", AnnotationGPUSharing: "mps"}, has: true, want: core.Request{GPUMilli: 250, Sharing: core.SharingMPS}},
		{name: "not a number", ann: map[string]string{AnnotationGPUFraction: "half"}, has: true, wantErr: `annotation tessera.dev/gpu-fraction: "half" is not a fraction between 0 and 1`},
		{name: "whole", ann: map[string]string{AnnotationGPUFraction: "1"}, has: true, wantErr: `"1" is not a fraction between 0 and 1`},
		{name: "NaN", ann: map[string]string{AnnotationGPUFraction: "NaN"}, has: true, wantErr: `"NaN" is not a fraction`},
		{name: "too small", ann: map[string]string{AnnotationGPUFraction: "0.0001"}, has: true, wantErr: `"0.0001" rounds to 0 thousandths`},
		{name: "too close to one", ann: map[string]string{AnnotationGPUFraction: "0.9999"}, has: true, wantErr: `"0.9999" rounds to 1000 thousandths`},
		{name: "bad memory", ann: map[string]string{AnnotationGPUMemory: "lots"}, has: true, wantErr: `annotation tessera.dev/gpu-memory: "lots" is not a positive amount of memory`},
		{name: "zero memory", ann: map[string]string{AnnotationGPUMemory: "0"}, has: true, wantErr: `"0" is not a positive amount`},
		// Past 2^63 Quantity.Value wraps: these read as a negative number or 0.
		{name: "memory past 2^63", ann: map[string]string{AnnotationGPUMemory: "9223372036854775808"}, has: true,
			wantErr: `annotation tessera.dev/gpu-memory: "9223372036854775808" is more memory than any GPU has; the most Tessera accepts is 64Ti`},
		{name: "memory 1e19", ann: map[string]string{AnnotationGPUMemory: "1e19"}, has: true, wantErr: `"1e19" is more memory than any GPU has`},
		{name: "memory 10E", ann: map[string]string{AnnotationGPUMemory: "10E"}, has: true, wantErr: `"10E" is more memory than any GPU has`},
		{name: "memory 1e100", ann: map[string]string{AnnotationGPUMemory: "1e100"}, has: true, wantErr: `"1e100" is more memory than any GPU has`},
		// Compared or parsed exactly these took seconds each (a power of ten of ten million digits).
		{name: "memory 1e9999999", ann: map[string]string{AnnotationGPUMemory: "1e9999999"}, has: true, wantErr: `"1e9999999" is more memory than any GPU has`},
		{name: "memory 1e-9999999", ann: map[string]string{AnnotationGPUMemory: "1e-9999999"}, has: true, wantErr: `"1e-9999999" is not a positive amount of memory of at least a byte`},
		{name: "memory 1e+0000999", ann: map[string]string{AnnotationGPUMemory: "1e+0000999"}, has: true, wantErr: `"1e+0000999" is more memory than any GPU has`},
		{name: "memory written long", ann: map[string]string{AnnotationGPUMemory: "0." + strings.Repeat("0", 100) + "1"}, has: true, wantErr: "annotation tessera.dev/gpu-memory: 103 characters are not an amount of memory"},
		{name: "memory 1e-999", ann: map[string]string{AnnotationGPUMemory: "1e-999"}, has: true, want: core.Request{GPUMemory: 1, Sharing: core.SharingMPS}},
		{name: "memory at the maximum", ann: map[string]string{AnnotationGPUMemory: "64Ti"}, has: true, want: core.Request{GPUMemory: core.MaxAmount, Sharing: core.SharingMPS}},
		{name: "memory below a byte rounds up", ann: map[string]string{AnnotationGPUMemory: "1m"}, has: true, want: core.Request{GPUMemory: 1, Sharing: core.SharingMPS}},
		{name: "fraction 1e19", ann: map[string]string{AnnotationGPUFraction: "1e19"}, has: true, wantErr: `"1e19" is not a fraction between 0 and 1`},
		{name: "both", ann: map[string]string{AnnotationGPUFraction: "0.5", AnnotationGPUMemory: "20Gi"}, has: true, wantErr: "give one, not both"},
		{name: "sharing alone", ann: map[string]string{AnnotationGPUSharing: "mps"}, has: true, wantErr: "annotation tessera.dev/gpu-sharing without"},
		{name: "bad sharing", ann: map[string]string{AnnotationGPUFraction: "0.25", AnnotationGPUSharing: "mig"}, has: true, wantErr: `annotation tessera.dev/gpu-sharing: "mig" is not mps or timeslice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, has, err := FractionRequest(c.ann)
			assert.Equal(t, c.has, has)
			if c.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestDevicePluginRequest(t *testing.T) {
	half := map[string]string{AnnotationGPUFraction: "0.5"}
	cases := []struct {
		name    string
		ann     map[string]string
		limits  v1.ResourceList
		claims  bool // the pod's claims ask for Tessera GPUs
		gpuRes  string
		dp      bool
		want    core.Request
		wantErr string
	}{
		{name: "no GPU at all", limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}},
		{name: "claims only", claims: true},
		{name: "share", ann: half, limits: v1.ResourceList{ResourceShare: resource.MustParse("1")}, dp: true, want: core.Request{GPUMilli: 500, Sharing: core.SharingMPS}},
		{name: "share by memory", ann: map[string]string{AnnotationGPUMemory: "10Gi", AnnotationGPUSharing: "timeslice"}, limits: v1.ResourceList{ResourceShare: resource.MustParse("1")}, dp: true,
			want: core.Request{GPUMemory: 10 << 30, Sharing: core.SharingTimeSlice}},
		{name: "whole GPUs", limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}, dp: true, want: core.Request{GPUs: 2}},
		{name: "whole GPUs under another name", gpuRes: "example.com/gpu", limits: v1.ResourceList{"example.com/gpu": resource.MustParse("3"), "nvidia.com/gpu": resource.MustParse("1")}, dp: true, want: core.Request{GPUs: 3}},
		{name: "other name not configured", limits: v1.ResourceList{"example.com/gpu": resource.MustParse("3")}},
		{name: "annotated without the slot", ann: half, dp: true, wantErr: "add tessera.dev/gpu-share: 1 to a container's limits, or install Tessera's admission webhook"},
		{name: "malformed annotation", ann: map[string]string{AnnotationGPUFraction: "half"}, limits: v1.ResourceList{ResourceShare: resource.MustParse("1")}, dp: true, wantErr: `"half" is not a fraction`},
		{name: "annotations and claims", ann: half, claims: true, limits: v1.ResourceList{ResourceShare: resource.MustParse("1")}, dp: true, wantErr: "through annotations and for GPUs through ResourceClaims"},
		{name: "annotations and whole GPUs", ann: half, limits: v1.ResourceList{ResourceShare: resource.MustParse("1"), "nvidia.com/gpu": resource.MustParse("1")}, dp: true, wantErr: "a share or for whole GPUs, not both"},
		{name: "whole GPUs past the maximum", limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("65537")}, dp: true, wantErr: "asks for 65537 nvidia.com/gpu; the most Tessera accepts is 65536"},
		{name: "two slots", ann: half, limits: v1.ResourceList{ResourceShare: resource.MustParse("2")}, dp: true, wantErr: "asks for 2 tessera.dev/gpu-share"},
		{name: "slot without annotations", limits: v1.ResourceList{ResourceShare: resource.MustParse("1")}, dp: true, wantErr: "without annotation tessera.dev/gpu-fraction"},
		{name: "whole GPUs and claims", claims: true, limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}, dp: true, wantErr: "ask in one way only"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.gpuRes == "" {
				c.gpuRes = "nvidia.com/gpu"
			}
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: c.ann}, Spec: v1.PodSpec{Containers: []v1.Container{
				{Name: "a", Resources: v1.ResourceRequirements{Limits: c.limits, Requests: c.limits}},
			}}}
			_, _, other, rerr := podResources(pod)
			require.NoError(t, rerr)
			got, dp, err := devicePluginRequest(pod.Annotations, other, c.gpuRes, c.claims)
			assert.Equal(t, c.dp, dp)
			if c.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			if c.dp {
				// The extended resources stay in Other: the node must
				// advertise them too.
				for name := range c.limits {
					assert.Contains(t, other, string(name))
				}
			}
		})
	}
}
