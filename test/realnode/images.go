package realnode

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tessera-gpu/tessera/internal/images"
)

// Image names. There is no registry: the images are built here as
// docker-archive tars (internal/images, on go-containerregistry) and
// imported into containerd; pods use imagePullPolicy: Never.
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
const imageLayout = "2"

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
	files := baseDirs()
	files = append(files, images.File{Path: "bin/busybox", Mode: 0o755, Data: bin})
	for applet := range strings.FieldsSeq(string(list)) {
		if applet != "busybox" {
			files = append(files, images.File{Path: "bin/" + applet, Link: "busybox"})
		}
	}
	files = append(files,
		images.File{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		images.File{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	)
	cfg := v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"sh"}}
	return out, images.WriteDockerArchive(out, BusyboxImage, cfg, files)
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
	files := append(baseDirs(), images.File{Path: "pause", Mode: 0o755, Data: bin})
	return out, images.WriteDockerArchive(out, PauseImage, v1.Config{Entrypoint: []string{"/pause"}}, files)
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
func baseDirs() []images.File {
	var e []images.File
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "root", "var", "usr", "usr/bin"} {
		e = append(e, images.File{Path: d, Dir: true, Mode: 0o755})
	}
	return append(e, images.File{Path: "tmp", Dir: true, Mode: 0o1777})
}
