package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/require"
)

// fakeMirror serves a Debian suite holding one libc6 package per arch,
// built with dpkg-deb from files named like the real package's.
type fakeMirror struct {
	srv     *httptest.Server
	files   map[string][]byte
	corrupt bool // serve .debs with a flipped byte
}

func newFakeMirror(t *testing.T, arches ...string) *fakeMirror {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb (Debian's dpkg) is needed to build and read .deb files")
	}
	m := &fakeMirror{files: map[string][]byte{}}
	var packages bytes.Buffer
	for _, arch := range arches {
		deb := buildFakeLibc(t, arch)
		sum := sha256.Sum256(deb)
		name := fmt.Sprintf("pool/main/g/glibc/libc6_2.36-9+test1_%s.deb", arch)
		m.files[name] = deb
		fmt.Fprintf(&packages, "Package: zlib1g\nArchitecture: %s\nVersion: 1\n\nPackage: libc6\nSource: glibc\nVersion: 2.36-9+test1\nArchitecture: %s\nFilename: %s\nSize: %d\nSHA256: %x\nDescription: GNU C Library: Shared libraries\n Contains the standard libraries.\n\n",
			arch, arch, name, len(deb), sum)
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(packages.Bytes())
		require.NoError(t, zw.Close())
		m.files["dists/bookworm/main/binary-"+arch+"/Packages.gz"] = gz.Bytes()
		packages.Reset()
	}
	var release strings.Builder
	release.WriteString("Origin: Debian\nSuite: stable\nCodename: bookworm\nSHA256:\n")
	for p, b := range m.files {
		if rel, ok := strings.CutPrefix(p, "dists/bookworm/"); ok {
			fmt.Fprintf(&release, " %x %d %s\n", sha256.Sum256(b), len(b), rel)
		}
	}
	m.files["dists/bookworm/InRelease"] = []byte(release.String())
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := m.files[strings.TrimPrefix(r.URL.Path, "/debian/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if m.corrupt && strings.HasSuffix(r.URL.Path, ".deb") {
			b = append([]byte(nil), b...)
			b[len(b)/2] ^= 0xff
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *fakeMirror) url() string { return m.srv.URL + "/debian" }

func triplet(arch string) string {
	return map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]
}

// buildFakeLibc builds a .deb laid out like Debian 12's libc6.
func buildFakeLibc(t *testing.T, arch string) []byte {
	t.Helper()
	root := t.TempDir()
	tr := triplet(arch)
	files := map[string]string{
		"DEBIAN/control":                     fmt.Sprintf("Package: libc6\nVersion: 2.36-9+test1\nArchitecture: %s\nMaintainer: test <t@example.com>\nDescription: fake glibc\n", arch),
		"lib/" + tr + "/libc.so.6":           "ELF libc " + arch,
		"lib/" + tr + "/libm.so.6":           "ELF libm",
		"etc/ld.so.conf.d/" + tr + ".conf":   "/lib/" + tr + "\n",
		"usr/share/doc/libc6/copyright":      "GNU LGPL",
		"usr/share/doc/libc6/changelog.gz":   "changes",
		"usr/share/lintian/overrides/libc6":  "x",
		"usr/lib/" + tr + "/gconv/UTF-16.so": "gconv",
	}
	for p, c := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(c), 0o644))
	}
	require.NoError(t, os.Symlink("/lib/"+tr+"/ld-linux.so", filepath.Join(root, "lib", "ld-link")))
	out := filepath.Join(t.TempDir(), "libc6.deb")
	b, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out).CombinedOutput()
	require.NoError(t, err, "%s", b)
	deb, err := os.ReadFile(out)
	require.NoError(t, err)
	return deb
}

func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	require.NoError(t, err)
	return abs
}

// layerFiles lists the paths (and contents of regular files) in an image's layers.
func layerFiles(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	layers, err := img.Layers()
	require.NoError(t, err)
	out := map[string]string{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		require.NoError(t, err)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			out[strings.TrimSuffix(h.Name, "/")] = string(b)
		}
		require.NoError(t, rc.Close())
	}
	return out
}

// TestBuildCgoImageOnGlibc builds a cgo image for this machine's platform
// on the fake mirror's glibc and checks what the image holds: the glibc
// files NVML's dlopen needs and nothing else of the package, the binary as
// entrypoint with the version stamped, root as the user.
func TestBuildCgoImageOnGlibc(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles a program and builds an image")
	}
	mirror := newFakeMirror(t, runtime.GOARCH)
	cache, out := t.TempDir(), t.TempDir()
	opts := Options{
		RepoDir: repoRoot(t), CacheDir: cache, OutDir: out, Version: "9.9.9-test", Registry: "example.com/t",
		Platforms: []string{HostPlatform()}, Mirror: mirror.url(),
		Specs: []Spec{{Name: "hello", Package: "./internal/images/testdata/hello", Cgo: true}},
	}
	res, err := Build(context.Background(), opts)
	require.NoError(t, err)
	require.Len(t, res.Images, 1)
	got := res.Images[0]
	require.Equal(t, "example.com/t/hello:9.9.9-test", got.Ref)
	require.FileExists(t, got.Archive)

	idx, ref, err := readLayout(got.Layout)
	require.NoError(t, err)
	require.Equal(t, got.Ref, ref)
	digest, err := idx.Digest()
	require.NoError(t, err)
	require.Equal(t, got.Digest, digest.String())
	img := onlyImage(t, idx, HostPlatform())

	files := layerFiles(t, img)
	tr := triplet(runtime.GOARCH)
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	require.Equal(t, []string{
		"etc", "etc/ld.so.conf.d", "etc/ld.so.conf.d/" + tr + ".conf",
		"lib", "lib/ld-link", "lib/" + tr, "lib/" + tr + "/libc.so.6", "lib/" + tr + "/libm.so.6",
		"tmp", "usr", "usr/local/bin", "usr/local/bin/hello",
		"usr/share", "usr/share/doc", "usr/share/doc/libc6", "usr/share/doc/libc6/copyright",
	}, paths)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, []string{"/usr/local/bin/hello"}, cf.Config.Entrypoint)
	require.Empty(t, cf.Config.User, "a cgo spec without User runs as root")
	require.Equal(t, runtime.GOARCH, cf.Architecture)

	// The binary in the image runs here and carries the version.
	bin := filepath.Join(t.TempDir(), "hello")
	require.NoError(t, os.WriteFile(bin, []byte(files["usr/local/bin/hello"]), 0o755))
	b, err := exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "%s", b)
	require.Equal(t, "hello 9.9.9-test\n", string(b))

	// The same inputs give the same image.
	again, err := Build(context.Background(), opts)
	require.NoError(t, err)
	require.Equal(t, got.Digest, again.Images[0].Digest, "the build is reproducible")

	// With the mirror gone, the cached package is used.
	mirror.srv.Close()
	offline, err := Build(context.Background(), opts)
	require.NoError(t, err)
	require.Equal(t, got.Digest, offline.Images[0].Digest)
}

// TestBuildStaticMultiArch builds a static, non-root image for both
// platforms into one index, without glibc or a mirror.
func TestBuildStaticMultiArch(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles a program twice")
	}
	res, err := Build(context.Background(), Options{
		RepoDir: repoRoot(t), CacheDir: t.TempDir(), OutDir: t.TempDir(), Version: "1.0.0",
		Mirror: "http://127.0.0.1:1/unused",
		Specs:  []Spec{{Name: "hello", Package: "./internal/images/testdata/hello", User: "65532:65532"}},
	})
	require.NoError(t, err)
	got := res.Images[0]
	require.Equal(t, DefaultRegistry+"/hello:1.0.0", got.Ref)
	idx, _, err := readLayout(got.Layout)
	require.NoError(t, err)
	for _, p := range DefaultPlatforms {
		img := onlyImage(t, idx, p)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		require.Equal(t, "65532:65532", cf.Config.User)
		require.Equal(t, "linux/"+cf.Architecture, p)
		files := layerFiles(t, img)
		require.Contains(t, files, "usr/local/bin/hello")
		require.NotContains(t, files, "lib", "a static image has no glibc")
	}
	require.Len(t, got.Platforms, 2)
	for _, p := range got.Platforms {
		require.Positive(t, p.Size)
	}
}

func TestBuildRejects(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"bad platform", Options{Platforms: []string{"linux/riscv64"}}, "only linux/amd64 and linux/arm64"},
		{"windows", Options{Platforms: []string{"windows/amd64"}}, "only linux/amd64 and linux/arm64"},
		{"twice", Options{Platforms: []string{"linux/amd64", "linux/amd64"}}, "listed twice"},
		{"bad version", Options{Version: "1.0 beta"}, "is not an image tag"},
		{"bad registry", Options{Registry: "UPPER/case"}, "image reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.RepoDir, tt.opts.CacheDir, tt.opts.OutDir = repoRoot(t), t.TempDir(), t.TempDir()
			_, err := Build(context.Background(), tt.opts)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestFetchDebRejectsCorruptPackage: a .deb whose hash differs from the
// index's is not stored, and the error says so.
func TestFetchDebRejectsCorruptPackage(t *testing.T) {
	mirror := newFakeMirror(t, "arm64")
	mirror.corrupt = true
	cache := t.TempDir()
	f := debFetcher{mirror: mirror.url(), suite: DebianSuite, cache: cache, client: http.DefaultClient}
	_, _, err := f.fetchDeb(context.Background(), "libc6", "arm64")
	require.ErrorContains(t, err, "the index lists")
	debs, _ := filepath.Glob(filepath.Join(cache, "debian", "*.deb"))
	require.Empty(t, debs, "nothing stored")

	mirror.corrupt = false
	path, pkg, err := f.fetchDeb(context.Background(), "libc6", "arm64")
	require.NoError(t, err)
	require.Equal(t, "2.36-9+test1", pkg.Version)
	ok, err := fileHasSHA256(path, pkg.SHA256)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "libc6_2.36-9+test1_arm64.deb", filepath.Base(path))
}

func onlyImage(t *testing.T, idx v1.ImageIndex, platform string) v1.Image {
	t.Helper()
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.String() == platform {
			img, err := idx.Image(d.Digest)
			require.NoError(t, err)
			return img
		}
	}
	t.Fatalf("index has no %s image", platform)
	return nil
}
