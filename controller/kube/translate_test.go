package kube

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/draname"
)

func device(index int64, domain string, taint bool) resourceapi.Device {
	d := resourceapi.Device{
		Name: draname.DeviceName(int(index)),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			draname.AttrIndex:        {IntValue: ptr.To(index)},
			draname.AttrProductName:  {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
			draname.AttrNVLinkDomain: {StringValue: ptr.To(domain)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{draname.CapacityMemory: {Value: resource.MustParse("80Gi")}},
	}
	if taint {
		d.Taints = []resourceapi.DeviceTaint{{Key: "gpu.tessera.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return d
}

func TestGPUsFromSlices(t *testing.T) {
	node := "n1"
	old := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, Generation: 1},
		Devices: []resourceapi.Device{device(0, "old", false)}}}
	cur := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, Generation: 2},
		Devices: []resourceapi.Device{device(1, "d", true), device(0, "d", false)}}}
	other := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "other.example.com", NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, Generation: 9},
		Devices: []resourceapi.Device{{Name: "x"}}}}
	g := gpusFromSlices(klog.Background(), []*resourceapi.ResourceSlice{old, cur, other})
	require.Len(t, g.gpus, 2, "only the newest generation of Tessera's pool counts")
	assert.Equal(t, 0, g.gpus[0].Index)
	assert.Equal(t, 1, g.gpus[1].Index)
	assert.Equal(t, int64(80<<30), g.gpus[0].Memory)
	assert.Equal(t, "d", g.gpus[1].NVLinkDomain)
	assert.Equal(t, 1, g.byDevice["gpu-1"])
	assert.True(t, g.tainted["gpu-1"])
	assert.False(t, g.tainted["gpu-0"])
	assert.Equal(t, int64(2), g.generation)
}

// TestGPUsFromSlicesDevicePluginTaint: the device-plugin taint does not
// make a GPU unusable (the controller knows those pods by their
// assignment); it is recorded, whole winning over shared. Other taints are
// unusable, also next to it.
func TestGPUsFromSlicesDevicePluginTaint(t *testing.T) {
	dp := func(v string) resourceapi.DeviceTaint {
		return resourceapi.DeviceTaint{Key: draname.TaintDevicePlugin, Value: v, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	unhealthy := resourceapi.DeviceTaint{Key: "gpu.tessera.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	for _, tc := range []struct {
		name        string
		taints      []resourceapi.DeviceTaint
		wantTainted bool
		wantHeld    string
	}{
		{"none", nil, false, ""},
		{"whole", []resourceapi.DeviceTaint{dp("whole")}, false, "whole"},
		{"shared", []resourceapi.DeviceTaint{dp("shared")}, false, "shared"},
		{"whole wins", []resourceapi.DeviceTaint{dp("whole"), dp("shared")}, false, "whole"},
		{"unhealthy too", []resourceapi.DeviceTaint{unhealthy, dp("shared")}, true, "shared"},
		{"other key", []resourceapi.DeviceTaint{{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoExecute}}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := "n1"
			d := device(0, "d", false)
			d.Taints = tc.taints
			g := gpusFromSlices(klog.Background(), []*resourceapi.ResourceSlice{{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node,
				Pool: resourceapi.ResourcePool{Name: node, Generation: 1}, Devices: []resourceapi.Device{d}}}})
			require.Len(t, g.gpus, 1)
			assert.Equal(t, tc.wantTainted, g.tainted["gpu-0"])
			assert.Equal(t, tc.wantHeld, g.dpHeld["gpu-0"])
		})
	}
}

// TestAddDevicePluginHeld: tainted GPUs that no bound pod's assignment
// accounts for are held whole by an external pod, whatever the value.
func TestAddDevicePluginHeld(t *testing.T) {
	gpus := func(held map[string]string) *nodeGPUs {
		g := &nodeGPUs{dpHeld: held}
		for i := range 4 {
			g.gpus = append(g.gpus, core.GPU{Index: i, Memory: 80 << 30})
		}
		return g
	}
	for _, tc := range []struct {
		name     string
		held     map[string]string
		assigned map[int]bool
		want     []int // GPUs of the external pod; nil: no pod
	}{
		{"no taint", nil, nil, nil},
		{"whole, no holder", map[string]string{"gpu-1": "whole"}, nil, []int{1}},
		{"whole, assigned", map[string]string{"gpu-1": "whole"}, map[int]bool{1: true}, nil},
		{"shared, no holder: held whole", map[string]string{"gpu-2": "shared"}, nil, []int{2}},
		{"shared, assigned", map[string]string{"gpu-2": "shared"}, map[int]bool{2: true}, nil},
		{"some of them", map[string]string{"gpu-0": "whole", "gpu-3": "shared", "gpu-2": "whole"}, map[int]bool{2: true}, []int{0, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := &cycleIndex{gpus: map[string]*nodeGPUs{"n1": gpus(tc.held), "n2": nil}, jobs: map[string]*jobRef{}}
			jobs := map[string]*core.Job{}
			var order []string
			addDevicePluginHeld(idx, map[string]map[int]bool{"n1": tc.assigned}, jobs, &order)
			if tc.want == nil {
				assert.Empty(t, jobs)
				return
			}
			require.Equal(t, []string{"<external>/<device-plugin>/n1"}, order)
			j := jobs[order[0]]
			assert.Equal(t, externalQueue, j.Queue)
			require.Len(t, j.Pods, 1)
			p := j.Pods[0]
			assert.Equal(t, core.PodBound, p.Phase)
			assert.Equal(t, tc.want, p.Placement.GPUs)
			assert.Equal(t, len(tc.want), p.Request.GPUs, "held whole")
			assert.Empty(t, p.Placement.Sharing)
		})
	}
}

func class(name string, strategy gpuconfig.SharingStrategy) *resourceapi.DeviceClass {
	raw, _ := json.Marshal(map[string]any{"apiVersion": gpuconfig.APIVersion, "kind": gpuconfig.Kind, "sharing": map[string]any{"strategy": strategy}})
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: driverOnlySelector}}},
		Config:    []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: raw}}}}},
	}}
}

func claim(name string, reqs ...resourceapi.ExactDeviceRequest) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for i, r := range reqs {
		r := r
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: string(rune('a' + i)), Exactly: &r})
	}
	return c
}

func TestPodGPURequest(t *testing.T) {
	classes := map[string]*resourceapi.DeviceClass{
		"gpu.tessera.dev":           class("gpu.tessera.dev", gpuconfig.Exclusive),
		"mps.gpu.tessera.dev":       class("mps.gpu.tessera.dev", gpuconfig.MPS),
		"timeslice.gpu.tessera.dev": class("timeslice.gpu.tessera.dev", gpuconfig.TimeSlicing),
		"nic.example.com":           {ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}},
	}
	lookup := func(n string) *resourceapi.DeviceClass { return classes[n] }
	mem := func(q string) *resourceapi.CapacityRequirements {
		return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{draname.CapacityMemory: resource.MustParse(q)}}
	}
	tests := []gpuRequestCase{
		{name: "one whole GPU by default", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"})}, want: core.Request{GPUs: 1}, tessera: true},
		{name: "counts add up over claims", claims: []*resourceapi.ResourceClaim{
			claim("c1", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Count: 2}),
			claim("c2", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Count: 3}),
		}, want: core.Request{GPUs: 5}, tessera: true},
		{name: "MPS fraction", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "mps.gpu.tessera.dev", Capacity: mem("40Gi")})},
			want: core.Request{GPUMemory: 40 << 30, Sharing: core.SharingMPS}, tessera: true},
		{name: "time-sliced fraction", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice.gpu.tessera.dev", Capacity: mem("10Gi")})},
			want: core.Request{GPUMemory: 10 << 30, Sharing: core.SharingTimeSlice}, tessera: true},
		{name: "other drivers' claims are not GPUs", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com"})}},
		{name: "unknown class", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "nope"})}, err: `DeviceClass "nope" not found`},
		{name: "memory on an exclusive class", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Capacity: mem("1Gi")})}, err: "use DeviceClass mps.gpu.tessera.dev"},
		{name: "fraction with count 2", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "mps.gpu.tessera.dev", Count: 2, Capacity: mem("1Gi")})}, err: "count must be 1"},
		{name: "whole and fraction", claims: []*resourceapi.ResourceClaim{
			claim("c1", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}),
			claim("c2", resourceapi.ExactDeviceRequest{DeviceClassName: "mps.gpu.tessera.dev", Capacity: mem("1Gi")}),
		}, err: "not both"},
		{name: "allocation mode All", claims: []*resourceapi.ResourceClaim{claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeAll})}, err: "allocationMode All"},
	}
	checkGPURequests(t, lookup, tests)
}

// gpuRequestCase is one row of podGPURequest's tables: what the pod's
// claims translate to (its own request, its alternatives and the
// subrequest of each), or the error.
type gpuRequestCase struct {
	name    string
	claims  []*resourceapi.ResourceClaim
	want    core.Request
	alts    []core.Request
	choices []subrequestChoice
	tessera bool
	err     string
}

func checkGPURequests(t *testing.T, lookup classLookup, tests []gpuRequestCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podGPURequest(tc.claims, lookup)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.req)
			assert.Equal(t, tc.alts, got.alts)
			assert.Equal(t, tc.choices, got.choices)
			assert.Equal(t, tc.tessera, got.tessera)
		})
	}
}

func TestNVLinkConstraint(t *testing.T) {
	c := claim("c", resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev", Count: 2})
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(draname.AttrNVLinkDomain))}}
	got, err := podGPURequest([]*resourceapi.ResourceClaim{c}, func(string) *resourceapi.DeviceClass { return class("gpu.tessera.dev", gpuconfig.Exclusive) })
	require.NoError(t, err)
	assert.Equal(t, core.NVLinkRequired, got.req.NVLink)
}

func TestQueueFromObject(t *testing.T) {
	q := &schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: schedv1.QueueSpec{
		Parent: "org", Priority: ptr.To[int32](120),
		Resources: schedv1.QueueResources{
			GPU:    &schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("2.5")), Limit: ptr.To(resource.MustParse("-1")), OverQuotaWeight: ptr.To[int32](3)},
			Memory: &schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("1Gi"))},
		},
	}}
	got, err := queueFromObject(q, time.Time{})
	require.NoError(t, err)
	assert.Equal(t, "org", got.Parent)
	assert.Equal(t, int32(120), got.Priority)
	assert.Equal(t, core.QueueResource{Quota: 2500, Limit: core.Unlimited, OverQuotaWeight: 3}, got.Resources[core.ResGPU])
	assert.Equal(t, int64(1<<30), got.Resources[core.ResMemory].Quota)
	assert.Equal(t, core.Unlimited, got.Resources[core.ResCPU].Quota, "cpu quota defaults to unlimited")
}

// TestQueueSchedule: a Queue's windows give the settings in effect at the
// cycle's time (New York business hours across the spring-forward weekend),
// its time protections reach the core (unset: inherited), and a window that
// breaks the queue's rules fails the queue whether it holds or not.
func TestQueueSchedule(t *testing.T) {
	q := &schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: schedv1.QueueSpec{
		Resources:         schedv1.QueueResources{GPU: &schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("1")), Limit: ptr.To(resource.MustParse("8"))}},
		ReclaimMinRuntime: &metav1.Duration{Duration: 30 * time.Minute},
		Schedule: []schedv1.QueueWindow{{Days: []string{"Mon-Fri"}, Start: "09:00", End: "17:00", TimeZone: "America/New_York",
			Resources: schedv1.WindowResources{GPU: &schedv1.WindowQuota{Quota: ptr.To(resource.MustParse("4"))}}}},
	}}
	for _, c := range []struct {
		at    string
		quota int64
		next  string
	}{
		{"2026-03-06T16:59:00-05:00", 4000, "2026-03-06T17:00:00-05:00"},
		{"2026-03-06T17:00:00-05:00", 1000, "2026-03-09T09:00:00-04:00"},
		{"2026-03-09T08:59:59-04:00", 1000, "2026-03-09T09:00:00-04:00"},
		{"2026-03-09T09:00:00-04:00", 4000, "2026-03-09T17:00:00-04:00"},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		got, err := queueFromObject(q, at)
		require.NoError(t, err)
		assert.Equal(t, core.QueueResource{Quota: c.quota, Limit: 8000, OverQuotaWeight: 1}, got.Resources[core.ResGPU], "at %s", c.at)
		assert.Equal(t, 30*time.Minute, got.ReclaimMinRuntime)
		assert.Equal(t, core.InheritDuration, got.PreemptMinRuntime)
		assert.Equal(t, core.InheritDuration, got.PreemptionDelay)
		next, _ := time.Parse(time.RFC3339, c.next)
		assert.True(t, nextWindowChange(q, at).Equal(next), "next change after %s: %s, want %s", c.at, nextWindowChange(q, at), c.next)
	}
	bad := q.DeepCopy()
	bad.Spec.Schedule[0].Resources.GPU.Quota = ptr.To(resource.MustParse("9"))
	_, err := queueFromObject(bad, time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)) // a Sunday: the window does not hold
	require.ErrorContains(t, err, "queue team: spec.schedule[0]: gpu quota is above its limit while the window holds")
	bad = q.DeepCopy()
	bad.Spec.Schedule[0].TimeZone = "Mars/Olympus"
	_, err = queueFromObject(bad, time.Time{})
	require.ErrorContains(t, err, `queue team: spec.schedule[0]: timeZone: "Mars/Olympus" is not an IANA time zone name`)
}

// A quota or limit that would wrap, or a weight below 0, is an error naming
// the queue, the field and its value; never a wrapped number.
func TestQueueFromObjectInvalid(t *testing.T) {
	for _, c := range []struct {
		name string
		rq   schedv1.ResourceQuota
		res  string // gpu, cpu or memory
		want string
	}{
		{"GPU quota past 2^63 milli", schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("9223372036854776"))}, "gpu",
			"queue team: spec.resources.gpu.quota 9223372036854776: is above the most Tessera accepts, 4611686018427387904m"},
		{"GPU limit 1e100", schedv1.ResourceQuota{Limit: ptr.To(resource.MustParse("1e100"))}, "gpu", "spec.resources.gpu.limit 10e99: is above the most"},
		{"memory quota 10E", schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("10E"))}, "memory", "spec.resources.memory.quota 10E: is above the most Tessera accepts, 4Ei"},
		{"negative other than -1", schedv1.ResourceQuota{Quota: ptr.To(resource.MustParse("-2"))}, "cpu", "spec.resources.cpu.quota -2: is negative; -1 means unlimited"},
		{"negative weight", schedv1.ResourceQuota{OverQuotaWeight: ptr.To[int32](-1)}, "gpu", "spec.resources.gpu.overQuotaWeight -1: is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team"}}
			switch c.res {
			case "gpu":
				q.Spec.Resources.GPU = &c.rq
			case "cpu":
				q.Spec.Resources.CPU = &c.rq
			default:
				q.Spec.Resources.Memory = &c.rq
			}
			_, err := queueFromObject(q, time.Time{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	// Large but in range: read exactly.
	q := &schedv1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "big"}, Spec: schedv1.QueueSpec{Resources: schedv1.QueueResources{
		Memory: &schedv1.ResourceQuota{Limit: ptr.To(resource.MustParse("1Ei"))}}}}
	got, err := queueFromObject(q, time.Time{})
	require.NoError(t, err)
	assert.Equal(t, int64(1)<<60, got.Resources[core.ResMemory].Limit)
}

func TestPodGroupSpec(t *testing.T) {
	pg := &schedv1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: schedv1.PodGroupSpec{MinMember: 3, Queue: "team"}}
	got, err := podGroupSpec(pg)
	require.NoError(t, err)
	assert.Equal(t, groupSpec{minMember: 3, queue: "team"}, got)
	pg.Spec.SubGroups = []schedv1.PodSubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 2}}
	got, err = podGroupSpec(pg)
	require.NoError(t, err)
	assert.Equal(t, []core.SubGroup{{Name: "leader", MinMember: 1}, {Name: "workers", MinMember: 2}}, got.subGroups)
	for _, m := range []int32{0, -1, -2147483648} {
		pg.Spec.MinMember = m
		_, err := podGroupSpec(pg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("PodGroup ns/g: spec.minMember %d must be at least 1", m))
	}
}

func TestToleratesAll(t *testing.T) {
	taints := []v1.Taint{{Key: "a", Effect: v1.TaintEffectNoSchedule}, {Key: "b", Effect: v1.TaintEffectPreferNoSchedule}}
	assert.False(t, toleratesAll(nil, taints))
	assert.True(t, toleratesAll([]v1.Toleration{{Key: "a", Operator: v1.TolerationOpExists}}, taints), "PreferNoSchedule does not block")
	assert.True(t, toleratesAll(nil, nil))
}

func TestPodResources(t *testing.T) {
	rl := func(kv ...string) v1.ResourceList {
		out := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	always := v1.ContainerRestartPolicyAlways
	cases := []struct {
		name      string
		spec      v1.PodSpec
		cpu, mem  int64
		wantOther map[string]int64
	}{
		{
			name: "an init container's larger request wins",
			spec: v1.PodSpec{
				Containers:     []v1.Container{{Resources: v1.ResourceRequirements{Requests: rl("cpu", "1", "memory", "1Gi")}}, {Resources: v1.ResourceRequirements{Requests: rl("cpu", "500m")}}},
				InitContainers: []v1.Container{{Resources: v1.ResourceRequirements{Requests: rl("cpu", "4")}}},
			},
			cpu: 4000, mem: 1 << 30, wantOther: map[string]int64{"pods": 1},
		},
		{
			name: "sidecars run alongside; overhead counts",
			spec: v1.PodSpec{
				Containers:     []v1.Container{{Resources: v1.ResourceRequirements{Requests: rl("cpu", "1")}}},
				InitContainers: []v1.Container{{RestartPolicy: &always, Resources: v1.ResourceRequirements{Requests: rl("cpu", "250m")}}},
				Overhead:       rl("cpu", "100m"),
			},
			cpu: 1350, wantOther: map[string]int64{"pods": 1},
		},
		{
			name: "extended resources, hugepages and ephemeral storage",
			spec: v1.PodSpec{Containers: []v1.Container{
				{Resources: v1.ResourceRequirements{Requests: rl("example.com/widget", "2", "hugepages-2Mi", "4Mi", "ephemeral-storage", "1Gi")}},
				{Resources: v1.ResourceRequirements{Requests: rl("example.com/widget", "1")}},
			}},
			wantOther: map[string]int64{"pods": 1, "example.com/widget": 3, "hugepages-2Mi": 4 << 20, "ephemeral-storage": 1 << 30},
		},
		{
			name: "host ports, each once, TCP by default",
			spec: v1.PodSpec{
				InitContainers: []v1.Container{{Ports: []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}}},
				Containers: []v1.Container{{Ports: []v1.ContainerPort{
					{ContainerPort: 80, HostPort: 8080, Protocol: v1.ProtocolTCP}, {ContainerPort: 53, HostPort: 53, Protocol: v1.ProtocolUDP}, {ContainerPort: 9000},
				}}},
			},
			wantOther: map[string]int64{"pods": 1, "host port TCP/8080": 1, "host port UDP/53": 1},
		},
		{
			name: "pod-level requests",
			spec: v1.PodSpec{
				Resources:  &v1.ResourceRequirements{Requests: rl("cpu", "3", "memory", "2Gi")},
				Containers: []v1.Container{{Resources: v1.ResourceRequirements{Requests: rl("cpu", "1")}}},
			},
			cpu: 3000, mem: 2 << 30, wantOther: map[string]int64{"pods": 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cpu, mem, other, err := podResources(&v1.Pod{Spec: c.spec})
			require.NoError(t, err)
			assert.Equal(t, c.cpu, cpu, "cpu")
			assert.Equal(t, c.mem, mem, "memory")
			assert.Equal(t, c.wantOther, other)
		})
	}
}

// Amounts past core.MaxAmount (or past 2^63, where Value and MilliValue
// wrap) are an error naming the resource and its value, and count as
// MaxAmount, so a bound pod asking for them still holds its node.
func TestPodResourcesOutOfRange(t *testing.T) {
	for _, c := range []struct {
		name, res, value, want string
		cpu, mem               int64
		other                  map[string]int64
	}{
		{name: "cpu wraps in milli", res: "cpu", value: "9223372036854776", want: "asks for cpu 9223372036854776: is above the most Tessera accepts, 70368744177664m", cpu: core.MaxAmount},
		{name: "memory past 2^63", res: "memory", value: "9223372036854775808", want: "asks for memory 9223372036854775808: is above the most Tessera accepts, 64Ti", mem: core.MaxAmount},
		{name: "memory 1e100", res: "memory", value: "1e100", want: "asks for memory 10e99: is above", mem: core.MaxAmount},
		{name: "extended resource 10E", res: "example.com/widget", value: "10E", want: "asks for example.com/widget 10E: is above the most Tessera accepts, 70368744177664", other: map[string]int64{"example.com/widget": core.MaxAmount}},
		{name: "just below the maximum", res: "memory", value: "64Ti", mem: core.MaxAmount},
	} {
		t.Run(c.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceName(c.res): resource.MustParse(c.value)}}}}}}
			cpu, mem, other, err := podResources(pod)
			if c.want == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.want)
			}
			assert.Equal(t, c.cpu, cpu, "cpu")
			assert.Equal(t, c.mem, mem, "memory")
			for name, v := range c.other {
				assert.Equal(t, v, other[name], name)
			}
		})
	}
}

// A node's allocatable is clamped to core.MaxAmount, never wrapped.
func TestNodeAmountsClamped(t *testing.T) {
	alloc := v1.ResourceList{v1.ResourceCPU: resource.MustParse("9223372036854776"), v1.ResourceMemory: resource.MustParse("1e100"), "example.com/widget": resource.MustParse("10E")}
	assert.Equal(t, core.MaxAmount, nodeAmount(alloc, v1.ResourceCPU))
	assert.Equal(t, core.MaxAmount, nodeAmount(alloc, v1.ResourceMemory))
	assert.Equal(t, core.MaxAmount, nodeOther(&v1.Node{Status: v1.NodeStatus{Allocatable: alloc}})["example.com/widget"])
	assert.Equal(t, int64(8000), nodeAmount(v1.ResourceList{v1.ResourceCPU: resource.MustParse("8")}, v1.ResourceCPU))
}

func TestNodeOther(t *testing.T) {
	n := &v1.Node{Status: v1.NodeStatus{Allocatable: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("1Gi"),
		v1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("4"),
	}}}
	assert.Equal(t, map[string]int64{"pods": 110, "nvidia.com/gpu": 4}, nodeOther(n))
}

func TestAddHostPorts(t *testing.T) {
	snap := &core.Snapshot{Nodes: []core.Node{{Name: "a"}, {Name: "b", Other: map[string]int64{"pods": 110}}}}
	jobs := map[string]*core.Job{"j": {Pods: []core.Pod{{Request: core.Request{Other: map[string]int64{"pods": 1, "host port TCP/8080": 1}}}}}}
	addHostPorts(snap, jobs)
	assert.Equal(t, map[string]int64{"host port TCP/8080": 1}, snap.Nodes[0].Other)
	assert.Equal(t, map[string]int64{"pods": 110, "host port TCP/8080": 1}, snap.Nodes[1].Other)
}
