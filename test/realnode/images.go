package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Image names. There is no registry: the images are built here as
// docker-archive tars and imported into containerd; pods use
// imagePullPolicy: Never.
const (
	// BusyboxImage is Debian's busybox-static with every applet linked in
	// /bin; its default command is sh.
	BusyboxImage = "tessera.local/busybox:test"
	// PauseImage is containerd 2.4's default sandbox image, so that no
	// containerd setting has to name it.
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// imageLayout is bumped whenever the way images are built changes, so that
// cached tars are rebuilt.
const imageLayout = "1"

// pauseSource is the sandbox's pid 1: it sleeps until told to stop and
// reaps the orphans of the pod's shared pid namespace.
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
`

type layerEntry struct {
	name string // path in the image, without a leading slash
	mode int64
	data []byte
	link string // symlink target
	dir  bool
}

type imageConfig struct {
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

// buildImages returns the tars of the busybox and pause images, building
// them into cacheDir/images when absent.
func buildImages(cacheDir string) ([]string, error) {
	dir := filepath.Join(cacheDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating image cache: %w", err)
	}
	bb, err := busyboxTar(dir)
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	pause, err := pauseTar(dir)
	if err != nil {
		return nil, fmt.Errorf("pause image: %w", err)
	}
	return []string{bb, pause}, nil
}

func busyboxTar(dir string) (string, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return "", fmt.Errorf("reading %s (Debian busybox-static): %w", busyboxPath, err)
	}
	sum := sha256.Sum256(append(bin, imageLayout...))
	out := filepath.Join(dir, "busybox-"+hex.EncodeToString(sum[:8])+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	list, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	entries := baseDirs()
	entries = append(entries, layerEntry{name: "bin/busybox", mode: 0o755, data: bin})
	for applet := range strings.FieldsSeq(string(list)) {
		if applet != "busybox" {
			entries = append(entries, layerEntry{name: "bin/" + applet, link: "busybox"})
		}
	}
	entries = append(entries,
		layerEntry{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		layerEntry{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	)
	cfg := imageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"sh"}}
	return out, writeDockerArchive(out, BusyboxImage, cfg, entries)
}

func pauseTar(dir string) (string, error) {
	sum := sha256.Sum256([]byte(pauseSource + runtime.Version() + imageLayout))
	out := filepath.Join(dir, "pause-"+hex.EncodeToString(sum[:8])+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	work, err := os.MkdirTemp("", "tessera-pause-")
	if err != nil {
		return "", fmt.Errorf("creating build dir: %w", err)
	}
	defer os.RemoveAll(work)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte("module pause\n\ngo 1.21\n"), 0o644); err != nil {
		return "", fmt.Errorf("writing go.mod: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "main.go"), []byte(pauseSource), 0o644); err != nil {
		return "", fmt.Errorf("writing main.go: %w", err)
	}
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", "pause", ".")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building pause: %w: %s", err, b)
	}
	bin, err := os.ReadFile(filepath.Join(work, "pause"))
	if err != nil {
		return "", fmt.Errorf("reading pause binary: %w", err)
	}
	entries := append(baseDirs(), layerEntry{name: "pause", mode: 0o755, data: bin})
	return out, writeDockerArchive(out, PauseImage, imageConfig{Entrypoint: []string{"/pause"}}, entries)
}

// goTool finds the go command that runs the tests.
func goTool() (string, error) {
	// go test puts its own GOROOT/bin first on PATH.
	p, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("finding the go command: %w", err)
	}
	return p, nil
}

// baseDirs are the directories a container runtime expects to find or
// mount onto.
func baseDirs() []layerEntry {
	var e []layerEntry
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "root", "var", "usr", "usr/bin"} {
		e = append(e, layerEntry{name: d, dir: true, mode: 0o755})
	}
	return append(e, layerEntry{name: "tmp", dir: true, mode: 0o1777})
}

// writeDockerArchive writes a one-layer image in the format of
// `docker save` (manifest.json, config, layer.tar), which `ctr images
// import` reads.
func writeDockerArchive(out, ref string, cfg imageConfig, entries []layerEntry) error {
	epoch := time.Unix(0, 0).UTC()
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := lw.WriteHeader(h); err != nil {
			return fmt.Errorf("layer entry %s: %w", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := lw.Write(e.data); err != nil {
				return fmt.Errorf("layer entry %s: %w", e.name, err)
			}
		}
	}
	if err := lw.Close(); err != nil {
		return fmt.Errorf("closing layer: %w", err)
	}
	diffID := sha256.Sum256(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}},
		"history":      []map[string]string{{"created": epoch.Format(time.RFC3339), "created_by": "tessera test/realnode"}},
	})
	if err != nil {
		return fmt.Errorf("encoding image config: %w", err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{"layer.tar"},
	}})
	if err != nil {
		return fmt.Errorf("encoding manifest: %w", err)
	}

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, file := range []struct {
		name string
		data []byte
	}{{"layer.tar", layer.Bytes()}, {configName, config}, {"manifest.json", manifest}} {
		h := &tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: epoch, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return fmt.Errorf("archive entry %s: %w", file.name, err)
		}
		if _, err := tw.Write(file.data); err != nil {
			f.Close()
			return fmt.Errorf("archive entry %s: %w", file.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("closing archive: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("storing %s: %w", out, err)
	}
	return nil
}
