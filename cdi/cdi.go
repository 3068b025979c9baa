// Package cdi writes the Container Device Interface specs through which
// containerd (or CRI-O) gives a container the GPUs of a prepared claim.
//
// One spec file per claim, named after the claim's UID, holds one CDI device
// per (request, GPU) of the claim. The kind is gpu.tessera.dev/claim, so a
// device's fully-qualified name is
//
//	gpu.tessera.dev/claim=<claimUID>_<request>_<gpuUUID>
//
// which is what the DRA plugin returns to the kubelet. Specs are validated by
// the CDI library and written atomically (a temp file of ours, fsync,
// rename), so a reader never sees a half-written file and writing the same
// claim twice is harmless.
package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
)

const (
	// Vendor and Class make the CDI kind gpu.tessera.dev/claim; the vendor
	// is the DRA driver's name (internal/draname).
	Vendor = draname.Driver
	Class  = "claim"
	Kind   = Vendor + "/" + Class

	// DefaultRoot is where container runtimes look for dynamic CDI specs.
	DefaultRoot = "/var/run/cdi"

	// ContainerMPSPipeDir is where an MPS claim's container sees its GPU's
	// MPS pipe directory (the CUDA default, so clients that ignore the env
	// still find it).
	ContainerMPSPipeDir = "/tmp/nvidia-mps"

	// Spec annotations, for people and for List.
	AnnotationClaimUID = draname.Driver + "/claim-uid"
	AnnotationClaim    = draname.Driver + "/claim"

	specExt = ".json"
)

// Env variable names set in every container.
const (
	EnvNvidiaVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvGPUUUIDs             = "TESSERA_GPU_UUIDS"
	EnvClaim                = "TESSERA_CLAIM"
	EnvClaimUID             = "TESSERA_CLAIM_UID"
	EnvSharing              = "TESSERA_SHARING"
	EnvGPUMemory            = "TESSERA_GPU_MEMORY_BYTES"
	EnvTimeSliceInterval    = "TESSERA_TIMESLICE_INTERVAL"
	EnvMPSPipeDir           = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSMemLimit          = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSThreadPercentage  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Options configure a Writer.
type Options struct {
	// Root is the CDI spec directory; DefaultRoot when empty.
	Root string
	// Fake writes env only: no device nodes, driver files or mounts, so
	// containers on nodes without GPUs (kind, the real-node tests) start and
	// can print what they were given.
	Fake bool
	// DriverRoot is where this process sees the host's driver installation
	// ("/" when empty; e.g. "/driver-root" when tessera-node runs in a
	// container with the host root mounted there).
	DriverRoot string
	// HostDriverRoot is where the container runtime sees that same
	// installation, used as the source of mounts and device nodes; "/" when
	// empty.
	HostDriverRoot string
	// DriverFiles overrides discovery of driver libraries and binaries (real
	// mode only); nil means DiscoverDriverFiles(DriverRoot).
	DriverFiles *DriverFiles
	// Logger logs what the writer does (specs written and removed); klog's
	// global logger when unset. The driver passes its own.
	Logger klog.Logger
}

// Device is one GPU of a claim to expose to containers.
type Device struct {
	// Request is the request name of the allocation result ("gpu", or
	// "gpu/small" for a subrequest).
	Request string
	GPU     gpu.Device
	// MemoryBytes is the consumed memory capacity; 0 means the whole GPU.
	MemoryBytes uint64
	// Config is the request's final config (v1alpha1.ConfigForRequest); nil
	// means Exclusive.
	Config *v1alpha1.GpuConfig
	// MPSPipeDir is the host path of the GPU's MPS pipe directory (from the
	// sharing package); required for MPS in real mode.
	MPSPipeDir string
}

// Claim is a prepared claim: what one spec file describes.
type Claim struct {
	UID       string
	Namespace string
	Name      string
	Devices   []Device
}

// Writer generates, writes, lists and removes claim specs.
type Writer struct {
	opts  Options
	files DriverFiles
}

// New returns a Writer for opts. In real mode it discovers the driver files
// once, so a node without a driver fails here and not on the first claim.
func New(opts Options) (*Writer, error) {
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	if opts.HostDriverRoot == "" {
		opts.HostDriverRoot = "/"
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	if err := os.MkdirAll(opts.Root, 0o755); err != nil {
		return nil, fmt.Errorf("creating CDI spec directory %s: %w", opts.Root, err)
	}
	w := &Writer{opts: opts}
	if !opts.Fake {
		if opts.DriverFiles != nil {
			w.files = *opts.DriverFiles
		} else {
			files, err := DiscoverDriverFiles(opts.DriverRoot)
			if err != nil {
				return nil, err
			}
			w.files = files
		}
		w.opts.Logger.Info("CDI driver files", "libraries", len(w.files.Libraries), "binaries", len(w.files.Binaries), "ldcacheHook", w.files.LdcacheHook != "")
	}
	return w, nil
}

// Root returns the spec directory.
func (w *Writer) Root() string { return w.opts.Root }

// DeviceName is the CDI device name of one GPU of one request of a claim.
// Request names may hold '/' (subrequests), which CDI names may not.
func DeviceName(claimUID, request, gpuUUID string) string {
	return claimUID + "_" + strings.ReplaceAll(request, "/", "-") + "_" + gpuUUID
}

// QualifiedName is the fully-qualified CDI device ID the kubelet passes to
// the runtime.
func QualifiedName(deviceName string) string {
	return parser.QualifiedName(Vendor, Class, deviceName)
}

// SpecName is the spec file name (without directory) of a claim.
func SpecName(claimUID string) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, claimUID) + specExt
}

// SpecPath is the path of a claim's spec file.
func (w *Writer) SpecPath(claimUID string) string {
	return filepath.Join(w.opts.Root, SpecName(claimUID))
}

// Write generates the claim's spec and writes it atomically, replacing any
// earlier one. It returns the qualified CDI device ID of each of
// c.Devices, in order.
func (w *Writer) Write(c Claim) ([]string, error) {
	spec, ids, err := w.Spec(c)
	if err != nil {
		return nil, err
	}
	if err := w.writeSpec(spec, SpecName(c.UID)); err != nil {
		return nil, fmt.Errorf("writing CDI spec for claim %s/%s (%s): %w", c.Namespace, c.Name, c.UID, err)
	}
	w.opts.Logger.V(2).Info("Wrote CDI spec", "claim", klog.KRef(c.Namespace, c.Name), "uid", c.UID, "path", w.SpecPath(c.UID), "devices", ids)
	return ids, nil
}

// Remove deletes the claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID string) error {
	if claimUID == "" {
		return errors.New("removing CDI spec: empty claim UID")
	}
	if err := os.Remove(w.SpecPath(claimUID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing CDI spec of claim %s: %w", claimUID, err)
	}
	w.opts.Logger.V(2).Info("Removed CDI spec", "uid", claimUID)
	return nil
}

// List returns the UIDs of the claims that have a spec, sorted, so the
// driver can remove specs of claims it no longer knows after a restart.
func (w *Writer) List() ([]string, error) {
	prefix := cdiapi.GenerateTransientSpecName(Vendor, Class, "")
	entries, err := os.ReadDir(w.opts.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing CDI specs in %s: %w", w.opts.Root, err)
	}
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, specExt) {
			continue
		}
		if uid := strings.TrimSuffix(strings.TrimPrefix(name, prefix), specExt); uid != "" {
			uids = append(uids, uid)
		}
	}
	sort.Strings(uids)
	return uids, nil
}

// Spec generates the claim's spec without writing it, and the qualified
// device IDs in the order of c.Devices.
func (w *Writer) Spec(c Claim) (*cdispec.Spec, []string, error) {
	if c.UID == "" {
		return nil, nil, errors.New("generating CDI spec: empty claim UID")
	}
	if len(c.Devices) == 0 {
		return nil, nil, fmt.Errorf("generating CDI spec for claim %s: no devices", c.UID)
	}
	spec := &cdispec.Spec{
		Kind: Kind,
		Annotations: map[string]string{
			AnnotationClaimUID: c.UID,
			AnnotationClaim:    c.Namespace + "/" + c.Name,
		},
	}
	if !w.opts.Fake {
		spec.ContainerEdits = w.commonEdits()
	}

	// Env that lists GPUs is per request: a container gets the devices of
	// the requests it names, and all devices of one request carry the same
	// values, so they never contradict each other.
	byRequest := map[string][]Device{}
	for _, d := range c.Devices {
		byRequest[d.Request] = append(byRequest[d.Request], d)
	}

	ids := make([]string, len(c.Devices))
	seen := map[string]bool{}
	for i, d := range c.Devices {
		if d.GPU.UUID == "" {
			return nil, nil, fmt.Errorf("claim %s request %q: GPU without UUID", c.UID, d.Request)
		}
		name := DeviceName(c.UID, d.Request, d.GPU.UUID)
		if seen[name] {
			return nil, nil, fmt.Errorf("claim %s: GPU %s listed twice for request %q", c.UID, d.GPU.UUID, d.Request)
		}
		seen[name] = true
		edits, err := w.deviceEdits(c, d, byRequest[d.Request])
		if err != nil {
			return nil, nil, err
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: edits})
		ids[i] = QualifiedName(name)
	}

	// The oldest spec version that holds what we wrote, so older runtimes
	// can read it.
	version, err := cdiapi.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("claim %s: CDI spec version: %w", c.UID, err)
	}
	spec.Version = version
	return spec, ids, nil
}

func (w *Writer) deviceEdits(c Claim, d Device, siblings []Device) (cdispec.ContainerEdits, error) {
	strategy := d.Config.Strategy()
	uuids := make([]string, len(siblings))
	for i, s := range siblings {
		uuids[i] = s.GPU.UUID
	}
	env := []string{
		EnvNvidiaVisibleDevices + "=" + strings.Join(uuids, ","),
		EnvGPUUUIDs + "=" + strings.Join(uuids, ","),
		EnvClaim + "=" + c.Namespace + "/" + c.Name,
		EnvClaimUID + "=" + c.UID,
		EnvSharing + "=" + string(strategy),
	}
	if d.MemoryBytes > 0 {
		env = append(env, EnvGPUMemory+"="+strconv.FormatUint(d.MemoryBytes, 10))
	}
	var edits cdispec.ContainerEdits
	switch strategy {
	case v1alpha1.MPS:
		// An MPS client talks to one control daemon, and Tessera runs one
		// per GPU: an MPS request therefore holds one GPU.
		if len(siblings) > 1 {
			return edits, fmt.Errorf("claim %s request %q: MPS shares one GPU, but the request has %d", c.UID, d.Request, len(siblings))
		}
		memory := d.MemoryBytes
		if memory == 0 || memory > d.GPU.MemoryBytes {
			memory = d.GPU.MemoryBytes
		}
		env = append(env,
			EnvMPSPipeDir+"="+ContainerMPSPipeDir,
			EnvMPSMemLimit+"="+MPSMemoryLimit(d.GPU.UUID, memory),
			EnvMPSThreadPercentage+"="+strconv.Itoa(int(ActiveThreadPercentage(d.Config.ComputePercent(), memory, d.GPU.MemoryBytes))),
		)
		if !w.opts.Fake {
			if d.MPSPipeDir == "" {
				return edits, fmt.Errorf("claim %s request %q: MPS GPU %s has no MPS pipe directory", c.UID, d.Request, d.GPU.UUID)
			}
			edits.Mounts = append(edits.Mounts, &cdispec.Mount{
				HostPath:      d.MPSPipeDir,
				ContainerPath: ContainerMPSPipeDir,
				Options:       []string{"rw", "nosuid", "nodev", "bind"},
			})
		}
	case v1alpha1.TimeSlicing:
		env = append(env, EnvTimeSliceInterval+"="+string(d.Config.Interval()))
	}
	edits.Env = env
	if !w.opts.Fake {
		minor := deviceMinor(w.opts.DriverRoot, d.GPU)
		edits.DeviceNodes = append(edits.DeviceNodes, w.deviceNode(fmt.Sprintf("/dev/nvidia%d", minor)))
	}
	return edits, nil
}

// MPSMemoryLimit formats CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for one GPU, in
// whole MiB rounded down, so the limit never exceeds what was allocated.
func MPSMemoryLimit(uuid string, memoryBytes uint64) string {
	return fmt.Sprintf("%s=%dM", uuid, memoryBytes>>20)
}

// ActiveThreadPercentage is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: the configured
// percentage when set (1..100), otherwise the claim's share of the GPU's
// memory, rounded up, at least 1.
func ActiveThreadPercentage(configured int32, memoryBytes, gpuMemoryBytes uint64) int32 {
	if configured > 0 {
		return min(configured, 100)
	}
	if gpuMemoryBytes == 0 || memoryBytes == 0 || memoryBytes >= gpuMemoryBytes {
		return 100
	}
	p := math.Ceil(float64(memoryBytes) * 100 / float64(gpuMemoryBytes))
	return int32(max(1, min(100, p)))
}

// commonEdits are the spec-wide edits of real mode: control device nodes,
// driver libraries and binaries, and the ld cache hook.
func (w *Writer) commonEdits() cdispec.ContainerEdits {
	var e cdispec.ContainerEdits
	for _, n := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		// uvm-tools is missing on some installs; only what exists is passed.
		if _, err := os.Stat(filepath.Join(w.opts.DriverRoot, n)); err == nil || n == "/dev/nvidiactl" {
			e.DeviceNodes = append(e.DeviceNodes, w.deviceNode(n))
		}
	}
	for _, f := range append(append([]DriverFile{}, w.files.Libraries...), w.files.Binaries...) {
		e.Mounts = append(e.Mounts, &cdispec.Mount{
			HostPath:      filepath.Join(w.opts.HostDriverRoot, f.Source),
			ContainerPath: f.Path,
			Options:       []string{"ro", "nosuid", "nodev", "rbind", "rprivate"},
		})
	}
	if w.files.LdcacheHook != "" && len(w.files.Libraries) > 0 {
		args := []string{filepath.Base(w.files.LdcacheHook), "update-ldcache"}
		for _, dir := range w.files.LibraryDirs() {
			args = append(args, "--folder", dir)
		}
		e.Hooks = append(e.Hooks, &cdispec.Hook{
			HookName: "createContainer",
			Path:     filepath.Join(w.opts.HostDriverRoot, w.files.LdcacheHook),
			Args:     args,
		})
	}
	return e
}

func (w *Writer) deviceNode(path string) *cdispec.DeviceNode {
	n := &cdispec.DeviceNode{Path: path}
	if w.opts.HostDriverRoot != "/" {
		n.HostPath = filepath.Join(w.opts.HostDriverRoot, path)
	}
	return n
}
