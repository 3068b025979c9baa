package driver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrStillPrepared is returned by RemoveState when the ledger still holds
// claims or device-plugin pods: their state must outlive the uninstall so
// that a later install can unprepare them.
var ErrStillPrepared = errors.New("claims or device-plugin pods still prepared")

// RemoveState stops the plugin (as Stop) and, if the ledger is empty,
// removes what tessera-node keeps on the node between lives: the
// checkpoint, its temp files, the lock and the plugin data directory itself
// when nothing else is in it. Only for an uninstall (the DaemonSet is gone):
// an upgrade's new pod would find nothing to adopt. With claims or pods
// still prepared it removes nothing and returns ErrStillPrepared naming
// them.
func (d *Driver) RemoveState() error {
	d.stopPlugin("tessera-node stopping for uninstall")
	defer d.lock.Close()
	return d.removeState()
}

// removeState is RemoveState once the plugin is stopped, the lock held.
func (d *Driver) removeState() error {
	d.mu.Lock()
	var held []string
	for _, cl := range d.ckpt.SortedClaims() {
		held = append(held, "claim "+cl.Namespace+"/"+cl.Name)
	}
	for _, p := range d.ckpt.SortedPods() {
		held = append(held, "pod "+p.Namespace+"/"+p.Name)
	}
	d.mu.Unlock()
	if len(held) > 0 {
		return fmt.Errorf("%w, kept in %s: %s", ErrStillPrepared, d.store.path, strings.Join(held, ", "))
	}
	dir := filepath.Dir(d.store.path)
	if _, err := d.store.RemoveTemps(); err != nil {
		return err
	}
	// The lock goes last and while held: a tessera-node waiting for it
	// (lockDir) notices the file is gone and takes a new one.
	for _, f := range []string{d.store.path, filepath.Join(dir, LockFile)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", f, err)
		}
	}
	// The directory goes only if empty (the DRA socket is already gone).
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		if ents, rerr := os.ReadDir(dir); rerr == nil && len(ents) > 0 {
			return fmt.Errorf("plugin directory %s kept: not empty (%s, ...)", dir, ents[0].Name())
		}
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
