package scheduler_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
)

// TestPlacement: whole GPUs, two fractions sharing one GPU, an NVLink
// matchAttribute constraint, and a pod in an unknown queue.
func TestPlacement(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("h100-0", "h100-sxm-8")
	e.startScheduler(core.Config{})

	t.Run("whole GPUs", func(t *testing.T) {
		e.createPod(podSpec{name: "whole-1", claim: &gpuClaim{count: 1}})
		e.createPod(podSpec{name: "whole-2", claim: &gpuClaim{count: 2}})
		e.waitBound("whole-1", "whole-2")
		d1, d2 := e.devicesOf("whole-1"), e.devicesOf("whole-2")
		if len(d1) != 1 || len(d2) != 2 {
			t.Fatalf("devices: whole-1 %v, whole-2 %v", d1, d2)
		}
		for _, d := range d2 {
			if d == d1[0] {
				t.Fatalf("GPU %s given to two exclusive claims", d)
			}
		}
	})

	t.Run("two fractions share one GPU", func(t *testing.T) {
		e.createPod(podSpec{name: "mps-1", claim: &gpuClaim{class: deviceclasses.MPS, memory: "40Gi"}})
		e.createPod(podSpec{name: "mps-2", claim: &gpuClaim{class: deviceclasses.MPS, memory: "40Gi"}})
		e.waitBound("mps-1", "mps-2")
		d1, d2 := e.devicesOf("mps-1"), e.devicesOf("mps-2")
		if len(d1) != 1 || d1[0] != d2[0] {
			t.Fatalf("fractions not packed onto one GPU: %v and %v", d1, d2)
		}
		for _, p := range []string{"mps-1", "mps-2"} {
			r := e.claimOf(p).Status.Allocation.Devices.Results[0]
			if q := r.ConsumedCapacity["memory"]; q.Cmp(*resourceQuantity("40Gi")) != 0 || r.ShareID == nil {
				t.Errorf("%s: consumed %v, share %v; want 40Gi and a share ID", p, r.ConsumedCapacity, r.ShareID)
			}
		}
		// A time-sliced fraction never joins the MPS GPU.
		e.createPod(podSpec{name: "ts-1", claim: &gpuClaim{class: deviceclasses.TimeSlicing, memory: "20Gi"}})
		e.waitBound("ts-1")
		if d := e.devicesOf("ts-1"); d[0] == d1[0] {
			t.Fatalf("time-sliced fraction placed on the MPS GPU %s", d[0])
		}
	})

	t.Run("unknown queue", func(t *testing.T) {
		e.createPod(podSpec{name: "lost", queue: "nope", claim: &gpuClaim{}})
		e.eventually("pending reason", 30*time.Second, func() (bool, string) {
			r := pendingReason(e.pod("lost"))
			return contains(r, "queue nope does not exist"), r
		})
		if e.pod("lost").Spec.NodeName != "" {
			t.Fatal("pod in an unknown queue was bound")
		}
		// A parent queue holds no workloads.
		e.createQueue("org", "", "", "", 100)
		e.createQueue("org-team", "org", "", "", 100)
		e.createPod(podSpec{name: "in-parent", queue: "org", claim: &gpuClaim{}})
		e.eventually("pending reason", 30*time.Second, func() (bool, string) {
			r := pendingReason(e.pod("in-parent"))
			return contains(r, "queue org is a parent queue"), r
		})
	})
	e.checkNoDoubleAllocation()
}

// TestNVLink: on a100-pcie-4 (bridged pairs 0-1 and 2-3) a 2-GPU claim with
// matchAttribute nvlinkDomain gets a linked pair.
func TestNVLink(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("a100-0", "a100-pcie-4")
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "one-a", claim: &gpuClaim{}})
	e.waitBound("one-a")
	e.createPod(podSpec{name: "pair", claim: &gpuClaim{count: 2, nvlink: true}})
	e.waitBound("pair")
	devs := e.devicesOf("pair")
	domains := e.attribute("a100-0", "gpu.tessera.dev/nvlinkDomain")
	if len(devs) != 2 || domains[devs[0]] != domains[devs[1]] || domains[devs[0]] == "" {
		t.Fatalf("pair got %v with domains %v", devs, domains)
	}
	// One GPU is left; a second linked pair cannot fit and waits, saying why.
	e.createPod(podSpec{name: "pair-2", claim: &gpuClaim{count: 2, nvlink: true}})
	e.eventually("pair-2 pending with a reason", 30*time.Second, func() (bool, string) {
		r := pendingReason(e.pod("pair-2"))
		return contains(r, "Unschedulable"), r
	})
	e.checkNoDoubleAllocation()
}

func (e *env) attribute(node, attr string) map[string]string {
	out := map[string]string{}
	sl, err := e.Client.ResourceV1().ResourceSlices().List(e.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		e.T.Fatal(err)
	}
	for _, s := range sl.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[resourceapi.QualifiedName(attr)]; ok && a.StringValue != nil {
				out[s.Spec.Pool.Name+"/"+d.Name] = *a.StringValue
			}
		}
	}
	return out
}

// TestGang: a 4-pod gang across 2 nodes is placed all at once; a gang that
// does not fit stays wholly pending, then is placed whole when room appears.
func TestGang(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.addGPUNode("dgx-1", "h100-sxm-8")
	e.startScheduler(core.Config{})
	e.createPodGroup("train", "", 4)
	var names []string
	for i := 0; i < 4; i++ {
		n := fmt.Sprintf("train-%d", i)
		names = append(names, n)
		e.createPod(podSpec{name: n, group: "train", claim: &gpuClaim{count: 4}})
	}
	e.waitBound(names...)
	nodes := map[string]int{}
	for _, n := range names {
		nodes[e.pod(n).Spec.NodeName]++
	}
	if len(nodes) != 2 {
		t.Fatalf("gang placed on %v; want both nodes", nodes)
	}

	e.createPodGroup("big", "", 2)
	e.createPod(podSpec{name: "big-0", group: "big", claim: &gpuClaim{count: 8}})
	e.createPod(podSpec{name: "big-1", group: "big", claim: &gpuClaim{count: 8}})
	e.eventually("PodGroup big pending with a reason", 30*time.Second, func() (bool, string) {
		u, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Get(e.Ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return phase == "Pending" && contains(pendingReason(e.pod("big-0")), "gang"), phase + " / " + pendingReason(e.pod("big-0"))
	})
	// Wholly pending: no member bound, no claim allocated.
	for _, n := range []string{"big-0", "big-1"} {
		if e.pod(n).Spec.NodeName != "" {
			t.Fatalf("%s bound although its gang does not fit", n)
		}
	}
	for _, n := range names {
		if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitBound("big-0", "big-1")
	if e.pod("big-0").Spec.NodeName == e.pod("big-1").Spec.NodeName {
		t.Fatal("two 8-GPU pods on one 8-GPU node")
	}
	e.checkNoDoubleAllocation()
}

// twoTeamsOnOneNode starts the scheduler (no consolidation) over one 8-GPU
// node shared by queues team-a and team-b (GPU quota 4 each), fills the node
// with team-a's eight one-GPU pods a-0 … a-7 and returns their names once
// bound. Creation times have 1 s resolution: each pod whose index is in
// newer is created over a second after the pods before it, so that victim
// order (newest first) tells them apart.
func (e *env) twoTeamsOnOneNode(newer ...int) []string {
	e.T.Helper()
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.createQueue("team-a", "", "4", "", 100)
	e.createQueue("team-b", "", "4", "", 100)
	e.startScheduler(core.Config{DisableConsolidation: true})
	var a []string
	for i := 0; i < 8; i++ {
		if slices.Contains(newer, i) {
			time.Sleep(1100 * time.Millisecond)
		}
		n := fmt.Sprintf("a-%d", i)
		a = append(a, n)
		e.createPod(podSpec{name: n, queue: "team-a", priority: "tessera-train", claim: &gpuClaim{}})
	}
	e.waitBound(a...)
	return a
}

// TestReclaimAndPreempt: a queue below its fair share reclaims from one
// above it; inside a queue a higher-priority job preempts a lower one.
func TestReclaimAndPreempt(t *testing.T) {
	e := newEnv(t)
	a := e.twoTeamsOnOneNode()

	t.Run("reclaim", func(t *testing.T) {
		for i := 0; i < 4; i++ {
			e.createPod(podSpec{name: fmt.Sprintf("b-%d", i), queue: "team-b", priority: "tessera-train", claim: &gpuClaim{}})
		}
		e.waitBound("b-0", "b-1", "b-2", "b-3")
		left := 0
		for _, n := range a {
			if p := e.pod(n); p != nil && p.DeletionTimestamp == nil {
				left++
			}
		}
		if left != 4 {
			t.Fatalf("team-a kept %d pods; reclaim should stop at its fair share of 4", left)
		}
		// No flapping: the state holds over more cycles.
		time.Sleep(2 * time.Second)
		for i := 0; i < 4; i++ {
			if p := e.pod(fmt.Sprintf("b-%d", i)); p == nil || p.DeletionTimestamp != nil {
				t.Fatalf("b-%d evicted after reclaim settled", i)
			}
		}
		e.eventually("Queue status", 20*time.Second, func() (bool, string) {
			u, err := e.Dyn.Resource(kube.QueueGVR).Get(e.Ctx, "team-b", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			alloc, _, _ := unstructured.NestedString(u.Object, "status", "resources", "gpu", "allocated")
			fair, _, _ := unstructured.NestedString(u.Object, "status", "resources", "gpu", "fairShare")
			return alloc == "4" && fair == "4", "allocated " + alloc + ", fair share " + fair
		})
	})

	t.Run("preemptionPolicy Never waits", func(t *testing.T) {
		e.createPod(podSpec{name: "b-patient", queue: "team-b", priority: "build-no-preempt", claim: &gpuClaim{count: 2}})
		e.eventually("b-patient pending with its reason", 20*time.Second, func() (bool, string) {
			why := pendingReason(e.pod("b-patient"))
			return contains(why, "it evicts no pod to run (preemptionPolicy Never)"), why
		})
		time.Sleep(2 * time.Second) // more cycles
		for i := 0; i < 4; i++ {
			if p := e.pod(fmt.Sprintf("b-%d", i)); p == nil || p.DeletionTimestamp != nil {
				t.Fatalf("b-%d evicted for a pod whose preemptionPolicy is Never", i)
			}
		}
		if err := e.Client.CoreV1().Pods(e.NS).Delete(e.Ctx, "b-patient", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("preempt inside a queue", func(t *testing.T) {
		e.createPod(podSpec{name: "b-urgent", queue: "team-b", priority: "tessera-build", claim: &gpuClaim{count: 2}})
		e.waitBound("b-urgent")
		gone := 0
		for i := 0; i < 4; i++ {
			if p := e.pod(fmt.Sprintf("b-%d", i)); p == nil || p.DeletionTimestamp != nil {
				gone++
			}
		}
		if gone != 2 {
			t.Fatalf("%d of team-b's low-priority pods preempted; want 2", gone)
		}
		left := 0
		for _, n := range a {
			if p := e.pod(n); p != nil && p.DeletionTimestamp == nil {
				left++
			}
		}
		if left != 4 {
			t.Fatalf("preemption reached into team-a: %d of its pods left, want 4", left)
		}
	})
	e.checkNoDoubleAllocation()
}

// TestConsolidation: pods spread over two nodes are moved so an 8-GPU pod
// gets a whole node; the moved pods (a ReplicaSet's) come back elsewhere.
func TestConsolidation(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.addGPUNode("dgx-1", "h100-sxm-8")
	e.startScheduler(core.Config{Placement: core.Spread})
	tmpl := e.claimTemplate("small", gpuClaim{})
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: e.NS},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](4),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "small"}},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "small"}},
				Spec: v1.PodSpec{
					SchedulerName:     kube.SchedulerName,
					PriorityClassName: "tessera-train",
					Containers:        []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
					ResourceClaims:    []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}},
				},
			},
		},
	}
	if _, err := e.Client.AppsV1().ReplicaSets(e.NS).Create(e.Ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("4 small pods spread over both nodes", 60*time.Second, func() (bool, string) {
		nodes := e.nodesOfApp("small")
		return nodes["dgx-0"] > 0 && nodes["dgx-1"] > 0 && nodes["dgx-0"]+nodes["dgx-1"] == 4, fmt.Sprint(nodes)
	})
	e.stopScheduler()
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "whole-node", priority: "tessera-train", claim: &gpuClaim{count: 8}})
	e.waitBound("whole-node")
	e.eventually("small pods re-placed", 60*time.Second, func() (bool, string) {
		nodes := e.nodesOfApp("small")
		other := "dgx-0"
		if e.pod("whole-node").Spec.NodeName == "dgx-0" {
			other = "dgx-1"
		}
		return nodes[other] == 4, fmt.Sprint(nodes)
	})
	e.checkNoDoubleAllocation()
}

func (e *env) nodesOfApp(app string) map[string]int {
	pods, err := e.Client.CoreV1().Pods(e.NS).List(e.Ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		e.T.Fatal(err)
	}
	out := map[string]int{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName]++
		}
	}
	return out
}

// TestRestartMidStream: the scheduler restarts while pods keep coming; it
// rebuilds its state from the API and gives no device twice.
func TestRestartMidStream(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.addGPUNode("dgx-1", "h100-sxm-8")
	e.startScheduler(core.Config{})
	var names []string
	for i := 0; i < 24; i++ {
		n := fmt.Sprintf("s-%d", i)
		names = append(names, n)
		c := &gpuClaim{}
		if i%2 == 0 {
			c = &gpuClaim{class: deviceclasses.MPS, memory: "20Gi"}
		}
		e.createPod(podSpec{name: n, claim: c})
		if i == 10 {
			e.stopScheduler()
			e.startScheduler(core.Config{})
		}
	}
	e.waitBound(names...)
	e.checkNoDoubleAllocation()
}

// TestConstraints: node taints, device CEL selectors and an unhealthy GPU's
// taint keep pods off what they may not use.
func TestConstraints(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("plain", "h100-sxm-8")
	e.addGPUNode("dedicated", "h100-sxm-8", v1.Taint{Key: "dedicated", Value: "infer", Effect: v1.TaintEffectNoSchedule})
	e.startScheduler(core.Config{})

	t.Run("CEL selector picks the device", func(t *testing.T) {
		e.createPod(podSpec{name: "gpu5", claim: &gpuClaim{cel: `device.attributes["gpu.tessera.dev"].index == 5`}})
		e.waitBound("gpu5")
		if d := e.devicesOf("gpu5"); len(d) != 1 || d[0] != "plain/gpu-5" {
			t.Fatalf("selector index == 5 got %v", d)
		}
	})

	t.Run("node taints", func(t *testing.T) {
		var names []string
		for i := 0; i < 8; i++ {
			n := fmt.Sprintf("untolerating-%d", i)
			names = append(names, n)
			e.createPod(podSpec{name: n, claim: &gpuClaim{}})
		}
		// 7 GPUs are left on "plain": 7 bind there, one waits.
		e.eventually("7 bound on plain, 1 pending", 60*time.Second, func() (bool, string) {
			bound, pending := 0, 0
			for _, n := range names {
				p := e.pod(n)
				switch {
				case p.Spec.NodeName == "dedicated":
					t.Fatalf("%s placed on a tainted node it does not tolerate", n)
				case p.Spec.NodeName == "plain":
					bound++
				case contains(pendingReason(p), "Unschedulable"):
					pending++
				}
			}
			return bound == 7 && pending == 1, fmt.Sprintf("%d bound, %d pending", bound, pending)
		})
		e.createPod(podSpec{name: "tolerating", tolerate: "dedicated", claim: &gpuClaim{}})
		e.waitBound("tolerating")
		if n := e.pod("tolerating").Spec.NodeName; n != "dedicated" {
			t.Fatalf("tolerating pod on %s", n)
		}
	})

	// Extended resources (here one a device plugin would advertise) gate
	// placement as in kube-scheduler: a pod goes only where the kubelet
	// would admit it, and waits, saying why, when no node has room.
	t.Run("extended resources", func(t *testing.T) {
		const widget = v1.ResourceName("example.com/widget")
		node, err := e.Client.CoreV1().Nodes().Get(e.Ctx, "dedicated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Capacity[widget] = resource.MustParse("1")
		node.Status.Allocatable[widget] = resource.MustParse("1")
		if _, err := e.Client.CoreV1().Nodes().UpdateStatus(e.Ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"widget-a", "widget-b"} {
			e.createPod(podSpec{name: n, tolerate: "dedicated", limits: v1.ResourceList{widget: resource.MustParse("1")}})
		}
		e.eventually("one widget pod on dedicated, the other pending for want of a widget", 60*time.Second, func() (bool, string) {
			a, b := e.pod("widget-a"), e.pod("widget-b")
			if a.Spec.NodeName != "" && a.Spec.NodeName != "dedicated" {
				t.Fatalf("widget-a bound to %s, which has no example.com/widget", a.Spec.NodeName)
			}
			if b.Spec.NodeName != "" {
				t.Fatalf("widget-b bound to %s, though the only widget is taken", b.Spec.NodeName)
			}
			want := "needs 1 example.com/widget; the most free on any node is 0"
			return a.Spec.NodeName == "dedicated" && contains(pendingReason(b), want),
				fmt.Sprintf("widget-a on %q; widget-b: %s (want %q)", a.Spec.NodeName, pendingReason(b), want)
		})
		// Pending reasons settle within a cycle or two; a bind cannot come later.
		time.Sleep(time.Second)
		if n := e.pod("widget-b").Spec.NodeName; n != "" {
			t.Fatalf("widget-b bound to %s later", n)
		}
	})

	// Required pod anti-affinity keeps replicas apart; required pod
	// affinity puts a pod beside the one it needs.
	t.Run("pod affinity", func(t *testing.T) {
		term := func(key, value string) []v1.PodAffinityTerm {
			return []v1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}}}
		}
		replicas := []string{"web-0", "web-1", "web-2"}
		for _, n := range replicas {
			e.createPod(podSpec{name: n, tolerate: "dedicated", labels: map[string]string{"app": "web"},
				affinity: &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: term("app", "web")}}})
		}
		e.waitApart(replicas, "required pod anti-affinity")
		e.createPod(podSpec{name: "cache", tolerate: "dedicated", labels: map[string]string{"tier": "cache"}, nodeSelector: map[string]string{"kubernetes.io/hostname": "plain"}})
		e.waitBound("cache")
		e.createPod(podSpec{name: "reader", tolerate: "dedicated",
			affinity: &v1.Affinity{PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: term("tier", "cache")}}})
		e.waitBound("reader")
		if n := e.pod("reader").Spec.NodeName; n != "plain" {
			t.Fatalf("reader on %s; the cache it needs is on plain", n)
		}
	})

	// Topology spread (DoNotSchedule) evens replicas out over the nodes,
	// against bin-packing's preference for the fuller one.
	t.Run("topology spread", func(t *testing.T) {
		var names []string
		for i := 0; i < 4; i++ {
			n := fmt.Sprintf("spread-%d", i)
			names = append(names, n)
			e.createPod(podSpec{name: n, tolerate: "dedicated", labels: map[string]string{"app": "spread"}, spread: []v1.TopologySpreadConstraint{{
				MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: v1.DoNotSchedule,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "spread"}},
			}}})
		}
		e.waitBound(names...)
		nodes := map[string]int{}
		for _, n := range names {
			nodes[e.pod(n).Spec.NodeName]++
		}
		if nodes["plain"] != 2 || nodes["dedicated"] != 2 {
			t.Fatalf("replicas per node %v; want 2 and 2", nodes)
		}
	})

	// Two pods asking the same host port never share a node (the kubelet
	// would refuse the second): with two nodes, the third waits.
	t.Run("host ports", func(t *testing.T) {
		names := []string{"port-0", "port-1", "port-2"}
		for _, n := range names {
			p := podSpec{name: n, tolerate: "dedicated", ports: []v1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}}
			e.createPod(p)
		}
		e.waitApart(names, "needs 1 host port TCP/8080; the most free on any node is 0")
	})

	// Soft preferences decide between nodes that fit before bin-packing
	// does. Here bin-packing alone puts every pod without a GPU on
	// "plain" (its GPUs are all taken, so it is the fuller node). Plain
	// gets a PreferNoSchedule taint first (the pods before the last two
	// tolerate it), so that the scheduler has long seen it when it counts.
	t.Run("preferences", func(t *testing.T) {
		node, err := e.Client.CoreV1().Nodes().Get(e.Ctx, "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Spec.Taints = append(node.Spec.Taints, v1.Taint{Key: "busy", Effect: v1.TaintEffectPreferNoSchedule})
		if _, err := e.Client.CoreV1().Nodes().Update(e.Ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		onNode := func(p podSpec) string {
			e.createPod(p)
			e.waitBound(p.name)
			return e.pod(p.name).Spec.NodeName
		}
		if n := onNode(podSpec{name: "packed", tolerate: "dedicated", tolerateSoft: "busy"}); n != "plain" {
			t.Fatalf("without preferences the pod went to %s; the test assumes bin-packing picks plain", n)
		}
		// Preferred pod anti-affinity spreads replicas.
		antiSoft := &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{{
			Weight: 100, PodAffinityTerm: v1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "soft"}}},
		}}}}
		replica := func(name string) podSpec {
			return podSpec{name: name, tolerate: "dedicated", tolerateSoft: "busy", labels: map[string]string{"app": "soft"}, affinity: antiSoft}
		}
		if a, b := onNode(replica("soft-0")), onNode(replica("soft-1")); a == b {
			t.Fatalf("soft-0 and soft-1 both on %s despite preferred anti-affinity", a)
		}
		// Preferred node affinity.
		likes := &v1.Affinity{NodeAffinity: &v1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{
			Weight: 10, Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: v1.NodeSelectorOpIn, Values: []string{"dedicated"}}}},
		}}}}
		if n := onNode(podSpec{name: "likes-dedicated", tolerate: "dedicated", tolerateSoft: "busy", affinity: likes}); n != "dedicated" {
			t.Fatalf("likes-dedicated on %s", n)
		}
		// The PreferNoSchedule taint steers a pod that does not tolerate
		// it elsewhere, but never keeps one from its only node.
		if n := onNode(podSpec{name: "avoids-busy", tolerate: "dedicated"}); n != "dedicated" {
			t.Fatalf("avoids-busy on %s, which has a PreferNoSchedule taint it does not tolerate", n)
		}
		if n := onNode(podSpec{name: "only-plain"}); n != "plain" { // does not tolerate dedicated's NoSchedule taint
			t.Fatalf("only-plain on %s", n)
		}
		// Symmetry, as kube-scheduler: a placed pod's preferred
		// anti-affinity pushes away the pods it selects, though they
		// carry no terms themselves.
		x := onNode(podSpec{name: "sym-control", tolerate: "dedicated", tolerateSoft: "busy"}) // where bin-packing puts such a pod
		repel := &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{{
			Weight: 50, PodAffinityTerm: v1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shy"}}},
		}}}}
		if n := onNode(podSpec{name: "sym-repeller", tolerate: "dedicated", tolerateSoft: "busy", nodeSelector: map[string]string{"kubernetes.io/hostname": x}, affinity: repel}); n != x {
			t.Fatalf("sym-repeller on %s, not %s", n, x)
		}
		if n := onNode(podSpec{name: "sym-shy", tolerate: "dedicated", tolerateSoft: "busy", labels: map[string]string{"app": "shy"}}); n == x {
			t.Fatalf("sym-shy on %s, beside a pod whose preferred anti-affinity selects it", n)
		}
	})
	e.checkNoDoubleAllocation()
}

// waitApart waits until all but one of the pods are bound, each on a node of
// its own, and the last is pending with a reason containing want; it fails
// at once if two of them share a node.
func (e *env) waitApart(names []string, want string) {
	e.T.Helper()
	e.eventually(fmt.Sprintf("%d pods on different nodes, one pending", len(names)-1), 60*time.Second, func() (bool, string) {
		nodes := map[string]string{}
		var waiting []string
		for _, n := range names {
			p := e.pod(n)
			if p.Spec.NodeName == "" {
				waiting = append(waiting, pendingReason(p))
				continue
			}
			if other, ok := nodes[p.Spec.NodeName]; ok {
				e.T.Fatalf("%s and %s both on %s", other, n, p.Spec.NodeName)
			}
			nodes[p.Spec.NodeName] = n
		}
		ok := len(nodes) == len(names)-1 && len(waiting) == 1 && contains(waiting[0], want)
		return ok, fmt.Sprintf("bound %v; waiting: %q (want one, with %q)", nodes, waiting, want)
	})
}

// TestSchedulingGates: a pod with scheduling gates (Kueue's way of holding
// a workload back) is left alone — no claim allocated, no bind — while a
// later pod is placed; once its gates are gone it is placed like any other.
func TestSchedulingGates(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("box", "l4-2")
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "gated", claim: &gpuClaim{}, gates: []string{"example.com/admission"}})
	e.createPod(podSpec{name: "after", claim: &gpuClaim{}})
	e.waitBound("after")
	// A few more cycles for a scheduler that would (wrongly) take it.
	time.Sleep(3 * time.Second)
	if n := e.pod("gated").Spec.NodeName; n != "" {
		t.Fatalf("the gated pod was bound to %s", n)
	}
	claims, err := e.Client.ResourceV1().ResourceClaims(e.NS).List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		for _, o := range c.OwnerReferences {
			if o.Name == "gated" && c.Status.Allocation != nil {
				t.Fatalf("claim %s of the gated pod was allocated: %+v", c.Name, c.Status.Allocation.Devices.Results)
			}
		}
	}
	pod := e.pod("gated")
	pod.Spec.SchedulingGates = nil
	if _, err := e.Client.CoreV1().Pods(e.NS).Update(e.Ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitBound("gated")
	e.checkNoDoubleAllocation()
}

// TestOtherDriverClaims: a pod that asks for a GPU and for a device of
// another driver gets both, on the one node that has that device (it sorts
// last, so bin-packing by name alone would pick the other), through the
// structured allocator.
func TestOtherDriverClaims(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("gpu-only", "l4-2")
	e.addGPUNode("z-gpu-nic", "l4-2")
	node := "z-gpu-nic"
	if _, err := e.Client.ResourceV1().ResourceSlices().Create(e.Ctx, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "z-gpu-nic-nics"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "nic.example.com", NodeName: &node,
			Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "nic-0"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.ResourceV1().DeviceClasses().Create(e.Ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "gpu-and-nic", claim: &gpuClaim{}, nicClass: "nic.example.com"})
	e.waitBound("gpu-and-nic")
	p := e.pod("gpu-and-nic")
	if p.Spec.NodeName != node {
		t.Fatalf("bound to %s; only %s has the NIC", p.Spec.NodeName, node)
	}
	var got []string
	for _, s := range p.Status.ResourceClaimStatuses {
		c, err := e.Client.ResourceV1().ResourceClaims(e.NS).Get(e.Ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated", c.Name)
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			got = append(got, r.Driver+"/"+r.Device)
		}
	}
	slices.Sort(got)
	if len(got) != 2 || got[1] != "nic.example.com/nic-0" || !contains(got[0], "gpu.tessera.dev/gpu-") {
		t.Fatalf("allocated %v; want one GPU and nic-0", got)
	}
}

// protect labels pods as protected, and a PodDisruptionBudget keeps all of
// them available; it returns once the budget's status allows no disruption.
func (e *env) protect(pods ...string) {
	e.T.Helper()
	patch := []byte(`{"metadata":{"labels":{"protected":"yes"}}}`)
	for _, n := range pods {
		if _, err := e.Client.CoreV1().Pods(e.NS).Patch(e.Ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			e.T.Fatal(err)
		}
	}
	all := intstr.FromInt32(int32(len(pods)))
	if _, err := e.Client.PolicyV1().PodDisruptionBudgets(e.NS).Create(e.Ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "protect"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &all,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"protected": "yes"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	e.eventually("PDB status observed", 30*time.Second, func() (bool, string) {
		p, err := e.Client.PolicyV1().PodDisruptionBudgets(e.NS).Get(e.Ctx, "protect", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.ObservedGeneration == p.Generation && int(p.Status.CurrentHealthy) == len(pods) && p.Status.DisruptionsAllowed == 0, fmt.Sprintf("%+v", p.Status)
	})
}

// waitEvents waits for at least n events of reason in the namespace.
func (e *env) waitEvents(reason string, n int) {
	e.T.Helper()
	e.eventually(fmt.Sprintf("%d %s event(s)", n, reason), 30*time.Second, func() (bool, string) {
		ev, err := e.Client.CoreV1().Events(e.NS).List(e.Ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return false, err.Error()
		}
		return len(ev.Items) >= n, fmt.Sprintf("%d events", len(ev.Items))
	})
}

// TestReclaimHonoursPDB: when a PodDisruptionBudget refuses the eviction of
// the victims the core picked first, other victims are chosen.
func TestReclaimHonoursPDB(t *testing.T) {
	e := newEnv(t)
	a := e.twoTeamsOnOneNode(4) // a-4 … a-7 strictly newer
	// The newest four, which victim order picks first, are protected.
	e.protect(a[4:]...)
	for i := 0; i < 4; i++ {
		e.createPod(podSpec{name: fmt.Sprintf("b-%d", i), queue: "team-b", priority: "tessera-train", claim: &gpuClaim{}})
	}
	e.waitBound("b-0", "b-1", "b-2", "b-3")
	// The core's first pick (the newest, protected pods) was refused.
	e.waitEvents("EvictionBlocked", 1)
	for i, n := range a {
		p := e.pod(n)
		alive := p != nil && p.DeletionTimestamp == nil
		if i >= 4 && !alive {
			t.Errorf("protected pod %s was evicted despite its PodDisruptionBudget", n)
		}
		if i < 4 && alive {
			t.Errorf("unprotected pod %s survived; reclaim should have taken it instead", n)
		}
	}
	e.checkNoDoubleAllocation()
}

// TestPlanSparedWhenPDBRefusesAVictim: a gang of two needs two victims in
// one plan, and a PodDisruptionBudget refuses one of them. The other is not
// evicted either: it would stop for a plan that cannot complete. Here every
// pod but one is protected, so no plan ever completes, and the unprotected
// pod must run on.
func TestPlanSparedWhenPDBRefusesAVictim(t *testing.T) {
	e := newEnv(t)
	// a-7, then a-6, are the newest: the first two victims of a plan.
	a := e.twoTeamsOnOneNode(6, 7)
	e.protect(append(slices.Clone(a[:6]), a[7])...) // all but a-6
	e.createPodGroup("gang", "team-b", 2)
	e.createPod(podSpec{name: "b-0", queue: "team-b", group: "gang", priority: "tessera-train", claim: &gpuClaim{}})
	e.createPod(podSpec{name: "b-1", queue: "team-b", group: "gang", priority: "tessera-train", claim: &gpuClaim{}})
	// Several plans refused in turn (each excludes the refused pod for a
	// while and tries the next protected one with a-6).
	e.waitEvents("EvictionBlocked", 3)
	for _, n := range a {
		if p := e.pod(n); p == nil || p.DeletionTimestamp != nil {
			t.Errorf("pod %s was evicted, for a plan a PodDisruptionBudget refused", n)
		}
	}
	for _, n := range []string{"b-0", "b-1"} {
		if e.pod(n).Spec.NodeName != "" {
			t.Errorf("%s bound, though no plan could free two GPUs", n)
		}
	}
	e.checkNoDoubleAllocation()
}

// TestClaimAllocatedPodUnbound: a scheduler that dies between writing a
// claim's allocation and binding its pod (a leader killed mid-commit)
// leaves a pending pod whose claim is allocated and reserved for it. The
// next scheduler must bind the pod to the node its claim holds a GPU on —
// here the emptier node, which bin-packing alone would not pick — keep that
// allocation, and give that GPU to nobody else. A claim allocated but
// reserved for nobody holds its GPU too.
func TestClaimAllocatedPodUnbound(t *testing.T) {
	e := newEnv(t)
	e.addGPUNode("dgx-0", "h100-sxm-8")
	e.addGPUNode("dgx-1", "h100-sxm-8")
	e.startScheduler(core.Config{})
	e.createPod(podSpec{name: "first", claim: &gpuClaim{}})
	e.waitBound("first")
	e.stopScheduler()
	first := e.claimOf("first")
	full := e.pod("first").Spec.NodeName
	other := "dgx-0"
	if full == other {
		other = "dgx-1"
	}

	// allocate writes what a dead scheduler would have: the finalizer, an
	// allocation of GPU dev on the other node, and the reservation.
	allocate := func(claim *resourceapi.ResourceClaim, dev string, pod *v1.Pod) {
		t.Helper()
		claim.Finalizers = append(claim.Finalizers, "resource.kubernetes.io/delete-protection")
		claim, err := e.Client.ResourceV1().ResourceClaims(e.NS).Update(e.Ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		alloc := first.Status.Allocation.DeepCopy()
		alloc.Devices.Results[0].Pool = other
		alloc.Devices.Results[0].Device = dev
		alloc.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{other},
		}}}}}
		claim.Status.Allocation = alloc
		if pod != nil {
			claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
		}
		if _, err := e.Client.ResourceV1().ResourceClaims(e.NS).UpdateStatus(e.Ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	orphan := e.createPod(podSpec{name: "orphan", claim: &gpuClaim{}})
	claim := e.waitClaim("orphan")
	allocate(claim, "gpu-7", orphan)
	// A claim of its own (not from a template), allocated but reserved for
	// nobody: nothing deallocates it, so it holds its GPU.
	lone := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "lone", Namespace: e.NS}, Spec: claim.Spec}
	lone, err := e.Client.ResourceV1().ResourceClaims(e.NS).Create(e.Ctx, lone, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocate(lone, "gpu-6", nil)
	// Fill the cluster, so a scheduler that ignored either allocation
	// would have to double-book gpu-6 or gpu-7 of the other node.
	e.startScheduler(core.Config{})
	var names []string
	for i := range 13 {
		n := fmt.Sprintf("fill-%d", i)
		names = append(names, n)
		e.createPod(podSpec{name: n, claim: &gpuClaim{}})
	}
	e.waitBound(append(names, "orphan")...)
	if got := e.pod("orphan").Spec.NodeName; got != other {
		t.Errorf("orphan bound to %s; its claim holds a GPU of %s", got, other)
	}
	if got, want := e.devicesOf("orphan"), []string{other + "/gpu-7"}; !slices.Equal(got, want) {
		t.Errorf("orphan's claim holds %v, want the allocation it had, %v", got, want)
	}
	e.checkNoDoubleAllocation()
	// The cluster is full now (16 GPUs: first, orphan, lone, 13 fills): one
	// more pod waits, with the core's reason, rather than take lone's GPU.
	e.createPod(podSpec{name: "extra", claim: &gpuClaim{}})
	// The reason must be the core's (no GPU free), not a commit refusing
	// the GPU the core thought free ("... do not fit GPUs [6] of node ...").
	e.eventually("extra pending for lack of GPUs", 30*time.Second, func() (bool, string) {
		r := pendingReason(e.pod("extra"))
		return contains(r, "GPU") && !contains(r, "do not fit") && e.pod("extra").Spec.NodeName == "", "reason " + r
	})
	time.Sleep(2 * time.Second) // some more cycles
	if n := e.pod("extra").Spec.NodeName; n != "" {
		t.Errorf("extra bound to %s, onto lone's GPU", n)
	}
	e.checkNoDoubleAllocation()
}
