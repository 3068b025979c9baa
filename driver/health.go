package driver

import (
	"context"
	"sort"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// healthResend is how often the same health is sent again when nothing
// changed: the kubelet reports a device as unknown when its health was not
// refreshed within healthTimeout.
const (
	healthResend  = 10 * time.Second
	healthTimeout = 30 * time.Second
)

// WatchHealthStatus streams the GPUs' health to the kubelet (DRA device
// health, Kubernetes 1.36+): one report of every GPU now, then one at each
// change and every healthResend, until ctx ends.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	tick := time.NewTicker(healthResend)
	defer tick.Stop()
	for {
		report, changed := d.healthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// healthReport is the health of every GPU, in index order, and the channel
// closed at the next change.
func (d *Driver) healthReport() (kubeletplugin.DeviceHealthReport, <-chan struct{}) {
	d.changedMu.Lock()
	changed := d.changed
	d.changedMu.Unlock()
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	now := time.Now()
	out := make([]kubeletplugin.DeviceHealth, 0, len(d.byUUID))
	for uuid, g := range d.byUUID {
		h := kubeletplugin.DeviceHealth{
			PoolName: d.opts.NodeName, DeviceName: DeviceName(g.Index),
			Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: healthTimeout,
		}
		if ev, bad := d.health[uuid]; bad {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, ev.Reason
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceName < out[j].DeviceName })
	return kubeletplugin.DeviceHealthReport{Devices: out}, changed
}
