package cdi

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// TestWriteFailureLeavesNoTemp: a write that fails after its temp file
// exists (the rename: the spec's path is a directory) removes it.
func TestWriteFailureLeavesNoTemp(t *testing.T) {
	root := t.TempDir()
	w, err := New(Options{Root: root, Fake: true})
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(w.SpecPath("u"), "x"), 0o755))
	_, err = w.Write(Claim{UID: "u", Namespace: "ns", Name: "n", Devices: []Device{{Request: "gpu", GPU: h100(0)}}})
	require.ErrorContains(t, err, "replacing CDI spec")
	assert.Equal(t, []string{SpecName("u")}, names(t, root))
}

// TestRemoveTemps: the temp files of interrupted writes are removed: ours
// by name, the CDI library's (written by earlier builds) when they hold our
// kind. Specs, other vendors' files and temp files not provably ours stay.
func TestRemoveTemps(t *testing.T) {
	root := t.TempDir()
	w, err := New(Options{Root: root, Fake: true})
	require.NoError(t, err)
	_, err = w.Write(Claim{UID: "kept", Namespace: "ns", Name: "n", Devices: []Device{{Request: "gpu", GPU: h100(0)}}})
	require.NoError(t, err)
	ourSpec, err := os.ReadFile(w.SpecPath("kept"))
	require.NoError(t, err)
	files := map[string]string{
		"." + SpecName("a") + ".tmp-123": "",                                               // ours, empty (killed before writing)
		"." + SpecName("b") + ".tmp-9":   string(ourSpec[:40]),                             // ours, cut
		"spec.4711.tmp":                  string(ourSpec),                                  // the library's, our kind
		"spec.4712.tmp":                  string(ourSpec[:60]),                             // the library's, cut after our kind
		"spec.4713.tmp":                  `{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu"}`, // another vendor's
		"spec.4714.tmp":                  "",                                               // not provably ours
		"nvidia.com-gpu.yaml":            "x",
		".nvidia.com-gpu.yaml.tmp-1":     "x",
	}
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o644))
	}
	removed, err := w.RemoveTemps()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"." + SpecName("a") + ".tmp-123", "." + SpecName("b") + ".tmp-9", "spec.4711.tmp", "spec.4712.tmp"}, removed)
	assert.Equal(t, []string{".nvidia.com-gpu.yaml.tmp-1", SpecName("kept"), "nvidia.com-gpu.yaml", "spec.4713.tmp", "spec.4714.tmp"}, names(t, root))
	uids, err := w.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"kept"}, uids)
}
