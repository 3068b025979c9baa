package kube

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// fourGPUs is a node of four 80 GiB GPUs with UUIDs GPU-0..GPU-3.
func fourGPUs(t *testing.T) *nodeGPUs {
	node := "n1"
	sl := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, Generation: 1}}}
	for i := int64(0); i < 4; i++ {
		d := device(i, "d", false)
		d.Attributes[attrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("GPU-%d", i))}
		sl.Spec.Devices = append(sl.Spec.Devices, d)
	}
	g := gpusFromSlices([]*resourceapi.ResourceSlice{sl})
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
