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
	"github.com/tessera-gpu/tessera/internal/killpoint"
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
	if ok {
		held := 0
		for _, uuid := range req.GPUs {
			if slices.ContainsFunc(p.Devices, func(dev DeviceCheckpoint) bool { return dev.GPUUUID == uuid }) {
				held++
			}
		}
		switch {
		case held == len(req.GPUs) && p.State == StatePrepared:
			// A retry, or an init container's GPUs reused by a later
			// container: idempotent.
			return p.copy(), nil
		case held == 0 && req.Config == nil:
			// Another container of the pod: its GPUs join the pod's entry.
			return d.extendPod(ctx, p, req)
		case held != len(req.GPUs):
			return nil, fmt.Errorf("%s already holds GPUs %v through the device plugin; it cannot also get %v (overlapping, or a second share)", who, p.gpuUUIDs(), req.GPUs)
		}
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
		killpoint.Reach(killpoint.AllocateAfterPreparingSave)
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
	killpoint.Reach(killpoint.AllocateBeforeSliceMark)
	d.republish(ctx)
	return p.copy(), nil
}

// extendPod adds the GPUs of another container of a pod (the kubelet calls
// Allocate once per container) to the pod's entry: one entry per pod keeps
// release and the over-commit check as they are. Each container's GPUs get
// their own request name, so a container's CDI devices list its own GPUs
// only (NVIDIA_VISIBLE_DEVICES is per request). On failure the entry is
// left as it was. Callers hold d.mu.
func (d *Driver) extendPod(ctx context.Context, p *PodCheckpoint, req PodRequest) (*PodCheckpoint, error) {
	logger := klog.FromContext(ctx)
	who := "pod " + req.Namespace + "/" + req.Name
	if p.State != StatePrepared || len(p.Devices) == 0 || p.Devices[0].Strategy != string(v1alpha1.Exclusive) {
		return nil, fmt.Errorf("%s: adding GPUs %v of another container needs a prepared entry of whole GPUs, it has %v (%s)", who, req.GPUs, p.gpuUUIDs(), p.State)
	}
	add, err := d.planPod(req)
	if err != nil {
		return nil, err
	}
	if err := d.checkLedger(p.UID, who, add.Devices); err != nil {
		return nil, conflictError{err}
	}
	request := fmt.Sprintf("%s/%d", req.Resource, p.containers())
	for i := range add.Devices {
		add.Devices[i].Request = request
	}
	old := p.copy()
	restore := func() { p.Devices, p.DeviceIDs, p.State = old.Devices, old.DeviceIDs, old.State }
	p.Devices = append(slices.Clone(p.Devices), add.Devices...)
	p.DeviceIDs = append(slices.Clone(p.DeviceIDs), req.DeviceIDs...)
	p.State = StatePreparing
	if err := d.store.Save(d.ckpt); err != nil {
		restore()
		return nil, fmt.Errorf("checkpoint before adding GPUs %v to %s: %w", req.GPUs, who, err)
	}
	if _, err := d.apply(ctx, p.asClaim()); err != nil {
		logger.Error(err, "Adding GPUs of another container failed; rolling back", "pod", klog.KRef(p.Namespace, p.Name), "gpus", req.GPUs)
		var errs []error
		for _, dev := range add.Devices {
			if uerr := d.sharing.Unprepare(ctx, p.UID, dev.GPUUUID); uerr != nil {
				errs = append(errs, uerr)
			}
		}
		restore()
		// Rewrite the CDI spec of the GPUs the pod keeps.
		if _, aerr := d.apply(ctx, p.asClaim()); aerr != nil {
			errs = append(errs, aerr)
		}
		if serr := d.store.Save(d.ckpt); serr != nil {
			errs = append(errs, serr)
		}
		if rerr := errors.Join(errs...); rerr != nil {
			logger.Error(rerr, "Rolling back the added GPUs", "pod", klog.KRef(p.Namespace, p.Name))
		}
		return nil, err
	}
	p.State = StatePrepared
	p.Time = time.Now().UTC()
	if err := d.store.Save(d.ckpt); err != nil {
		// Kept "preparing": it holds the GPUs until the pod's release.
		return nil, fmt.Errorf("checkpoint after adding GPUs %v to %s: %w", req.GPUs, who, err)
	}
	d.updateMetrics()
	d.metrics.devicePluginAllocations.WithLabelValues(req.Resource).Inc()
	d.republish(ctx)
	logger.V(2).Info("Added another container's GPUs to a device-plugin pod", "pod", klog.KRef(p.Namespace, p.Name), "gpus", req.GPUs, "request", request)
	return p.copy(), nil
}

// containers is how many container allocations the entry holds: its
// distinct request names.
func (p *PodCheckpoint) containers() int {
	seen := map[string]bool{}
	for _, dev := range p.Devices {
		seen[dev.Request] = true
	}
	return len(seen)
}

func (p *PodCheckpoint) gpuUUIDs() []string {
	out := make([]string, 0, len(p.Devices))
	for _, dev := range p.Devices {
		out = append(out, dev.GPUUUID)
	}
	return out
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
	d.republish(ctx)
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

// CDIDeviceIDs are the qualified CDI device IDs of the entry, in order;
// with gpus given, only those of these GPUs (one container's).
func (p *PodCheckpoint) CDIDeviceIDs(gpus ...string) []string {
	var ids []string
	for _, dev := range p.Devices {
		if dev.CDIDeviceID != "" && (len(gpus) == 0 || slices.Contains(gpus, dev.GPUUUID)) {
			ids = append(ids, dev.CDIDeviceID)
		}
	}
	return ids
}
