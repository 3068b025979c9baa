package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/require"
)

// writeLayout writes an OCI layout like images.Build's: one two-platform
// index annotated with its reference.
func writeLayout(t *testing.T, dir, ref string) v1.ImageIndex {
	t.Helper()
	idx := v1.ImageIndex(empty.Index)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := random.Image(512, 2)
		require.NoError(t, err)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	lp, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	tag, err := name.NewTag(ref)
	require.NoError(t, err)
	require.NoError(t, lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag.TagStr(),
	})))
	return idx
}

// TestPushToRegistry pushes what `make images` writes to
// go-containerregistry's in-memory registry and pulls it back.
func TestPushToRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)

	out := t.TempDir()
	want := map[string]v1.ImageIndex{
		"tessera-node":       writeLayout(t, filepath.Join(out, "tessera-node"), "ghcr.io/tessera-gpu/tessera-node:0.3.0"),
		"tessera-controller": writeLayout(t, filepath.Join(out, "tessera-controller"), "ghcr.io/tessera-gpu/tessera-controller:0.3.0"),
	}
	require.NoError(t, os.WriteFile(filepath.Join(out, "kubectl-tessera-linux-amd64"), []byte("not a layout"), 0o755))

	var stdout bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"push", "--registry", u.Host + "/team/gpu", "--dir", out}, &stdout))
	for image, idx := range want {
		ref := u.Host + "/team/gpu/" + image + ":0.3.0"
		require.Contains(t, stdout.String(), ref+"\n")
		r, err := name.ParseReference(ref)
		require.NoError(t, err)
		got, err := remote.Index(r)
		require.NoError(t, err, ref)
		gotDigest, err := got.Digest()
		require.NoError(t, err)
		wantDigest, err := idx.Digest()
		require.NoError(t, err)
		require.Equal(t, wantDigest, gotDigest, "%s in the registry is the index built", ref)
		m, err := got.IndexManifest()
		require.NoError(t, err)
		for _, d := range m.Manifests {
			img, err := got.Image(d.Digest)
			require.NoError(t, err)
			layers, err := img.Layers()
			require.NoError(t, err)
			require.Len(t, layers, 2, "%s %s: every layer pushed", ref, d.Platform)
		}
	}
}

func TestPushErrors(t *testing.T) {
	empty := t.TempDir()
	notIndex := filepath.Join(t.TempDir(), "image")
	lp, err := layout.Write(notIndex, emptyIndex())
	require.NoError(t, err)
	img, err := random.Image(10, 1)
	require.NoError(t, err)
	require.NoError(t, lp.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "x/y:1"})))
	unnamed := filepath.Join(t.TempDir(), "unnamed")
	writeLayout(t, unnamed, "a/b:1")
	// Drop the name annotation to check the layout is refused, not guessed.
	b, err := os.ReadFile(filepath.Join(unnamed, "index.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(unnamed, "index.json"), []byte(strings.ReplaceAll(string(b), "io.containerd.image.name", "other")), 0o644))

	good := filepath.Join(t.TempDir(), "good")
	writeLayout(t, good, "example.com/a/b:1")

	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no registry", []string{"push", "--dir", empty}, "--registry is required"},
		{"no layouts", []string{"push", "--registry", "localhost:1/x", "--dir", empty}, "no OCI layouts"},
		{"image not index", []string{"push", "--registry", "localhost:1/x", "--dir", filepath.Dir(notIndex)}, "not an image index"},
		{"unnamed", []string{"push", "--registry", "localhost:1/x", "--dir", filepath.Dir(unnamed)}, "annotation"},
		{"bad registry", []string{"push", "--registry", "bad registry", "--dir", filepath.Dir(good)}, `registry "bad registry"`},
		{"unknown command", []string{"pull"}, `unknown command "pull"`},
		{"nothing", nil, "usage:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, &bytes.Buffer{})
			require.Error(t, err)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func emptyIndex() v1.ImageIndex { return empty.Index }
