package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
)

// TestRemoveState: an uninstall removes the checkpoint, its temp files,
// the lock and the plugin directory, but only with nothing prepared; a
// tessera-node waiting for the lock meanwhile takes a fresh one.
func TestRemoveState(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prepared bool
		extra    string // another file in the plugin directory
		wantErr  string
	}{
		{name: "empty ledger"},
		{name: "claim prepared", prepared: true, wantErr: "still prepared, kept in"},
		{name: "foreign file", extra: "someone-else", wantErr: "not empty (someone-else"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newUnitDriver(t, "h100-sxm-8")
			// Its own plugin directory (newUnitDriver's holds other files).
			dir := filepath.Join(t.TempDir(), "plugin")
			require.NoError(t, os.MkdirAll(dir, 0o750))
			d.store = checkpointStore{path: filepath.Join(dir, CheckpointFile)}
			var err error
			d.lock, err = lockDir(context.Background(), dir)
			require.NoError(t, err)
			if tc.prepared {
				c := claim("ns", "c1", "uid-1", []resourceapi.DeviceRequestAllocationResult{r("gpu", node, "gpu-0", "")}, exclusive)
				prepare(t, d, c)
				t.Cleanup(func() { unprepare(t, d, c) })
			}
			require.NoError(t, d.store.Save(d.ckpt))
			require.NoError(t, os.WriteFile(filepath.Join(dir, d.store.tempPrefix()+"1"), nil, 0o600))
			if tc.extra != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, tc.extra), nil, 0o600))
			}
			// A second tessera-node waits for the lock.
			got := make(chan error, 1)
			go func() {
				f, err := lockDir(context.Background(), dir)
				if err == nil {
					if !sameFile(f, filepath.Join(dir, LockFile)) {
						err = os.ErrNotExist
					}
					f.Close()
				}
				got <- err
			}()
			time.Sleep(150 * time.Millisecond)
			err = d.removeState()
			d.lock.Close()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				if tc.prepared {
					require.FileExists(t, d.store.path, "the checkpoint is kept")
				}
			} else {
				require.NoError(t, err)
			}
			select {
			case err := <-got:
				require.NoError(t, err, "the waiting tessera-node holds a lock on the file at the path")
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting tessera-node never got the lock")
			}
			if tc.wantErr == "" {
				// The waiter re-created the lock file; nothing else is left.
				require.Equal(t, []string{LockFile}, dirNames(t, dir))
			}
		})
	}
}
