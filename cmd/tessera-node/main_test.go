package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/gpufault"
)

// TestArmGPUFaults: the test fault file is inert unless its variable is
// set, refused without fake GPUs, and with them makes a listed GPU
// unhealthy.
func TestArmGPUFaults(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logger := klog.Background()
	fake, err := gpu.NewFake("l4-2", "node-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })

	t.Setenv(gpufault.Env, "")
	require.NoError(t, armGPUFaults(ctx, logger, nil), "unset: nothing armed, real GPUs or not")

	path := filepath.Join(t.TempDir(), "faults")
	t.Setenv(gpufault.Env, path)
	err = armGPUFaults(ctx, logger, nil)
	require.Error(t, err, "no fake GPUs")
	assert.Contains(t, err.Error(), gpufault.Env)
	assert.Contains(t, err.Error(), "--fake-gpus")

	health := fake.Health(ctx)
	require.NoError(t, armGPUFaults(ctx, logger, fake))
	require.NoError(t, os.WriteFile(path, []byte("1\n"), 0o644))
	select {
	case e := <-health:
		assert.Equal(t, 1, e.Index)
		assert.False(t, e.Healthy)
	case <-time.After(5 * time.Second):
		t.Fatal("GPU 1 not reported unhealthy 5s after the fault file listed it")
	}
}
