package gpu

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"sigs.k8s.io/yaml"
)

// model is a GPU model a fake profile can hold: go-nvml's mock configuration
// plus what the mock does not carry.
type model struct {
	config          gpus.Config
	multiprocessors int
	migCapable      bool
}

// models are the GPU models fake profiles can name. The mock's own
// configurations are reused where go-nvml has them.
var models = map[string]model{
	"a100-sxm-40gb":  {config: renamed(gpus.A100_SXM4_40GB, "NVIDIA A100-SXM4-40GB"), multiprocessors: 108, migCapable: true},
	"a100-sxm-80gb":  {config: gpus.A100_SXM4_80GB, multiprocessors: 108, migCapable: true},
	"a100-pcie-40gb": {config: gpus.A100_PCIE_40GB, multiprocessors: 108, migCapable: true},
	"a100-pcie-80gb": {config: gpus.A100_PCIE_80GB, multiprocessors: 108, migCapable: true},
	"a30-pcie-24gb":  {config: gpus.A30_PCIE_24GB, multiprocessors: 56, migCapable: true},
	"h100-sxm-80gb":  {config: gpus.H100_SXM5_80GB, multiprocessors: 132, migCapable: true},
	"h200-sxm-141gb": {config: gpus.H200_SXM5_141GB, multiprocessors: 132, migCapable: true},
	"b200-sxm-180gb": {config: gpus.B200_SXM5_180GB, multiprocessors: 148, migCapable: true},
	"gb200-186gb":    {config: gb200, multiprocessors: 148, migCapable: true},
	"l4-24gb":        {config: l4, multiprocessors: 58},
	"l40s-48gb":      {config: l40s, multiprocessors: 142},
	"rtx-a6000-48gb": {config: rtxA6000, multiprocessors: 84},
}

// go-nvml's mock has no Ada-generation or workstation GPUs.
var (
	l4 = gpus.Config{
		Name: "NVIDIA L4", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 24576, CudaMajor: 8, CudaMinor: 9, PciDeviceId: 0x27B810DE,
	}
	l40s = gpus.Config{
		Name: "NVIDIA L40S", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 49152, CudaMajor: 8, CudaMinor: 9, PciDeviceId: 0x26B910DE,
	}
	rtxA6000 = gpus.Config{
		Name: "NVIDIA RTX A6000", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 49152, CudaMajor: 8, CudaMinor: 6, PciDeviceId: 0x223010DE,
	}
)

// gb200 is a Grace Blackwell superchip's GPU: B200's mock with the GB200's
// name and memory (186 GB usable of 192).
var gb200 = func() gpus.Config {
	c := renamed(gpus.B200_SXM5_180GB, "NVIDIA GB200")
	c.MemoryMB = 189471
	c.PciDeviceId = 0x294110DE
	return c
}()

func renamed(c gpus.Config, name string) gpus.Config {
	c.Name = name
	return c
}

// ProfileSpec is a fake node: its GPUs and how they are linked. It is also
// the format of a custom profile file (see README.md).
type ProfileSpec struct {
	// DriverVersion defaults to "550.54.15".
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion ("12.4") defaults to "12.4".
	CUDADriverVersion string      `json:"cudaDriverVersion,omitempty"`
	GPUs              []GPUSpec   `json:"gpus"`
	NVLink            *NVLinkSpec `json:"nvlink,omitempty"`
	// Clique puts every GPU in a multi-node NVLink clique,
	// "<cluster UUID>.<clique ID>" (as NVML's fabric info reads); empty for
	// none. WithFakeClique (--fake-clique) overrides it.
	Clique string `json:"clique,omitempty"`
}

// GPUSpec is one group of identical GPUs in a profile.
type GPUSpec struct {
	// Model names a built-in model (see Models); the fields below override it.
	Model string `json:"model,omitempty"`
	// Count of GPUs of this group; default 1.
	Count             int    `json:"count,omitempty"`
	ProductName       string `json:"productName,omitempty"`
	Architecture      string `json:"architecture,omitempty"`
	ComputeCapability string `json:"computeCapability,omitempty"`
	// Memory as a quantity in binary units: "80Gi", "24576Mi".
	Memory          string `json:"memory,omitempty"`
	Multiprocessors int    `json:"multiprocessors,omitempty"`
	MIGCapable      *bool  `json:"migCapable,omitempty"`
	// NUMANode of every GPU of the group; default 0.
	NUMANode *int `json:"numaNode,omitempty"`
	// PCIBusIDs, one per GPU of the group; default generated from the index.
	PCIBusIDs []string `json:"pciBusIDs,omitempty"`
	// PCIeRoot of every GPU of the group; default derived from its bus ID.
	PCIeRoot string `json:"pcieRoot,omitempty"`
}

// NVLinkSpec says how a profile's GPUs are linked.
type NVLinkSpec struct {
	// NVSwitch puts every GPU on one NVSwitch fabric.
	NVSwitch bool `json:"nvswitch,omitempty"`
	// Bridges link pairs of GPUs directly.
	Bridges []BridgeSpec `json:"bridges,omitempty"`
}

// BridgeSpec is a direct NVLink between two GPUs.
type BridgeSpec struct {
	GPUs [2]int `json:"gpus"`
	// Links is the number of NVLinks in the bridge; default 4.
	Links int `json:"links,omitempty"`
}

// builtinProfiles are the profiles --fake-gpus can name.
var builtinProfiles = map[string]ProfileSpec{
	"h100-sxm-8": {
		GPUs: []GPUSpec{
			{Model: "h100-sxm-80gb", Count: 4, NUMANode: ptr(0), PCIBusIDs: []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}},
			{Model: "h100-sxm-80gb", Count: 4, NUMANode: ptr(1), PCIBusIDs: []string{"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}},
		},
		NVLink: &NVLinkSpec{NVSwitch: true},
	},
	"h200-sxm-8": {
		GPUs: []GPUSpec{
			{Model: "h200-sxm-141gb", Count: 4, NUMANode: ptr(0), PCIBusIDs: []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}},
			{Model: "h200-sxm-141gb", Count: 4, NUMANode: ptr(1), PCIBusIDs: []string{"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}},
		},
		NVLink: &NVLinkSpec{NVSwitch: true},
	},
	"a100-pcie-4": {
		GPUs: []GPUSpec{
			{Model: "a100-pcie-40gb", Count: 2, NUMANode: ptr(0), PCIBusIDs: []string{"0000:31:00.0", "0000:4b:00.0"}},
			{Model: "a100-pcie-40gb", Count: 2, NUMANode: ptr(1), PCIBusIDs: []string{"0000:b1:00.0", "0000:ca:00.0"}},
		},
		NVLink: &NVLinkSpec{Bridges: []BridgeSpec{{GPUs: [2]int{0, 1}, Links: 12}, {GPUs: [2]int{2, 3}, Links: 12}}},
	},
	// One compute tray of a GB200 NVL72 rack: 4 GPUs on the rack's NVLink
	// fabric, clique 1 of FakeClusterUUID unless --fake-clique says
	// another, so a test lays out the trays of a rack (18 of them in one
	// clique) or several racks.
	"gb200-nvl72": {
		GPUs: []GPUSpec{
			{Model: "gb200-186gb", Count: 2, NUMANode: ptr(0), PCIBusIDs: []string{"0000:01:00.0", "0000:11:00.0"}},
			{Model: "gb200-186gb", Count: 2, NUMANode: ptr(1), PCIBusIDs: []string{"0000:81:00.0", "0000:91:00.0"}},
		},
		NVLink: &NVLinkSpec{NVSwitch: true},
		Clique: FakeClusterUUID.String() + ".1",
	},
	"l4-2": {
		GPUs: []GPUSpec{
			{Model: "l4-24gb", NUMANode: ptr(0), PCIBusIDs: []string{"0000:01:00.0"}},
			{Model: "l4-24gb", NUMANode: ptr(1), PCIBusIDs: []string{"0000:81:00.0"}},
		},
	},
}

func ptr[T any](v T) *T { return &v }

// Profiles lists the built-in fake profile names, sorted.
func Profiles() []string {
	names := make([]string, 0, len(builtinProfiles))
	for n := range builtinProfiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Models lists the GPU model names a custom profile can use, sorted.
func Models() []string {
	names := make([]string, 0, len(models))
	for n := range models {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LoadProfile reads a custom profile from a YAML file, strictly: unknown
// fields are errors.
func LoadProfile(path string) (ProfileSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ProfileSpec{}, fmt.Errorf("reading GPU profile: %w", err)
	}
	p, err := ParseProfile(data)
	if err != nil {
		return ProfileSpec{}, fmt.Errorf("GPU profile %s: %w", path, err)
	}
	return p, nil
}

// ParseProfile decodes and validates a profile from YAML.
func ParseProfile(data []byte) (ProfileSpec, error) {
	var p ProfileSpec
	// Unknown fields are found first, by path ("gpus[1].cout"): the JSON
	// decoder behind sigs.k8s.io/yaml names only the key.
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return ProfileSpec{}, fmt.Errorf("decoding: %w", err)
	}
	if err := checkFields(generic, reflect.TypeOf(p), ""); err != nil {
		return ProfileSpec{}, err
	}
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return ProfileSpec{}, fmt.Errorf("decoding: %w", err)
	}
	if _, err := p.resolve(); err != nil {
		return ProfileSpec{}, err
	}
	return p, nil
}

// fakeGPU is one resolved GPU of a profile.
type fakeGPU struct {
	config          gpus.Config
	multiprocessors int
	migCapable      bool
	numaNode        int
	busID           string
	bus             uint32
	pcieRoot        string
}

// resolvedProfile is a validated profile, ready to build a mock from.
type resolvedProfile struct {
	driverVersion string
	cudaVersion   int // NVML's encoding: 12040 for 12.4
	gpus          []fakeGPU
	nvswitch      bool
	links         map[[2]int]int // GPU pair (low, high) -> NVLink count
	// clique is every GPU's multi-node NVLink clique ("" for none).
	clique string
}

var (
	busIDRE    = regexp.MustCompile(`^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)
	pcieRootRE = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)
	ccRE       = regexp.MustCompile(`^([0-9]+)\.([0-9]+)$`)
	memRE      = regexp.MustCompile(`^([0-9]+)(Mi|Gi|Ti)$`)
	archs      = map[string]nvml.DeviceArchitecture{
		"Volta": nvml.DEVICE_ARCH_VOLTA, "Turing": nvml.DEVICE_ARCH_TURING, "Ampere": nvml.DEVICE_ARCH_AMPERE,
		"Ada Lovelace": nvml.DEVICE_ARCH_ADA, "Hopper": nvml.DEVICE_ARCH_HOPPER, "Blackwell": nvml.DEVICE_ARCH_BLACKWELL,
	}
)

// maxFakeGPUs bounds a profile so generated bus IDs stay distinct.
const maxFakeGPUs = 16

// resolve validates the profile and expands it, with errors naming the field.
func (p ProfileSpec) resolve() (*resolvedProfile, error) {
	r := &resolvedProfile{driverVersion: p.DriverVersion, cudaVersion: 12040, links: map[[2]int]int{}}
	if r.driverVersion == "" {
		r.driverVersion = "550.54.15"
	}
	if p.CUDADriverVersion != "" {
		m := ccRE.FindStringSubmatch(p.CUDADriverVersion)
		if m == nil {
			return nil, fmt.Errorf("cudaDriverVersion: %q is not MAJOR.MINOR", p.CUDADriverVersion)
		}
		major, _ := strconv.Atoi(m[1])
		minor, _ := strconv.Atoi(m[2])
		r.cudaVersion = major*1000 + minor*10
	}
	if len(p.GPUs) == 0 {
		return nil, fmt.Errorf("gpus: at least one GPU group is required")
	}
	if p.Clique != "" {
		if _, _, err := ParseClique(p.Clique); err != nil {
			return nil, fmt.Errorf("clique: %w", err)
		}
		r.clique = p.Clique
	}
	seenBus := map[string]string{}
	for gi, g := range p.GPUs {
		field := func(f string) string { return fmt.Sprintf("gpus[%d].%s", gi, f) }
		proto, err := g.resolve(field)
		if err != nil {
			return nil, err
		}
		if err := r.addGPUs(g, proto, field, seenBus); err != nil {
			return nil, err
		}
	}
	if p.NVLink != nil {
		if err := r.resolveNVLink(p.NVLink); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// resolve is what every GPU of the group is (model, then what the group
// overrides), without its place (bus, PCIe root, NUMA node).
func (g GPUSpec) resolve(field func(string) string) (fakeGPU, error) {
	var m model
	if g.Model != "" {
		var ok bool
		if m, ok = models[g.Model]; !ok {
			return fakeGPU{}, fmt.Errorf("%s: unknown model %q (known: %s)", field("model"), g.Model, strings.Join(Models(), ", "))
		}
	}
	c := m.config
	if g.ProductName != "" {
		c.Name = g.ProductName
	}
	if g.Architecture != "" {
		a, ok := archs[g.Architecture]
		if !ok {
			known := make([]string, 0, len(archs))
			for k := range archs {
				known = append(known, k)
			}
			sort.Strings(known)
			return fakeGPU{}, fmt.Errorf("%s: unknown architecture %q (known: %s)", field("architecture"), g.Architecture, strings.Join(known, ", "))
		}
		c.Architecture = a
	}
	if g.ComputeCapability != "" {
		mm := ccRE.FindStringSubmatch(g.ComputeCapability)
		if mm == nil {
			return fakeGPU{}, fmt.Errorf("%s: %q is not MAJOR.MINOR", field("computeCapability"), g.ComputeCapability)
		}
		c.CudaMajor, _ = strconv.Atoi(mm[1])
		c.CudaMinor, _ = strconv.Atoi(mm[2])
	}
	if g.Memory != "" {
		mm := memRE.FindStringSubmatch(g.Memory)
		if mm == nil {
			return fakeGPU{}, fmt.Errorf("%s: %q is not a whole number of Mi, Gi or Ti", field("memory"), g.Memory)
		}
		v, err := strconv.ParseUint(mm[1], 10, 40)
		if err != nil || v == 0 {
			return fakeGPU{}, fmt.Errorf("%s: %q is out of range", field("memory"), g.Memory)
		}
		c.MemoryMB = v * map[string]uint64{"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}[mm[2]]
	}
	sms := m.multiprocessors
	if g.Multiprocessors < 0 {
		return fakeGPU{}, fmt.Errorf("%s: must not be negative", field("multiprocessors"))
	}
	if g.Multiprocessors > 0 {
		sms = g.Multiprocessors
	}
	mig := m.migCapable
	if g.MIGCapable != nil {
		mig = *g.MIGCapable
	}
	if mig && len(c.MIGProfiles.GpuInstanceProfiles) == 0 {
		return fakeGPU{}, fmt.Errorf("%s: model %q has no MIG profiles in go-nvml's mock", field("migCapable"), g.Model)
	}
	// Without a model every attribute must be given.
	switch {
	case c.Name == "":
		return fakeGPU{}, fmt.Errorf("%s: required when no model is given", field("productName"))
	case c.Architecture == 0:
		return fakeGPU{}, fmt.Errorf("%s: required when no model is given", field("architecture"))
	case c.CudaMajor == 0:
		return fakeGPU{}, fmt.Errorf("%s: required when no model is given", field("computeCapability"))
	case c.MemoryMB == 0:
		return fakeGPU{}, fmt.Errorf("%s: required when no model is given", field("memory"))
	case sms == 0:
		return fakeGPU{}, fmt.Errorf("%s: required when no model is given", field("multiprocessors"))
	}
	if c.Brand == 0 {
		c.Brand = nvml.BRAND_NVIDIA
	}
	return fakeGPU{config: c, multiprocessors: sms, migCapable: mig}, nil
}

// addGPUs adds the group's GPUs to the profile, each in its place: the
// bus IDs given or generated, its PCIe root and NUMA node.
func (r *resolvedProfile) addGPUs(g GPUSpec, proto fakeGPU, field func(string) string, seenBus map[string]string) error {
	count := g.Count
	if count < 0 {
		return fmt.Errorf("%s: must not be negative", field("count"))
	}
	if count == 0 {
		count = 1
	}
	if len(r.gpus)+count > maxFakeGPUs {
		return fmt.Errorf("%s: a profile holds at most %d GPUs", field("count"), maxFakeGPUs)
	}
	if len(g.PCIBusIDs) != 0 && len(g.PCIBusIDs) != count {
		return fmt.Errorf("%s: has %d entries for %d GPUs", field("pciBusIDs"), len(g.PCIBusIDs), count)
	}
	if g.PCIeRoot != "" && !pcieRootRE.MatchString(g.PCIeRoot) {
		return fmt.Errorf("%s: %q is not like pci0000:10", field("pcieRoot"), g.PCIeRoot)
	}
	numa := 0
	if g.NUMANode != nil {
		if *g.NUMANode < 0 {
			return fmt.Errorf("%s: must not be negative", field("numaNode"))
		}
		numa = *g.NUMANode
	}
	for k := 0; k < count; k++ {
		idx := len(r.gpus)
		// Generated IDs give every GPU its own root complex, 16 buses apart.
		busID := fmt.Sprintf("0000:%02x:00.0", 0x08+0x10*idx)
		if len(g.PCIBusIDs) != 0 {
			busID = strings.ToLower(g.PCIBusIDs[k])
		}
		mm := busIDRE.FindStringSubmatch(busID)
		if mm == nil {
			return fmt.Errorf("%s[%d]: %q is not a PCI address like 0000:18:00.0", field("pciBusIDs"), k, busID)
		}
		if other, dup := seenBus[busID]; dup {
			return fmt.Errorf("%s[%d]: %s is already used by %s", field("pciBusIDs"), k, busID, other)
		}
		seenBus[busID] = fmt.Sprintf("GPU %d", idx)
		bus, _ := strconv.ParseUint(mm[2], 16, 8)
		root := g.PCIeRoot
		if root == "" {
			root = fmt.Sprintf("pci%s:%02x", mm[1], bus&0xf0)
		}
		gpu := proto
		gpu.numaNode, gpu.busID, gpu.bus, gpu.pcieRoot = numa, busID, uint32(bus), root
		r.gpus = append(r.gpus, gpu)
	}
	return nil
}

// resolveNVLink checks the NVLink bridges (or NVSwitch) against the
// profile's GPUs and records them.
func (r *resolvedProfile) resolveNVLink(nv *NVLinkSpec) error {
	r.nvswitch = nv.NVSwitch
	for bi, b := range nv.Bridges {
		field := fmt.Sprintf("nvlink.bridges[%d]", bi)
		for _, g := range b.GPUs {
			if g < 0 || g >= len(r.gpus) {
				return fmt.Errorf("%s.gpus: index %d out of range (the profile has %d GPUs)", field, g, len(r.gpus))
			}
		}
		if b.GPUs[0] == b.GPUs[1] {
			return fmt.Errorf("%s.gpus: a GPU cannot be bridged to itself", field)
		}
		// Checked here, each bridge alone: the sums below would
		// overflow for bridges of 2⁶² links and pass their check.
		if b.Links < 0 || b.Links > nvlinksPerGPU {
			return fmt.Errorf("%s.links: %d is out of range (0 to %d, 0 meaning 4)", field, b.Links, nvlinksPerGPU)
		}
		links := b.Links
		if links == 0 {
			links = 4
		}
		pair := [2]int{min(b.GPUs[0], b.GPUs[1]), max(b.GPUs[0], b.GPUs[1])}
		if _, dup := r.links[pair]; dup {
			return fmt.Errorf("%s.gpus: GPUs %d and %d are already bridged", field, pair[0], pair[1])
		}
		r.links[pair] = links
	}
	if r.nvswitch && len(r.links) > 0 {
		return fmt.Errorf("nvlink: set either nvswitch or bridges, not both")
	}
	// A GPU's links are shared among its bridges; NVML numbers them 0..N-1.
	used := make([]int, len(r.gpus))
	for pair, n := range r.links {
		used[pair[0]] += n
		used[pair[1]] += n
	}
	for i, u := range used {
		if u > nvlinksPerGPU {
			return fmt.Errorf("nvlink.bridges: GPU %d has %d links in all, more than %d", i, u, nvlinksPerGPU)
		}
	}
	return nil
}

// nvlinksPerGPU is the number of NVLinks a fake GPU has (Hopper's 18).
const nvlinksPerGPU = 18

// checkFields reports the first key in v that type t has no field for.
func checkFields(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch; the decoder reports it
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = t.Field(i).Type
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown field %q", p)
			}
			if err := checkFields(m[k], ft, p); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		l, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, e := range l {
			if err := checkFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}
