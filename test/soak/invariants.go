// Package soak is Tessera's chaos soak: a seeded stream of pods, gangs,
// fractions and deletions from several queues on kwok nodes, each with a
// real tessera-node --fake-gpus process, while controller replicas,
// tessera-node processes and the API server are killed at random; after
// every event the invariants in this file are checked on one consistent
// picture of the cluster. See README.md.
package soak

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/assignment"
)

// The invariants, by the name a failure prints.
const (
	// InvOverCapacity: the memory held on a GPU (DRA claims' consumed
	// capacity plus device-plugin share assignments; a whole GPU holds all
	// of it) exceeds the GPU's memory.
	InvOverCapacity = "device over capacity"
	// InvDoubleAllocation: a GPU held whole (an exclusive claim or a
	// device-plugin whole-GPU assignment) is also held by anything else.
	InvDoubleAllocation = "double allocation"
	// InvMixedSharing: shares of one GPU in two sharing modes (DESIGN.md:
	// one sharing mode per GPU at a time).
	InvMixedSharing = "sharing modes mixed on a GPU"
	// InvUnbacked: a bound, live pod of tessera-scheduler whose claim is
	// missing, unallocated, not reserved for it or allocated on another
	// node, or whose device-plugin request has no valid assignment.
	InvUnbacked = "bound pod without its GPUs"
	// InvHalfBoundGang: a PodGroup with 0 < bound live members < minMember
	// for longer than the gang window (see Checker.GangWindow).
	InvHalfBoundGang = "half-bound gang"
	// InvNoReason: a pending pod of tessera-scheduler without a
	// PodScheduled=False condition carrying a message, PendingGrace after
	// it was created (or after the last disruption, whichever is later).
	InvNoReason = "pending pod without a reason"
	// InvQueueLimit: the GPUs held by a queue's pods (its subtree's) exceed
	// the queue's GPU limit.
	InvQueueLimit = "queue over its GPU limit"
	// InvQueueQuota: the GPUs held by a queue's non-preemptible pods exceed
	// its GPU quota (DESIGN.md: non-preemptible jobs use in-quota resources
	// only).
	InvQueueQuota = "non-preemptible GPUs over quota"
)

// modeExclusive is the sharing mode of a whole GPU.
const modeExclusive = "Exclusive"

// State is one consistent picture of the cluster: every list read at the
// same etcd revision.
type State struct {
	At              time.Time
	Revision        string
	Pods            []corev1.Pod
	Claims          []resourceapi.ResourceClaim
	Slices          []resourceapi.ResourceSlice
	PodGroups       []schedv1.PodGroup
	Queues          []schedv1.Queue
	PriorityClasses []schedulingv1.PriorityClass
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string
	// Objects are "pod ns/name", "claim ns/name", "podgroup ns/name",
	// "queue name" or "gpu pool/device".
	Objects []string
	Detail  string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s [%s]", v.Invariant, v.Detail, strings.Join(v.Objects, ", "))
}

// Checker checks the invariants on each State. It keeps what a single
// picture cannot tell: since when a gang has been half-bound, and each
// GPU's memory when its node's slice is missing (tessera-node restarting).
type Checker struct {
	// PendingGrace is how long a pending pod may go without a reason.
	PendingGrace time.Duration
	// GangWindow is how long a gang may stay half-bound: the controller's
	// stale-gang timeout plus the time to notice, evict and see the pods
	// go. A gang is half-bound legitimately while a member was just deleted
	// (by a user, or the soak) until the stale-gang eviction, and while a
	// commit binds its members one after the other. The timer of the
	// stale-gang eviction lives in the leader's memory, so the window counts
	// from the later of the gang becoming half-bound and the last
	// disruption (a controller or API server kill).
	GangWindow time.Duration

	halfBound map[string]time.Time
	devices   map[string]gpuDevice
}

// NewChecker returns a Checker with the given windows.
func NewChecker(pendingGrace, gangWindow time.Duration) *Checker {
	return &Checker{PendingGrace: pendingGrace, GangWindow: gangWindow,
		halfBound: map[string]time.Time{}, devices: map[string]gpuDevice{}}
}

// gpuDevice is one GPU of a node's pool.
type gpuDevice struct {
	node   string
	index  int
	memory int64
}

// holder is something that holds (part of) one GPU.
type holder struct {
	what   string // "claim ns/name" or "pod ns/name"
	mode   string // modeExclusive, assignment.SharingMPS or SharingTimeSlicing
	memory int64  // a share's bytes; a whole GPU holds the device's memory
}

// Check returns every invariant s breaks. lastDisruption is when a
// controller replica or the API server was last killed or restarted.
func (c *Checker) Check(s *State, lastDisruption time.Time) []Violation {
	c.learnDevices(s)
	idx := newIndex(s, c.devices)
	var out []Violation
	out = append(out, c.checkDevices(idx)...)
	out = append(out, checkBoundPods(s, idx)...)
	out = append(out, c.checkGangs(s, lastDisruption)...)
	out = append(out, c.checkPending(s, lastDisruption)...)
	out = append(out, checkQueues(s, idx)...)
	return out
}

// learnDevices records every GPU of the State's slices; a GPU keeps its
// last known memory while its slice is gone.
func (c *Checker) learnDevices(s *State) {
	for _, sl := range s.Slices {
		if sl.Spec.Driver != driver.DriverName || sl.Spec.NodeName == nil {
			continue
		}
		for _, d := range sl.Spec.Devices {
			a, ok := d.Attributes[driver.AttrIndex]
			if !ok || a.IntValue == nil {
				continue
			}
			var mem int64
			if cp, ok := d.Capacity[driver.CapacityMemory]; ok {
				mem = cp.Value.Value()
			}
			c.devices[sl.Spec.Pool.Name+"/"+d.Name] = gpuDevice{node: *sl.Spec.NodeName, index: int(*a.IntValue), memory: mem}
		}
	}
}

// index is what the checks look up: claims by name, GPUs by node and
// index, and the holders of each GPU.
type index struct {
	claims  map[string]*resourceapi.ResourceClaim // "ns/name"
	devices map[string]gpuDevice                  // "pool/device"
	byNode  map[string]map[int]string             // node → index → "pool/device"
	holders map[string][]holder                   // "pool/device" → holders
	// broken lists what could not be read: an assignment that does not
	// parse, a GPU index no slice knows.
	broken []Violation
}

func newIndex(s *State, devices map[string]gpuDevice) *index {
	idx := &index{claims: map[string]*resourceapi.ResourceClaim{}, devices: devices,
		byNode: map[string]map[int]string{}, holders: map[string][]holder{}}
	for key, d := range devices {
		if idx.byNode[d.node] == nil {
			idx.byNode[d.node] = map[int]string{}
		}
		idx.byNode[d.node][d.index] = key
	}
	for i := range s.Claims {
		cl := &s.Claims[i]
		idx.claims[cl.Namespace+"/"+cl.Name] = cl
		idx.addClaim(cl)
	}
	for i := range s.Pods {
		idx.addAssignment(&s.Pods[i])
	}
	return idx
}

// addClaim adds an allocated claim's Tessera devices as holders.
func (idx *index) addClaim(cl *resourceapi.ResourceClaim) {
	if cl.Status.Allocation == nil {
		return
	}
	what := "claim " + cl.Namespace + "/" + cl.Name
	for _, r := range cl.Status.Allocation.Devices.Results {
		if r.Driver != driver.DriverName {
			continue
		}
		h := holder{what: what, mode: claimMode(cl, r.Request)}
		if q, ok := r.ConsumedCapacity[driver.CapacityMemory]; ok && h.mode != modeExclusive {
			h.memory = q.Value()
		}
		key := r.Pool + "/" + r.Device
		idx.holders[key] = append(idx.holders[key], h)
	}
}

// claimMode is the sharing mode of a claim's request (for a prioritized
// list, "request/subrequest"), from its DeviceClass. A class the soak does
// not know counts as exclusive: the strictest reading.
func claimMode(cl *resourceapi.ResourceClaim, request string) string {
	main, sub, _ := strings.Cut(request, "/")
	for _, r := range cl.Spec.Devices.Requests {
		if r.Name != main {
			continue
		}
		class := ""
		if r.Exactly != nil {
			class = r.Exactly.DeviceClassName
		}
		for _, alt := range r.FirstAvailable {
			if alt.Name == sub {
				class = alt.DeviceClassName
			}
		}
		switch class {
		case deviceclasses.MPS:
			return assignment.SharingMPS
		case deviceclasses.TimeSlicing:
			return assignment.SharingTimeSlicing
		}
	}
	return modeExclusive
}

// addAssignment adds a placed device-plugin pod's assignment as holders.
// Terminating pods still hold their GPUs (their containers may run);
// finished ones do not.
func (idx *index) addAssignment(p *corev1.Pod) {
	if p.Spec.NodeName == "" || podFinished(p) {
		return
	}
	a, ok, err := assignment.Of(p.Annotations)
	if !ok {
		return
	}
	what := "pod " + p.Namespace + "/" + p.Name
	if err != nil {
		idx.broken = append(idx.broken, Violation{InvUnbacked, []string{what}, fmt.Sprintf("assignment on node %s does not parse: %v", p.Spec.NodeName, err)})
		return
	}
	for _, g := range a.GPUs {
		key, ok := idx.byNode[p.Spec.NodeName][g]
		if !ok {
			idx.broken = append(idx.broken, Violation{InvUnbacked, []string{what}, fmt.Sprintf("assignment names GPU %d, which node %s does not have", g, p.Spec.NodeName)})
			continue
		}
		h := holder{what: what, mode: modeExclusive}
		if a.IsShare() {
			h.mode, h.memory = a.Sharing, a.MemoryBytes
		}
		idx.holders[key] = append(idx.holders[key], h)
	}
}

func podFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// checkDevices checks each GPU's holders: a whole GPU alone, one sharing
// mode, memory within the device's.
func (c *Checker) checkDevices(idx *index) []Violation {
	out := append([]Violation(nil), idx.broken...)
	for _, key := range sortedKeys(idx.holders) {
		hs := idx.holders[key]
		objs := []string{"gpu " + key}
		modes := map[string]bool{}
		whole, shares := 0, 0
		for _, h := range hs {
			objs = append(objs, h.what)
			if h.mode == modeExclusive {
				whole++
			} else {
				shares++
				modes[h.mode] = true
			}
		}
		if whole > 0 && len(hs) > 1 {
			out = append(out, Violation{InvDoubleAllocation, objs, fmt.Sprintf("GPU %s held whole by %d and shared by %d at once", key, whole, shares)})
		}
		if len(modes) > 1 {
			out = append(out, Violation{InvMixedSharing, objs, fmt.Sprintf("GPU %s shared in modes %v", key, sortedKeys(modes))})
		}
		dev, known := idx.devices[key]
		if !known || dev.memory == 0 {
			continue // its slice was never seen: nothing to compare with
		}
		var used int64
		for _, h := range hs {
			if h.mode == modeExclusive {
				used += dev.memory
			} else {
				used += h.memory
			}
		}
		if used > dev.memory {
			out = append(out, Violation{InvOverCapacity, objs, fmt.Sprintf("GPU %s: %d bytes held of %d", key, used, dev.memory)})
		}
	}
	return out
}

// ours reports whether tessera-scheduler places the pod and it is live.
func ours(p *corev1.Pod) bool {
	return p.Spec.SchedulerName == kube.SchedulerName && p.DeletionTimestamp == nil && !podFinished(p)
}

// podClaimNames returns "ns/name" of each of the pod's claims, or "" for a
// claim from a template whose name the pod's status does not give yet.
func podClaimNames(p *corev1.Pod) []string {
	var out []string
	for i := range p.Spec.ResourceClaims {
		name := ""
		if n, _, err := resourceclaim.Name(p, &p.Spec.ResourceClaims[i]); err == nil && n != nil {
			name = p.Namespace + "/" + *n
		}
		out = append(out, name)
	}
	return out
}

// asksDevicePlugin reports whether a pod asks for GPUs the device-plugin
// way (whole GPUs or a share slot).
func asksDevicePlugin(p *corev1.Pod) bool {
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for name, q := range rl {
				if (name == assignment.DefaultResourceGPU || name == assignment.ResourceShare) && !q.IsZero() {
					return true
				}
			}
		}
	}
	return false
}

// checkBoundPods checks that every bound pod of ours holds what it asked
// for: each claim allocated on its node and reserved for it, and an
// assignment when it asks the device-plugin way.
func checkBoundPods(s *State, idx *index) []Violation {
	var out []Violation
	for i := range s.Pods {
		p := &s.Pods[i]
		if !ours(p) || p.Spec.NodeName == "" {
			continue
		}
		what := "pod " + p.Namespace + "/" + p.Name
		for _, name := range podClaimNames(p) {
			if why := claimBacks(idx.claims[name], name, p); why != "" {
				out = append(out, Violation{InvUnbacked, []string{what, "claim " + name}, why})
			}
		}
		if asksDevicePlugin(p) {
			if _, ok, _ := assignment.Of(p.Annotations); !ok {
				out = append(out, Violation{InvUnbacked, []string{what}, "bound on " + p.Spec.NodeName + " asking for device-plugin GPUs without an assignment"})
			}
		}
	}
	return out
}

// claimBacks returns why a claim does not back a pod bound to its node, or
// "" when it does.
func claimBacks(cl *resourceapi.ResourceClaim, name string, p *corev1.Pod) string {
	switch {
	case name == "":
		return "bound before its claim was created"
	case cl == nil:
		return "its claim does not exist"
	case cl.Status.Allocation == nil:
		return "its claim is not allocated"
	case !slices.ContainsFunc(cl.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }):
		return "its claim is not reserved for it"
	}
	if n := allocationNode(cl.Status.Allocation); n != "" && n != p.Spec.NodeName {
		return fmt.Sprintf("bound on %s, its claim allocated on %s", p.Spec.NodeName, n)
	}
	return ""
}

// allocationNode is the node an allocation's node selector names, or "".
func allocationNode(a *resourceapi.AllocationResult) string {
	if a.NodeSelector == nil {
		return ""
	}
	for _, term := range a.NodeSelector.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// checkGangs finds gangs half-bound for longer than the gang window.
func (c *Checker) checkGangs(s *State, lastDisruption time.Time) []Violation {
	bound := map[string][]string{}
	for i := range s.Pods {
		p := &s.Pods[i]
		if g := p.Annotations[kube.AnnotationPodGroup]; g != "" && ours(p) && p.Spec.NodeName != "" {
			key := p.Namespace + "/" + g
			bound[key] = append(bound[key], "pod "+p.Namespace+"/"+p.Name)
		}
	}
	var out []Violation
	seen := map[string]bool{}
	for _, pg := range s.PodGroups {
		key := pg.Namespace + "/" + pg.Name
		n := len(bound[key])
		if n == 0 || n >= int(pg.Spec.MinMember) {
			continue
		}
		seen[key] = true
		since, ok := c.halfBound[key]
		if !ok {
			since = s.At
			c.halfBound[key] = since
		}
		from := since
		if lastDisruption.After(from) {
			from = lastDisruption
		}
		if s.At.Sub(from) > c.GangWindow {
			objs := append([]string{"podgroup " + key}, bound[key]...)
			out = append(out, Violation{InvHalfBoundGang, objs,
				fmt.Sprintf("%d of minMember %d bound since %s (window %v from %s)", n, pg.Spec.MinMember, since.Format(time.TimeOnly), c.GangWindow, from.Format(time.TimeOnly))})
		}
	}
	for key := range c.halfBound {
		if !seen[key] {
			delete(c.halfBound, key)
		}
	}
	return out
}

// checkPending finds pending pods of ours that have gone without a reason
// for longer than the grace period.
func (c *Checker) checkPending(s *State, lastDisruption time.Time) []Violation {
	var out []Violation
	for i := range s.Pods {
		p := &s.Pods[i]
		if !ours(p) || p.Spec.NodeName != "" || len(p.Spec.SchedulingGates) > 0 {
			continue
		}
		from := p.CreationTimestamp.Time
		if lastDisruption.After(from) {
			from = lastDisruption
		}
		if s.At.Sub(from) <= c.PendingGrace || pendingReason(p) != "" {
			continue
		}
		out = append(out, Violation{InvNoReason, []string{"pod " + p.Namespace + "/" + p.Name},
			fmt.Sprintf("pending since %s with no PodScheduled=False message (grace %v from %s)", p.CreationTimestamp.Format(time.TimeOnly), c.PendingGrace, from.Format(time.TimeOnly))})
	}
	return out
}

// pendingReason is the message of a pod's PodScheduled=False condition.
func pendingReason(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			return cond.Message
		}
	}
	return ""
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
