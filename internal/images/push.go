package images

import (
	"context"
	"fmt"
	"path"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/klog/v2"
)

// PushOptions configure Push.
type PushOptions struct {
	// Registry replaces the registry part of the image's name, e.g.
	// registry.example.com/gpu: ghcr.io/tessera-gpu/tessera-node:0.1.0
	// becomes registry.example.com/gpu/tessera-node:0.1.0.
	Registry string
	// Insecure talks plain HTTP to the registry (it is implied for
	// localhost and private addresses, as crane does).
	Insecure bool
	// Remote are extra options for go-containerregistry's remote package;
	// by default credentials come from the Docker config file
	// (~/.docker/config.json, as `crane auth login` or `docker login`
	// write it).
	Remote []remote.Option
}

// Push sends the image index of the OCI layout at dir (as Build writes it)
// to opts.Registry and returns the reference it pushed.
func Push(ctx context.Context, dir string, opts PushOptions) (string, error) {
	idx, ref, err := readLayout(dir)
	if err != nil {
		return "", err
	}
	src, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("layout %s names %q: %w", dir, ref, err)
	}
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	dst, err := name.NewTag(fmt.Sprintf("%s/%s:%s", opts.Registry, path.Base(src.RepositoryStr()), src.TagStr()), nameOpts...)
	if err != nil {
		return "", fmt.Errorf("registry %q: %w", opts.Registry, err)
	}
	ropts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts.Remote...)
	klog.FromContext(ctx).Info("Pushing", "layout", dir, "image", dst.String())
	if err := remote.WriteIndex(dst, idx, ropts...); err != nil {
		return "", fmt.Errorf("pushing %s: %w", dst, err)
	}
	return dst.String(), nil
}

// readLayout returns the one image index in an OCI layout written by Build
// and the reference it is annotated with.
func readLayout(dir string) (v1.ImageIndex, string, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("reading %s/index.json: %w", dir, err)
	}
	if len(m.Manifests) != 1 {
		return nil, "", fmt.Errorf("%s/index.json lists %d entries; a layout from Build lists one image index", dir, len(m.Manifests))
	}
	desc := m.Manifests[0]
	ref := desc.Annotations[annotationImageName]
	if ref == "" {
		return nil, "", fmt.Errorf("%s/index.json: entry has no %s annotation", dir, annotationImageName)
	}
	if !desc.MediaType.IsIndex() {
		return nil, "", fmt.Errorf("%s/index.json: entry is a %s, not an image index", dir, desc.MediaType)
	}
	idx, err := root.ImageIndex(desc.Digest)
	if err != nil {
		return nil, "", fmt.Errorf("%s: image index %s: %w", dir, desc.Digest, err)
	}
	return idx, ref, nil
}

// Layouts lists the OCI layouts Build wrote into dir, one per image.
func Layouts(dir string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "*", "index.json"))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("no OCI layouts (*/index.json) in %s: run `make images` first", dir)
	}
	var out []string
	for _, m := range matches {
		out = append(out, filepath.Dir(m))
	}
	return out, nil
}
