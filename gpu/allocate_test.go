package gpu

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func retName(r nvml.Return) string {
	if r == nvml.SUCCESS {
		return "SUCCESS"
	}
	return nvml.ErrorString(r)
}

func uuidsOf(devs []Device, idx ...int) []string {
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, devs[i].UUID)
	}
	return out
}

func allUUIDs(devs []Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.UUID)
	}
	return out
}

func TestPreferredAllocation(t *testing.T) {
	tests := []struct {
		name      string
		profile   string
		available []int
		required  []int
		size      int
		// anyOf lists acceptable answers (as GPU indices); nil means any
		// size-long subset of available.
		anyOf [][]int
	}{
		{name: "a100 pair", profile: "a100-pcie-4", available: []int{0, 1, 2, 3}, size: 2, anyOf: [][]int{{0, 1}, {2, 3}}},
		{name: "a100 pair after one used", profile: "a100-pcie-4", available: []int{1, 2, 3}, size: 2, anyOf: [][]int{{2, 3}}},
		{name: "a100 partner of required", profile: "a100-pcie-4", available: []int{0, 1, 2, 3}, required: []int{2}, size: 2, anyOf: [][]int{{2, 3}}},
		{name: "a100 partner of required 1", profile: "a100-pcie-4", available: []int{0, 1, 2, 3}, required: []int{1}, size: 2, anyOf: [][]int{{0, 1}}},
		{name: "a100 all four", profile: "a100-pcie-4", available: []int{0, 1, 2, 3}, size: 4, anyOf: [][]int{{0, 1, 2, 3}}},
		{name: "h100 any two", profile: "h100-sxm-8", available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 2},
		{name: "h100 four", profile: "h100-sxm-8", available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 4},
		{name: "h200 eight", profile: "h200-sxm-8", available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 8, anyOf: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{name: "l4 no nvlink", profile: "l4-2", available: []int{0, 1}, size: 2, anyOf: [][]int{{0, 1}}},
		{name: "l4 one", profile: "l4-2", available: []int{0, 1}, size: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, tc.profile)
			devs, err := f.Devices()
			require.NoError(t, err)
			got, err := PreferredAllocation(f, uuidsOf(devs, tc.available...), uuidsOf(devs, tc.required...), tc.size)
			require.NoError(t, err)
			require.Len(t, got, tc.size)
			avail := uuidsOf(devs, tc.available...)
			for _, u := range got {
				assert.Contains(t, avail, u)
			}
			for _, u := range uuidsOf(devs, tc.required...) {
				assert.Contains(t, got, u)
			}
			if tc.anyOf != nil {
				ok := false
				for _, want := range tc.anyOf {
					if assert.ObjectsAreEqual(len(want), len(got)) && subset(uuidsOf(devs, want...), got) {
						ok = true
					}
				}
				assert.True(t, ok, "got %v, want one of %v", indices(devs, got), tc.anyOf)
			}
		})
	}
}

func subset(want, got []string) bool {
	set := map[string]bool{}
	for _, g := range got {
		set[g] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func indices(devs []Device, uuids []string) []int {
	var out []int
	for _, u := range uuids {
		for _, d := range devs {
			if d.UUID == u {
				out = append(out, d.Index)
			}
		}
	}
	return out
}

func TestPreferredAllocationErrors(t *testing.T) {
	f := newFake(t, "l4-2")
	devs, err := f.Devices()
	require.NoError(t, err)
	_, err = PreferredAllocation(f, []string{"GPU-missing"}, nil, 1)
	assert.ErrorContains(t, err, "GPU-missing")

	got, err := PreferredAllocation(f, allUUIDs(devs), nil, 3)
	require.NoError(t, err)
	assert.Empty(t, got, "cannot allocate more than available")

	_, err = PreferredAllocation(notNVML{}, nil, nil, 1)
	assert.ErrorContains(t, err, "has no NVML")
}

type notNVML struct{ Inventory }

func (notNVML) Health(context.Context) <-chan HealthEvent { return nil }
