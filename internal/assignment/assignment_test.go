package assignment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    Assignment
		wantErr string
	}{
		{name: "whole GPUs", value: `{"gpus":[0,1]}`, want: Assignment{GPUs: []int{0, 1}}},
		{name: "share", value: `{"gpus":[3],"memoryBytes":1024,"computeMilli":250,"sharing":"MPS"}`,
			want: Assignment{GPUs: []int{3}, MemoryBytes: 1024, ComputeMilli: 250, Sharing: SharingMPS}},
		{name: "not JSON", value: `gpu-3`, wantErr: "is not valid JSON"},
		{name: "no GPUs", value: `{"gpus":[]}`, wantErr: "no GPUs"},
		{name: "unsorted", value: `{"gpus":[1,0]}`, wantErr: "not ascending"},
		{name: "duplicate", value: `{"gpus":[1,1]}`, wantErr: "not ascending and distinct"},
		{name: "negative", value: `{"gpus":[-1]}`, wantErr: "negative"},
		{name: "share of two", value: `{"gpus":[0,1],"memoryBytes":1,"computeMilli":5,"sharing":"MPS"}`, wantErr: "share is of one GPU"},
		{name: "share without memory", value: `{"gpus":[0],"computeMilli":5,"sharing":"MPS"}`, wantErr: "memoryBytes > 0"},
		{name: "share without compute", value: `{"gpus":[0],"memoryBytes":5,"sharing":"TimeSlicing"}`, wantErr: "computeMilli in 1..999"},
		{name: "unknown sharing", value: `{"gpus":[0],"memoryBytes":5,"computeMilli":5,"sharing":"MIG"}`, wantErr: `sharing "MIG"`},
		{name: "memory without sharing", value: `{"gpus":[0],"memoryBytes":5}`, wantErr: "without a sharing mode"},
		{name: "UUIDs mismatch", value: `{"gpus":[0,1],"uuids":["GPU-a"]}`, wantErr: "1 UUIDs for 2 GPUs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.value)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Contains(t, err.Error(), Annotation)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			again, err := Parse(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, again, "String and Parse round-trip")
		})
	}
}

func TestOf(t *testing.T) {
	_, ok, err := Of(map[string]string{"other": "x"})
	assert.False(t, ok)
	assert.NoError(t, err)
	a, ok, err := Of(map[string]string{Annotation: `{"gpus":[2]}`})
	assert.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, a.GPUs)
	_, ok, err = Of(map[string]string{Annotation: `{`})
	assert.True(t, ok)
	assert.Error(t, err)
}
