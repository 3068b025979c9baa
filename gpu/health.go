package gpu

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// applicationXIDs are raised by a faulty application, not a faulty GPU; like
// NVIDIA's device plugin, they leave the GPU healthy.
var applicationXIDs = map[uint64]bool{
	13:  true, // graphics engine exception
	31:  true, // GPU memory page fault
	43:  true, // GPU stopped processing
	45:  true, // preemptive cleanup
	68:  true, // video processor exception
	109: true, // context switch timeout
}

var xidReasons = map[uint64]string{
	13:  "graphics engine exception (an application's)",
	31:  "GPU memory page fault (an application's)",
	43:  "GPU stopped processing (an application's)",
	45:  "preemptive cleanup (an application's)",
	68:  "video processor exception (an application's)",
	109: "context switch timeout (an application's)",
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping event",
	64:  "ECC page retirement or row remapping failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// IsCriticalXID reports whether an XID error makes a GPU unhealthy.
func IsCriticalXID(xid uint64) bool { return !applicationXIDs[xid] }

// XIDReason describes an XID error in a person's words.
func XIDReason(xid uint64) string {
	if r, ok := xidReasons[xid]; ok {
		return fmt.Sprintf("XID %d: %s", xid, r)
	}
	return fmt.Sprintf("XID %d: critical GPU error", xid)
}

// gpuState is what the health loop knows of one GPU.
type gpuState struct {
	handle    nvml.Device
	uuid      string
	healthy   bool
	lastFault time.Time
}

// Health streams health changes until ctx is done. Each call watches on its
// own NVML event set, so several consumers can each have a stream.
//
// A GPU turns unhealthy on a critical XID event, or when NVML reports it lost.
// It turns healthy again once it answers NVML, has no row remapping pending
// (those need a GPU reset) and no critical XID for the recovery quiet period.
func (n *NVMLInventory) Health(ctx context.Context) <-chan HealthEvent {
	out := make(chan HealthEvent, 64)
	// The event set is registered before Health returns: an XID raised
	// right after the call is not lost to a goroutine not yet started.
	logger := klog.FromContext(ctx)
	states, set, ok := n.openHealth(logger)
	go func() {
		defer close(out)
		if !ok {
			return
		}
		if set != nil {
			defer set.Free()
		}
		n.watchHealth(ctx, out, states, set)
	}()
	return out
}

// openHealth finds the GPUs and registers an event set for their critical
// XIDs; set is nil where NVML gives none (then the GPUs are only polled).
func (n *NVMLInventory) openHealth(logger klog.Logger) (states []*gpuState, set nvml.EventSet, ok bool) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		logger.Error(nvmlErr("counting GPUs", ret), "Health: not watching GPUs")
		return nil, nil, false
	}
	states = make([]*gpuState, count)
	for i := range states {
		states[i] = &gpuState{healthy: true}
		if h, ret := n.lib.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			states[i].handle = h
			states[i].uuid, _ = h.GetUUID()
		}
	}
	s, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		logger.Info("Health: no NVML event set; only polling GPUs", "nvml", nvml.ErrorString(ret))
		return states, nil, true
	}
	for i := range states {
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, s); ret != nvml.SUCCESS {
			logger.Info("Health: GPU does not report XID events; only polling it", "gpu", i, "nvml", nvml.ErrorString(ret))
		}
	}
	return states, s, true
}

func (n *NVMLInventory) watchHealth(ctx context.Context, out chan<- HealthEvent, states []*gpuState, set nvml.EventSet) {
	logger := klog.FromContext(ctx)
	send := func(i int, healthy bool, reason string, xid uint64) bool {
		st := states[i]
		if st.healthy == healthy {
			return true
		}
		st.healthy = healthy
		ev := HealthEvent{UUID: st.uuid, Index: i, Healthy: healthy, Reason: reason, XID: xid, Time: time.Now()}
		if healthy {
			logger.Info("GPU is healthy again", "gpu", i, "uuid", st.uuid, "reason", reason)
		} else {
			logger.Info("GPU is unhealthy", "gpu", i, "uuid", st.uuid, "reason", reason)
		}
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}

	// Wait in short slices so that ctx cancellation is noticed promptly.
	wait := n.opts.probeInterval
	if wait <= 0 || wait > time.Second {
		wait = time.Second
	}
	nextProbe := time.Now()
	for ctx.Err() == nil {
		if !time.Now().Before(nextProbe) {
			for i := range states {
				healthy, reason := n.probe(i, states[i])
				if !send(i, healthy, reason, 0) {
					return
				}
			}
			nextProbe = time.Now().Add(n.opts.probeInterval)
		}
		if set == nil {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		e, ret := set.Wait(uint32(wait / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// Which GPU is not said; the probe finds out.
			nextProbe = time.Now()
			continue
		default:
			logger.Info("Health: waiting for NVML events failed", "nvml", nvml.ErrorString(ret))
			continue
		}
		if e.EventType != nvml.EventTypeXidCriticalError {
			continue
		}
		i := n.eventIndex(e, states)
		if i < 0 {
			logger.Info("Health: XID on an unknown GPU", "xid", e.EventData)
			continue
		}
		if !IsCriticalXID(e.EventData) {
			logger.V(2).Info("Health: application XID; the GPU stays healthy", "gpu", i, "xid", e.EventData)
			continue
		}
		states[i].lastFault = time.Now()
		if !send(i, false, XIDReason(e.EventData), e.EventData) {
			return
		}
	}
}

// eventIndex finds which GPU an event is about.
func (n *NVMLInventory) eventIndex(e nvml.EventData, states []*gpuState) int {
	if e.Device == nil {
		return -1
	}
	// The handle identifies even a GPU that no longer answers queries.
	for i, st := range states {
		if sameHandle(st.handle, e.Device) {
			return i
		}
	}
	if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
		for i, st := range states {
			if st.uuid == uuid {
				return i
			}
		}
	}
	if idx, ret := e.Device.GetIndex(); ret == nvml.SUCCESS && idx >= 0 && idx < len(states) {
		return idx
	}
	return -1
}

// probe says whether GPU i is healthy now, and why.
func (n *NVMLInventory) probe(i int, st *gpuState) (bool, string) {
	h, ret := n.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return false, "GPU lost: " + nvml.ErrorString(ret)
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return false, "GPU lost: " + nvml.ErrorString(ret)
	}
	if st.uuid == "" {
		st.uuid = uuid
	}
	if st.healthy {
		return true, ""
	}
	// Only an unhealthy GPU is checked further: recovery must be earned.
	if _, _, pending, failed, ret := h.GetRemappedRows(); ret == nvml.SUCCESS {
		if failed {
			return false, "row remapping failed; the GPU needs replacing"
		}
		if pending {
			return false, "row remapping pending; the GPU needs a reset"
		}
	}
	if since := time.Since(st.lastFault); !st.lastFault.IsZero() && since < n.opts.quietPeriod {
		return false, "waiting for the GPU to stay free of errors"
	}
	return true, "GPU answers NVML again with no pending errors"
}

// sameHandle compares two device handles; a handle type that cannot be
// compared just does not match.
func sameHandle(a, b nvml.Device) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a != nil && a == b
}
