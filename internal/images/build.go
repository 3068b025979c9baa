package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// VersionPackage is the package whose Version variable the build stamps.
const VersionPackage = "github.com/tessera-gpu/tessera/internal/version"

// Annotations containerd's importer and OCI tools read from index.json.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

func buildImage(ctx context.Context, opts Options, spec Spec, plats []v1.Platform) (*Image, error) {
	ref, err := Ref(opts.Registry, spec.Name, opts.Version)
	if err != nil {
		return nil, err
	}
	img := &Image{Name: spec.Name, Ref: ref.String()}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range plats {
		bin, err := GoBuild(ctx, opts.RepoDir, opts.CacheDir, spec.Package, p.Architecture, spec.Cgo, opts.Version)
		if err != nil {
			return nil, err
		}
		pi, err := assemble(ctx, opts, spec, p, bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.String(), err)
		}
		d, err := describe(pi, p)
		if err != nil {
			return nil, err
		}
		img.Platforms = append(img.Platforms, d)
		pc := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: pi, Descriptor: v1.Descriptor{Platform: &pc}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return nil, fmt.Errorf("index digest: %w", err)
	}
	img.Digest = digest.String()
	img.Layout = filepath.Join(opts.OutDir, spec.Name)
	img.Archive = img.Layout + ".oci.tar"
	if err := writeLayout(img.Layout, img.Archive, idx, ref.String(), ref.TagStr()); err != nil {
		return nil, err
	}
	return img, nil
}

// assemble stacks the image for one platform: glibc (cgo binaries only),
// then the binary at /usr/local/bin/NAME as the entrypoint.
func assemble(ctx context.Context, opts Options, spec Spec, p v1.Platform, bin string) (v1.Image, error) {
	var layers []v1.Layer
	if spec.Cgo {
		f := debFetcher{mirror: opts.Mirror, suite: opts.Suite, cache: opts.CacheDir, client: opts.HTTPClient}
		deb, _, err := f.fetchDeb(ctx, "libc6", p.Architecture)
		if err != nil {
			return nil, fmt.Errorf("glibc: %w", err)
		}
		l, err := GlibcLayer(ctx, deb)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	data, err := readFile(bin)
	if err != nil {
		return nil, err
	}
	app, err := FileLayer([]File{
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "usr/local/bin", Dir: true, Mode: 0o755},
		{Path: "usr/local/bin/" + spec.Name, Mode: 0o755, Data: data},
	})
	if err != nil {
		return nil, err
	}
	layers = append(layers, app)
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		return nil, fmt.Errorf("appending layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = p.OS, p.Architecture, v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/local/bin/" + spec.Name},
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		User:       spec.User,
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":   spec.Name,
			"org.opencontainers.image.version": opts.Version,
			"org.opencontainers.image.source":  "https://github.com/tessera-gpu/tessera",
		},
	}
	cf.History = nil
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting config: %w", err)
	}
	return img, nil
}

func describe(img v1.Image, p v1.Platform) (PlatformImage, error) {
	d, err := img.Digest()
	if err != nil {
		return PlatformImage{}, fmt.Errorf("image digest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return PlatformImage{}, fmt.Errorf("image manifest: %w", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return PlatformImage{}, fmt.Errorf("image manifest: %w", err)
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return PlatformImage{Platform: p.String(), Digest: d.String(), Size: size}, nil
}

// writeLayout replaces dir with a fresh OCI layout of idx, annotated with
// the image's name, and archive with a tar of it.
func writeLayout(dir, archive string, idx v1.ImageIndex, ref, tag string) error {
	if err := removeIfExists(dir); err != nil {
		return err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("creating layout %s: %w", dir, err)
	}
	ann := map[string]string{annotationImageName: ref, annotationRefName: tag}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(ann)); err != nil {
		return fmt.Errorf("writing layout %s: %w", dir, err)
	}
	tmp := archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		f.Close()
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, archive); err != nil {
		return fmt.Errorf("storing %s: %w", archive, err)
	}
	return nil
}

// GoBuild compiles pkg for linux/arch into cacheDir/images/bin and returns
// the binary's path. Stripped (-s -w) and -trimpath: an image carries no
// debug info or build-machine paths. The version goes into
// internal/version.Version.
func GoBuild(ctx context.Context, repoDir, cacheDir, pkg, arch string, cgo bool, version string) (string, error) {
	out := filepath.Join(cacheDir, "images", "bin", version, "linux-"+arch, filepath.Base(pkg))
	env := append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "GOFLAGS=-buildvcs=false")
	if cgo {
		cc, err := CrossCompiler(arch)
		if err != nil {
			return "", err
		}
		env = append(env, "CGO_ENABLED=1", "CC="+cc)
	} else {
		env = append(env, "CGO_ENABLED=0")
	}
	ldflags := fmt.Sprintf("-s -w -X %s.Version=%s", VersionPackage, version)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir, cmd.Env = repoDir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for linux/%s (cgo %v): %w\n%s", pkg, arch, cgo, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// PluginPackage is the kubectl plugin, shipped as a binary per platform.
const PluginPackage = "./cmd/kubectl-tessera"

// Artifact is a release binary.
type Artifact struct {
	Platform, Path, SHA256 string
	Size                   int64
}

// BuildPlugin compiles the kubectl plugin (static) for each platform into
// OutDir as kubectl-tessera-linux-ARCH, and writes their SHA-256 sums to
// OutDir/SHA256SUMS in sha256sum's format.
func BuildPlugin(ctx context.Context, opts Options) ([]Artifact, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	plats, err := parsePlatforms(opts.Platforms)
	if err != nil {
		return nil, err
	}
	var out []Artifact
	var sums strings.Builder
	for _, p := range plats {
		bin, err := GoBuild(ctx, opts.RepoDir, opts.CacheDir, PluginPackage, p.Architecture, false, opts.Version)
		if err != nil {
			return nil, err
		}
		data, err := readFile(bin)
		if err != nil {
			return nil, err
		}
		base := fmt.Sprintf("%s-linux-%s", filepath.Base(PluginPackage), p.Architecture)
		dst := filepath.Join(opts.OutDir, base)
		if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", opts.OutDir, err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			return nil, fmt.Errorf("writing %s: %w", dst, err)
		}
		sum := sha256.Sum256(data)
		a := Artifact{Platform: p.String(), Path: dst, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
		fmt.Fprintf(&sums, "%s  %s\n", a.SHA256, base)
		out = append(out, a)
	}
	sumFile := filepath.Join(opts.OutDir, "SHA256SUMS")
	if err := os.WriteFile(sumFile, []byte(sums.String()), 0o644); err != nil {
		return nil, fmt.Errorf("writing %s: %w", sumFile, err)
	}
	return out, nil
}
