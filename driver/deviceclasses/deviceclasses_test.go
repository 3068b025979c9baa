package deviceclasses

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
)

func TestLoad(t *testing.T) {
	classes, err := Load()
	require.NoError(t, err)
	want := map[string]v1alpha1.SharingStrategy{Exclusive: v1alpha1.Exclusive, MPS: v1alpha1.MPS, TimeSlicing: v1alpha1.TimeSlicing}
	require.Len(t, classes, len(want))
	for _, dc := range classes {
		strategy, ok := want[dc.Name]
		require.True(t, ok, dc.Name)
		require.Len(t, dc.Spec.Selectors, 1)
		assert.Equal(t, `device.driver == "gpu.tessera.dev"`, dc.Spec.Selectors[0].CEL.Expression)
		require.Len(t, dc.Spec.Config, 1)
		opaque := dc.Spec.Config[0].Opaque
		require.NotNil(t, opaque)
		assert.Equal(t, "gpu.tessera.dev", opaque.Driver)
		cfg, err := v1alpha1.Parse(opaque.Parameters.Raw)
		require.NoError(t, err, "the class config must pass strict decoding")
		assert.Equal(t, strategy, cfg.Strategy())
	}
}
