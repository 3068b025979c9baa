package driver

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// Attribute and capacity names published for every GPU: internal/draname's,
// typed for the ResourceSlice API. The exported aliases keep the tests and
// tools that name them through this package unchanged.
const (
	AttrUUID                  resourceapi.QualifiedName = draname.AttrUUID
	AttrIndex                 resourceapi.QualifiedName = draname.AttrIndex
	AttrProductName           resourceapi.QualifiedName = draname.AttrProductName
	AttrArchitecture          resourceapi.QualifiedName = draname.AttrArchitecture
	AttrCUDAComputeCapability resourceapi.QualifiedName = draname.AttrCUDAComputeCapability
	AttrDriverVersion         resourceapi.QualifiedName = draname.AttrDriverVersion
	AttrMultiprocessors       resourceapi.QualifiedName = draname.AttrMultiprocessors
	AttrNVLinkDomain          resourceapi.QualifiedName = draname.AttrNVLinkDomain
	AttrNVLinkPeers           resourceapi.QualifiedName = draname.AttrNVLinkPeers
	AttrMode                  resourceapi.QualifiedName = draname.AttrMode
	AttrClique                resourceapi.QualifiedName = draname.AttrClique
	AttrPCIBusID                                        = deviceattribute.StandardDeviceAttributePCIBusID
	AttrPCIeRoot                                        = deviceattribute.StandardDeviceAttributePCIeRoot
	AttrNUMANode              resourceapi.QualifiedName = draname.AttrNUMANode

	// CapacityMemory is the consumable GPU memory, in bytes.
	CapacityMemory resourceapi.QualifiedName = draname.CapacityMemory

	// TaintUnhealthy is the device taint key of a GPU that NVML reports
	// unhealthy; NoSchedule keeps new claims off it while running pods stay.
	TaintUnhealthy = draname.TaintUnhealthy

	// TaintDevicePlugin marks a GPU the device plugin holds, value
	// TaintValueWhole or TaintValueShared.
	TaintDevicePlugin = draname.TaintDevicePlugin
	TaintValueWhole   = draname.TaintWhole
	TaintValueShared  = draname.TaintShared
	// AttrDevicePluginPod is, on a GPU held whole by the device plugin, the
	// UID of the pod the kubelet gave it to.
	AttrDevicePluginPod resourceapi.QualifiedName = draname.AttrDevicePluginPod
)

// DeviceName is the name of GPU index in the node's pool.
func DeviceName(index int) string { return draname.DeviceName(index) }

// deviceIndex parses a DeviceName; -1 when it is not one of ours.
func deviceIndex(name string) int { return draname.DeviceIndex(name) }

// SemverVersion normalizes an NVIDIA version string to semantic versioning,
// which DRA version attributes require: missing parts become 0 and leading
// zeros are dropped ("9.0" → "9.0.0", "535.104.05" → "535.104.5").
func SemverVersion(v string) (string, error) {
	parts := strings.Split(strings.TrimSpace(v), ".")
	if len(parts) == 0 || len(parts) > 3 || parts[0] == "" {
		return "", fmt.Errorf("version %q: want MAJOR[.MINOR[.PATCH]]", v)
	}
	nums := make([]string, 3)
	for i := range nums {
		nums[i] = "0"
		if i >= len(parts) {
			continue
		}
		n, err := strconv.ParseUint(parts[i], 10, 32)
		if err != nil {
			return "", fmt.Errorf("version %q: part %q is not a number", v, parts[i])
		}
		nums[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(nums, "."), nil
}

// Health is the last known health of one GPU, by UUID. A GPU without an
// entry is healthy.
type Health map[string]gpu.HealthEvent

// DevicePluginMark is how a GPU held by device-plugin allocations is marked
// in the slice: Taint is TaintValueWhole or TaintValueShared; Pod is, for a
// GPU held whole, the holder's UID (AttrDevicePluginPod).
type DevicePluginMark struct {
	Taint string
	Pod   string
}

// DevicePluginHeld maps the UUID of a GPU held by device-plugin allocations
// to its mark.
type DevicePluginHeld map[string]DevicePluginMark

// BuildDevices turns the inventory into ResourceSlice devices, in index
// order, so that equal inputs give deeply equal output (the ResourceSlice
// controller then does not update anything on a restart). mode is the
// admin-fixed sharing mode, "" when claims choose.
func BuildDevices(devs []gpu.Device, health Health, mode string) []resourceapi.Device {
	return BuildDevicesHeld(devs, health, nil, mode)
}

// BuildDevicesHeld is BuildDevices with the GPUs the device-plugin path
// holds marked by a TaintDevicePlugin taint each (after the unhealthy one)
// and, when held whole, the holder's UID as AttrDevicePluginPod.
func BuildDevicesHeld(devs []gpu.Device, health Health, held DevicePluginHeld, mode string) []resourceapi.Device {
	devs = append([]gpu.Device(nil), devs...)
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	out := make([]resourceapi.Device, 0, len(devs))
	for _, g := range devs {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrUUID:            {StringValue: ptr.To(g.UUID)},
			AttrIndex:           {IntValue: ptr.To(int64(g.Index))},
			AttrProductName:     {StringValue: ptr.To(g.ProductName)},
			AttrArchitecture:    {StringValue: ptr.To(g.Architecture)},
			AttrMultiprocessors: {IntValue: ptr.To(int64(g.Multiprocessors))},
			AttrNVLinkPeers:     {IntValue: ptr.To(int64(len(g.NVLinkPeers)))},
		}
		if g.NUMANode >= 0 {
			attrs[AttrNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
		}
		if g.NVLinkDomain != "" {
			attrs[AttrNVLinkDomain] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.NVLinkDomain)}
		}
		if g.Clique != "" {
			attrs[AttrClique] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.Clique)}
		}
		if g.PCIBusID != "" {
			attrs[AttrPCIBusID] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIBusID)}
		}
		if g.PCIeRoot != "" {
			attrs[AttrPCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIeRoot)}
		}
		if mode != "" {
			attrs[AttrMode] = resourceapi.DeviceAttribute{StringValue: ptr.To(mode)}
		}
		for name, raw := range map[resourceapi.QualifiedName]string{
			AttrCUDAComputeCapability: g.CUDAComputeCapability,
			AttrDriverVersion:         g.DriverVersion,
		} {
			if raw == "" {
				continue
			}
			v, err := SemverVersion(raw)
			if err != nil {
				// A version we cannot parse is left out rather than failing
				// the whole slice: selectors on it then simply do not match.
				klog.ErrorS(err, "Leaving out version attribute", "gpu", g.UUID, "attribute", name)
				continue
			}
			attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
		}

		mem := resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)
		d := resourceapi.Device{
			Name:                     DeviceName(g.Index),
			AllowMultipleAllocations: ptr.To(true),
			Attributes:               attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityMemory: {
					Value: *mem,
					// A request that names no memory consumes all of it:
					// a plain claim is a whole, exclusive GPU.
					RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(mem.DeepCopy())},
				},
			},
		}
		if ev, ok := health[g.UUID]; ok && !ev.Healthy {
			d.Taints = append(d.Taints, UnhealthyTaint(ev))
		}
		if m, ok := held[g.UUID]; ok {
			d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: TaintDevicePlugin, Value: m.Taint, Effect: resourceapi.DeviceTaintEffectNoSchedule})
			if m.Taint == TaintValueWhole && m.Pod != "" {
				d.Attributes[AttrDevicePluginPod] = resourceapi.DeviceAttribute{StringValue: ptr.To(m.Pod)}
			}
		}
		out = append(out, d)
	}
	return out
}

// UnhealthyTaint is the NoSchedule taint of a GPU reported unhealthy. The
// value is a label value, so it holds the XID and not the free-text reason.
func UnhealthyTaint(ev gpu.HealthEvent) resourceapi.DeviceTaint {
	value := "unhealthy"
	if ev.XID != 0 {
		value = "xid-" + strconv.FormatUint(ev.XID, 10)
	}
	return resourceapi.DeviceTaint{Key: TaintUnhealthy, Value: value, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

// Resources is what the node publishes: one pool named after the node with
// one slice holding every GPU.
func Resources(nodeName string, devices []resourceapi.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}
}
