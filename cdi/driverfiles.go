package cdi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/gpu"
)

// Why not nvidia-container-toolkit's nvcdi: it would bring runc, NRI (with
// a WebAssembly runtime), logrus and urfave/cli into the node agent, and it
// needs NVML and a driver at generation time, which our fake mode must not.
// What a CUDA container needs from the driver is a short, stable list of
// user-space files, found below.

// DriverFile is one driver file to bind-mount into containers.
type DriverFile struct {
	// Source is the real file, as a path inside the driver root.
	Source string
	// Path is where containers see it (the same path as on the host; for a
	// library also its soname link, e.g. libcuda.so.1, so no symlink has to
	// be created in the container).
	Path string
}

// DriverFiles are the user-space driver files given to every GPU container.
type DriverFiles struct {
	Libraries []DriverFile
	Binaries  []DriverFile
	// LdcacheHook is nvidia-cdi-hook (or nvidia-ctk), as a path inside the
	// driver root, when installed: it refreshes the container's ld cache so
	// the mounted libraries are found. Empty when absent.
	LdcacheHook string
}

// LibraryDirs returns the container directories holding libraries, sorted.
func (f DriverFiles) LibraryDirs() []string {
	set := map[string]bool{}
	for _, l := range f.Libraries {
		set[filepath.Dir(l.Path)] = true
	}
	dirs := make([]string, 0, len(set))
	for d := range set {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	return dirs
}

// Driver libraries a CUDA container may load (compute and utility; no
// graphics), by name stem.
var driverLibraries = []string{
	"libcuda", "libcudadebugger", "libnvidia-ml", "libnvidia-ptxjitcompiler",
	"libnvidia-nvvm", "libnvidia-gpucomp", "libnvidia-allocator", "libnvidia-cfg",
	"libnvidia-opencl", "libnvidia-fatbinaryloader",
}

var driverBinaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

var libraryDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
	"/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64",
}

var binaryDirs = []string{"/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin"}

// DiscoverDriverFiles finds the driver's user-space files under root (the
// host's "/" as this process sees it). It fails when libcuda or
// libnvidia-ml is missing, since no CUDA container could work.
func DiscoverDriverFiles(root string) (DriverFiles, error) {
	var out DriverFiles
	found := map[string]bool{}
	mounted := map[string]bool{}
	for _, stem := range driverLibraries {
		for _, dir := range libraryDirs {
			// "<stem>.so.*" takes the versioned file and the soname link,
			// and skips the unversioned development link.
			matches, _ := filepath.Glob(filepath.Join(root, dir, stem+".so.*"))
			for _, m := range matches {
				real, err := resolveInRoot(root, m)
				if err != nil {
					continue
				}
				path := strings.TrimPrefix(m, filepath.Clean(root))
				if root == "/" {
					path = m
				}
				if mounted[path] {
					continue
				}
				mounted[path] = true
				found[stem] = true
				out.Libraries = append(out.Libraries, DriverFile{Source: real, Path: path})
			}
		}
	}
	var missing []string
	for _, stem := range []string{"libcuda", "libnvidia-ml"} {
		if !found[stem] {
			missing = append(missing, stem+".so")
		}
	}
	if len(missing) > 0 {
		return DriverFiles{}, fmt.Errorf("discovering NVIDIA driver files under %s: %s not found in %s (is the driver installed, and the driver root right?)",
			root, strings.Join(missing, ", "), strings.Join(libraryDirs, ", "))
	}
	for _, name := range driverBinaries {
		if p, real, ok := findBinary(root, name); ok {
			out.Binaries = append(out.Binaries, DriverFile{Source: real, Path: p})
		}
	}
	for _, name := range []string{"nvidia-cdi-hook", "nvidia-ctk"} {
		if _, real, ok := findBinary(root, name); ok {
			out.LdcacheHook = real
			break
		}
	}
	return out, nil
}

func findBinary(root, name string) (path, real string, ok bool) {
	for _, dir := range binaryDirs {
		p := filepath.Join(dir, name)
		r, err := resolveInRoot(root, filepath.Join(root, p))
		if err != nil {
			continue
		}
		if st, err := os.Stat(filepath.Join(root, r)); err == nil && st.Mode().IsRegular() {
			return p, r, true
		}
	}
	return "", "", false
}

// resolveInRoot follows symlinks of a path under root and returns the real
// regular file as a path inside root. Absolute link targets are taken as
// inside root, as the host would see them.
func resolveInRoot(root, p string) (string, error) {
	root = filepath.Clean(root)
	rel := strings.TrimPrefix(p, root)
	if root == "/" {
		rel = p
	}
	for range 16 {
		full := filepath.Join(root, rel)
		st, err := os.Lstat(full)
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 {
			if !st.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", full)
			}
			return rel, nil
		}
		target, err := os.Readlink(full)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			rel = filepath.Clean(target)
		} else {
			rel = filepath.Join(filepath.Dir(rel), target)
		}
	}
	return "", errors.New("too many symlinks at " + p)
}

// deviceMinor returns the minor number of the GPU's /dev/nvidiaN node. The
// kernel driver numbers nodes by its own order, which is not always NVML's
// index; /proc/driver/nvidia/gpus/<bus id>/information has the truth. The
// index is the fallback (fake mode, or no procfs).
func deviceMinor(root string, d gpu.Device) int {
	if d.PCIBusID == "" {
		return d.Index
	}
	f, err := os.Open(filepath.Join(root, "/proc/driver/nvidia/gpus", strings.ToLower(d.PCIBusID), "information"))
	if err != nil {
		return d.Index
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Device Minor:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return d.Index
}
