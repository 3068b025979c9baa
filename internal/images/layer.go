package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every file's and image's timestamp, so that the same inputs
// give the same digests.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of a layer built from memory.
type File struct {
	Path string // in the image, without a leading slash
	Mode int64
	Data []byte
	Link string // symlink target
	Dir  bool
}

// FileLayer is a layer holding files, directories and symlinks, as ko
// builds its application layer; go-containerregistry compresses it and
// computes its digests.
func FileLayer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, strings.TrimSuffix(f.Path, "/")+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.Path, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing layer: %w", err)
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// keepGlibcPath says which files of Debian's libc6 go into the image: the
// dynamic loader and the shared libraries NVML's dlopen and a cgo binary
// load, the loader's search-path configuration, and the copyright notice
// (glibc is LGPL). Left out: charset converters (gconv), the audit
// library, documentation and lintian overrides.
func keepGlibcPath(name string) bool {
	const copyright = "usr/share/doc/libc6/copyright"
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	switch {
	case name == copyright || strings.HasPrefix(copyright, name+"/"):
		return true
	case strings.HasPrefix(name, "usr/"):
		return false
	}
	return true
}

// GlibcLayer unpacks the data of Debian's libc6 package (a .deb) into a
// layer holding the files keepGlibcPath keeps. dpkg-deb reads the .deb,
// whatever compression its data member uses.
func GlibcLayer(ctx context.Context, deb string) (v1.Layer, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) || errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s (Debian's dpkg): %w: %s", deb, err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	var out bytes.Buffer
	kept, err := filterTar(bytes.NewReader(raw), &out, keepGlibcPath)
	if err != nil {
		return nil, fmt.Errorf("unpacking %s: %w", deb, err)
	}
	if kept == 0 {
		return nil, fmt.Errorf("%s holds no glibc files", deb)
	}
	data := out.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// filterTar copies the entries keep accepts, with timestamps and owners
// normalised, and returns how many regular files it kept.
func filterTar(r io.Reader, w io.Writer, keep func(string) bool) (int, error) {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	files := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		clean := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if clean == "" || !keep(clean) {
			continue
		}
		if h.Typeflag == tar.TypeDir {
			clean += "/"
		}
		hdr := &tar.Header{Name: clean, Typeflag: h.Typeflag, Mode: h.Mode, Size: h.Size, Linkname: h.Linkname, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return 0, fmt.Errorf("%s: %w", clean, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return 0, fmt.Errorf("%s: %w", clean, err)
			}
			files++
		}
	}
	return files, tw.Close()
}

// readFile is os.ReadFile with the path in the error.
func readFile(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	return b, nil
}

// WriteDockerArchive writes a one-layer image of files for this machine's
// platform as a docker-archive tar (the format of `docker save`, which
// `ctr images import` reads) named ref. The test node's busybox and pause
// images are built this way.
func WriteDockerArchive(out, ref string, cfg v1.Config, files []File) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	layer, err := FileLayer(files)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("appending layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created, cf.Config, cf.History = "linux", runtime.GOARCH, v1.Time{Time: epoch}, cfg, nil
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("setting config: %w", err)
	}
	tmp := out + ".tmp"
	defer os.Remove(tmp)
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("storing %s: %w", out, err)
	}
	return nil
}
