package cdi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
)

const gib = uint64(1) << 30

func h100(i int) gpu.Device {
	return gpu.Device{UUID: "GPU-0000000" + string(rune('0'+i)) + "-aaaa-bbbb-cccc-dddddddddddd", Index: i, MemoryBytes: 80 * gib}
}

var (
	mpsConfig = v1alpha1.NewMPSConfig
	tsConfig  = v1alpha1.NewTimeSlicingConfig
)

// inject applies CDI devices to an empty OCI spec through the library, as
// containerd would, and returns the container's env as a map.
func inject(t *testing.T, root string, ids ...string) (*oci.Spec, map[string]string) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	require.NoError(t, err)
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(spec, ids...)
	require.NoError(t, err, "unresolved: %v", unresolved)
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return spec, env
}

func TestFakeModeWriteReadBack(t *testing.T) {
	root := t.TempDir()
	w, err := New(Options{Root: root, Fake: true})
	require.NoError(t, err)

	claim := Claim{UID: "uid-1", Namespace: "team-a", Name: "train", Devices: []Device{
		{Request: "whole", GPU: h100(0)},
		{Request: "whole", GPU: h100(1)},
		{Request: "half", GPU: h100(2), MemoryBytes: 40 * gib, Config: mpsConfig(0), MPSPipeDir: "/run/tessera/mps/x/pipe"},
		{Request: "ts/small", GPU: h100(3), MemoryBytes: 10 * gib, Config: tsConfig(v1alpha1.IntervalShort)},
	}}
	ids, err := w.Write(claim)
	require.NoError(t, err)
	require.Len(t, ids, 4)
	assert.Equal(t, "gpu.tessera.dev/claim=uid-1_whole_"+h100(0).UUID, ids[0])
	assert.Equal(t, "gpu.tessera.dev/claim=uid-1_ts-small_"+h100(3).UUID, ids[3])

	// The written file parses and validates with the library.
	spec, err := cdiapi.ReadSpec(w.SpecPath("uid-1"), 0)
	require.NoError(t, err)
	assert.Equal(t, Kind, spec.Kind)
	assert.Equal(t, "uid-1", spec.Annotations[AnnotationClaimUID])
	assert.Len(t, spec.Devices, 4)
	for _, d := range spec.Devices {
		assert.Empty(t, d.ContainerEdits.DeviceNodes, "fake mode has no device nodes")
		assert.Empty(t, d.ContainerEdits.Mounts, "fake mode has no mounts")
	}
	assert.Empty(t, spec.ContainerEdits.DeviceNodes)

	ociSpec, env := inject(t, root, ids[0], ids[1])
	assert.Equal(t, h100(0).UUID+","+h100(1).UUID, env[EnvNvidiaVisibleDevices])
	assert.Equal(t, h100(0).UUID+","+h100(1).UUID, env[EnvGPUUUIDs])
	assert.Equal(t, "team-a/train", env[EnvClaim])
	assert.Equal(t, "Exclusive", env[EnvSharing])
	assert.NotContains(t, env, EnvMPSPipeDir)
	assert.Empty(t, ociSpec.Linux.Devices)

	_, env = inject(t, root, ids[2])
	assert.Equal(t, h100(2).UUID, env[EnvNvidiaVisibleDevices])
	assert.Equal(t, "MPS", env[EnvSharing])
	assert.Equal(t, ContainerMPSPipeDir, env[EnvMPSPipeDir])
	assert.Equal(t, h100(2).UUID+"=40960M", env[EnvMPSMemLimit])
	assert.Equal(t, "50", env[EnvMPSThreadPercentage])
	assert.Equal(t, "42949672960", env[EnvGPUMemory])

	_, env = inject(t, root, ids[3])
	assert.Equal(t, "TimeSlicing", env[EnvSharing])
	assert.Equal(t, "Short", env[EnvTimeSliceInterval])
	assert.NotContains(t, env, EnvMPSMemLimit)
}

func TestMPSEnv(t *testing.T) {
	root := t.TempDir()
	w, err := New(Options{Root: root, Fake: true})
	require.NoError(t, err)
	tests := []struct {
		name    string
		memory  uint64
		cfg     *v1alpha1.GpuConfig
		limit   string
		percent string
	}{
		{name: "configured percent wins", memory: 40 * gib, cfg: mpsConfig(30), limit: "=40960M", percent: "30"},
		{name: "proportional rounded up", memory: 10 * gib, cfg: mpsConfig(0), limit: "=10240M", percent: "13"},
		{name: "whole GPU when no memory", memory: 0, cfg: mpsConfig(0), limit: "=81920M", percent: "100"},
		{name: "tiny share is at least 1", memory: 1 << 20, cfg: mpsConfig(0), limit: "=1M", percent: "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, err := w.Write(Claim{UID: "mps", Namespace: "ns", Name: "c", Devices: []Device{{Request: "r", GPU: h100(0), MemoryBytes: tt.memory, Config: tt.cfg}}})
			require.NoError(t, err)
			_, env := inject(t, root, ids...)
			assert.Equal(t, h100(0).UUID+tt.limit, env[EnvMPSMemLimit])
			assert.Equal(t, tt.percent, env[EnvMPSThreadPercentage])
		})
	}
}

func TestActiveThreadPercentage(t *testing.T) {
	tests := []struct {
		configured  int32
		memory, gpu uint64
		want        int32
	}{
		{0, 40, 80, 50}, {0, 41, 80, 52}, {0, 1, 1000, 1}, {0, 80, 80, 100}, {0, 0, 80, 100},
		{0, 10, 0, 100}, {25, 40, 80, 25}, {100, 1, 80, 100}, {0, 79, 80, 99},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ActiveThreadPercentage(tt.configured, tt.memory, tt.gpu), "%+v", tt)
	}
}

func TestIdempotentRemoveList(t *testing.T) {
	root := t.TempDir()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(2)))
	w, err := New(Options{Root: root, Fake: true, Logger: logger})
	require.NoError(t, err)
	claim := func(uid string) Claim {
		return Claim{UID: uid, Namespace: "ns", Name: "n", Devices: []Device{{Request: "gpu", GPU: h100(0)}}}
	}
	ids1, err := w.Write(claim("b-uid"))
	require.NoError(t, err)
	first, err := os.ReadFile(w.SpecPath("b-uid"))
	require.NoError(t, err)
	ids2, err := w.Write(claim("b-uid"))
	require.NoError(t, err)
	again, err := os.ReadFile(w.SpecPath("b-uid"))
	require.NoError(t, err)
	assert.Equal(t, ids1, ids2)
	assert.Equal(t, string(first), string(again), "same claim, same bytes")

	_, err = w.Write(claim("a-uid"))
	require.NoError(t, err)
	// Files of other vendors and stray files are not ours.
	require.NoError(t, os.WriteFile(filepath.Join(root, "nvidia.com-gpu.yaml"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "gpu.tessera.dev-claim_junk.tmp"), []byte("x"), 0o644))

	uids, err := w.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"a-uid", "b-uid"}, uids)

	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), "spec.", "no temp files left behind")
	}

	require.NoError(t, w.Remove("b-uid"))
	require.NoError(t, w.Remove("b-uid"), "removing twice is fine")
	_, err = os.Stat(w.SpecPath("b-uid"))
	assert.True(t, os.IsNotExist(err))
	uids, err = w.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"a-uid"}, uids)
	assert.Error(t, w.Remove(""))
	// Logged to the writer's logger (Options.Logger).
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	assert.Contains(t, logs, `INFO Wrote CDI spec claim="ns/n" uid="b-uid"`)
	assert.Contains(t, logs, `INFO Removed CDI spec uid="b-uid"`)

	// A new Writer (a restarted node agent) sees the same specs.
	w2, err := New(Options{Root: root, Fake: true})
	require.NoError(t, err)
	uids, err = w2.List()
	require.NoError(t, err)
	assert.Equal(t, []string{"a-uid"}, uids)
}

func TestSpecErrors(t *testing.T) {
	w, err := New(Options{Root: t.TempDir(), Fake: true})
	require.NoError(t, err)
	realW, err := New(Options{Root: t.TempDir(), DriverFiles: &DriverFiles{}})
	require.NoError(t, err)
	tests := []struct {
		name    string
		w       *Writer
		claim   Claim
		wantErr string
	}{
		{name: "no uid", w: w, claim: Claim{Devices: []Device{{Request: "r", GPU: h100(0)}}}, wantErr: "empty claim UID"},
		{name: "no devices", w: w, claim: Claim{UID: "u"}, wantErr: "no devices"},
		{name: "no gpu uuid", w: w, claim: Claim{UID: "u", Devices: []Device{{Request: "r"}}}, wantErr: "GPU without UUID"},
		{name: "duplicate", w: w, claim: Claim{UID: "u", Devices: []Device{{Request: "r", GPU: h100(0)}, {Request: "r", GPU: h100(0)}}}, wantErr: "listed twice"},
		{name: "mps request with two GPUs", w: w, claim: Claim{UID: "u", Devices: []Device{
			{Request: "r", GPU: h100(0), Config: mpsConfig(0)}, {Request: "r", GPU: h100(1), Config: mpsConfig(0)}}}, wantErr: "MPS shares one GPU, but the request has 2"},
		{name: "real mps without pipe dir", w: realW, claim: Claim{UID: "u", Devices: []Device{{Request: "r", GPU: h100(0), Config: mpsConfig(0)}}}, wantErr: "no MPS pipe directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.w.Write(tt.claim)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// fakeDriverRoot lays out a driver installation the way a host has it.
func fakeDriverRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	require.NoError(t, os.MkdirAll(lib, 0o755))
	for _, stem := range []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"} {
		real := stem + ".so.550.54.15"
		require.NoError(t, os.WriteFile(filepath.Join(lib, real), []byte("elf"), 0o644))
		require.NoError(t, os.Symlink(real, filepath.Join(lib, stem+".so.1")))
		require.NoError(t, os.Symlink(stem+".so.1", filepath.Join(lib, stem+".so"))) // dev link: skipped
	}
	// An absolute link, as some distributions have.
	require.NoError(t, os.Symlink("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", filepath.Join(lib, "libcudadebugger.so.1")))
	for _, p := range []string{"usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control", "usr/bin/nvidia-cdi-hook", "dev/nvidiactl", "dev/nvidia-uvm"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), nil, 0o755))
	}
	info := filepath.Join(root, "proc/driver/nvidia/gpus/0000:18:00.0/information")
	require.NoError(t, os.MkdirAll(filepath.Dir(info), 0o755))
	require.NoError(t, os.WriteFile(info, []byte("Model: NVIDIA H100\nIRQ: 42\nDevice Minor: 3\n"), 0o644))
	return root
}

func TestDiscoverDriverFiles(t *testing.T) {
	root := fakeDriverRoot(t)
	files, err := DiscoverDriverFiles(root)
	require.NoError(t, err)
	paths := map[string]string{}
	for _, f := range files.Libraries {
		paths[f.Path] = f.Source
	}
	assert.Equal(t, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", paths["/usr/lib/x86_64-linux-gnu/libcuda.so.1"])
	assert.Equal(t, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", paths["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"])
	assert.Equal(t, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", paths["/usr/lib/x86_64-linux-gnu/libcudadebugger.so.1"])
	assert.Contains(t, paths, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
	assert.NotContains(t, paths, "/usr/lib/x86_64-linux-gnu/libcuda.so")
	assert.Len(t, files.Binaries, 2)
	assert.Equal(t, "/usr/bin/nvidia-cdi-hook", files.LdcacheHook)
	assert.Equal(t, []string{"/usr/lib/x86_64-linux-gnu"}, files.LibraryDirs())

	_, err = DiscoverDriverFiles(t.TempDir())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "libcuda.so, libnvidia-ml.so not found")
	_, err = New(Options{Root: t.TempDir(), DriverRoot: t.TempDir()})
	assert.Error(t, err, "real mode without a driver fails at start")
}

func TestRealModeSpec(t *testing.T) {
	driverRoot := fakeDriverRoot(t)
	cdiRoot := t.TempDir()
	w, err := New(Options{Root: cdiRoot, DriverRoot: driverRoot, HostDriverRoot: "/host"})
	require.NoError(t, err)
	g0 := h100(0)
	g0.PCIBusID = "0000:18:00.0" // minor 3, from procfs
	g1 := h100(1)                // no procfs entry: minor = index
	ids, err := w.Write(Claim{UID: "real", Namespace: "ns", Name: "c", Devices: []Device{
		{Request: "a", GPU: g0, MemoryBytes: 20 * gib, Config: mpsConfig(0), MPSPipeDir: "/run/tessera/mps/g0/pipe"},
		{Request: "b", GPU: g1},
	}})
	require.NoError(t, err)

	spec, err := cdiapi.ReadSpec(w.SpecPath("real"), 0)
	require.NoError(t, err)
	var nodes []string
	for _, n := range spec.ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path)
		assert.Equal(t, "/host"+n.Path, n.HostPath)
	}
	assert.Equal(t, []string{"/dev/nvidiactl", "/dev/nvidia-uvm"}, nodes, "uvm-tools is absent on this host")
	mounts := map[string]string{}
	for _, m := range spec.ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	assert.Equal(t, "/host/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"])
	assert.Equal(t, "/host/usr/bin/nvidia-smi", mounts["/usr/bin/nvidia-smi"])
	require.Len(t, spec.ContainerEdits.Hooks, 1)
	assert.Equal(t, "/host/usr/bin/nvidia-cdi-hook", spec.ContainerEdits.Hooks[0].Path)
	assert.Equal(t, []string{"nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"}, spec.ContainerEdits.Hooks[0].Args)

	d0 := spec.Devices[0].ContainerEdits
	require.Len(t, d0.DeviceNodes, 1)
	assert.Equal(t, "/dev/nvidia3", d0.DeviceNodes[0].Path)
	require.Len(t, d0.Mounts, 1)
	assert.Equal(t, "/run/tessera/mps/g0/pipe", d0.Mounts[0].HostPath)
	assert.Equal(t, ContainerMPSPipeDir, d0.Mounts[0].ContainerPath)
	assert.Equal(t, "/dev/nvidia1", spec.Devices[1].ContainerEdits.DeviceNodes[0].Path)
	assert.Len(t, ids, 2)
}

// TestDiscoverHostDriver checks discovery against this machine's driver; it
// is skipped on machines without one.
func TestDiscoverHostDriver(t *testing.T) {
	files, err := DiscoverDriverFiles("/")
	if err != nil {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	assert.NotEmpty(t, files.Libraries)
	for _, f := range files.Libraries {
		assert.FileExists(t, f.Source)
	}
}
