package kube

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	gpuconfig "github.com/tessera-gpu/tessera/api/config/v1alpha1"
	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/quotaschedule"
	"github.com/tessera-gpu/tessera/internal/draname"
)

// nodeGPUs is what the adapter knows of one node's Tessera GPUs, read from
// the node's ResourceSlices.
type nodeGPUs struct {
	gpus []core.GPU
	// byDevice maps a device name ("gpu-3") to its position in gpus.
	byDevice map[string]int
	// tainted holds device names with a NoSchedule or NoExecute taint,
	// but for draname.TaintDevicePlugin.
	tainted map[string]bool
	// dpHeld maps the device names tessera-node's device plugin holds (its
	// draname.TaintDevicePlugin taint) to draname.TaintWhole or draname.TaintShared.
	dpHeld map[string]string
	// dpPod maps the device names held whole by a device-plugin pod to that
	// pod's UID: the node's record of what the kubelet gave it
	// (draname.AttrDevicePluginPod, see devicePluginPlacement).
	dpPod map[string]types.UID
	// devices by GPU index, for CEL selectors.
	devices map[int]*resourceapi.Device
	// pool and generation identify the slices the GPUs came from.
	pool       string
	generation int64
}

// gpusFromSlices reads the Tessera devices of one node's ResourceSlices. Only
// the newest generation of a pool counts, as the DRA API specifies.
func gpusFromSlices(logger klog.Logger, slices []*resourceapi.ResourceSlice) *nodeGPUs {
	out := &nodeGPUs{byDevice: map[string]int{}, tainted: map[string]bool{}, dpHeld: map[string]string{}, dpPod: map[string]types.UID{}, devices: map[int]*resourceapi.Device{}}
	for _, s := range slices {
		if s.Spec.Driver == DriverName && s.Spec.Pool.Generation > out.generation {
			out.generation = s.Spec.Pool.Generation
			out.pool = s.Spec.Pool.Name
		}
	}
	for _, s := range slices {
		if s.Spec.Driver != DriverName || s.Spec.Pool.Generation != out.generation {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			g := core.GPU{Index: -1}
			if a, ok := d.Attributes[draname.AttrIndex]; ok && a.IntValue != nil {
				g.Index = int(*a.IntValue)
			} else if i, err := strconv.Atoi(strings.TrimPrefix(d.Name, draname.DevicePrefix)); err == nil {
				g.Index = i
			}
			if g.Index < 0 {
				continue
			}
			if a, ok := d.Attributes[draname.AttrProductName]; ok && a.StringValue != nil {
				g.Model = *a.StringValue
			}
			if a, ok := d.Attributes[draname.AttrNVLinkDomain]; ok && a.StringValue != nil {
				g.NVLinkDomain = *a.StringValue
			}
			if c, ok := d.Capacity[draname.CapacityMemory]; ok {
				v, err := readAmount(c.Value, unitBytes, core.MaxAmount)
				if err != nil || v == 0 {
					// The core would refuse it; without it no pod is
					// placed on a GPU whose size is unknown.
					logger.Info("Leaving out a GPU whose memory capacity Tessera cannot use", "slice", s.Name, "device", d.Name, "memory", c.Value.String())
					continue
				}
				g.Memory = v
			}
			if a, ok := d.Attributes[draname.AttrDevicePluginPod]; ok && a.StringValue != nil && *a.StringValue != "" {
				out.dpPod[d.Name] = types.UID(*a.StringValue)
			}
			for _, t := range d.Taints {
				if t.Key == draname.TaintDevicePlugin {
					// Not unusable: the holders are device-plugin pods,
					// known by their assignment or counted as external.
					if out.dpHeld[d.Name] != draname.TaintWhole {
						out.dpHeld[d.Name] = t.Value
					}
					continue
				}
				if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
					out.tainted[d.Name] = true
				}
			}
			out.byDevice[d.Name] = len(out.gpus)
			out.devices[g.Index] = d
			out.gpus = append(out.gpus, g)
		}
	}
	// Sort by index; keep byDevice pointing at the right entries.
	order := make([]int, len(out.gpus))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return out.gpus[order[a]].Index < out.gpus[order[b]].Index })
	sorted := make([]core.GPU, len(out.gpus))
	newPos := make([]int, len(out.gpus))
	for to, from := range order {
		sorted[to] = out.gpus[from]
		newPos[from] = to
	}
	for name, pos := range out.byDevice {
		out.byDevice[name] = newPos[pos]
	}
	out.gpus = sorted
	return out
}

// claimLookup returns a claim by namespace and name, or nil.
type claimLookup func(namespace, name string) *resourceapi.ResourceClaim

// classLookup returns a DeviceClass by name, or nil.
type classLookup func(name string) *resourceapi.DeviceClass

// podClaims resolves the ResourceClaims a pod references, in spec order. A
// missing claim is an error saying which (the ResourceClaim controller may
// not have created it yet).
func podClaims(pod *v1.Pod, claims claimLookup) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, pc)
		if err != nil {
			return nil, fmt.Errorf("resource claim %q: %w", pc.Name, err)
		}
		if name == nil {
			continue // a template that resolves to no claim
		}
		c := claims(pod.Namespace, *name)
		if c == nil {
			return nil, fmt.Errorf("waiting for ResourceClaim %s/%s", pod.Namespace, *name)
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(pod, c, false); err != nil {
				return nil, fmt.Errorf("resource claim %s/%s: %w", pod.Namespace, *name, err)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// isTesseraClass reports whether a DeviceClass selects Tessera GPUs.
func isTesseraClass(class *resourceapi.DeviceClass) bool {
	if _, ok := classSharing[class.Name]; ok {
		return true
	}
	for _, c := range class.Spec.Config {
		if c.Opaque != nil && c.Opaque.Driver == DriverName {
			return true
		}
	}
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, `"`+DriverName+`"`) {
			return true
		}
	}
	return false
}

// requestSharing works out the sharing strategy of one request of an
// unallocated claim from the class's and the claim's opaque configs.
func requestSharing(class *resourceapi.DeviceClass, claim *resourceapi.ResourceClaim, request string) (gpuconfig.SharingStrategy, error) {
	var configs []resourceapi.DeviceAllocationConfiguration
	hasClassConfig := false
	for _, c := range class.Spec.Config {
		configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: c.DeviceConfiguration})
		if c.Opaque != nil && c.Opaque.Driver == DriverName {
			hasClassConfig = true
		}
	}
	for _, c := range claim.Spec.Devices.Config {
		configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration})
	}
	if !hasClassConfig {
		if mode, ok := classSharing[class.Name]; ok {
			// A shipped class edited to drop its config keeps its meaning.
			configs = append([]resourceapi.DeviceAllocationConfiguration{{
				Source: resourceapi.AllocationConfigSourceClass,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: DriverName, Parameters: rawConfig(gpuconfig.SharingStrategy(mode)),
				}},
			}}, configs...)
		}
	}
	cfg, err := gpuconfig.ConfigForRequest(DriverName, configs, request)
	if err != nil {
		return "", err
	}
	return cfg.Strategy(), nil
}

func rawConfig(s gpuconfig.SharingStrategy) (out runtime.RawExtension) {
	out.Raw = []byte(fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"sharing":{"strategy":%q}}`, gpuconfig.APIVersion, gpuconfig.Kind, s))
	return out
}

// gpuRequest is what a pod's claims ask of Tessera GPUs.
type gpuRequest struct {
	req core.Request
	// tessera is true when at least one claim asks for Tessera GPUs.
	tessera bool
	// alts are the core's Pod.Alternatives (GPU fields only) when a claim
	// asks for GPUs with a prioritized list (firstAvailable); choices then
	// names the subrequest of req (choices[0]) and of each of alts.
	alts    []core.Request
	choices []subrequestChoice
}

// subrequestChoice names one subrequest of a firstAvailable request.
type subrequestChoice struct {
	claim, request, subrequest string
}

// podGPURequest sums what a pod's unallocated claims ask of Tessera GPUs.
// Only shapes the core can place are accepted: any number of whole GPUs, or
// one fraction of one GPU; the error says what is wrong otherwise. A
// request with a prioritized list (firstAvailable) of Tessera subrequests
// gives the core alternatives: the rest of the pod's requests plus each
// subrequest in turn. One such request per pod is supported; one whose
// subrequests are all other drivers' is left to the commit's allocator,
// like another driver's exact request.
func podGPURequest(claims []*resourceapi.ResourceClaim, classes classLookup) (gpuRequest, error) {
	var out gpuRequest
	var base core.Request
	fractions := 0
	// The firstAvailable request, translated subrequest by subrequest.
	var subs []core.Request
	for _, c := range claims {
		if c.Status.Allocation != nil {
			continue // already allocated (a shared claim): it constrains the node only
		}
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly == nil {
				got, err := firstAvailableGPUs(c, &r, classes)
				if err != nil {
					return out, err
				}
				if got == nil {
					continue // other drivers' devices only
				}
				if subs != nil {
					return out, fmt.Errorf("claim %s request %q: tessera-scheduler supports one firstAvailable request for GPUs per pod; %s/%s is another", c.Name, r.Name, out.choices[0].claim, out.choices[0].request)
				}
				out.tessera = true
				for _, sub := range r.FirstAvailable {
					out.choices = append(out.choices, subrequestChoice{claim: c.Name, request: r.Name, subrequest: sub.Name})
				}
				subs = got
				continue
			}
			class := classes(r.Exactly.DeviceClassName)
			if class == nil {
				return out, fmt.Errorf("claim %s request %q: DeviceClass %q not found", c.Name, r.Name, r.Exactly.DeviceClassName)
			}
			if !isTesseraClass(class) {
				continue
			}
			out.tessera = true
			g, err := exactGPUs(c, r.Name, r.Exactly, class)
			if err != nil {
				return out, fmt.Errorf("claim %s request %q: %w", c.Name, r.Name, err)
			}
			if g.IsFraction() {
				fractions++
			}
			addGPUs(&base, g)
		}
		for _, k := range c.Spec.Devices.Constraints {
			if k.MatchAttribute != nil && string(*k.MatchAttribute) == draname.AttrNVLinkDomain {
				base.NVLink = core.NVLinkRequired
			}
		}
	}
	if subs == nil {
		if err := checkShape(base, fractions); err != nil {
			return out, err
		}
		out.req = base
		return out, nil
	}
	for i, g := range subs {
		r, n := base, fractions
		if g.IsFraction() {
			n++
		}
		addGPUs(&r, g)
		if err := checkShape(r, n); err != nil {
			ch := out.choices[i]
			return out, fmt.Errorf("claim %s request %q subrequest %q: %w", ch.claim, ch.request, ch.subrequest, err)
		}
		if i == 0 {
			out.req = r
		} else {
			out.alts = append(out.alts, r)
		}
	}
	return out, nil
}

// firstAvailableGPUs translates the subrequests of a firstAvailable
// request, each as an exact request is; nil when none asks for Tessera
// GPUs. Mixing Tessera and other drivers' classes in one list is refused:
// the core weighs GPUs only, so it could not honour the order between a
// GPU and another driver's device.
func firstAvailableGPUs(c *resourceapi.ResourceClaim, r *resourceapi.DeviceRequest, classes classLookup) ([]core.Request, error) {
	if len(r.FirstAvailable) == 0 {
		return nil, fmt.Errorf("claim %s request %q: neither exactly nor firstAvailable is set", c.Name, r.Name)
	}
	var out []core.Request
	tessera, other := "", ""
	for i := range r.FirstAvailable {
		sub := &r.FirstAvailable[i]
		class := classes(sub.DeviceClassName)
		if class == nil {
			return nil, fmt.Errorf("claim %s request %q subrequest %q: DeviceClass %q not found", c.Name, r.Name, sub.Name, sub.DeviceClassName)
		}
		if !isTesseraClass(class) {
			other = sub.Name
			continue
		}
		tessera = sub.Name
		// The same fields as an exact request's, so the same translation.
		g, err := exactGPUs(c, r.Name+"/"+sub.Name, &resourceapi.ExactDeviceRequest{
			DeviceClassName: sub.DeviceClassName, Selectors: sub.Selectors, AllocationMode: sub.AllocationMode,
			Count: sub.Count, Tolerations: sub.Tolerations, Capacity: sub.Capacity,
		}, class)
		if err != nil {
			return nil, fmt.Errorf("claim %s request %q subrequest %q: %w", c.Name, r.Name, sub.Name, err)
		}
		out = append(out, g)
	}
	if tessera != "" && other != "" {
		return nil, fmt.Errorf("claim %s request %q: subrequest %q asks for another driver's devices and %q for Tessera GPUs; tessera-scheduler cannot order the two in one firstAvailable list (use separate claims)", c.Name, r.Name, other, tessera)
	}
	return out, nil
}

// exactGPUs translates one exact request for Tessera GPUs (request names
// it for the claim's configs: "req", or "req/sub" for a subrequest) into
// whole GPUs or one share of one GPU. The error does not name the claim
// and request; the caller does.
func exactGPUs(c *resourceapi.ResourceClaim, request string, r *resourceapi.ExactDeviceRequest, class *resourceapi.DeviceClass) (core.Request, error) {
	var out core.Request
	if r.AllocationMode == resourceapi.DeviceAllocationModeAll {
		return out, fmt.Errorf("allocationMode All is not supported for GPUs; ask for a count")
	}
	count := r.Count
	if count == 0 {
		count = 1
	}
	mode, err := requestSharing(class, c, request)
	if err != nil {
		return out, err
	}
	var mem *resource.Quantity
	if r.Capacity != nil {
		if q, ok := r.Capacity.Requests[draname.CapacityMemory]; ok {
			mem = &q
		}
	}
	if mem == nil {
		if count < 0 || count > core.MaxGPUs {
			return out, fmt.Errorf("count %d: must be from 1 to %d", count, core.MaxGPUs)
		}
		out.GPUs = int(count)
		return out, nil
	}
	if mode == gpuconfig.Exclusive {
		return out, fmt.Errorf("a memory request shares a GPU; use DeviceClass %s or %s", draname.ClassMPS, draname.ClassTimeSlicing)
	}
	if count != 1 {
		return out, fmt.Errorf("a fractional request takes a share of one GPU; count must be 1, got %d", count)
	}
	if out.GPUMemory, err = readAmount(*mem, unitBytes, core.MaxAmount); err != nil || out.GPUMemory == 0 {
		return core.Request{}, fmt.Errorf("capacity request %s %q: not a positive amount of memory up to %s", draname.CapacityMemory, mem.String(), maxQuantityString(unitBytes, core.MaxAmount))
	}
	out.Sharing = core.SharingMPS
	if mode == gpuconfig.TimeSlicing {
		out.Sharing = core.SharingTimeSlice
	}
	return out, nil
}

// addGPUs adds g's whole GPUs or share to r.
func addGPUs(r *core.Request, g core.Request) {
	r.GPUs += g.GPUs
	if g.IsFraction() {
		r.GPUMemory, r.Sharing = g.GPUMemory, g.Sharing
	}
}

// checkShape refuses what the core cannot place: several shares, or a
// share with whole GPUs.
func checkShape(r core.Request, fractions int) error {
	if fractions > 1 || (fractions == 1 && r.GPUs > 0) {
		return fmt.Errorf("a pod may ask for whole GPUs or for one share of one GPU, not both or several shares")
	}
	return nil
}

// allocatedPlacement reads where a pod's allocated Tessera claims put it.
func allocatedPlacement(node string, claims []*resourceapi.ResourceClaim, gpus *nodeGPUs) core.Placement {
	pl := core.Placement{Node: node}
	if gpus == nil {
		return pl
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != DriverName || r.Pool != gpus.pool {
				continue
			}
			pos, ok := gpus.byDevice[r.Device]
			if !ok {
				continue // the GPU is gone from the slice (removed or unhealthy)
			}
			g := gpus.gpus[pos]
			mem := g.Memory
			if q, ok := r.ConsumedCapacity[draname.CapacityMemory]; ok {
				mem, _ = clampAmount(q, unitBytes)
			}
			pl.GPUs = append(pl.GPUs, g.Index)
			pl.GPUMemory = append(pl.GPUMemory, mem)
			milli := int64(1000)
			if mem < g.Memory && g.Memory > 0 {
				milli = (mem*1000 + g.Memory - 1) / g.Memory
				strategy, err := gpuconfig.ConfigForRequest(DriverName, c.Status.Allocation.Devices.Config, r.Request)
				pl.Sharing = core.SharingMPS
				if err == nil && strategy.Strategy() == gpuconfig.TimeSlicing {
					pl.Sharing = core.SharingTimeSlice
				}
			}
			pl.GPUMilli = append(pl.GPUMilli, milli)
		}
	}
	// The core wants indices ascending.
	idx := make([]int, len(pl.GPUs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return pl.GPUs[idx[a]] < pl.GPUs[idx[b]] })
	sorted := core.Placement{Node: node, Sharing: pl.Sharing}
	for _, i := range idx {
		sorted.GPUs = append(sorted.GPUs, pl.GPUs[i])
		sorted.GPUMemory = append(sorted.GPUMemory, pl.GPUMemory[i])
		sorted.GPUMilli = append(sorted.GPUMilli, pl.GPUMilli[i])
	}
	return sorted
}

// podResources is the pod's effective request as kube-scheduler counts it
// (component-helpers' PodRequests: the larger of the containers' sum and
// the largest init container, sidecars alongside, overhead, pod-level
// resources, and what an in-place resize has allocated): CPU in milli,
// memory in bytes, and every other resource (ephemeral storage, hugepages,
// extended resources) in its own units, plus one "pods" slot, so that the
// core places a pod only where the kubelet will admit it.
//
// Each amount is read with overflow and range checks (readAmount): one
// negative or above core.MaxAmount is an error naming the resource and its
// value, and is counted as MaxAmount (0 if negative), so that a bound pod
// asking for it still holds its node rather than nothing.
func podResources(pod *v1.Pod) (cpu, mem int64, other map[string]int64, err error) {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true})
	other = map[string]int64{string(v1.ResourcePods): 1}
	names := make([]string, 0, len(reqs))
	for name := range reqs {
		names = append(names, string(name))
	}
	slices.Sort(names) // the first bad one named is always the same
	for _, name := range names {
		q := reqs[v1.ResourceName(name)]
		v, rerr := readAmount(q, unitOf(v1.ResourceName(name)), core.MaxAmount)
		if rerr != nil {
			if err == nil {
				err = fmt.Errorf("asks for %s %s: %w", name, q.String(), rerr)
			}
			if !errors.Is(rerr, errNegative) {
				v = core.MaxAmount
			}
		}
		switch v1.ResourceName(name) {
		case v1.ResourceCPU:
			cpu = v
		case v1.ResourceMemory:
			mem = v
		default:
			if v > 0 {
				other[name] = v
			}
		}
	}
	for _, port := range hostPorts(pod) {
		other[port] = 1
	}
	return cpu, mem, other, err
}

// hostPortPrefix names the other resources that stand for host ports: every
// node holds one of each, so two pods asking the same port never share a
// node (the kubelet would refuse the second, as kube-scheduler's NodePorts
// filter knows). The host IP is not told apart: two pods on different
// addresses of one node with the same port are kept apart too.
const hostPortPrefix = "host port "

// hostPorts lists the host ports of the pod's containers, init containers
// included, as other-resource names ("host port TCP/8080").
func hostPorts(pod *v1.Pod) []string {
	var out []string
	add := func(cs []v1.Container) {
		for i := range cs {
			for _, p := range cs[i].Ports {
				if p.HostPort > 0 {
					proto := p.Protocol
					if proto == "" {
						proto = v1.ProtocolTCP
					}
					name := fmt.Sprintf("%s%s/%d", hostPortPrefix, proto, p.HostPort)
					if !slices.Contains(out, name) {
						out = append(out, name)
					}
				}
			}
		}
	}
	add(pod.Spec.InitContainers)
	add(pod.Spec.Containers)
	return out
}

// nodeOther is what the node can hold of the resources podResources puts
// in other.
func nodeOther(n *v1.Node) map[string]int64 {
	out := make(map[string]int64, len(n.Status.Allocatable))
	for name, q := range n.Status.Allocatable {
		if name != v1.ResourceCPU && name != v1.ResourceMemory {
			out[string(name)], _ = clampAmount(q, unitOf(name))
		}
	}
	return out
}

// queueFromObject turns a Queue object into the core's queue with DESIGN.md's
// defaults for what is unset. Quotas and limits are read with overflow and
// range checks: -1 (unlimited), or from 0 to core.MaxQueueAmount; the
// error names the queue, the field and its value (the Queue's jobs wait
// with it).
func queueFromObject(q *schedv1.Queue, now time.Time) (core.Queue, error) {
	out := core.NewQueue(q.Name, q.Spec.Parent)
	if q.Spec.Priority != nil {
		out.Priority = *q.Spec.Priority
	}
	for _, p := range []struct {
		d   *metav1.Duration
		dst *time.Duration
	}{{q.Spec.PreemptMinRuntime, &out.PreemptMinRuntime}, {q.Spec.ReclaimMinRuntime, &out.ReclaimMinRuntime}, {q.Spec.PreemptionDelay, &out.PreemptionDelay}} {
		if p.d != nil {
			*p.dst = max(p.d.Duration, 0)
		}
	}
	if err := queueResources(q.Name, "spec.resources", &q.Spec.Resources, &out); err != nil {
		return out, err
	}
	sched, err := queueSchedule(q)
	if err != nil {
		return out, err
	}
	// The windows are all checked above, whichever holds now: a bad one
	// fails the queue every cycle, not only while it holds.
	if i := sched.Active(now); i >= 0 {
		if err := queueResources(q.Name, fmt.Sprintf("spec.schedule[%d].resources", i), windowResources(&q.Spec.Schedule[i].Resources), &out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// queueSchedule reads a Queue's windows (controller/quotaschedule) and
// checks each window's resources over the queue's own.
func queueSchedule(q *schedv1.Queue) (quotaschedule.Schedule, error) {
	var sched quotaschedule.Schedule
	for i := range q.Spec.Schedule {
		w := &q.Spec.Schedule[i]
		pw, err := quotaschedule.Parse(quotaschedule.Spec{Days: w.Days, Start: w.Start, End: w.End, TimeZone: w.TimeZone})
		if err != nil {
			return nil, fmt.Errorf("queue %s: spec.schedule[%d]: %w", q.Name, i, err)
		}
		probe := core.NewQueue(q.Name, q.Spec.Parent)
		if err := queueResources(q.Name, "spec.resources", &q.Spec.Resources, &probe); err != nil {
			return nil, err
		}
		if err := queueResources(q.Name, fmt.Sprintf("spec.schedule[%d].resources", i), windowResources(&w.Resources), &probe); err != nil {
			return nil, err
		}
		for r, qr := range probe.Resources {
			if qr.Limit != core.Unlimited && (qr.Quota == core.Unlimited || qr.Quota > qr.Limit) {
				return nil, fmt.Errorf("queue %s: spec.schedule[%d]: %s quota is above its limit while the window holds", q.Name, i, core.Resource(r))
			}
		}
		sched = append(sched, pw)
	}
	return sched, nil
}

// windowResources reads a window's overrides as the queue's own fields.
func windowResources(w *schedv1.WindowResources) *schedv1.QueueResources {
	conv := func(q *schedv1.WindowQuota) *schedv1.ResourceQuota {
		if q == nil {
			return nil
		}
		return &schedv1.ResourceQuota{Quota: q.Quota, Limit: q.Limit, OverQuotaWeight: q.OverQuotaWeight}
	}
	return &schedv1.QueueResources{GPU: conv(w.GPU), CPU: conv(w.CPU), Memory: conv(w.Memory)}
}

// nextWindowChange is the next instant after now at which a Queue's
// schedule may change its settings; zero for none (or an unreadable one).
func nextWindowChange(q *schedv1.Queue, now time.Time) time.Time {
	sched, err := queueSchedule(q)
	if err != nil {
		return time.Time{}
	}
	return sched.Next(now)
}

// queueResources sets out's quota, limit and weight from what rs sets (at
// field, for errors), leaving the rest as it is.
func queueResources(name, field string, rs *schedv1.QueueResources, out *core.Queue) error {
	for _, f := range []struct {
		r  core.Resource
		rq *schedv1.ResourceQuota
		u  unit
	}{{core.ResGPU, rs.GPU, unitMilli}, {core.ResCPU, rs.CPU, unitMilli}, {core.ResMemory, rs.Memory, unitBytes}} {
		if f.rq == nil {
			continue
		}
		dst := &out.Resources[f.r]
		for _, v := range []struct {
			name string
			q    *resource.Quantity
			dst  *int64
		}{{"quota", f.rq.Quota, &dst.Quota}, {"limit", f.rq.Limit, &dst.Limit}} {
			if v.q == nil {
				continue
			}
			n, err := queueAmount(*v.q, f.u)
			if err != nil {
				return fmt.Errorf("queue %s: %s.%s.%s %s: %w", name, field, f.r, v.name, v.q.String(), err)
			}
			*v.dst = n
		}
		if w := f.rq.OverQuotaWeight; w != nil {
			if *w < 0 {
				return fmt.Errorf("queue %s: %s.%s.overQuotaWeight %d: is negative", name, field, f.r, *w)
			}
			dst.OverQuotaWeight = int64(*w)
		}
	}
	return nil
}

// queueAmount reads a quota or limit: -1 is unlimited; any other negative
// amount, or one above core.MaxQueueAmount, is an error.
func queueAmount(q resource.Quantity, u unit) (int64, error) {
	if q.Cmp(resource.MustParse("-1")) == 0 {
		return core.Unlimited, nil
	}
	v, err := readAmount(q, u, core.MaxQueueAmount)
	if errors.Is(err, errNegative) {
		return 0, errors.New("is negative; -1 means unlimited")
	}
	return v, err
}

// groupSpec is what the scheduler reads of a PodGroup's spec.
type groupSpec struct {
	minMember int
	queue     string
	subGroups []core.SubGroup
	topology  *core.TopologyConstraint
}

// podGroupSpec reads a PodGroup's spec with range checks (the CRD checks
// them too, but an object written around it must not count as a gang of
// none): minMember from 1 on. The error names the PodGroup, the field and
// its value; the group's pods wait with it.
func podGroupSpec(pg *schedv1.PodGroup) (groupSpec, error) {
	if pg.Spec.MinMember < 1 {
		return groupSpec{}, fmt.Errorf("PodGroup %s/%s: spec.minMember %d must be at least 1", pg.Namespace, pg.Name, pg.Spec.MinMember)
	}
	spec := groupSpec{minMember: int(pg.Spec.MinMember), queue: pg.Spec.Queue, topology: constraintOf(pg.Spec.Topology)}
	// Names, minimums and topologies are checked by the CRD and again by
	// the core, whose reason names the group.
	for _, g := range pg.Spec.SubGroups {
		spec.subGroups = append(spec.subGroups, core.SubGroup{Name: g.Name, MinMember: int(g.MinMember), Topology: constraintOf(g.Topology)})
	}
	return spec, nil
}
