package driver

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
)

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// TestCheckpointSaveFailureLeavesNoTemp: a write that fails after its temp
// file exists (here the rename: checkpoint.json is a directory) removes it.
func TestCheckpointSaveFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	s := checkpointStore{path: filepath.Join(dir, CheckpointFile)}
	require.NoError(t, os.MkdirAll(filepath.Join(s.path, "x"), 0o750))
	err := s.Save(sampleCheckpoint())
	require.ErrorContains(t, err, "replacing checkpoint")
	assert.Equal(t, []string{CheckpointFile}, dirNames(t, dir))
}

// TestCheckpointRemoveTemps: only the store's own temp files go.
func TestCheckpointRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	s := checkpointStore{path: filepath.Join(dir, CheckpointFile)}
	require.NoError(t, s.Save(sampleCheckpoint()))
	for _, name := range []string{".checkpoint.json.tmp-123", ".checkpoint.json.tmp-", "checkpoint.json.bad-20260101T000000Z", ".other.json.tmp-1", "dra.sock"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("{"), 0o600))
	}
	removed, err := s.RemoveTemps()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{".checkpoint.json.tmp-123", ".checkpoint.json.tmp-"}, removed)
	assert.Equal(t, []string{".other.json.tmp-1", CheckpointFile, "checkpoint.json.bad-20260101T000000Z", "dra.sock"}, dirNames(t, dir))
	_, err = s.Load("boot-1")
	require.NoError(t, err, "the checkpoint itself is untouched")

	removed, err = checkpointStore{path: filepath.Join(dir, "missing", CheckpointFile)}.RemoveTemps()
	require.NoError(t, err, "a directory not created yet has nothing to remove")
	assert.Empty(t, removed)
}

// TestRestoreRemovesTemps: the temp files killed writes left, of the
// checkpoint and of CDI specs, are gone after a restart's restore; the
// checkpoint's claims and their specs stay.
func TestRestoreRemovesTemps(t *testing.T) {
	d, _ := newUnitDriver(t, "h100-sxm-8")
	kept := claim("ns", "kept", "uid-kept", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-1", "10Gi")}, timeSliced)
	require.NoError(t, prepare(t, d, kept)["uid-kept"].Err)
	dir := filepath.Dir(d.store.path)
	cdiRoot := d.cdi.Root()
	for range 10 {
		f, err := os.CreateTemp(dir, d.store.tempPrefix()+"*")
		require.NoError(t, err)
		f.Close()
		f, err = os.CreateTemp(cdiRoot, ".gpu.tessera.dev-claim_uid-kept.json.tmp-*")
		require.NoError(t, err)
		_, _ = f.WriteString(`{"cdiVersion":`)
		f.Close()
	}
	require.NoError(t, d.restore(context.Background()))
	for _, name := range dirNames(t, dir) {
		assert.NotContains(t, name, ".tmp-", "checkpoint directory")
	}
	assert.Equal(t, []string{"gpu.tessera.dev-claim_uid-kept.json"}, dirNames(t, cdiRoot))
	require.Contains(t, d.ckpt.Claims, "uid-kept")
	assert.Equal(t, StatePrepared, d.ckpt.Claims["uid-kept"].State)
}

// TestLockDir: a second tessera-node on the same plugin directory waits
// for the first one's lock, and gets it once the first is gone.
func TestLockDir(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDir(context.Background(), dir)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = lockDir(ctx, dir)
	require.ErrorContains(t, err, "held by another tessera-node")

	got := make(chan error, 1)
	go func() {
		second, err := lockDir(context.Background(), dir)
		if err == nil {
			second.Close()
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, first.Close())
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the second lock was not taken after the first was released")
	}
}
