package gpu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// ErrNVMLUnavailable is returned by NewNVML when libnvidia-ml cannot be loaded
// (no NVIDIA driver on this machine, or the library is not mounted in).
var ErrNVMLUnavailable = errors.New("NVML library (libnvidia-ml.so.1) not found")

// errGPULost marks a GPU that stopped answering NVML; Devices skips such GPUs
// rather than failing the whole node.
var errGPULost = errors.New("GPU is lost")

// NVMLInventory is the Inventory over any nvml.Interface: the real library or
// go-nvml's mock (see Fake). Everything NVML can answer is asked through it, so
// fakes exercise the same code as real GPUs.
type NVMLInventory struct {
	lib  nvml.Interface
	opts options

	closeOnce sync.Once
}

var _ Inventory = (*NVMLInventory)(nil)

// options are the seams NVML itself has no API for, plus health tuning.
type options struct {
	// pcieRoot maps a PCI bus ID to its PCIe root ("pci0000:10"); NVML does
	// not report it, so the real backend reads sysfs and fakes use the profile.
	pcieRoot func(busID string) string
	// numaFallback is asked when NVML cannot report a GPU's NUMA node.
	numaFallback func(busID string) int
	// setTimeSlice applies a compute time-slice; NVML has no public call for
	// it, so the real backend runs nvidia-smi and fakes record it.
	setTimeSlice func(uuid string, interval TimeSliceInterval) error
	// probeInterval is how often Health re-checks every GPU (lost GPUs, recovery).
	probeInterval time.Duration
	// quietPeriod is how long a GPU must stay free of critical XIDs before it
	// is reported healthy again; it keeps a flaky GPU from flapping.
	quietPeriod time.Duration
	// fakeClique overrides a fake profile's clique (WithFakeClique).
	fakeClique string
	// logger logs what calls without a context do (Devices, a fake's
	// dropped events); klog's global logger unless WithLogger.
	logger klog.Logger
}

// Option tunes an inventory.
type Option func(*options)

// WithFakeClique puts a fake node's GPUs in a multi-node NVLink clique:
// "<cluster UUID>.<clique ID>", or a clique ID alone on FakeClusterUUID.
// Real GPUs report their own; NewFake checks the value.
func WithFakeClique(clique string) Option {
	return func(o *options) { o.fakeClique = clique }
}

// WithHealthProbeInterval sets how often Health re-checks every GPU.
func WithHealthProbeInterval(d time.Duration) Option {
	return func(o *options) { o.probeInterval = d }
}

// WithRecoveryQuietPeriod sets how long a GPU must stay free of critical XID
// errors (and answer NVML, with no pending row remapping) before Health reports
// it healthy again.
func WithRecoveryQuietPeriod(d time.Duration) Option {
	return func(o *options) { o.quietPeriod = d }
}

// WithLogger sets the logger of what the inventory logs outside calls that
// take a context (Health logs to its context's logger).
func WithLogger(logger klog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// NewNVML opens the real NVML library. Without libnvidia-ml it returns an error
// wrapping ErrNVMLUnavailable instead of panicking.
func NewNVML(opts ...Option) (*NVMLInventory, error) {
	lib := nvml.New()
	// Init dlopens the library first and reports ERROR_LIBRARY_NOT_FOUND when
	// that fails, so no other NVML call is made on a missing library.
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("initializing NVML: %w; is the NVIDIA driver installed and the library visible to this process? (use --fake-gpus=PROFILE to run without GPUs)", ErrNVMLUnavailable)
	default:
		return nil, fmt.Errorf("initializing NVML: %s", nvml.ErrorString(ret))
	}
	o := options{
		pcieRoot:      sysfsPCIeRoot,
		numaFallback:  sysfsNUMANode,
		setTimeSlice:  nvidiaSMITimeSlice,
		probeInterval: 10 * time.Second,
		quietPeriod:   time.Minute,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return newInventory(lib, o), nil
}

// newInventory wraps an already initialised nvml.Interface.
func newInventory(lib nvml.Interface, o options) *NVMLInventory {
	if o.logger.GetSink() == nil {
		o.logger = klog.Background()
	}
	return &NVMLInventory{lib: lib, opts: o}
}

// NVML returns the underlying library, for code that needs NVML directly
// (go-gpuallocator, MIG management).
func (n *NVMLInventory) NVML() nvml.Interface { return n.lib }

// Close shuts NVML down; it is safe to call more than once.
func (n *NVMLInventory) Close() error {
	var err error
	n.closeOnce.Do(func() {
		if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("shutting down NVML: %s", nvml.ErrorString(ret))
		}
	})
	return err
}

// nvmlErr turns an NVML return code into an error naming what was asked.
func nvmlErr(what string, ret nvml.Return) error {
	if ret == nvml.ERROR_GPU_IS_LOST {
		return fmt.Errorf("%s: %w", what, errGPULost)
	}
	return fmt.Errorf("%s: %s", what, nvml.ErrorString(ret))
}

// Devices lists the GPUs in index order. GPUs that NVML reports lost are left
// out (and logged) so one dead GPU does not hide the others.
func (n *NVMLInventory) Devices() ([]Device, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("counting GPUs", ret)
	}
	driver, ret := n.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("reading driver version", ret)
	}
	cudaVer, ret := n.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("reading CUDA driver version", ret)
	}
	cuda := fmt.Sprintf("%d.%d", cudaVer/1000, (cudaVer%1000)/10)

	var devs []Device
	var handles []nvml.Device
	for i := 0; i < count; i++ {
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			err := nvmlErr(fmt.Sprintf("getting handle of GPU %d", i), ret)
			if errors.Is(err, errGPULost) {
				n.opts.logger.Info("Skipping a lost GPU", "gpu", i, "err", err)
				continue
			}
			return nil, err
		}
		d, err := n.readDevice(h, i)
		if errors.Is(err, errGPULost) {
			n.opts.logger.Info("Skipping a lost GPU", "gpu", i, "err", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		d.DriverVersion = driver
		d.CUDADriverVersion = cuda
		devs = append(devs, d)
		handles = append(handles, h)
	}
	fillNVLinkTopology(devs, handles)
	return devs, nil
}

// readDevice reads one GPU's own attributes (not its links).
func (n *NVMLInventory) readDevice(h nvml.Device, index int) (Device, error) {
	d := Device{Index: index, NUMANode: -1}
	var ret nvml.Return
	what := func(s string) string { return fmt.Sprintf("reading %s of GPU %d", s, index) }

	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return d, nvmlErr(what("UUID"), ret)
	}
	if d.ProductName, ret = h.GetName(); ret != nvml.SUCCESS {
		return d, nvmlErr(what("name"), ret)
	}
	arch, ret := h.GetArchitecture()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(what("architecture"), ret)
	}
	d.Architecture = archName(arch)
	major, minor, ret := h.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(what("CUDA compute capability"), ret)
	}
	d.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(what("memory"), ret)
	}
	d.MemoryBytes = mem.Total
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(what("PCI info"), ret)
	}
	d.PCIBusID = pciBusID(pci)
	d.Multiprocessors = multiprocessors(h, pci.PciDeviceId, major, minor)
	if n.opts.pcieRoot != nil {
		d.PCIeRoot = n.opts.pcieRoot(d.PCIBusID)
	}
	// nvmlDeviceGetNumaNodeId is new (driver 535+); older drivers need sysfs.
	if node, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS {
		d.NUMANode = node
	} else if ret == nvml.ERROR_GPU_IS_LOST {
		return d, nvmlErr(what("NUMA node"), ret)
	} else if n.opts.numaFallback != nil {
		d.NUMANode = n.opts.numaFallback(d.PCIBusID)
	}
	switch _, _, ret := h.GetMigMode(); ret {
	case nvml.SUCCESS:
		d.MIGCapable = true
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return d, nvmlErr(what("MIG mode"), ret)
	}
	var err error
	if d.Clique, err = readClique(h); err != nil {
		return d, fmt.Errorf("GPU %d: %w", index, err)
	}
	return d, nil
}

// knownMultiprocessors is the last resort for the SM count, keyed by PCI
// device ID, for drivers that answer neither call below.
var knownMultiprocessors = map[uint32]int{
	0x20B010DE: 108, // A100-SXM4-40GB
	0x20B210DE: 108, // A100-SXM4-80GB
	0x20F110DE: 108, // A100-PCIE-40GB
	0x20B510DE: 108, // A100-PCIE-80GB
	0x20B710DE: 56,  // A30
	0x233010DE: 132, // H100 SXM5 80GB
	0x233110DE: 114, // H100 PCIe
	0x233310DE: 132, // H200 SXM5 141GB
	0x233510DE: 132, // H200 (seen on a real H200, driver 580)
	0x27B810DE: 58,  // L4
	0x26B910DE: 142, // L40S
	0x2B0010DE: 148, // B200
}

// multiprocessors is the GPU's SM count. nvmlDeviceGetAttributes answers it
// only for MIG devices on current drivers (a real H200 on driver 580 says
// NOT_SUPPORTED), so the count is also derived from the CUDA core count, which
// every supported GPU reports, and the cores per SM of its compute capability.
func multiprocessors(h nvml.Device, pciDeviceID uint32, ccMajor, ccMinor int) int {
	if attrs, ret := h.GetAttributes(); ret == nvml.SUCCESS && attrs.MultiprocessorCount > 0 {
		return int(attrs.MultiprocessorCount)
	}
	if cores, ret := h.GetNumGpuCores(); ret == nvml.SUCCESS && cores > 0 {
		if per := coresPerSM(ccMajor, ccMinor); per > 0 && cores%per == 0 {
			return cores / per
		}
	}
	return knownMultiprocessors[pciDeviceID] // 0 when unknown
}

// coresPerSM is the number of FP32 CUDA cores in one SM of a compute
// capability (CUDA's own table: the CUDA programming guide, "Arithmetic
// Instructions"); 0 when unknown, so no SM count is guessed.
func coresPerSM(major, minor int) int {
	switch {
	case major == 3:
		return 192
	case major == 5:
		return 128
	case major == 6 && minor == 0:
		return 64
	case major == 6:
		return 128
	case major == 7:
		return 64
	case major == 8 && minor == 0:
		return 64
	case major == 8:
		return 128
	case major == 9, major == 10, major == 12:
		return 128
	}
	return 0
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	default:
		return "Unknown"
	}
}

// pciBusID formats NVML's bus ID ("00000000:18:00.0") the way sysfs and
// Kubernetes write it ("0000:18:00.0").
func pciBusID(p nvml.PciInfo) string {
	var b []byte
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	id := strings.ToLower(string(b))
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) > 4 {
		id = dom[len(dom)-4:] + ":" + rest
	}
	return id
}

// sysfsPCIeRoot resolves the PCIe root complex of a device from sysfs: the
// device's canonical path is /sys/devices/pci0000:17/0000:17:01.0/.../BDF.
func sysfsPCIeRoot(busID string) string {
	p, err := filepath.EvalSymlinks(filepath.Join("/sys/bus/pci/devices", busID))
	if err == nil {
		for _, part := range strings.Split(p, "/") {
			if strings.HasPrefix(part, "pci") {
				return part
			}
		}
	}
	return ""
}

func sysfsNUMANode(busID string) int {
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", busID, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func (n *NVMLInventory) handleByUUID(uuid string) (nvml.Device, error) {
	h, ret := n.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("finding GPU %s", uuid), ret)
	}
	return h, nil
}

// SetComputeMode sets a GPU's compute mode through NVML (needs root).
func (n *NVMLInventory) SetComputeMode(uuid string, mode ComputeMode) error {
	var m nvml.ComputeMode
	switch mode {
	case ComputeModeDefault:
		m = nvml.COMPUTEMODE_DEFAULT
	case ComputeModeExclusiveProcess:
		m = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	default:
		return fmt.Errorf("setting compute mode of GPU %s: unknown mode %d", uuid, mode)
	}
	h, err := n.handleByUUID(uuid)
	if err != nil {
		return fmt.Errorf("setting compute mode: %w", err)
	}
	if ret := h.SetComputeMode(m); ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("setting compute mode of GPU %s", uuid), ret)
	}
	return nil
}

// timeSliceLevels are nvidia-smi's compute-policy --set-timeslice values.
var timeSliceLevels = map[TimeSliceInterval]int{
	TimeSliceDefault: 0,
	TimeSliceShort:   1,
	TimeSliceMedium:  2,
	TimeSliceLong:    3,
}

// SetTimeSlice sets a GPU's compute time-slice interval.
func (n *NVMLInventory) SetTimeSlice(uuid string, interval TimeSliceInterval) error {
	if _, ok := timeSliceLevels[interval]; !ok {
		return fmt.Errorf("setting time-slice of GPU %s: unknown interval %q (want Default, Short, Medium or Long)", uuid, interval)
	}
	if _, err := n.handleByUUID(uuid); err != nil {
		return fmt.Errorf("setting time-slice: %w", err)
	}
	if err := n.opts.setTimeSlice(uuid, interval); err != nil {
		return fmt.Errorf("setting time-slice of GPU %s to %s: %w", uuid, interval, err)
	}
	return nil
}

// nvidiaSMITimeSlice applies a time-slice with nvidia-smi, as NVIDIA's own DRA
// driver does: NVML's public API has no call for compute time-slices.
func nvidiaSMITimeSlice(uuid string, interval TimeSliceInterval) error {
	out, err := exec.Command("nvidia-smi", "compute-policy", "-i", uuid,
		"--set-timeslice="+strconv.Itoa(timeSliceLevels[interval])).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nvidia-smi compute-policy: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
