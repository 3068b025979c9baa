package kube

import (
	"fmt"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// fourGPUs is a node of four 80 GiB GPUs with UUIDs GPU-0..GPU-3.
func fourGPUs(t *testing.T) *nodeGPUs {
	node := "n1"
	sl := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, Generation: 1}}}
	for i := int64(0); i < 4; i++ {
		d := device(i, "d", false)
		d.Attributes[draname.AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("GPU-%d", i))}
		sl.Spec.Devices = append(sl.Spec.Devices, d)
	}
	g := gpusFromSlices(klog.Background(), []*resourceapi.ResourceSlice{sl})
	require.Len(t, g.gpus, 4)
	return g
}

func TestAssignmentPlacement(t *testing.T) {
	g := fourGPUs(t)
	const gpuMem = 80 << 30
	cases := []struct {
		name string
		a    assignment.Assignment
		want core.Placement
	}{
		{"whole GPUs", assignment.Assignment{GPUs: []int{1, 3}},
			core.Placement{Node: "n1", GPUs: []int{1, 3}, GPUMilli: []int64{1000, 1000}, GPUMemory: []int64{gpuMem, gpuMem}}},
		{"MPS share", assignment.Assignment{GPUs: []int{2}, MemoryBytes: 40 << 30, ComputeMilli: 500, Sharing: assignment.SharingMPS},
			core.Placement{Node: "n1", GPUs: []int{2}, GPUMilli: []int64{500}, GPUMemory: []int64{40 << 30}, Sharing: core.SharingMPS}},
		{"time-sliced share", assignment.Assignment{GPUs: []int{0}, MemoryBytes: 10 << 30, ComputeMilli: 125, Sharing: assignment.SharingTimeSlicing},
			core.Placement{Node: "n1", GPUs: []int{0}, GPUMilli: []int64{125}, GPUMemory: []int64{10 << 30}, Sharing: core.SharingTimeSlice}},
		{"a GPU gone from the slice is left out", assignment.Assignment{GPUs: []int{3, 7}},
			core.Placement{Node: "n1", GPUs: []int{3}, GPUMilli: []int64{1000}, GPUMemory: []int64{gpuMem}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, assignmentPlacement("n1", c.a, g))
		})
	}
}

func TestMalformedPlacement(t *testing.T) {
	g := fourGPUs(t)
	cases := []struct {
		name, value string
		want        []int
	}{
		{"share on two GPUs: both held whole", `{"gpus":[2,1],"memoryBytes":1,"computeMilli":500,"sharing":"MPS"}`, []int{1, 2}},
		{"bad sharing mode", `{"gpus":[0],"sharing":"MIG"}`, []int{0}},
		{"not JSON: every GPU", `gpu 1 please`, []int{0, 1, 2, 3}},
		{"no GPUs: every GPU", `{"gpus":[]}`, []int{0, 1, 2, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := assignment.Parse(c.value)
			require.Error(t, err, "the case must be malformed")
			pl := malformedPlacement("n1", c.value, g)
			assert.Equal(t, c.want, pl.GPUs)
			assert.Empty(t, pl.Sharing, "held whole")
			for _, m := range pl.GPUMilli {
				assert.Equal(t, int64(1000), m)
			}
		})
	}
}

func TestPlacementAssignment(t *testing.T) {
	g := fourGPUs(t)
	cases := []struct {
		name    string
		pl      core.Placement
		req     core.Request
		want    assignment.Assignment
		wantErr string
	}{
		{"whole GPUs", core.Placement{Node: "n1", GPUs: []int{0, 2}, GPUMilli: []int64{1000, 1000}, GPUMemory: []int64{80 << 30, 80 << 30}}, core.Request{GPUs: 2},
			assignment.Assignment{GPUs: []int{0, 2}, UUIDs: []string{"GPU-0", "GPU-2"}}, ""},
		{"half, MPS", core.Placement{Node: "n1", GPUs: []int{1}, GPUMilli: []int64{500}, GPUMemory: []int64{40 << 30}, Sharing: core.SharingMPS}, core.Request{GPUMilli: 500, Sharing: core.SharingMPS},
			assignment.Assignment{GPUs: []int{1}, UUIDs: []string{"GPU-1"}, MemoryBytes: 40 << 30, ComputeMilli: 500, Sharing: assignment.SharingMPS}, ""},
		{"memory, time-sliced", core.Placement{Node: "n1", GPUs: []int{3}, GPUMilli: []int64{125}, GPUMemory: []int64{10 << 30}}, core.Request{GPUMemory: 10 << 30, Sharing: core.SharingTimeSlice},
			assignment.Assignment{GPUs: []int{3}, UUIDs: []string{"GPU-3"}, MemoryBytes: 10 << 30, ComputeMilli: 125, Sharing: assignment.SharingTimeSlicing}, ""},
		{"all the memory still shares", core.Placement{Node: "n1", GPUs: []int{3}, GPUMilli: []int64{1000}, GPUMemory: []int64{80 << 30}, Sharing: core.SharingMPS}, core.Request{GPUMemory: 80 << 30},
			assignment.Assignment{GPUs: []int{3}, UUIDs: []string{"GPU-3"}, MemoryBytes: 80 << 30, ComputeMilli: 999, Sharing: assignment.SharingMPS}, ""},
		{"a GPU without a device: no UUIDs", core.Placement{Node: "n1", GPUs: []int{3, 9}}, core.Request{GPUs: 2},
			assignment.Assignment{GPUs: []int{3, 9}}, ""},
		{"a share on two GPUs", core.Placement{Node: "n1", GPUs: []int{0, 1}, GPUMilli: []int64{500, 500}, GPUMemory: []int64{1, 1}}, core.Request{GPUMilli: 500},
			assignment.Assignment{}, "a share placed on 2 GPUs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := placementAssignment(c.pl, c.req, g)
			if c.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, a)
			back, err := assignment.Parse(a.String())
			require.NoError(t, err, "what is written reads back")
			if len(a.UUIDs) > 0 { // all its GPUs are on the node
				assert.Equal(t, c.pl.GPUs, assignmentPlacement("n1", back, g).GPUs, "read back, the assignment puts the pod where the core placed it")
			}
		})
	}
}

func TestMergePlacements(t *testing.T) {
	claims := core.Placement{Node: "n1", GPUs: []int{0, 3}, GPUMilli: []int64{1000, 1000}, GPUMemory: []int64{8, 8}}
	dp := core.Placement{Node: "n1", GPUs: []int{1}, GPUMilli: []int64{1000}, GPUMemory: []int64{8}}
	assert.Equal(t, core.Placement{Node: "n1", GPUs: []int{0, 1, 3}, GPUMilli: []int64{1000, 1000, 1000}, GPUMemory: []int64{8, 8, 8}}, mergePlacements(claims, dp))
	assert.Equal(t, dp, mergePlacements(core.Placement{Node: "n1"}, dp))
	assert.Equal(t, claims, mergePlacements(claims, core.Placement{Node: "n1"}))
}

// publishedGPUs is what the controller reads from a node whose slice
// tessera-node's own code built (driver.BuildDevicesHeld, fake h100-sxm-8):
// the contract between both sides, not a hand-written copy of it.
func publishedGPUs(t *testing.T, held driver.DevicePluginHeld) *nodeGPUs {
	t.Helper()
	f, err := gpu.NewFake("h100-sxm-8", "n1")
	require.NoError(t, err)
	devs, err := f.Devices()
	require.NoError(t, err)
	node := "n1"
	sl := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node,
		Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}, Devices: driver.BuildDevicesHeld(devs, nil, held, "")}}
	g := gpusFromSlices(klog.Background(), []*resourceapi.ResourceSlice{sl})
	require.Len(t, g.gpus, 8)
	return g
}

// TestDevicePluginPlacement: what a bound pod is counted as holding through
// the device plugin. The node's record (the UID on a GPU held whole) wins
// over the assignment, a GPU is never counted twice, and an assignment is
// trusted only on a pod that asks for what it assigns.
func TestDevicePluginPlacement(t *testing.T) {
	const uid, otherUID = "11111111-2222-3333-4444-555555555555", "99999999-8888-7777-6666-555555555555"
	const gpuRes = assignment.DefaultResourceGPU
	whole := func(n int64) v1.ResourceList {
		return v1.ResourceList{gpuRes: *resource.NewQuantity(n, resource.DecimalSI)}
	}
	slot := v1.ResourceList{ResourceShare: resource.MustParse("1")}
	uuid := func(i int) string { return gpu.FakeUUID("n1", i) }
	mark := func(pod string, gpus ...int) driver.DevicePluginHeld {
		out := driver.DevicePluginHeld{}
		for _, i := range gpus {
			out[uuid(i)] = driver.DevicePluginMark{Taint: driver.TaintValueWhole, Pod: pod}
		}
		return out
	}
	share := assignment.Assignment{GPUs: []int{5}, MemoryBytes: 10 << 30, ComputeMilli: 125, Sharing: assignment.SharingMPS}.String()
	for _, tc := range []struct {
		name       string
		limits     v1.ResourceList
		ann        map[string]string
		held       driver.DevicePluginHeld
		wantOK     bool
		wantGPUs   []int
		wantShare  bool
		wantEvent  string // reason of the Warning event, "" for none
		wantMetric string // ignored reason counted, or "disagree"
	}{
		{name: "CPU-only pod with a forged \"x\": nothing", ann: map[string]string{AnnotationAssignment: "x"},
			wantEvent: "AssignmentIgnored", wantMetric: ignoredNoRequest},
		{name: "CPU-only pod with a valid-looking assignment: nothing", ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1,2,3,4,5,6,7]}`},
			wantEvent: "AssignmentIgnored", wantMetric: ignoredNoRequest},
		{name: "whole GPUs, not yet allocated: the assignment", limits: whole(2), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			wantOK: true, wantGPUs: []int{0, 1}},
		{name: "whole GPUs, the kubelet chose others: the node's record only", limits: whole(2), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			held: mark(uid, 2, 3), wantOK: true, wantGPUs: []int{2, 3}, wantMetric: "disagree"},
		{name: "whole GPUs, as assigned: no disagreement", limits: whole(2), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			held: mark(uid, 0, 1), wantOK: true, wantGPUs: []int{0, 1}},
		{name: "first container allocated elsewhere: topped up from the assignment", limits: whole(2), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			held: mark(uid, 6), wantOK: true, wantGPUs: []int{0, 6}},
		{name: "never a GPU another pod holds", limits: whole(2), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			held: mergeHeld(mark(uid, 6), mark(otherUID, 0)), wantOK: true, wantGPUs: []int{1, 6}},
		{name: "no assignment (another scheduler): the node's record", limits: whole(2), held: mark(uid, 4, 5), wantOK: true, wantGPUs: []int{4, 5}},
		{name: "another pod's record is not this pod's", limits: whole(2), held: mark(otherUID, 4, 5)},
		{name: "a share", limits: slot, ann: map[string]string{AnnotationAssignment: share, AnnotationGPUFraction: "0.125"},
			wantOK: true, wantGPUs: []int{5}, wantShare: true},
		{name: "a share without a fraction annotation: ignored", limits: slot, ann: map[string]string{AnnotationAssignment: share},
			wantEvent: "AssignmentIgnored", wantMetric: ignoredNoRequest},
		{name: "a share on a whole-GPU pod: ignored", limits: whole(1), ann: map[string]string{AnnotationAssignment: share},
			wantEvent: "AssignmentIgnored", wantMetric: ignoredMismatch},
		{name: "more GPUs than asked: ignored", limits: whole(1), ann: map[string]string{AnnotationAssignment: `{"gpus":[0,1]}`},
			wantEvent: "AssignmentIgnored", wantMetric: ignoredMismatch},
		{name: "malformed on a GPU pod: every GPU, conservatively", limits: whole(1), ann: map[string]string{AnnotationAssignment: "x"},
			wantOK: true, wantGPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantEvent: "MalformedAssignment"},
		{name: "malformed, but the node recorded: the record", limits: whole(1), ann: map[string]string{AnnotationAssignment: "x"},
			held: mark(uid, 3), wantOK: true, wantGPUs: []int{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			rec := record.NewFakeRecorder(10)
			s := &Scheduler{opts: Options{GPUResource: gpuRes, Metrics: NewMetrics(reg)}, malformed: map[types.UID]string{}, recorder: rec}
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: uid, Annotations: tc.ann},
				Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: tc.limits, Requests: tc.limits}}}}} // requests as the API server defaults them
			g := publishedGPUs(t, tc.held)
			_, _, other, err := podResources(pod)
			require.NoError(t, err)
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			logs := func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
			pl, ok := s.devicePluginPlacement(logger, pod, other, "n1", g)
			require.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.wantGPUs, pl.GPUs)
			assert.Equal(t, tc.wantShare, pl.Sharing != "", "a share")
			var events []string
			for len(rec.Events) > 0 {
				events = append(events, <-rec.Events)
			}
			if tc.wantEvent == "" {
				assert.Empty(t, events)
			} else {
				require.Len(t, events, 1)
				assert.Contains(t, events[0], "Warning "+tc.wantEvent)
			}
			ignored, disagree := counter(t, s.opts.Metrics.assignmentsIgnored.WithLabelValues(tc.wantMetric)), counter(t, s.opts.Metrics.nodeDisagreements)
			switch tc.wantMetric {
			case "":
				assert.Zero(t, disagree)
			case "disagree":
				assert.Equal(t, 1.0, disagree)
			default:
				assert.Equal(t, 1.0, ignored)
			}
			// Logged to the cycle's logger, with the pod.
			wantLog := map[string]string{"AssignmentIgnored": "INFO Ignoring the GPU assignment of a pod",
				"MalformedAssignment": "ERROR Malformed GPU assignment on a bound pod"}[tc.wantEvent]
			if tc.wantMetric == "disagree" {
				wantLog = "INFO The node gave a device-plugin pod other GPUs than its assignment"
			}
			if wantLog == "" {
				assert.Empty(t, logs())
			} else {
				assert.Contains(t, logs(), wantLog)
				assert.Contains(t, logs(), `pod="ns/p" node="n1"`)
			}
			// Reported once, not every cycle.
			before := logs()
			s.devicePluginPlacement(logger, pod, other, "n1", g)
			assert.Equal(t, before, logs())
			assert.Empty(t, rec.Events)
			assert.Equal(t, disagree, counter(t, s.opts.Metrics.nodeDisagreements))
		})
	}
}

func mergeHeld(a, b driver.DevicePluginHeld) driver.DevicePluginHeld {
	out := driver.DevicePluginHeld{}
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
