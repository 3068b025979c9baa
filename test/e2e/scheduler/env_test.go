package scheduler_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// env is a real control plane with kwok nodes, a tessera-node (fake GPUs)
// per node publishing its slices, and tessera-scheduler running in-process.
type env struct {
	*framework.Env
	stop  context.CancelFunc
	sched *kube.Scheduler
	// reg holds the running scheduler's metrics.
	reg *prometheus.Registry
	// usage, when set before startScheduler, keeps a usage history.
	usage *kube.UsageOptions
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, controlplane.Options{})
}

// newEnvWith is newEnv on a control plane started with opts.
func newEnvWith(t *testing.T, opts controlplane.Options) *env {
	t.Helper()
	fe := framework.NewEnv(t, framework.EnvOptions{ControlPlane: opts, Namespace: "work"})
	e := &env{Env: fe}
	for name, value := range map[string]int32{"tessera-train": 50, "tessera-build": 100, "tessera-inference": 125} {
		_, err := e.Client.SchedulingV1().PriorityClasses().Create(e.Ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	never := v1.PreemptNever
	if _, err := e.Client.SchedulingV1().PriorityClasses().Create(e.Ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "build-no-preempt"}, Value: 100, PreemptionPolicy: &never}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) installCRDs() {
	if err := framework.InstallCRDs(e.Ctx, e.Dyn); err != nil {
		e.T.Fatal(err)
	}
}

// startScheduler runs tessera-scheduler in-process until the test ends or
// stopScheduler is called.
func (e *env) startScheduler(cfg core.Config) {
	e.T.Helper()
	e.reg = prometheus.NewRegistry()
	s, err := kube.New(kube.Options{Client: e.Client, Dynamic: e.Dyn, Interval: 200 * time.Millisecond, Core: cfg, Metrics: kube.NewMetrics(e.reg), Usage: e.usage})
	if err != nil {
		e.T.Fatal(err)
	}
	e.sched = s
	e.stop = e.Background("scheduler", s.Run)
}

func (e *env) stopScheduler() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}

// addGPUNode adds a kwok node with a tessera-node (in-process, fake profile)
// publishing its GPUs, and waits for the slice.
func (e *env) addGPUNode(name, profile string, taints ...v1.Taint) {
	e.T.Helper()
	e.addGPUNodeWith(name, profile, nil, taints...)
}

// addGPUNodeWith is addGPUNode with extra resources in the node's capacity
// and allocatable: the extended resources of tessera-node's device plugin
// (nvidia.com/gpu, tessera.dev/gpu-share), which a kubelet would report.
// It returns the node's driver, whose ledger tests may use as the device
// plugin would.
func (e *env) addGPUNodeWith(name, profile string, extra v1.ResourceList, taints ...v1.Taint) *driver.Driver {
	e.T.Helper()
	return e.AddGPUNode(name, profile, framework.NodeOptions{Extra: extra, Taints: taints, LabelClique: true})
}

// startTesseraNode runs tessera-node in-process (fake GPUs of profile,
// opts) for the kwok node name and waits for its slice.
func (e *env) startTesseraNode(name, profile string, opts ...gpu.Option) *driver.Driver {
	e.T.Helper()
	return e.StartTesseraNode(name, profile, framework.NodeOptions{LabelClique: true, GPU: opts})
}

func (e *env) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.T.Helper()
	e.Eventually(what, timeout, cond)
}

// gpuClaim describes the ResourceClaimTemplate of a test pod.
type gpuClaim struct {
	class  string // DeviceClass; default gpu.tessera.dev
	count  int64  // whole GPUs (default 1)
	memory string // for a fraction
	nvlink bool   // matchAttribute nvlinkDomain
	cel    string // a CEL selector on the request
}

type podSpec struct {
	name     string
	queue    string
	priority string // PriorityClass
	group    string // PodGroup
	// upstreamGroup is a scheduling.k8s.io PodGroup (spec.schedulingGroup).
	upstreamGroup string
	claim         *gpuClaim
	// claimTemplate names an existing ResourceClaimTemplate for the pod's
	// claim "gpu" (instead of claim).
	claimTemplate string
	cpu           string
	tolerate      string          // a NoSchedule taint key to tolerate
	tolerateSoft  string          // a PreferNoSchedule taint key to tolerate
	nicClass      string          // a second claim, for one device of this (other driver's) class
	limits        v1.ResourceList // e.g. an extended resource (requests default to limits)
	pvc           string          // a PersistentVolumeClaim mounted as volume "data"
	ports         []v1.ContainerPort
	// annotations and labels are added to the pod's.
	annotations, labels map[string]string
	affinity            *v1.Affinity
	nodeSelector        map[string]string
	spread              []v1.TopologySpreadConstraint
	gates               []string // scheduling gates
	// scheduler is the pod's schedulerName (default tessera-scheduler).
	scheduler string
}

func (e *env) createPod(p podSpec) *v1.Pod {
	e.T.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: e.NS, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: v1.PodSpec{
			SchedulerName:     kube.SchedulerName,
			PriorityClassName: p.priority,
			Containers:        []v1.Container{{Name: "main", Image: "busybox"}},
			Tolerations:       []v1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: v1.TolerationOpExists}},
		},
	}
	if p.queue != "" {
		pod.Labels[kube.LabelQueue] = p.queue
	}
	if p.scheduler != "" {
		pod.Spec.SchedulerName = p.scheduler
	}
	if p.tolerate != "" {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, v1.Toleration{Key: p.tolerate, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule})
	}
	if p.tolerateSoft != "" {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, v1.Toleration{Key: p.tolerateSoft, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectPreferNoSchedule})
	}
	if p.group != "" {
		pod.Annotations[kube.AnnotationPodGroup] = p.group
	}
	if p.upstreamGroup != "" {
		pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &p.upstreamGroup}
	}
	if p.cpu != "" {
		pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse(p.cpu)}
	}
	pod.Spec.Containers[0].Resources.Limits = p.limits
	pod.Spec.Containers[0].Ports = p.ports
	maps.Copy(pod.Annotations, p.annotations)
	maps.Copy(pod.Labels, p.labels)
	pod.Spec.Affinity = p.affinity
	pod.Spec.NodeSelector = p.nodeSelector
	pod.Spec.TopologySpreadConstraints = p.spread
	for _, g := range p.gates {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, v1.PodSchedulingGate{Name: g})
	}
	if p.pvc != "" {
		pod.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: p.pvc}}}}
	}
	if c := p.claim; c != nil {
		p.claimTemplate = e.claimTemplate(p.name, *c)
	}
	if p.claimTemplate != "" {
		tmpl := p.claimTemplate
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
		pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	}
	if p.nicClass != "" {
		tmpl := p.name + "-nic"
		spec := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: p.nicClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}
		if _, err := e.Client.ResourceV1().ResourceClaimTemplates(e.NS).Create(e.Ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: tmpl, Namespace: e.NS},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}},
		}, metav1.CreateOptions{}); err != nil {
			e.T.Fatal(err)
		}
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: "nic", ResourceClaimTemplateName: &tmpl})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: "nic"})
	}
	created, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatalf("creating pod %s: %v", p.name, err)
	}
	return created
}

func (e *env) claimTemplate(name string, c gpuClaim) string {
	e.T.Helper()
	if c.class == "" {
		c.class = deviceclasses.Exclusive
	}
	if c.count == 0 {
		c.count = 1
	}
	req := resourceapi.ExactDeviceRequest{DeviceClassName: c.class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: c.count}
	if c.cel != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: c.cel}}}
	}
	if c.memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(c.memory)}}
	}
	spec := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}
	if c.nvlink {
		spec.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.tessera.dev/nvlinkDomain"))}}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}},
	}
	if _, err := e.Client.ResourceV1().ResourceClaimTemplates(e.NS).Create(e.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating ResourceClaimTemplate %s: %v", name, err)
	}
	return name
}

func (e *env) createQueue(name, parent string, gpuQuota, gpuLimit string, priority int32) {
	e.T.Helper()
	gpuRes := map[string]any{}
	if gpuQuota != "" {
		gpuRes["quota"] = gpuQuota
	}
	if gpuLimit != "" {
		gpuRes["limit"] = gpuLimit
	}
	spec := map[string]any{"priority": int64(priority), "resources": map[string]any{"gpu": gpuRes}}
	if parent != "" {
		spec["parent"] = parent
	}
	e.CreateQueue(name, spec)
}

func (e *env) createPodGroup(name, queue string, minMember int64) {
	e.T.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": e.NS},
		"spec":     map[string]any{"minMember": minMember, "queue": queue},
	}}
	if _, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Create(e.Ctx, u, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("creating PodGroup %s: %v", name, err)
	}
}

func (e *env) pod(name string) *v1.Pod {
	e.T.Helper()
	return e.Pod(name)
}

func (e *env) waitBound(names ...string) {
	e.T.Helper()
	e.WaitBound(60*time.Second, names...)
}

var pendingReason = framework.PendingReason

// claimOf returns the allocated claim of a test pod.
func (e *env) claimOf(pod string) *resourceapi.ResourceClaim {
	e.T.Helper()
	if c := e.findClaim(pod); c != nil {
		return c
	}
	e.T.Fatalf("pod %s has no claim", pod)
	return nil
}

// waitClaim waits for kube-controller-manager to make the pod's claim.
func (e *env) waitClaim(pod string) *resourceapi.ResourceClaim {
	e.T.Helper()
	var c *resourceapi.ResourceClaim
	e.eventually(pod+"'s claim created", 30*time.Second, func() (bool, string) {
		c = e.findClaim(pod)
		return c != nil, "no claim yet"
	})
	return c
}

// findClaim returns the pod's first generated claim, or nil before there is
// one.
func (e *env) findClaim(pod string) *resourceapi.ResourceClaim {
	e.T.Helper()
	for _, s := range e.pod(pod).Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			c, err := e.Client.ResourceV1().ResourceClaims(e.NS).Get(e.Ctx, *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				e.T.Fatal(err)
			}
			return c
		}
	}
	return nil
}

// devicesOf lists "pool/device" of a pod's allocated claim.
func (e *env) devicesOf(pod string) []string {
	c := e.claimOf(pod)
	if c.Status.Allocation == nil {
		e.T.Fatalf("claim of %s is not allocated", pod)
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Pool+"/"+r.Device)
	}
	slices.Sort(out)
	return out
}

// checkNoDoubleAllocation fails when a device is given to two claims beyond
// its capacity, or a bound pod lacks its claim's allocation.
func (e *env) checkNoDoubleAllocation() {
	e.T.Helper()
	claims, err := e.Client.ResourceV1().ResourceClaims("").List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	used := map[string]int64{}
	exclusive := map[string]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			dev := r.Pool + "/" + r.Device
			if r.ShareID == nil || len(r.ConsumedCapacity) == 0 {
				if other, ok := exclusive[dev]; ok {
					e.T.Errorf("device %s given to claims %s and %s", dev, other, c.Name)
				}
				exclusive[dev] = c.Name
			}
			if q, ok := r.ConsumedCapacity["memory"]; ok {
				used[dev] += q.Value()
			} else {
				used[dev] += 80 << 30
			}
		}
	}
	for dev, u := range used {
		if u > 141<<30 {
			e.T.Errorf("device %s over-committed: %d bytes", dev, u)
		}
	}
	pods, err := e.Client.CoreV1().Pods("").List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || len(p.Spec.ResourceClaims) == 0 || p.Spec.SchedulerName != kube.SchedulerName {
			continue
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName == nil {
				continue
			}
			c, err := e.Client.ResourceV1().ResourceClaims(p.Namespace).Get(e.Ctx, *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				e.T.Errorf("bound pod %s: claim %s: %v", p.Name, *s.ResourceClaimName, err)
				continue
			}
			if c.Status.Allocation == nil || !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
				e.T.Errorf("pod %s is bound but its claim %s is not allocated and reserved for it", p.Name, c.Name)
			}
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func resourceQuantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }
