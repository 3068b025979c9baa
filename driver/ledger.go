package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/gpu"
)

// The device-plugin path (package deviceplugin) records its allocations in
// the same checkpoint, under the same lock and through the same atomic write
// as PrepareResourceClaims, and sets them up with the same apply/undo: one
// ledger, one over-commit check (checkLedger), the same CDI edits.

// ErrConflict is matched (errors.Is) by refusals because the capacity is
// held by another entry of the ledger, of either path.
var ErrConflict = errors.New("GPU capacity is held")

type conflictError struct{ error }

func (e conflictError) Is(target error) bool { return target == ErrConflict }
func (e conflictError) Unwrap() error        { return e.error }

// PodRequest is one device-plugin allocation to record and prepare.
type PodRequest struct {
	UID, Namespace, Name string
	// Resource is the extended resource the kubelet allocates.
	Resource string
	// DeviceIDs are the kubelet's device IDs (recorded, not interpreted).
	DeviceIDs []string
	// GPUs are the UUIDs of the GPUs the pod gets.
	GPUs []string
	// MemoryBytes is a share's memory (one GPU); 0 for whole GPUs.
	MemoryBytes uint64
	// Config is a share's sharing config (MPS or TimeSlicing); nil means
	// whole GPUs (Exclusive).
	Config *v1alpha1.GpuConfig
}

// GPUs returns the node's GPUs, in index order.
func (d *Driver) GPUs() []gpu.Device { return slices.Clone(d.sorted) }

// AllocatePod checks a device-plugin allocation against the ledger, records
// it "preparing", sets up sharing and the CDI spec exactly as a claim's
// (apply), and records it "prepared". The returned copy carries the CDI
// device IDs. It is idempotent per pod UID: the kubelet retries Allocate.
func (d *Driver) AllocatePod(ctx context.Context, req PodRequest) (*PodCheckpoint, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	who := "pod " + req.Namespace + "/" + req.Name

	p, ok := d.ckpt.DevicePlugin[req.UID]
	if ok && p.Resource != req.Resource {
		return nil, conflictError{fmt.Errorf("%s already holds %s through the device plugin; a pod gets GPUs through one extended resource", who, p.Resource)}
	}
	if ok && p.State == StatePrepared {
		return p.copy(), nil
	}
	if !ok {
		var err error
		if p, err = d.planPod(req); err != nil {
			return nil, err
		}
		if err := d.checkLedger(p.UID, who, p.Devices); err != nil {
			return nil, conflictError{err}
		}
		d.ckpt.DevicePlugin[p.UID] = p
		if err := d.store.Save(d.ckpt); err != nil {
			delete(d.ckpt.DevicePlugin, p.UID)
			return nil, fmt.Errorf("checkpoint before allocating %s: %w", who, err)
		}
	}
	if _, err := d.apply(ctx, p.asClaim()); err != nil {
		logger.Error(err, "Allocating for a device-plugin pod failed; rolling back", "pod", klog.KRef(p.Namespace, p.Name))
		if uerr := d.undo(ctx, p.asClaim()); uerr != nil {
			// Keep the "preparing" record: the release of the pod (or a
			// retry) cleans up what could not be undone now.
			logger.Error(uerr, "Rolling back device-plugin pod", "pod", klog.KRef(p.Namespace, p.Name))
		} else {
			delete(d.ckpt.DevicePlugin, p.UID)
			if serr := d.store.Save(d.ckpt); serr != nil {
				logger.Error(serr, "Checkpoint after rolling back", "pod", klog.KRef(p.Namespace, p.Name))
			}
		}
		d.updateMetrics()
		return nil, err
	}
	p.State = StatePrepared
	p.Time = time.Now().UTC()
	if err := d.store.Save(d.ckpt); err != nil {
		// Done but not recorded as done: the kubelet's retry redoes it
		// idempotently.
		p.State = StatePreparing
		return nil, fmt.Errorf("checkpoint after allocating %s: %w", who, err)
	}
	d.updateMetrics()
	d.metrics.devicePluginAllocations.WithLabelValues(req.Resource).Inc()
	return p.copy(), nil
}

// planPod turns a request into its ledger record (state preparing).
func (d *Driver) planPod(req PodRequest) (*PodCheckpoint, error) {
	who := "pod " + req.Namespace + "/" + req.Name
	if req.UID == "" {
		return nil, fmt.Errorf("%s: no UID", who)
	}
	if len(req.GPUs) == 0 {
		return nil, fmt.Errorf("%s: no GPUs", who)
	}
	cfg := req.Config
	if cfg == nil {
		cfg = v1alpha1.DefaultGpuConfig()
	}
	strategy := cfg.Strategy()
	if strategy != v1alpha1.Exclusive && len(req.GPUs) != 1 {
		return nil, fmt.Errorf("%s: a %s share is of one GPU, got %d", who, strategy, len(req.GPUs))
	}
	if d.opts.Mode != "" && strategy != d.opts.Mode {
		return nil, fmt.Errorf("%s: sharing mode %s, but the GPUs of node %s are fixed to %s by the admin", who, strategy, d.opts.NodeName, d.opts.Mode)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: encoding config: %w", who, err)
	}
	p := &PodCheckpoint{
		UID: req.UID, Namespace: req.Namespace, Name: req.Name, Resource: req.Resource,
		State: StatePreparing, DeviceIDs: slices.Clone(req.DeviceIDs), Time: time.Now().UTC(),
	}
	for _, uuid := range req.GPUs {
		g, ok := d.byUUID[uuid]
		if !ok {
			return nil, fmt.Errorf("%s: GPU %s is not on node %s", who, uuid, d.opts.NodeName)
		}
		mem := g.MemoryBytes
		if strategy != v1alpha1.Exclusive {
			mem = req.MemoryBytes
			if mem == 0 || mem > g.MemoryBytes {
				return nil, fmt.Errorf("%s: share memory %d bytes is not within %s's %d bytes", who, mem, DeviceName(g.Index), g.MemoryBytes)
			}
		}
		p.Devices = append(p.Devices, DeviceCheckpoint{
			Request: req.Resource, Pool: d.opts.NodeName, Device: DeviceName(g.Index), GPUUUID: uuid,
			MemoryBytes: mem, Strategy: string(strategy), Config: raw,
		})
	}
	return p, nil
}

// ReleasePod undoes a device-plugin allocation (sharing, CDI spec) and
// removes it from the ledger; released is false when the pod held nothing.
func (d *Driver) ReleasePod(ctx context.Context, uid string) (released bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.ckpt.DevicePlugin[uid]
	if !ok {
		return false, nil
	}
	if err := d.undo(ctx, p.asClaim()); err != nil {
		return false, fmt.Errorf("releasing pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	delete(d.ckpt.DevicePlugin, uid)
	if err := d.store.Save(d.ckpt); err != nil {
		// Undone on the node but still recorded: the next release retries.
		d.ckpt.DevicePlugin[uid] = p
		return false, fmt.Errorf("checkpoint after releasing pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	d.updateMetrics()
	d.metrics.devicePluginReleases.WithLabelValues(p.Resource).Inc()
	klog.FromContext(ctx).Info("Released device-plugin pod", "pod", klog.KRef(p.Namespace, p.Name), "uid", uid, "resource", p.Resource)
	return true, nil
}

// PodAllocations returns copies of the device-plugin entries, in UID order.
func (d *Driver) PodAllocations() []PodCheckpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]PodCheckpoint, 0, len(d.ckpt.DevicePlugin))
	for _, p := range d.ckpt.SortedPods() {
		out = append(out, *p.copy())
	}
	return out
}

// RecordRefusal counts a refused device-plugin Allocate.
func (d *Driver) RecordRefusal(resource, reason string) {
	d.metrics.devicePluginRefusals.WithLabelValues(resource, reason).Inc()
}

// asClaim views a pod's entry as a claim for apply and undo; the Devices
// slice is shared, so the CDI device IDs apply writes land in the pod's entry.
func (p *PodCheckpoint) asClaim() *ClaimCheckpoint {
	return &ClaimCheckpoint{UID: p.UID, Namespace: p.Namespace, Name: p.Name, State: p.State, Devices: p.Devices}
}

func (p *PodCheckpoint) copy() *PodCheckpoint {
	c := *p
	c.DeviceIDs = slices.Clone(p.DeviceIDs)
	c.Devices = slices.Clone(p.Devices)
	return &c
}

// CDIDeviceIDs are the qualified CDI device IDs of the entry, in order.
func (p *PodCheckpoint) CDIDeviceIDs() []string {
	var ids []string
	for _, dev := range p.Devices {
		if dev.CDIDeviceID != "" {
			ids = append(ids, dev.CDIDeviceID)
		}
	}
	return ids
}
