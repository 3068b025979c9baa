// Package images builds Tessera's container images from the Go binaries
// with go-containerregistry, as ko does: no Docker daemon, no registry, no
// Dockerfile. tessera-node is a cgo binary (NVML is dlopen'ed) on a base of
// Debian's glibc and nothing else; tessera-controller is static on an empty
// base and runs as a non-root user. Each image is written as an OCI layout
// and an OCI archive (a tar of the layout) holding an index of
// linux/amd64 and linux/arm64, which `ctr images import` reads and
// Push sends to a registry. See README.md.
package images

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"k8s.io/klog/v2"
)

// DefaultRegistry is where the chart's default images live; the chart's
// values.yaml names it (a test checks they agree).
const DefaultRegistry = "ghcr.io/tessera-gpu"

// Image names, the chart's image.node.repository and
// image.controller.repository.
const (
	NodeImage       = "tessera-node"
	ControllerImage = "tessera-controller"
)

// DefaultPlatforms are the platforms of a release: x86 GPU servers and
// Grace (arm64) nodes.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// Spec says how to build one image.
type Spec struct {
	Name    string // repository name, e.g. tessera-node
	Package string // Go package of the binary, relative to the module root
	// Cgo builds with CGO_ENABLED=1 (a cross compiler for other arches)
	// on a glibc base; otherwise the binary is static on an empty base.
	Cgo bool
	// User is the image's default user ("uid:gid"); empty is root.
	User string
}

// DefaultSpecs are Tessera's two images.
func DefaultSpecs() []Spec {
	return []Spec{
		// Root: tessera-node serves sockets in the kubelet's root-owned
		// plugin directories, writes CDI specs to /var/run/cdi, and
		// starts MPS control daemons that must run as the GPU's owner.
		{Name: NodeImage, Package: "./cmd/tessera-node", Cgo: true},
		// 65532 is the conventional "nonroot" user of distroless images;
		// the chart's controller pod runs as it too.
		{Name: ControllerImage, Package: "./cmd/tessera-controller", User: "65532:65532"},
	}
}

// Options configure Build. Zero values take the defaults shown.
type Options struct {
	RepoDir   string   // the module root (default: the current directory)
	CacheDir  string   // downloads and binaries (default: RepoDir/_cache)
	OutDir    string   // default: CacheDir/images/VERSION
	Registry  string   // image name prefix (default: DefaultRegistry)
	Version   string   // image tag (default: RepoDir/VERSION)
	Platforms []string // default: DefaultPlatforms
	Specs     []Spec   // default: DefaultSpecs()
	// Debian mirror and suite glibc comes from (defaults DebianMirror,
	// DebianSuite), and the HTTP client used (default: 2-minute timeout).
	Mirror, Suite string
	HTTPClient    *http.Client
}

// PlatformImage is one platform's image inside an index.
type PlatformImage struct {
	Platform string
	Digest   string
	Size     int64 // manifest, config and compressed layers, in bytes
}

// Image is one built image.
type Image struct {
	Name   string // repository name, e.g. tessera-node
	Ref    string // full reference, e.g. ghcr.io/tessera-gpu/tessera-node:0.1.0
	Digest string // of the index
	// Layout is the OCI image layout directory; Archive is the same as a
	// tar, for `ctr -n k8s.io images import ARCHIVE`, which names the
	// image Ref.
	Layout, Archive string
	Platforms       []PlatformImage
}

// Result is what Build made.
type Result struct {
	Version string
	OutDir  string
	Images  []Image
}

// Build compiles each spec's binary for each platform and assembles the
// images. Binaries are compiled by `go build` (cached by Go), glibc is
// downloaded once per version into CacheDir/debian.
func Build(ctx context.Context, opts Options) (*Result, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	plats, err := parsePlatforms(opts.Platforms)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("version", opts.Version)
	res := &Result{Version: opts.Version, OutDir: opts.OutDir}
	for _, spec := range opts.Specs {
		start := time.Now()
		img, err := buildImage(ctx, opts, spec, plats)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", spec.Name, err)
		}
		logger.V(2).Info("Built image", "image", img.Ref, "duration", time.Since(start))
		res.Images = append(res.Images, *img)
	}
	return res, nil
}

func (o *Options) defaults() error {
	if o.RepoDir == "" {
		o.RepoDir = "."
	}
	abs, err := filepath.Abs(o.RepoDir)
	if err != nil {
		return fmt.Errorf("repository dir: %w", err)
	}
	o.RepoDir = abs
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(o.RepoDir, "_cache")
	}
	if o.Version == "" {
		if o.Version, err = ReadVersion(o.RepoDir); err != nil {
			return err
		}
	} else if err := CheckVersion(o.Version); err != nil {
		return err
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.CacheDir, "images", o.Version)
	}
	if o.Registry == "" {
		o.Registry = DefaultRegistry
	}
	if len(o.Platforms) == 0 {
		o.Platforms = DefaultPlatforms
	}
	if len(o.Specs) == 0 {
		o.Specs = DefaultSpecs()
	}
	if o.Mirror == "" {
		o.Mirror = DebianMirror
	}
	if o.Suite == "" {
		o.Suite = DebianSuite
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 2 * time.Minute}
	}
	return nil
}

// Ref is the reference an image of this name and version gets.
func Ref(registry, imageName, version string) (name.Tag, error) {
	ref := imageName + ":" + version
	if registry != "" {
		ref = strings.TrimSuffix(registry, "/") + "/" + ref
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w", ref, err)
	}
	return tag, nil
}

// parsePlatforms accepts linux/amd64 and linux/arm64: the arches Debian
// and Go name alike, and the ones a cross compiler is set up for.
func parsePlatforms(in []string) ([]v1.Platform, error) {
	var out []v1.Platform
	seen := map[string]bool{}
	for _, s := range in {
		p, err := v1.ParsePlatform(s)
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", s, err)
		}
		if p.OS != "linux" || (p.Architecture != "amd64" && p.Architecture != "arm64") || p.Variant != "" {
			return nil, fmt.Errorf("platform %q: only linux/amd64 and linux/arm64 are built", s)
		}
		if seen[p.String()] {
			return nil, fmt.Errorf("platform %q listed twice", s)
		}
		seen[p.String()] = true
		out = append(out, *p)
	}
	return out, nil
}

// HostPlatform is the build machine's platform, for callers that import
// the images into a local containerd.
func HostPlatform() string { return "linux/" + runtime.GOARCH }

// CrossCompiler is the C compiler cgo uses for arch: gcc for the build
// machine's arch, Debian's cross gcc (package gcc-<triplet>) otherwise.
func CrossCompiler(arch string) (string, error) {
	if arch == runtime.GOARCH {
		return "gcc", nil
	}
	triplets := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
	t, ok := triplets[arch]
	if !ok {
		return "", fmt.Errorf("no cross compiler known for %s", arch)
	}
	cc := t + "-gcc"
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("cgo for linux/%s needs %s: apt-get install gcc-%s (make images installs it): %w", arch, cc, t, err)
	}
	return cc, nil
}

func removeIfExists(p string) error {
	if err := os.RemoveAll(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}
