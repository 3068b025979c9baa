package gpu

import (
	"fmt"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLBacked is an inventory that can hand out its nvml.Interface; both
// NVMLInventory and Fake are.
type NVMLBacked interface {
	NVML() nvml.Interface
}

// PreferredAllocation picks size GPUs (by UUID) from available, always
// including required, preferring the best-connected set (NVLink first, then
// PCIe distance), with go-gpuallocator's best-effort policy. It is what a
// device plugin's GetPreferredAllocation answers. It returns an empty list
// when no such set exists.
func PreferredAllocation(inv Inventory, available, required []string, size int) ([]string, error) {
	nb, ok := inv.(NVMLBacked)
	if !ok {
		return nil, fmt.Errorf("preferred allocation: inventory %T has no NVML", inv)
	}
	all, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(nb.NVML()))
	if err != nil {
		return nil, fmt.Errorf("preferred allocation: reading GPU topology: %w", err)
	}
	avail, err := all.Filter(available)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation: available devices: %w", err)
	}
	req, err := all.Filter(required)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation: required devices: %w", err)
	}
	picked := gpuallocator.NewBestEffortPolicy().Allocate(avail, req, size)
	uuids := make([]string, 0, len(picked))
	for _, d := range picked {
		uuids = append(uuids, d.UUID)
	}
	return uuids, nil
}
