package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api/config/v1alpha1"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// SlotID is the device ID of a share slot: "gpu-3-slot-7".
func SlotID(index, slot int) string { return fmt.Sprintf("gpu-%d-slot-%d", index, slot) }

// GetDevicePluginOptions implements the device plugin API.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// devices lists the plugin's devices: one per GPU (ID = GPU UUID) for whole
// GPUs, ShareSlots per GPU for shares, with the GPU's health and NUMA node.
// A whole GPU that a ResourceClaim or a share holds (held) is reported
// Unhealthy too: the device-plugin API has no other way to take a device out
// of the kubelet's allocatable, and the kubelet must not pick it for a pod
// that asks for whole GPUs (the ledger would refuse it). The kubelet keeps a
// device it already allocated, so this never disturbs a running pod.
func (p *plugin) devices(unhealthy, held map[string]bool) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, g := range p.m.gpus {
		health := pluginapi.Healthy
		if unhealthy[g.UUID] || (p.whole && held[g.UUID]) {
			health = pluginapi.Unhealthy
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		if p.whole {
			out = append(out, &pluginapi.Device{ID: g.UUID, Health: health, Topology: topo})
			continue
		}
		for s := range p.m.opts.ShareSlots {
			out = append(out, &pluginapi.Device{ID: SlotID(g.Index, s), Health: health, Topology: topo})
		}
	}
	return out
}

// ListAndWatch implements the device plugin API: the devices now, and again
// on every health change and, for whole GPUs, every change of what claims
// and shares hold.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var last []*pluginapi.Device
	for {
		unhealthy, held, changed := p.m.opts.Ledger.DeviceState()
		devs := p.devices(unhealthy, held)
		// A change that moves no device's health is not news.
		if last == nil || !sameDevices(last, devs) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			last = devs
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-p.m.ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// sameDevices reports whether two device lists of the plugin (same IDs in
// the same order) have the same health.
func sameDevices(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health {
			return false
		}
	}
	return true
}

// GetPreferredAllocation implements the device plugin API (whole GPUs): the
// GPUs the controller assigned to the oldest pod awaiting this many GPUs
// (those its other containers do not hold yet), when enough of them are
// available; otherwise the best-connected set (go-gpuallocator: NVLink
// first).
func (p *plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	logger := klog.FromContext(ctx)
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		size := int(cr.AllocationSize)
		var ids []string
		cands, _ := p.candidates(nil, size)
		for _, c := range cands {
			if !c.assigned {
				continue
			}
			uuids, err := p.m.assignedUUIDs(c.pod, c.a)
			if err != nil {
				continue
			}
			free := slices.DeleteFunc(uuids, func(u string) bool { return slices.Contains(c.held, u) || !slices.Contains(cr.AvailableDeviceIDs, u) })
			if len(free) < size || !subset(cr.MustIncludeDeviceIDs, free) {
				continue
			}
			// The must-include GPUs first, then the assignment's order.
			sort.SliceStable(free, func(i, j int) bool {
				return slices.Contains(cr.MustIncludeDeviceIDs, free[i]) && !slices.Contains(cr.MustIncludeDeviceIDs, free[j])
			})
			ids = free[:size]
			logger.V(2).Info("Preferring the GPUs assigned to a pod", "pod", klog.KObj(c.pod), "gpus", ids)
			break
		}
		if ids == nil {
			// The kubelet may still offer a GPU that a claim took since the
			// last ListAndWatch update: keep it out when enough are left.
			_, held, _ := p.m.opts.Ledger.DeviceState()
			avail := slices.DeleteFunc(slices.Clone(cr.AvailableDeviceIDs), func(u string) bool { return held[u] && !slices.Contains(cr.MustIncludeDeviceIDs, u) })
			if len(avail) < size {
				avail = cr.AvailableDeviceIDs
			}
			var err error
			ids, err = gpu.PreferredAllocation(p.m.opts.Inventory, avail, cr.MustIncludeDeviceIDs, size)
			if err != nil || len(ids) != size {
				// No topology: the kubelet's own choice is as good.
				logger.V(2).Info("No preferred allocation", "err", err)
				ids = nil
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer implements the device plugin API (not used).
func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Allocate implements the device plugin API. The kubelet does not say which
// pod it allocates for; the pod is found by the rule in README.md ("Which
// pod"), its assignment read (shares; whole GPUs use the kubelet's device
// IDs), and the allocation recorded in the ledger and set up exactly as a
// ResourceClaim's (same CDI edits).
func (p *plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.m.allocMu.Lock()
	defer p.m.allocMu.Unlock()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		cresp, reason, err := p.allocate(ctx, cr.DevicesIds)
		if err != nil {
			p.m.opts.Ledger.RecordRefusal(p.resource, reason)
			klog.FromContext(ctx).Error(err, "Refusing device-plugin allocation", "resource", p.resource, "devices", cr.DevicesIds)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// Refusal reasons (metric label).
const (
	reasonNoPod         = "no_pod"
	reasonBadAnnotation = "bad_annotation"
	reasonConflict      = "conflict"
	reasonGPUMismatch   = "gpu_mismatch"
	reasonGPUUnhealthy  = "gpu_unhealthy"
	reasonError         = "error"
)

func (p *plugin) allocate(ctx context.Context, deviceIDs []string) (*pluginapi.ContainerAllocateResponse, string, error) {
	logger := klog.FromContext(ctx)
	n := len(deviceIDs)
	cands, malformed := p.candidates(deviceIDs, n)
	if len(cands) == 0 {
		// The informer may lag behind the kubelet: ask the API server.
		cands, malformed = p.liveCandidates(ctx, deviceIDs, n)
	}
	if len(cands) == 0 {
		if len(malformed) > 0 {
			return nil, reasonBadAnnotation, fmt.Errorf("no pod bound to node %s with a valid %s annotation awaits %d %s: %s",
				p.m.opts.NodeName, assignment.Annotation, n, p.resource, strings.Join(malformed, "; "))
		}
		if p.whole {
			return nil, reasonNoPod, fmt.Errorf("no pod bound to node %s awaits %s (a container requesting %d, in a pod whose GPUs are not all allocated yet)",
				p.m.opts.NodeName, p.resource, n)
		}
		return nil, reasonNoPod, fmt.Errorf("no pod bound to node %s awaits %s with a %s annotation (a container requesting %d, not yet allocated)",
			p.m.opts.NodeName, p.resource, assignment.Annotation, n)
	}
	c := cands[0]
	pod, a := c.pod, c.a
	who := "pod " + pod.Namespace + "/" + pod.Name
	var assigned []string
	if c.assigned {
		var err error
		if assigned, err = p.m.assignedUUIDs(pod, a); err != nil {
			return nil, reasonGPUMismatch, err
		}
	}
	req := driver.PodRequest{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name, Resource: p.resource, DeviceIDs: deviceIDs}
	if p.whole {
		// The kubelet's device IDs are what it accounts; they win. A pod
		// without an assignment (bound by another scheduler) gets them as
		// NVIDIA's device plugin would give them.
		for _, id := range deviceIDs {
			if _, ok := p.m.byUUID[id]; !ok {
				return nil, reasonGPUMismatch, fmt.Errorf("%s: device %s is not a GPU of node %s", who, id, p.m.opts.NodeName)
			}
		}
		req.GPUs = slices.Clone(deviceIDs)
		if c.assigned && !subset(deviceIDs, assigned) {
			logger.Info("Warning: the kubelet allocated other GPUs than the controller assigned; using the kubelet's",
				"pod", klog.KObj(pod), "kubelet", deviceIDs, "assigned", assigned)
		}
	} else {
		// A slot names no GPU, so the kubelet's health check of the slot
		// does not cover the assigned GPU: check it here.
		if unhealthy, _, _ := p.m.opts.Ledger.DeviceState(); unhealthy[assigned[0]] {
			return nil, reasonGPUUnhealthy, fmt.Errorf("%s: its assigned GPU %d (%s) is unhealthy", who, a.GPUs[0], assigned[0])
		}
		req.GPUs = assigned
		req.MemoryBytes = uint64(a.MemoryBytes)
		req.Config = shareConfig(a)
	}
	entry, err := p.allocateOrFreeGone(ctx, req)
	if err != nil {
		if errors.Is(err, driver.ErrConflict) {
			return nil, reasonConflict, err
		}
		return nil, reasonError, err
	}
	var ids []string
	if p.whole {
		// The pod's entry holds the GPUs of all its containers: answer
		// with this container's.
		ids = entry.CDIDeviceIDs(req.GPUs...)
	} else {
		ids = entry.CDIDeviceIDs()
	}
	out := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		out.CdiDevices = append(out.CdiDevices, &pluginapi.CDIDevice{Name: id})
	}
	logger.Info("Allocated through the device plugin", "pod", klog.KObj(pod), "resource", p.resource, "gpus", req.GPUs,
		"cdiDevices", ids, "assignment", c.assigned, "retry", c.retry)
	return out, "", nil
}

// goneClaimCheckTimeout bounds the claim check of a refused Allocate: the
// kubelet admits one pod at a time and waits for the answer.
const goneClaimCheckTimeout = 10 * time.Second

// allocateOrFreeGone records the allocation; refused for a conflict, it
// unprepares the claims on those GPUs that the API server no longer has for
// this node and tries once more. That closes the window between the
// controller freeing a GPU (its claim gone from the API server) and the
// kubelet's NodeUnprepareResources (at the pod's teardown, seconds later):
// a DRA pod admitted there waits, since the kubelet retries Prepare, but a
// failed Allocate fails the pod's admission for good. A claim still
// allocated here is never unprepared; then the refusal stands.
func (p *plugin) allocateOrFreeGone(ctx context.Context, req driver.PodRequest) (*driver.PodCheckpoint, error) {
	entry, err := p.m.opts.Ledger.AllocatePod(ctx, req)
	if err == nil || !errors.Is(err, driver.ErrConflict) {
		return entry, err
	}
	logger := klog.FromContext(ctx)
	checkCtx, cancel := context.WithTimeout(ctx, goneClaimCheckTimeout)
	defer cancel()
	n, cerr := p.m.opts.Ledger.UnprepareGoneClaims(checkCtx, req.GPUs)
	if cerr != nil {
		logger.Error(cerr, "Checking the claims on a refused allocation's GPUs against the API server", "pod", klog.KRef(req.Namespace, req.Name), "gpus", req.GPUs)
	}
	if n == 0 {
		return nil, err
	}
	logger.Info("Unprepared claims the API server no longer has on a refused allocation's GPUs; retrying once",
		"pod", klog.KRef(req.Namespace, req.Name), "gpus", req.GPUs, "claims", n)
	return p.m.opts.Ledger.AllocatePod(ctx, req)
}

// shareConfig is the GpuConfig of a share: what a ResourceClaim of the same
// mode would carry. MPS gets the compute share rounded up to whole percent.
func shareConfig(a assignment.Assignment) *v1alpha1.GpuConfig {
	if a.Sharing == assignment.SharingTimeSlicing {
		return v1alpha1.NewTimeSlicingConfig("")
	}
	return v1alpha1.NewMPSConfig(int32(min(100, (a.ComputeMilli+9)/10)))
}

type candidate struct {
	pod *corev1.Pod
	// a is the pod's assignment; assigned says whether it has one (always
	// for shares; whole GPUs are served without one too).
	a        assignment.Assignment
	assigned bool
	// held are the GPUs the pod's entry holds already (other containers).
	held []string
	// retry: the pod's entry already holds exactly the devices asked for (a
	// kubelet retry, or an init container's GPUs reused by a later
	// container).
	retry bool
}

// candidates are the pods of the informer's cache that may be the one the
// kubelet allocates devices (ids; nil when only the count n is known) of
// this resource for, best first (see filter); malformed describes pods that
// would match but whose annotation is bad.
func (p *plugin) candidates(ids []string, n int) ([]candidate, []string) {
	pods, err := p.m.pods.List(labels.Everything())
	if err != nil {
		return nil, nil
	}
	return p.filter(pods, ids, n)
}

// liveCandidates is candidates from a fresh list of the node's pods.
func (p *plugin) liveCandidates(ctx context.Context, ids []string, n int) ([]candidate, []string) {
	list, err := p.m.opts.KubeClient.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.m.opts.NodeName).String(),
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods")
		return nil, nil
	}
	pods := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[i] = &list.Items[i]
	}
	return p.filter(pods, ids, n)
}

// filter applies the rule of README.md ("Which pod"). Whole GPUs: a live pod
// whose entry already holds exactly ids comes first; then pods with a
// container requesting n whose entry holds fewer GPUs than the pod requests
// in all (another container's Allocate), with or without an assignment.
// Shares: pods with a share assignment and no entry. Oldest binding first.
func (p *plugin) filter(pods []*corev1.Pod, ids []string, n int) ([]candidate, []string) {
	held := map[string]driver.PodCheckpoint{}
	for _, e := range p.m.opts.Ledger.PodAllocations() {
		held[e.UID] = e
	}
	var out []candidate
	var malformed []string
	for _, pod := range pods {
		if pod.Spec.NodeName != p.m.opts.NodeName || terminal(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		e, isHeld := held[string(pod.UID)]
		if isHeld && (!p.whole || e.Resource != p.resource) {
			continue
		}
		a, ok, err := assignment.Of(pod.Annotations)
		if ok && err != nil {
			if requests(pod, p.resource, n) && !isHeld {
				malformed = append(malformed, fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err))
			}
			continue
		}
		if ok && a.IsShare() == p.whole {
			continue
		}
		if !p.whole {
			if ok && requests(pod, p.resource, n) {
				out = append(out, candidate{pod: pod, a: a, assigned: true})
			}
			continue
		}
		c := candidate{pod: pod, a: a, assigned: ok, held: e.DeviceIDs}
		if len(ids) > 0 && subset(ids, e.DeviceIDs) {
			c.retry = true
			out = append(out, c)
			continue
		}
		total := podRequest(pod, p.resource)
		if !requests(pod, p.resource, n) || int64(len(e.DeviceIDs)+n) > total || (ok && int64(len(a.GPUs)) != total) {
			continue
		}
		out = append(out, c)
	}
	// Retries first; then oldest binding first. Binding times have a
	// resolution of a second, so ties go by creation, the order in which
	// the kubelet admits a batch of pods it receives together.
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].retry != out[j].retry {
			return out[i].retry
		}
		pi, pj := out[i].pod, out[j].pod
		if ti, tj := bound(pi), bound(pj); !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		if ci, cj := pi.CreationTimestamp, pj.CreationTimestamp; !ci.Equal(&cj) {
			return ci.Before(&cj)
		}
		return pi.Namespace+"/"+pi.Name < pj.Namespace+"/"+pj.Name
	})
	return out, malformed
}

// requests reports whether a container of the pod asks for n of resource.
func requests(pod *corev1.Pod, resource string, n int) bool {
	name := corev1.ResourceName(resource)
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if q, ok := amount(c, name); ok && q == int64(n) {
				return true
			}
		}
	}
	return false
}

// podRequest is how many of resource the pod gets in all, as the kubelet
// counts it: its containers' (and sidecars') sum, or the largest init
// container when that is more (init containers' devices are reused).
func podRequest(pod *corev1.Pod, resource string) int64 {
	name := corev1.ResourceName(resource)
	var sum, initMax int64
	for _, c := range pod.Spec.Containers {
		q, _ := amount(c, name)
		sum += q
	}
	for _, c := range pod.Spec.InitContainers {
		q, _ := amount(c, name)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum += q // a sidecar runs alongside the containers
			continue
		}
		initMax = max(initMax, q)
	}
	return max(sum, initMax)
}

// amount is a container's limit (else request) of an extended resource.
func amount(c corev1.Container, name corev1.ResourceName) (int64, bool) {
	q, ok := c.Resources.Limits[name]
	if !ok {
		q, ok = c.Resources.Requests[name]
	}
	return q.Value(), ok
}

// bound is when the pod was bound: its PodScheduled condition, else its
// creation.
func bound(pod *corev1.Pod) metav1.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime
		}
	}
	return pod.CreationTimestamp
}

// assignedUUIDs maps an assignment's GPU indices to this node's UUIDs,
// checking the UUIDs the controller saw, when it wrote them.
func (m *Manager) assignedUUIDs(pod *corev1.Pod, a assignment.Assignment) ([]string, error) {
	out := make([]string, 0, len(a.GPUs))
	for i, idx := range a.GPUs {
		g, ok := m.byIndex[idx]
		if !ok {
			return nil, fmt.Errorf("pod %s/%s: annotation %s names GPU index %d, which node %s does not have", pod.Namespace, pod.Name, assignment.Annotation, idx, m.opts.NodeName)
		}
		if len(a.UUIDs) > 0 && a.UUIDs[i] != g.UUID {
			return nil, fmt.Errorf("pod %s/%s: annotation %s says GPU %d is %s, but on node %s it is %s", pod.Namespace, pod.Name, assignment.Annotation, idx, a.UUIDs[i], m.opts.NodeName, g.UUID)
		}
		out = append(out, g.UUID)
	}
	return out, nil
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool { return len(a) == len(b) && subset(a, b) && subset(b, a) }

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
