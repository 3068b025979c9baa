package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFormatBytes(t *testing.T) {
	for _, c := range []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{512, "512"},
		{20 << 30, "20Gi"},
		{1536 << 20, "1536Mi"},
		{3 << 40, "3Ti"},
		{263853748 << 10, "251.63Gi"}, // a node's allocatable, in Ki
		{550e9, "512.23Gi"},           // "550G"
		{755813888, "720.8Mi"},
		{1536, "1.5Ki"},
		{(1 << 30) + 1, "1Gi"}, // rounds to two decimals
	} {
		assert.Equal(t, c.want, formatBytes(c.in), "%d bytes", c.in)
	}
}
