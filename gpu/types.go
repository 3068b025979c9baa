// Package gpu is Tessera's GPU inventory: what GPUs a node has, how they are
// connected, and whether they are healthy. The same code path serves real
// GPUs (NVML through cgo) and fake profiles (go-nvml's mock with the topology
// functions filled in), so everything above it is tested the same way.
package gpu

import (
	"context"
	"time"
)

// Device describes one GPU as the rest of Tessera sees it.
type Device struct {
	UUID                  string
	Index                 int
	ProductName           string
	Architecture          string // e.g. "Hopper", "Ampere", "Ada Lovelace"
	CUDAComputeCapability string // "9.0"
	DriverVersion         string // "550.54.15"
	CUDADriverVersion     string // "12.4"
	MemoryBytes           uint64
	Multiprocessors       int
	PCIBusID              string // "0000:18:00.0"
	PCIeRoot              string // "pci0000:10"
	NUMANode              int    // -1 when unknown
	// NVLinkPeers are the indices of the GPUs this one has an active NVLink to.
	NVLinkPeers []int
	// NVLinkDomain names the connected set of GPUs on one NVLink fabric on this
	// node; every GPU of an NVSwitch system shares one. A GPU without NVLink has
	// a domain of its own.
	NVLinkDomain string
	MIGCapable   bool
	// Clique is the multi-node NVLink clique, "<cluster UUID>.<clique ID>"
	// (NVML's fabric info; fabric.go): GPUs of several nodes that share it
	// are on one NVLink fabric. "" without one.
	Clique string
}

// HealthEvent reports a change in a GPU's health.
type HealthEvent struct {
	UUID    string
	Index   int
	Healthy bool
	// Reason says what happened in a person's words ("XID 79: GPU has fallen off the bus").
	Reason string
	XID    uint64 // 0 when not an XID event
	Time   time.Time
}

// ComputeMode mirrors NVML's compute modes that Tessera sets.
type ComputeMode int

const (
	ComputeModeDefault ComputeMode = iota
	ComputeModeExclusiveProcess
)

// Inventory is the node's view of its GPUs.
type Inventory interface {
	// Devices lists the GPUs in index order.
	Devices() ([]Device, error)
	// Health streams health changes until ctx is done.
	Health(ctx context.Context) <-chan HealthEvent
	// SetComputeMode sets a GPU's compute mode (MPS needs EXCLUSIVE_PROCESS).
	SetComputeMode(uuid string, mode ComputeMode) error
	// SetTimeSlice sets a GPU's time-slice interval for time-sliced sharing.
	SetTimeSlice(uuid string, interval TimeSliceInterval) error
	// Close releases NVML.
	Close() error
}

// TimeSliceInterval is NVML's compute time-slice setting.
type TimeSliceInterval string

const (
	TimeSliceDefault TimeSliceInterval = "Default"
	TimeSliceShort   TimeSliceInterval = "Short"
	TimeSliceMedium  TimeSliceInterval = "Medium"
	TimeSliceLong    TimeSliceInterval = "Long"
)
