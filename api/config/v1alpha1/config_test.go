package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const head = `"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"`

func ptr[T any](v T) *T { return &v }

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    *GpuConfig
		wantErr string
	}{
		{name: "minimal", raw: `{` + head + `}`, want: &GpuConfig{TypeMeta: NewGpuConfig("").TypeMeta}},
		{name: "mps", raw: `{` + head + `,"sharing":{"strategy":"MPS","mps":{"computePercent":30}}}`,
			want: &GpuConfig{TypeMeta: NewGpuConfig("").TypeMeta, Sharing: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](30)}}}},
		{name: "time slicing", raw: `{` + head + `,"sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`,
			want: &GpuConfig{TypeMeta: NewGpuConfig("").TypeMeta, Sharing: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalLong}}}},
		{name: "unknown top-level field", raw: `{` + head + `,"foo":1}`, wantErr: `unknown field "foo"`},
		{name: "unknown nested field", raw: `{` + head + `,"sharing":{"mps":{"computePercentage":30}}}`, wantErr: `unknown field "sharing.mps.computePercentage"`},
		{name: "wrong case is unknown", raw: `{` + head + `,"Sharing":{}}`, wantErr: `unknown field "Sharing"`},
		{name: "duplicate field", raw: `{` + head + `,"sharing":{},"sharing":{}}`, wantErr: `duplicate field "sharing"`},
		{name: "wrong apiVersion", raw: `{"apiVersion":"gpu.nvidia.com/v1beta1","kind":"GpuConfig"}`, wantErr: `apiVersion: must be gpu.tessera.dev/v1alpha1, got "gpu.nvidia.com/v1beta1"`},
		{name: "missing kind", raw: `{"apiVersion":"gpu.tessera.dev/v1alpha1"}`, wantErr: `kind: must be GpuConfig, got ""`},
		{name: "wrong type", raw: `{` + head + `,"sharing":{"mps":{"computePercent":"30"}}}`, wantErr: `decoding GpuConfig`},
		{name: "not json", raw: `sharing: {}`, wantErr: `decoding GpuConfig`},
		{name: "empty", raw: ``, wantErr: `empty parameters`},
		{name: "null", raw: `null`, wantErr: `empty parameters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.raw))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     *GpuConfig
		wantErr []string
	}{
		{name: "nil", cfg: nil},
		{name: "no sharing", cfg: &GpuConfig{}},
		{name: "exclusive", cfg: NewGpuConfig(Exclusive)},
		{name: "partial mps without strategy", cfg: &GpuConfig{Sharing: &GpuSharing{MPS: &MPSConfig{ComputePercent: ptr[int32](50)}}}},
		{name: "mps 1 and 100", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](100)}}}},
		{name: "bad strategy", cfg: NewGpuConfig("Shared"), wantErr: []string{`sharing.strategy: must be one of Exclusive|MPS|TimeSlicing, got "Shared"`}},
		{name: "percent too high", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](150)}}},
			wantErr: []string{"sharing.mps.computePercent: must be 1..100, got 150"}},
		{name: "percent zero", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](0)}}},
			wantErr: []string{"sharing.mps.computePercent: must be 1..100, got 0"}},
		{name: "bad interval", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: "Forever"}}},
			wantErr: []string{`sharing.timeSlicing.interval: must be one of Default|Short|Medium|Long, got "Forever"`}},
		{name: "mps section with time slicing", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicing, MPS: &MPSConfig{}}},
			wantErr: []string{"sharing.mps: only allowed with strategy MPS, strategy is TimeSlicing"}},
		{name: "two errors at once", cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: Exclusive, MPS: &MPSConfig{ComputePercent: ptr[int32](-1)}, TimeSlicing: &TimeSlicingConfig{}}},
			wantErr: []string{"sharing.mps: only allowed", "sharing.mps.computePercent: must be 1..100, got -1", "sharing.timeSlicing: only allowed with strategy TimeSlicing, strategy is Exclusive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wantErr) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	tests := []struct {
		name string
		in   *GpuConfig
		want *GpuSharing
	}{
		{name: "empty is exclusive", in: &GpuConfig{}, want: &GpuSharing{Strategy: Exclusive}},
		{name: "mps gets a section", in: NewGpuConfig(MPS), want: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{}}},
		{name: "time slicing gets Default", in: NewGpuConfig(TimeSlicing), want: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalDefault}}},
		{name: "set values kept", in: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalShort}}},
			want: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalShort}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Default()
			assert.Equal(t, tt.want, tt.in.Sharing)
			assert.Equal(t, APIVersion, tt.in.APIVersion)
			assert.Equal(t, Kind, tt.in.Kind)
			assert.NoError(t, tt.in.Validate())
		})
	}
	assert.Equal(t, Exclusive, (*GpuConfig)(nil).Strategy())
	assert.Equal(t, IntervalDefault, (*GpuConfig)(nil).Interval())
	assert.Equal(t, int32(0), NewGpuConfig(MPS).ComputePercent())
}

func TestMerge(t *testing.T) {
	mps := func(p *int32) *GpuConfig {
		c := NewGpuConfig(MPS)
		c.Sharing.MPS = &MPSConfig{ComputePercent: p}
		return c
	}
	partial := &GpuConfig{Sharing: &GpuSharing{MPS: &MPSConfig{ComputePercent: ptr[int32](20)}}}
	ts := &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalLong}}}
	tests := []struct {
		name    string
		in      []*GpuConfig
		want    *GpuSharing
		invalid bool
	}{
		{name: "none is exclusive", in: nil, want: &GpuSharing{Strategy: Exclusive}},
		{name: "nil skipped", in: []*GpuConfig{nil, NewGpuConfig(MPS), nil}, want: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{}}},
		{name: "claim percent over class", in: []*GpuConfig{mps(ptr[int32](50)), partial}, want: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](20)}}},
		{name: "later same strategy keeps earlier fields", in: []*GpuConfig{mps(ptr[int32](50)), NewGpuConfig(MPS)}, want: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](50)}}},
		{name: "strategy change replaces section", in: []*GpuConfig{mps(ptr[int32](50)), ts}, want: &GpuSharing{Strategy: TimeSlicing, TimeSlicing: &TimeSlicingConfig{Interval: IntervalLong}}},
		{name: "partial alone defaults to exclusive and is invalid", in: []*GpuConfig{partial}, want: &GpuSharing{Strategy: Exclusive, MPS: &MPSConfig{ComputePercent: ptr[int32](20)}}, invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before []*GpuConfig
			for _, c := range tt.in {
				before = append(before, c.DeepCopy())
			}
			got := Merge(tt.in...)
			assert.Equal(t, tt.want, got.Sharing)
			assert.Equal(t, before, tt.in, "inputs must not change")
			if tt.invalid {
				assert.Error(t, got.Validate())
			} else {
				assert.NoError(t, got.Validate())
			}
		})
	}
}

func TestConfigForRequest(t *testing.T) {
	opaque := func(src resourceapi.AllocationConfigSource, driver, raw string, requests ...string) resourceapi.DeviceAllocationConfiguration {
		return resourceapi.DeviceAllocationConfiguration{
			Source:   src,
			Requests: requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(raw)},
			}},
		}
	}
	classMPS := opaque(resourceapi.AllocationConfigSourceClass, GroupName, `{`+head+`,"sharing":{"strategy":"MPS","mps":{"computePercent":50}}}`)
	claimPct := opaque(resourceapi.AllocationConfigSourceClaim, GroupName, `{`+head+`,"sharing":{"mps":{"computePercent":25}}}`, "gpu")
	otherDriver := opaque(resourceapi.AllocationConfigSourceClaim, "other.example.com", `not even json`)
	bad := opaque(resourceapi.AllocationConfigSourceClaim, GroupName, `{`+head+`,"sharing":{"strategy":"MPS","mps":{"computePercent":150}}}`, "gpu")

	tests := []struct {
		name     string
		configs  []resourceapi.DeviceAllocationConfiguration
		request  string
		strategy SharingStrategy
		percent  int32
		wantErr  string
	}{
		{name: "no config", request: "gpu", strategy: Exclusive},
		{name: "class only", configs: []resourceapi.DeviceAllocationConfiguration{classMPS}, request: "gpu", strategy: MPS, percent: 50},
		// Claim configs win even when listed before class configs.
		{name: "claim over class", configs: []resourceapi.DeviceAllocationConfiguration{claimPct, classMPS}, request: "gpu", strategy: MPS, percent: 25},
		{name: "claim config for another request", configs: []resourceapi.DeviceAllocationConfiguration{classMPS, claimPct}, request: "other", strategy: MPS, percent: 50},
		{name: "subrequest matches parent", configs: []resourceapi.DeviceAllocationConfiguration{classMPS, claimPct}, request: "gpu/small", strategy: MPS, percent: 25},
		{name: "other driver ignored", configs: []resourceapi.DeviceAllocationConfiguration{otherDriver, classMPS}, request: "gpu", strategy: MPS, percent: 50},
		{name: "bad claim config names entry and field", configs: []resourceapi.DeviceAllocationConfiguration{classMPS, bad}, request: "gpu",
			wantErr: `claim config #1 for request "gpu": sharing.mps.computePercent: must be 1..100, got 150`},
		{name: "partial without class is invalid", configs: []resourceapi.DeviceAllocationConfiguration{claimPct}, request: "gpu",
			wantErr: `merged config for request "gpu": sharing.mps: only allowed with strategy MPS, strategy is Exclusive`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConfigForRequest(GroupName, tt.configs, tt.request)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, tt.wantErr, err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.strategy, got.Strategy())
			assert.Equal(t, tt.percent, got.ComputePercent())
		})
	}
}

func TestDeepCopy(t *testing.T) {
	c := &GpuConfig{TypeMeta: NewGpuConfig("").TypeMeta, Sharing: &GpuSharing{Strategy: MPS, MPS: &MPSConfig{ComputePercent: ptr[int32](10)}, TimeSlicing: &TimeSlicingConfig{Interval: IntervalShort}}}
	cp := c.DeepCopy()
	assert.Equal(t, c, cp)
	*cp.Sharing.MPS.ComputePercent = 99
	cp.Sharing.TimeSlicing.Interval = IntervalLong
	assert.Equal(t, int32(10), *c.Sharing.MPS.ComputePercent)
	assert.Equal(t, IntervalShort, c.Sharing.TimeSlicing.Interval)
	assert.Nil(t, (*GpuConfig)(nil).DeepCopy())
	var _ runtime.Object = c
}

func TestConstructors(t *testing.T) {
	m := NewMPSConfig(30)
	require.NoError(t, m.Validate())
	assert.Equal(t, int32(30), m.ComputePercent())
	assert.Equal(t, int32(0), NewMPSConfig(0).ComputePercent(), "0 follows the memory share")
	require.NoError(t, NewMPSConfig(0).Validate())
	ts := NewTimeSlicingConfig(IntervalLong)
	require.NoError(t, ts.Validate())
	assert.Equal(t, TimeSlicing, ts.Strategy())
	assert.Equal(t, IntervalLong, ts.Interval())
	assert.Equal(t, IntervalDefault, NewTimeSlicingConfig("").Interval())
}
