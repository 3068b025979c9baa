package driver

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/gpu"
)

// TestNodeClique: the node's label is the clique its GPUs agree on; GPUs
// without one do not count, GPUs in two cliques leave the node unlabelled.
func TestNodeClique(t *testing.T) {
	const a, b = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.1", "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.2"
	devs := func(cliques ...string) []gpu.Device {
		var out []gpu.Device
		for i, c := range cliques {
			out = append(out, gpu.Device{Index: i, Clique: c})
		}
		return out
	}
	for _, c := range []struct {
		name string
		devs []gpu.Device
		want string
	}{
		{"no GPUs", nil, ""},
		{"no clique", devs("", ""), ""},
		{"one clique", devs(a, a, a, a), a},
		{"some GPUs registered", devs("", a, "", a), a},
		{"two cliques", devs(a, a, b, b), ""},
	} {
		assert.Equal(t, c.want, nodeClique(klog.Background(), c.devs), c.name)
	}
}
