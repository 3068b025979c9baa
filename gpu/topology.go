package gpu

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// fillNVLinkTopology sets NVLinkPeers and NVLinkDomain on devs (handles[i]
// belongs to devs[i]).
//
// Peers come from NVML's P2P status over NVLink, which is right both for
// bridges (A100 PCIe pairs) and NVSwitch systems (where a link's remote end is
// a switch, not a GPU). Where P2P status is not answered, a link whose remote
// PCI device is another GPU still counts.
func fillNVLinkTopology(devs []Device, handles []nvml.Device) {
	n := len(devs)
	linked := make([][]bool, n)
	for i := range linked {
		linked[i] = make([]bool, n)
	}
	byBus := make(map[string]int, n)
	for i, d := range devs {
		byBus[d.PCIBusID] = i
	}
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			st, ret := handles[i].GetP2PStatus(handles[j], nvml.P2P_CAPS_INDEX_NVLINK)
			if ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
				linked[i][j], linked[j][i] = true, true
			}
		}
		for _, bus := range nvlinkRemoteBusIDs(handles[i]) {
			if j, ok := byBus[bus]; ok && j != i {
				linked[i][j], linked[j][i] = true, true
			}
		}
	}

	// Connected components by union-find; a GPU without NVLink is alone.
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	for i := 0; i < n; i++ {
		devs[i].NVLinkPeers = nil
		for j := 0; j < n; j++ {
			if linked[i][j] {
				devs[i].NVLinkPeers = append(devs[i].NVLinkPeers, devs[j].Index)
				if a, b := find(i), find(j); a != b {
					// Keep the lowest position as the root so the domain is
					// named after the lowest-indexed member.
					if a < b {
						parent[b] = a
					} else {
						parent[a] = b
					}
				}
			}
		}
		sort.Ints(devs[i].NVLinkPeers)
	}
	// Named after the lowest-indexed member's UUID: deterministic, stable
	// across restarts, and never equal on two nodes.
	for i := range devs {
		devs[i].NVLinkDomain = devs[find(i)].UUID
	}
}

// nvlinkRemoteBusIDs lists the PCI bus IDs at the far end of a GPU's active
// NVLinks (a GPU, or an NVSwitch).
func nvlinkRemoteBusIDs(h nvml.Device) []string {
	var out []string
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, ret := h.GetNvLinkState(l)
		// Beyond the GPU's link count NVML answers INVALID_ARGUMENT, and
		// NOT_SUPPORTED on GPUs without NVLink; both just mean no link here.
		if ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := h.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		out = append(out, pciBusID(pci))
	}
	return out
}
