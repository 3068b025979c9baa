package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/internal/killpoint"
)

// Temp files. The CDI library's own writer names its temp files
// "spec.*.tmp" and leaves one behind on a failed write or a kill; in a
// directory other vendors' tools share, such a name says nothing about
// whose it is. Ours start with "." and the spec's name, so they are ours
// alone, and runtimes ignore them (they read *.json and *.yaml).
const (
	tempInfix = ".tmp-"
	// libraryTemp is the CDI library's temp name pattern (v1.1), from
	// tessera-node builds that wrote through it.
	libraryTempPrefix, libraryTempSuffix = "spec.", ".tmp"
)

func tempPrefix(name string) string { return "." + name + tempInfix }

// writeSpec validates spec and writes it as root/name: a temp file, fsync,
// rename, fsync of the directory. On any error the temp file is removed.
func (w *Writer) writeSpec(spec *cdispec.Spec, name string) (err error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encoding CDI spec %s: %w", name, err)
	}
	tmp, err := os.CreateTemp(w.opts.Root, tempPrefix(name)+"*")
	if err != nil {
		return fmt.Errorf("creating CDI spec %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing CDI spec %s: %w", name, err)
	}
	// Validated as a runtime will read it: parsed back from the file.
	if _, err = cdiapi.ReadSpec(tmp.Name(), 0); err != nil {
		return fmt.Errorf("CDI spec %s is invalid: %w", name, err)
	}
	killpoint.Reach(killpoint.CDISpecWrite)
	if err = os.Rename(tmp.Name(), filepath.Join(w.opts.Root, name)); err != nil {
		return fmt.Errorf("replacing CDI spec %s: %w", name, err)
	}
	if d, derr := os.Open(w.opts.Root); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// RemoveTemps deletes the temp files of spec writes that never reached
// their rename (a killed tessera-node leaves one per write it was in): ours
// by name, and the CDI library's "spec.*.tmp" of earlier builds when they
// hold a spec of our kind (an empty one is not provably ours and stays).
// Callers make sure no write is in flight. It returns the names removed.
func (w *Writer) RemoveTemps() ([]string, error) {
	entries, err := os.ReadDir(w.opts.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing CDI specs in %s: %w", w.opts.Root, err)
	}
	// tempPrefix(SpecName(uid)) for any uid.
	ours := "." + cdiapi.GenerateTransientSpecName(Vendor, Class, "")
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		isOurs := strings.HasPrefix(name, ours) && strings.Contains(name, specExt+tempInfix)
		if e.IsDir() || !(isOurs || w.isOurLibraryTemp(name)) {
			continue
		}
		if err := os.Remove(filepath.Join(w.opts.Root, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing CDI temp file: %w", err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// isOurLibraryTemp says whether a "spec.*.tmp" file holds a spec of our
// kind. The library writes the JSON in one piece, "kind" second, so even a
// cut file shows it.
func (w *Writer) isOurLibraryTemp(name string) bool {
	if !strings.HasPrefix(name, libraryTempPrefix) || !strings.HasSuffix(name, libraryTempSuffix) {
		return false
	}
	data, err := os.ReadFile(filepath.Join(w.opts.Root, name))
	if err != nil {
		return false
	}
	return bytes.Contains(data, []byte(`"kind":"`+Kind+`"`))
}
