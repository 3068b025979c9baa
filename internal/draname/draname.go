// Package draname holds the DRA names tessera-node publishes and
// tessera-controller reads: the driver, the device names, the attribute and
// capacity keys of every GPU, the DeviceClasses, and the device taints. Both
// sides of that boundary (driver/, controller/kube, cdi/, the tools and the
// demo) use these constants, so a rename on one side cannot go unnoticed on
// the other (controller/kube's TestDriverSliceContract feeds the driver's
// own slice to the controller's reader). DESIGN.md, Names, is the contract
// in words.
package draname

import (
	"strconv"
	"strings"
)

// Driver is the DRA driver name: the ResourceSlices' and allocations'
// driver, the prefix of every attribute key, and the CDI vendor.
const Driver = "gpu.tessera.dev"

// Attribute keys published on every GPU device (fully qualified, so a CEL
// selector reads device.attributes["gpu.tessera.dev"].index).
const (
	AttrUUID                  = Driver + "/uuid"
	AttrIndex                 = Driver + "/index"
	AttrProductName           = Driver + "/productName"
	AttrArchitecture          = Driver + "/architecture"
	AttrCUDAComputeCapability = Driver + "/cudaComputeCapability"
	AttrDriverVersion         = Driver + "/driverVersion"
	AttrMultiprocessors       = Driver + "/multiprocessors"
	AttrNVLinkDomain          = Driver + "/nvlinkDomain"
	AttrNVLinkPeers           = Driver + "/nvlinkPeers"
	AttrMode                  = Driver + "/mode"
	// AttrClique is a GPU's multi-node NVLink clique, "<cluster UUID>.<clique
	// ID>" from NVML's fabric info, on GPUs that have one (a GB200 NVL72).
	AttrClique = Driver + "/clique"
	// LabelClique is the node label tessera-node writes with the clique of
	// its GPUs: NVIDIA's GPU feature discovery's name and value, so a
	// Topology level names it either way.
	LabelClique = "nvidia.com/gpu.clique"
	// AttrNUMANode is unqualified: the driver's own domain, as the
	// NVIDIA driver names it too.
	AttrNUMANode = "numaNode"

	// AttrDevicePluginPod is, on a GPU held whole by a device-plugin pod
	// (a TaintDevicePlugin taint of value TaintWhole), the UID of the pod
	// the kubelet gave it to: the node's record of which pod holds the
	// GPU, which may differ from the controller's assignment
	// (GetPreferredAllocation is only a preference). Only the node's own
	// agent writes its slice (the chart's tessera-node-own-slices policy),
	// so no user can forge it. A share needs no record: it always lands on
	// its assigned GPU. A UID (36 characters) fits the 64-character limit
	// of a string attribute.
	AttrDevicePluginPod = Driver + "/devicePluginPod"
)

// CapacityMemory is the consumable GPU memory, in bytes; a request that
// names no memory consumes all of it.
const CapacityMemory = "memory"

// Device taints.
const (
	// TaintUnhealthy is the NoSchedule taint of a GPU that NVML reports
	// unhealthy (value "unhealthy" or "xid-N").
	TaintUnhealthy = Driver + "/unhealthy"

	// TaintDevicePlugin is the NoSchedule device taint tessera-node puts
	// on a GPU its device plugin holds, value TaintWhole or TaintShared
	// (whole wins). It keeps kube-scheduler's claims off the GPU;
	// tessera-controller knows device-plugin pods by their assignment, so
	// the key does not make the GPU unusable to it.
	TaintDevicePlugin = Driver + "/device-plugin"
	TaintWhole        = "whole"
	TaintShared       = "shared"
)

// DeviceClasses that ship with Tessera (driver/deviceclasses holds the
// manifests).
const (
	ClassExclusive   = Driver
	ClassMPS         = "mps." + Driver
	ClassTimeSlicing = "timeslice." + Driver
)

// DevicePrefix starts the name of every GPU device: "gpu-3" is index 3.
const DevicePrefix = "gpu-"

// DeviceName is the name of GPU index in the node's pool.
func DeviceName(index int) string { return DevicePrefix + strconv.Itoa(index) }

// DeviceIndex parses a DeviceName strictly (no sign, no leading zeros);
// -1 when name is not one.
func DeviceIndex(name string) int {
	s, ok := strings.CutPrefix(name, DevicePrefix)
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return -1
	}
	return i
}
