// Command images builds Tessera's container images without Docker and
// pushes them to a registry (internal/images does the work; `make images`
// runs the build). Usage:
//
//	go run ./hack/images build [--version V] [--platforms linux/amd64,linux/arm64] [--out DIR] [--plugin]
//	go run ./hack/images push --registry REGISTRY [--dir DIR] [--insecure]
//
// build prints each image's name, digest and per-platform size; push sends
// every image of DIR (default: _cache/images/VERSION) to REGISTRY under the
// same name and tag, with credentials from ~/.docker/config.json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/images"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

const usage = "usage: images build [--version V] [--platforms P,...] [--out DIR] [--plugin] | images push --registry REGISTRY [--dir DIR] [--insecure]"

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	ctx = klog.NewContext(ctx, klog.Background())
	switch args[0] {
	case "build":
		return build(ctx, args[1:], stdout)
	case "push":
		return push(ctx, args[1:], stdout)
	}
	return fmt.Errorf("unknown command %q; %s", args[0], usage)
}

func build(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	var opts images.Options
	fs.StringVar(&opts.Version, "version", "", "image tag (default: the VERSION file)")
	fs.StringVar(&opts.OutDir, "out", "", "output directory (default: _cache/images/VERSION)")
	fs.StringVar(&opts.Registry, "registry", images.DefaultRegistry, "image name prefix")
	platforms := fs.String("platforms", strings.Join(images.DefaultPlatforms, ","), "comma-separated platforms")
	plugin := fs.Bool("plugin", true, "also build the kubectl plugin's release binaries")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	opts.Platforms = strings.Split(*platforms, ",")
	opts.CacheDir = os.Getenv("TESSERA_CACHE")
	res, err := images.Build(ctx, opts)
	if err != nil {
		return err
	}
	for _, img := range res.Images {
		fmt.Fprintf(stdout, "%s  %s\n", img.Ref, img.Digest)
		for _, p := range img.Platforms {
			fmt.Fprintf(stdout, "  %-12s %8.1f MB  %s\n", p.Platform, float64(p.Size)/1e6, p.Digest)
		}
		fmt.Fprintf(stdout, "  archive %s\n", img.Archive)
	}
	if *plugin {
		opts.OutDir = res.OutDir
		arts, err := images.BuildPlugin(ctx, opts)
		if err != nil {
			return err
		}
		for _, a := range arts {
			fmt.Fprintf(stdout, "%s  %8.1f MB  %s\n", a.Path, float64(a.Size)/1e6, a.SHA256)
		}
	}
	return nil
}

func push(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	var opts images.PushOptions
	fs.StringVar(&opts.Registry, "registry", "", "registry and path to push to, e.g. registry.example.com/gpu (required)")
	fs.BoolVar(&opts.Insecure, "insecure", false, "plain HTTP to the registry")
	dir := fs.String("dir", "", "directory `make images` wrote (default: _cache/images/VERSION)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if opts.Registry == "" || fs.NArg() > 0 {
		return errors.New("push: --registry is required and takes no arguments; " + usage)
	}
	if *dir == "" {
		v, err := images.ReadVersion(".")
		if err != nil {
			return err
		}
		cache := os.Getenv("TESSERA_CACHE")
		if cache == "" {
			cache = "_cache"
		}
		*dir = filepath.Join(cache, "images", v)
	}
	layouts, err := images.Layouts(*dir)
	if err != nil {
		return err
	}
	for _, l := range layouts {
		ref, err := images.Push(ctx, l, opts)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, ref)
	}
	return nil
}
