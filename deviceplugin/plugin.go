package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

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
func (p *plugin) devices(unhealthy map[string]bool) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, g := range p.m.gpus {
		health := pluginapi.Healthy
		if unhealthy[g.UUID] {
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
// on every health change.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		unhealthy, changed := p.m.health()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(unhealthy)}); err != nil {
			return err
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

// GetPreferredAllocation implements the device plugin API (whole GPUs): the
// GPUs the controller assigned to the oldest pod awaiting this many GPUs,
// when they are all available; otherwise the best-connected set
// (go-gpuallocator: NVLink first).
func (p *plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	logger := klog.FromContext(ctx)
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		size := int(cr.AllocationSize)
		var ids []string
		cands, _ := p.candidates(size)
		for _, c := range cands {
			uuids, err := p.m.assignedUUIDs(c.pod, c.a)
			if err != nil || len(uuids) != size || !subset(uuids, cr.AvailableDeviceIDs) || !subset(cr.MustIncludeDeviceIDs, uuids) {
				continue
			}
			ids = uuids
			logger.V(2).Info("Preferring the GPUs assigned to a pod", "pod", klog.KObj(c.pod), "gpus", ids)
			break
		}
		if ids == nil {
			var err error
			ids, err = gpu.PreferredAllocation(p.m.opts.Inventory, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, size)
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
// pod"), its assignment read, and the allocation recorded in the ledger and
// set up exactly as a ResourceClaim's (same CDI edits).
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
	cands, malformed := p.candidates(n)
	if len(cands) == 0 {
		// The informer may lag behind the kubelet: ask the API server.
		cands, malformed = p.liveCandidates(ctx, n)
	}
	if len(cands) == 0 {
		if len(malformed) > 0 {
			return nil, reasonBadAnnotation, fmt.Errorf("no pod bound to node %s with a valid %s annotation awaits %d %s: %s",
				p.m.opts.NodeName, assignment.Annotation, n, p.resource, strings.Join(malformed, "; "))
		}
		return nil, reasonNoPod, fmt.Errorf("no pod bound to node %s awaits %s with a %s annotation (a container requesting %d, not yet allocated)",
			p.m.opts.NodeName, p.resource, assignment.Annotation, n)
	}
	c := cands[0]
	pod, a := c.pod, c.a
	who := "pod " + pod.Namespace + "/" + pod.Name
	assigned, err := p.m.assignedUUIDs(pod, a)
	if err != nil {
		return nil, reasonGPUMismatch, err
	}
	req := driver.PodRequest{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name, Resource: p.resource, DeviceIDs: deviceIDs}
	if p.whole {
		// The kubelet's device IDs are what it accounts; they win.
		for _, id := range deviceIDs {
			if _, ok := p.m.byUUID[id]; !ok {
				return nil, reasonGPUMismatch, fmt.Errorf("%s: device %s is not a GPU of node %s", who, id, p.m.opts.NodeName)
			}
		}
		req.GPUs = slices.Clone(deviceIDs)
		if !sameSet(assigned, deviceIDs) {
			logger.Info("Warning: the kubelet allocated other GPUs than the controller assigned; using the kubelet's",
				"pod", klog.KObj(pod), "kubelet", deviceIDs, "assigned", assigned)
		}
	} else {
		// A slot names no GPU, so the kubelet's health check of the slot
		// does not cover the assigned GPU: check it here.
		if unhealthy, _ := p.m.health(); unhealthy[assigned[0]] {
			return nil, reasonGPUUnhealthy, fmt.Errorf("%s: its assigned GPU %d (%s) is unhealthy", who, a.GPUs[0], assigned[0])
		}
		req.GPUs = assigned
		req.MemoryBytes = uint64(a.MemoryBytes)
		req.Config = shareConfig(a)
	}
	entry, err := p.m.opts.Ledger.AllocatePod(ctx, req)
	if err != nil {
		if errors.Is(err, driver.ErrConflict) {
			return nil, reasonConflict, err
		}
		return nil, reasonError, err
	}
	ids := entry.CDIDeviceIDs()
	out := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		out.CdiDevices = append(out.CdiDevices, &pluginapi.CDIDevice{Name: id})
	}
	logger.Info("Allocated through the device plugin", "pod", klog.KObj(pod), "resource", p.resource, "gpus", req.GPUs, "cdiDevices", ids)
	return out, "", nil
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
	a   assignment.Assignment
}

// candidates are the pods of the informer's cache that may be the one the
// kubelet allocates n devices of this resource for, oldest binding first;
// malformed describes pods that would match but whose annotation is bad.
func (p *plugin) candidates(n int) ([]candidate, []string) {
	pods, err := p.m.pods.List(labels.Everything())
	if err != nil {
		return nil, nil
	}
	return p.filter(pods, n)
}

// liveCandidates is candidates from a fresh list of the node's pods.
func (p *plugin) liveCandidates(ctx context.Context, n int) ([]candidate, []string) {
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
	return p.filter(pods, n)
}

func (p *plugin) filter(pods []*corev1.Pod, n int) ([]candidate, []string) {
	held := map[string]bool{}
	for _, e := range p.m.opts.Ledger.PodAllocations() {
		held[e.UID] = true
	}
	var out []candidate
	var malformed []string
	for _, pod := range pods {
		if pod.Spec.NodeName != p.m.opts.NodeName || terminal(pod) || pod.DeletionTimestamp != nil || held[string(pod.UID)] {
			continue
		}
		if !requests(pod, p.resource, n) {
			continue
		}
		a, ok, err := assignment.Of(pod.Annotations)
		if !ok {
			continue
		}
		if err != nil {
			malformed = append(malformed, fmt.Sprintf("pod %s/%s: %v", pod.Namespace, pod.Name, err))
			continue
		}
		if a.IsShare() == p.whole || (p.whole && len(a.GPUs) != n) {
			continue
		}
		out = append(out, candidate{pod: pod, a: a})
	}
	// Oldest binding first; binding times have a resolution of a second, so
	// ties go by creation, the order in which the kubelet admits a batch of
	// pods it receives together.
	sort.SliceStable(out, func(i, j int) bool {
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
			q, ok := c.Resources.Limits[name]
			if !ok {
				q, ok = c.Resources.Requests[name]
			}
			if ok && q.Value() == int64(n) {
				return true
			}
		}
	}
	return false
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
