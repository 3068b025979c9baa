package gpu

import (
	"crypto/sha1"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Fake is an inventory of fake GPUs: go-nvml's mock server with the topology,
// event and settings functions filled in, read through the same NVMLInventory
// code as real GPUs. Tests can inject health events and read back settings.
type Fake struct {
	*NVMLInventory
	// Profile is the profile name or file the fake was built from.
	Profile string
	// Node is the node name the UUIDs derive from.
	Node string

	server  *server.Server
	profile *resolvedProfile
	index   map[nvml.Device]int

	mu    sync.Mutex
	state []fakeState
	sets  map[*fakeEventSet]struct{}
}

type fakeState struct {
	lost        bool
	faulted     bool // a critical XID that needs a GPU reset (until Recover)
	computeMode nvml.ComputeMode
	timeSlice   TimeSliceInterval
}

// fakeEventSet is an NVML event set whose events come from Fake's injections.
type fakeEventSet struct {
	mock.EventSet
	events     chan nvml.EventData
	registered map[int]uint64 // GPU index -> event mask
}

// NewFake builds fake GPUs from a built-in profile name (see Profiles) or the
// path of a YAML profile file, for the named node: UUIDs derive from node and
// index, so they are stable across restarts and differ between nodes.
func NewFake(profile, nodeName string, opts ...Option) (*Fake, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("fake GPUs: node name is empty; UUIDs derive from it")
	}
	spec, ok := builtinProfiles[profile]
	if !ok {
		if _, err := os.Stat(profile); err != nil {
			if strings.ContainsAny(profile, "/.") {
				return nil, fmt.Errorf("fake GPU profile %q: %w", profile, err)
			}
			return nil, fmt.Errorf("unknown fake GPU profile %q: want one of %s, or the path of a YAML profile file",
				profile, strings.Join(Profiles(), ", "))
		}
		var err error
		if spec, err = LoadProfile(profile); err != nil {
			return nil, err
		}
	}
	f, err := NewFakeFromSpec(spec, nodeName, opts...)
	if err != nil {
		return nil, fmt.Errorf("fake GPU profile %q: %w", profile, err)
	}
	f.Profile = profile
	return f, nil
}

// NewFakeFromSpec builds fake GPUs from a profile given in Go.
func NewFakeFromSpec(spec ProfileSpec, nodeName string, opts ...Option) (*Fake, error) {
	r, err := spec.resolve()
	if err != nil {
		return nil, err
	}
	var given options
	for _, opt := range opts {
		opt(&given)
	}
	if given.fakeClique != "" {
		if r.clique, err = cliqueInput(given.fakeClique); err != nil {
			return nil, err
		}
	}
	configs := make([]gpus.Config, len(r.gpus))
	for i, g := range r.gpus {
		configs[i] = g.config
	}
	srv, err := server.New(
		server.WithGPUs(configs...),
		server.WithDriverVersion(r.driverVersion),
		server.WithNVMLVersion("12."+r.driverVersion),
		server.WithCUDADriverVersion(r.cudaVersion),
	)
	if err != nil {
		return nil, fmt.Errorf("building NVML mock: %w", err)
	}
	f := &Fake{
		Node:    nodeName,
		server:  srv,
		profile: r,
		index:   make(map[nvml.Device]int, len(srv.Devices)),
		state:   make([]fakeState, len(srv.Devices)),
		sets:    map[*fakeEventSet]struct{}{},
	}
	for i, d := range srv.Devices {
		f.index[d] = i
		f.state[i].timeSlice = TimeSliceDefault
		f.state[i].computeMode = nvml.COMPUTEMODE_DEFAULT
	}
	for i, d := range srv.Devices {
		f.wireDevice(i, d.(*server.Device))
	}
	srv.EventSetCreateFunc = f.newEventSet
	srv.SystemGetCudaDriverVersion_v2Func = srv.SystemGetCudaDriverVersionFunc

	o := options{
		pcieRoot: func(busID string) string {
			for _, g := range r.gpus {
				if g.busID == busID {
					return g.pcieRoot
				}
			}
			return ""
		},
		numaFallback:  func(string) int { return -1 },
		setTimeSlice:  f.recordTimeSlice,
		probeInterval: 100 * time.Millisecond,
	}
	for _, opt := range opts {
		opt(&o)
	}
	f.NVMLInventory = newInventory(srv, o)
	return f, nil
}

// FakeUUID is the UUID of fake GPU index on node: a name-based (version 5
// style) UUID of the pair, so it is stable and differs between nodes.
func FakeUUID(node string, index int) string {
	h := sha1.Sum([]byte(fmt.Sprintf("tessera.dev/fake-gpu\x00%s\x00%d", node, index)))
	h[6] = (h[6] & 0x0f) | 0x50
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// nvmlPciInfo builds NVML's PCI info for a bus ID like "0000:18:00.0".
func nvmlPciInfo(busID string, deviceID uint32) nvml.PciInfo {
	var p nvml.PciInfo
	var dom, bus, dev, fn uint32
	_, _ = fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn)
	p.Domain, p.Bus, p.Device = dom, bus, dev
	p.PciDeviceId = deviceID
	p.PciSubSystemId = 0x16A110DE
	// NVML writes an 8-digit domain in BusId and a 4-digit one in BusIdLegacy.
	long := fmt.Sprintf("%08x:%02x:%02x.%x", dom, bus, dev, fn)
	short := fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
	for i := 0; i < len(long) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(strings.ToUpper(long)[i])
	}
	for i := 0; i < len(short) && i < len(p.BusIdLegacy)-1; i++ {
		p.BusIdLegacy[i] = int8(strings.ToUpper(short)[i])
	}
	return p
}

// switchBusID is the PCI address of NVSwitch s; domain 1 keeps it apart from GPUs.
func switchBusID(s int) string { return fmt.Sprintf("0001:%02x:00.0", s) }

const fakeNVSwitches = 4

// fakeLink is one NVLink of a fake GPU.
type fakeLink struct {
	remoteBusID string
	remoteType  nvml.IntNvLinkDeviceType
}

// linksOf numbers GPU i's NVLinks: on NVSwitch systems all of them go to the
// switches; with bridges, they go to the bridged GPU, in pair order.
func (f *Fake) linksOf(i int) []fakeLink {
	r := f.profile
	if r.nvswitch {
		links := make([]fakeLink, nvlinksPerGPU)
		for l := range links {
			links[l] = fakeLink{remoteBusID: switchBusID(l % fakeNVSwitches), remoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}
		}
		return links
	}
	var links []fakeLink
	for j := range r.gpus {
		pair := [2]int{min(i, j), max(i, j)}
		for k := 0; k < r.links[pair] && i != j; k++ {
			links = append(links, fakeLink{remoteBusID: r.gpus[j].busID, remoteType: nvml.NVLINK_DEVICE_TYPE_GPU})
		}
	}
	return links
}

func (f *Fake) nvlinked(i, j int) bool {
	if i == j {
		return false
	}
	if f.profile.nvswitch {
		return true
	}
	return f.profile.links[[2]int{min(i, j), max(i, j)}] > 0
}

// indexOf finds which fake GPU a handle is. Callers such as go-nvlib pass
// their own wrappers around our handles, so fall back to asking for the UUID.
func (f *Fake) indexOf(d nvml.Device) (int, nvml.Return) {
	if i, ok := f.index[d]; ok {
		return i, nvml.SUCCESS
	}
	if d == nil {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		return 0, ret
	}
	for i := range f.state {
		if FakeUUID(f.Node, i) == uuid {
			return i, nvml.SUCCESS
		}
	}
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

func (f *Fake) lost(i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[i].lost
}

// lost is what every function of a removed GPU answers, like a GPU off the
// bus.
const lost = nvml.ERROR_GPU_IS_LOST

// wireDevice fills in the mock functions of GPU i. Every function answers
// ERROR_GPU_IS_LOST once the GPU has been removed.
func (f *Fake) wireDevice(i int, d *server.Device) {
	g := f.profile.gpus[i]
	d.UUID = FakeUUID(f.Node, i)
	d.PciBusID = g.busID
	d.MemoryInfo = nvml.Memory{Total: g.config.MemoryMB << 20, Free: g.config.MemoryMB << 20}
	f.wireIdentity(i, d, g)
	f.wireCapabilities(i, d, g)
	f.wireTopology(i, d, g)
	f.wireNvLinks(i, d, f.linksOf(i))
	f.wireState(i, d)
}

// wireIdentity: what the GPU is (name, UUID, memory, PCI, fabric clique).
func (f *Fake) wireIdentity(i int, d *server.Device, g fakeGPU) {
	getUUID, getName, getArch := d.GetUUIDFunc, d.GetNameFunc, d.GetArchitectureFunc
	getCC, getMem, getIndex, getMinor := d.GetCudaComputeCapabilityFunc, d.GetMemoryInfoFunc, d.GetIndexFunc, d.GetMinorNumberFunc
	getBrand := d.GetBrandFunc

	d.GetUUIDFunc = func() (string, nvml.Return) {
		if f.lost(i) {
			return "", lost
		}
		return getUUID()
	}
	d.GetNameFunc = func() (string, nvml.Return) {
		if f.lost(i) {
			return "", lost
		}
		return getName()
	}
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		return getBrand()
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		return getArch()
	}
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) {
		if f.lost(i) {
			return 0, 0, lost
		}
		return getCC()
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if f.lost(i) {
			return nvml.Memory{}, lost
		}
		return getMem()
	}
	d.GetIndexFunc = func() (int, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		return getIndex()
	}
	d.GetMinorNumberFunc = func() (int, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		return getMinor()
	}
	// Fabric info as a GB200 reports it once registered; other GPUs, as a
	// Hopper without multi-node NVLink: not supported.
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		if f.lost(i) {
			return nvml.GpuFabricInfo{}, lost
		}
		if f.profile.clique == "" {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		cluster, id, _ := ParseClique(f.profile.clique)
		return nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: id, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}, nvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		if f.lost(i) {
			return nvml.PciInfo{}, lost
		}
		return nvmlPciInfo(g.busID, g.config.PciDeviceId), nvml.SUCCESS
	}
}

// wireCapabilities: SM and core counts, NUMA node, MIG.
func (f *Fake) wireCapabilities(i int, d *server.Device, g fakeGPU) {
	getMig := d.GetMigModeFunc
	// Like a current driver on a whole GPU: no attributes (those are for MIG
	// devices), the SM count only through the core count. A compute
	// capability whose cores per SM are unknown answers as older drivers
	// did, so a custom profile's count still comes through.
	perSM := coresPerSM(int(g.config.CudaMajor), int(g.config.CudaMinor))
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		if f.lost(i) {
			return nvml.DeviceAttributes{}, lost
		}
		if perSM > 0 {
			return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.DeviceAttributes{MultiprocessorCount: uint32(g.multiprocessors), MemorySizeMB: g.config.MemoryMB}, nvml.SUCCESS
	}
	d.GetNumGpuCoresFunc = func() (int, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		if perSM == 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return g.multiprocessors * perSM, nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
		if f.lost(i) {
			return 0, lost
		}
		return g.numaNode, nvml.SUCCESS
	}
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if f.lost(i) {
			return 0, 0, lost
		}
		if !g.migCapable {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		return getMig()
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if !g.migCapable {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return 7, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) {
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// wireTopology: how GPU i reaches the others (PCIe tree, NUMA, NVLink
// peer-to-peer).
func (f *Fake) wireTopology(i int, d *server.Device, g fakeGPU) {
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j, ret := f.indexOf(other)
		if ret != nvml.SUCCESS {
			return 0, ret
		}
		if f.lost(i) || f.lost(j) {
			return 0, lost
		}
		o := f.profile.gpus[j]
		switch {
		case i == j:
			return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
		case g.pcieRoot == o.pcieRoot:
			return nvml.TOPOLOGY_HOSTBRIDGE, nvml.SUCCESS
		case g.numaNode == o.numaNode:
			return nvml.TOPOLOGY_NODE, nvml.SUCCESS
		default:
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	d.GetP2PStatusFunc = func(other nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		j, ret := f.indexOf(other)
		if ret != nvml.SUCCESS {
			return 0, ret
		}
		if f.lost(i) || f.lost(j) {
			return 0, lost
		}
		if f.nvlinked(i, j) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		if caps == nvml.P2P_CAPS_INDEX_NVLINK {
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		// PCIe peer-to-peer works within a NUMA node, not across the CPU link.
		if g.numaNode == f.profile.gpus[j].numaNode {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		return nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, nvml.SUCCESS
	}
}

// wireNvLinks: GPU i's NVLinks, links[l] behind link l.
func (f *Fake) wireNvLinks(i int, d *server.Device, links []fakeLink) {
	nvlinkArg := func(l int) nvml.Return {
		switch {
		case f.lost(i):
			return lost
		case len(links) == 0:
			return nvml.ERROR_NOT_SUPPORTED
		case l < 0 || l >= nvlinksPerGPU:
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		if ret := nvlinkArg(l); ret != nvml.SUCCESS {
			return 0, ret
		}
		if l < len(links) {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		if ret := nvlinkArg(l); ret != nvml.SUCCESS {
			return nvml.PciInfo{}, ret
		}
		if l >= len(links) {
			return nvml.PciInfo{}, nvml.ERROR_NOT_FOUND
		}
		return nvmlPciInfo(links[l].remoteBusID, 0), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if ret := nvlinkArg(l); ret != nvml.SUCCESS {
			return 0, ret
		}
		if l >= len(links) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_NOT_FOUND
		}
		return links[l].remoteType, nvml.SUCCESS
	}
}

// wireState: what changes at run time (events, row remapping after a
// fault, compute mode).
func (f *Fake) wireState(i int, d *server.Device) {
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		if f.lost(i) {
			return lost
		}
		s, ok := set.(*fakeEventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		s.registered[i] |= mask
		return nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.state[i].lost {
			return 0, 0, false, false, lost
		}
		return 0, 0, f.state[i].faulted, false, nvml.SUCCESS
	}
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.state[i].lost {
			return 0, lost
		}
		return f.state[i].computeMode, nvml.SUCCESS
	}
	d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.state[i].lost {
			return lost
		}
		f.state[i].computeMode = m
		return nvml.SUCCESS
	}
}

func (f *Fake) newEventSet() (nvml.EventSet, nvml.Return) {
	s := &fakeEventSet{events: make(chan nvml.EventData, 256), registered: map[int]uint64{}}
	s.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
		t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
		defer t.Stop()
		select {
		case e := <-s.events:
			return e, nvml.SUCCESS
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	s.FreeFunc = func() nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.sets, s)
		return nvml.SUCCESS
	}
	f.mu.Lock()
	f.sets[s] = struct{}{}
	f.mu.Unlock()
	return s, nvml.SUCCESS
}

// deliver hands an event to every event set registered for it.
func (f *Fake) deliver(i int, e nvml.EventData) {
	for s := range f.sets {
		if s.registered[i]&e.EventType == 0 {
			continue
		}
		select {
		case s.events <- e:
		default:
			f.opts.logger.Info("Fake GPU: event set full, dropping the event", "gpu", i, "event", fmt.Sprintf("%+v", e))
		}
	}
}

func (f *Fake) checkIndex(i int) error {
	if i < 0 || i >= len(f.state) {
		return fmt.Errorf("fake GPU index %d out of range (0..%d)", i, len(f.state)-1)
	}
	return nil
}

// InjectXID raises an XID error on GPU index, as NVML would report it. A
// critical XID leaves the GPU needing a reset (unhealthy) until Recover.
func (f *Fake) InjectXID(index int, xid uint64) error {
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if IsCriticalXID(xid) {
		f.state[index].faulted = true
	}
	f.deliver(index, nvml.EventData{Device: f.server.Devices[index], EventType: nvml.EventTypeXidCriticalError, EventData: xid})
	return nil
}

// Remove makes GPU index fall off the bus: XID 79, then every NVML call on it
// answers GPU_IS_LOST until Recover.
func (f *Fake) Remove(index int) error {
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[index].lost = true
	f.deliver(index, nvml.EventData{Device: f.server.Devices[index], EventType: nvml.EventTypeXidCriticalError, EventData: 79})
	return nil
}

// Recover resets GPU index: it answers NVML again with no pending errors, so
// Health reports it healthy at its next probe.
func (f *Fake) Recover(index int) error {
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[index].lost = false
	f.state[index].faulted = false
	return nil
}

// ComputeMode is the compute mode last set on GPU index.
func (f *Fake) ComputeMode(index int) ComputeMode {
	if f.checkIndex(index) != nil {
		return ComputeModeDefault
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state[index].computeMode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		return ComputeModeExclusiveProcess
	}
	return ComputeModeDefault
}

// TimeSlice is the time-slice interval last set on GPU index ("" for no such GPU).
func (f *Fake) TimeSlice(index int) TimeSliceInterval {
	if f.checkIndex(index) != nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[index].timeSlice
}

func (f *Fake) recordTimeSlice(uuid string, interval TimeSliceInterval) error {
	for i := range f.state {
		if FakeUUID(f.Node, i) == uuid {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.state[i].lost {
				return errGPULost
			}
			f.state[i].timeSlice = interval
			return nil
		}
	}
	return fmt.Errorf("no fake GPU %s", uuid)
}
