package sharing

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tessera-gpu/tessera/gpu"
)

// smiInventory sets compute modes with nvidia-smi, so the real-MPS check
// does not wait on the NVML inventory.
type smiInventory struct{ *fakeInventory }

func (s *smiInventory) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	m := "DEFAULT"
	if mode == gpu.ComputeModeExclusiveProcess {
		m = "EXCLUSIVE_PROCESS"
	}
	return exec.Command("nvidia-smi", "-i", uuid, "-c", m).Run()
}

// TestRealMPS runs the real nvidia-cuda-mps-control on a real GPU. It runs
// only when TESSERA_REAL_MPS_GPU names a GPU UUID (and needs root).
func TestRealMPS(t *testing.T) {
	uuid := os.Getenv("TESSERA_REAL_MPS_GPU")
	if uuid == "" {
		t.Skip("TESSERA_REAL_MPS_GPU not set: no real GPU/MPS check")
	}
	if _, err := exec.LookPath(DefaultMPSControl); err != nil {
		t.Skip("nvidia-cuda-mps-control not on PATH")
	}
	m := NewMPSManager(&smiInventory{newFakeInventory()}, MPSOptions{Root: t.TempDir(), CheckInterval: 100 * time.Millisecond})
	ctx := context.Background()
	d, err := m.Acquire(ctx, "real-claim", uuid)
	require.NoError(t, err)
	assert.True(t, alive(d.PID))
	assert.FileExists(t, d.PipeDir+"/control")
	require.NoError(t, m.Release(ctx, "real-claim", uuid))
	assert.False(t, alive(d.PID))
}
