package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// LockFile is the lock in the plugin data directory that one tessera-node
// holds for its whole life: the checkpoint (and its temp files) have one
// writer, so a restart may remove what a killed writer left. The kernel
// drops the lock when the process dies, however it dies.
const LockFile = "tessera-node.lock"

// lockDir takes the directory's lock, waiting (until ctx is done) while
// another tessera-node holds it, e.g. the old pod of a rolling update that
// is still stopping.
func lockDir(ctx context.Context, dir string) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if sameFile(f, path) {
				return f, nil
			}
			// The holder removed the file before letting go (an uninstall,
			// Driver.RemoveState): this lock guards nothing; lock the path
			// anew.
			f.Close()
			if err := os.MkdirAll(dir, 0o750); err != nil {
				return nil, fmt.Errorf("creating %s: %w", dir, err)
			}
			if f, err = os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600); err != nil {
				return nil, fmt.Errorf("opening lock %s: %w", path, err)
			}
			continue
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !logged {
			klog.FromContext(ctx).Info("Another tessera-node holds the plugin directory; waiting for it to exit", "lock", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the lock %s held by another tessera-node: %w", path, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sameFile says whether f is still the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}
