package scheduler_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

const (
	labelBlock = "example.com/block"
	labelRack  = "example.com/rack"
)

// addRackNodes adds kwok nodes of 2 GPUs (l4-2), 2 per rack, in blocks
// b1, b2 of racks r1, r2 (rack names repeat across blocks: the domain is
// the pair), and the Topology dc: block, rack, hostname. It returns the
// nodes by domain "b1/r1".
func (e *env) addRackNodes() map[string][]string {
	e.T.Helper()
	racks := map[string][]string{}
	for _, b := range []string{"b1", "b2"} {
		for _, r := range []string{"r1", "r2"} {
			for i := 0; i < 2; i++ {
				name := fmt.Sprintf("%s-%s-%d", b, r, i)
				e.CP.AddKwokNodeWith(e.T, &v1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelBlock: b, labelRack: r}},
					Status: v1.NodeStatus{Capacity: v1.ResourceList{
						v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
					}},
				})
				e.startTesseraNode(name, "l4-2")
				racks[b+"/"+r] = append(racks[b+"/"+r], name)
			}
		}
	}
	if err := e.createTopology("dc", labelBlock, labelRack, "kubernetes.io/hostname"); err != nil {
		e.T.Fatal(err)
	}
	return racks
}

// createTopology creates a Topology of these levels.
func (e *env) createTopology(name string, levels ...string) error {
	var ls []any
	for _, l := range levels {
		ls = append(ls, map[string]any{"nodeLabel": l})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Topology",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"levels": ls},
	}}
	_, err := e.Dyn.Resource(kube.TopologyGVR).Create(e.Ctx, u, metav1.CreateOptions{})
	return err
}

// createTopoGroup creates a PodGroup of minMember pods with a topology
// constraint and returns the API server's answer.
func (e *env) createTopoGroup(name, queue string, minMember int64, topology map[string]any) error {
	spec := map[string]any{"minMember": minMember, "topology": topology}
	if queue != "" {
		spec["queue"] = queue
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": e.NS},
		"spec":     spec,
	}}
	_, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Create(e.Ctx, u, metav1.CreateOptions{})
	return err
}

// domainsOf maps each named pod's node to its "block/rack".
func (e *env) domainsOf(names ...string) map[string]bool {
	e.T.Helper()
	out := map[string]bool{}
	for _, n := range names {
		node, err := e.Client.CoreV1().Nodes().Get(e.Ctx, e.pod(n).Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			e.T.Fatal(err)
		}
		out[node.Labels[labelBlock]+"/"+node.Labels[labelRack]] = true
	}
	return out
}

// why is kubectl tessera why pod.
func (e *env) why(pod string) string {
	e.T.Helper()
	var out bytes.Buffer
	if err := ctl.Run(e.Ctx, ctl.Clients{Kube: e.Client, Dynamic: e.Dyn, Namespace: e.NS}, []string{"why", pod}, &out); err != nil {
		e.T.Fatalf("kubectl tessera why %s: %v", pod, err)
	}
	return out.String()
}

func podNames(prefix string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// TestTopologyGangs on 8 kwok nodes of 2 GPUs in 2 blocks × 2 racks: the
// CRDs refuse bad objects; a gang naming a missing Topology waits saying
// so; a required-rack gang lands in the one rack with room although
// bin-packing alone would fill the partly used nodes of other racks; a
// preferred-block gang that no block holds spills over two blocks.
func TestTopologyGangs(t *testing.T) {
	e := newEnv(t)
	racks := e.addRackNodes()
	e.startScheduler(core.Config{})

	for _, bad := range []struct {
		name, want string
		err        error
	}{
		{name: "twice", want: "each nodeLabel may be listed once", err: e.createTopology("twice", labelRack, labelRack)},
		{name: "no levels", want: "spec.levels", err: e.createTopology("empty")},
		{name: "no level in a constraint", want: "set required, preferred or both", err: e.createTopoGroup("nolevel", "", 1, map[string]any{"name": "dc"})},
	} {
		if bad.err == nil || !strings.Contains(bad.err.Error(), bad.want) {
			t.Errorf("%s: got %v, want an error with %q", bad.name, bad.err, bad.want)
		}
	}

	// One GPU used in every rack but b2/r2: a 4-pod gang that requires a
	// rack (4 GPUs) fits only there.
	var fillers []string
	for _, d := range []string{"b1/r1", "b1/r2", "b2/r1"} {
		n := "filler-" + strings.ReplaceAll(d, "/", "-")
		e.createPod(podSpec{name: n, claim: &gpuClaim{}, nodeSelector: map[string]string{"kubernetes.io/hostname": racks[d][0]}})
		fillers = append(fillers, n)
	}
	e.waitBound(fillers...)

	// A gang naming a Topology that does not exist waits with the reason.
	if err := e.createTopoGroup("rackgang", "", 4, map[string]any{"name": "dc2", "required": labelRack}); err != nil {
		t.Fatal(err)
	}
	gang := podNames("rackgang", 4)
	for _, n := range gang {
		e.createPod(podSpec{name: n, group: "rackgang", claim: &gpuClaim{}})
	}
	e.eventually("the gang waiting for its Topology", 30*time.Second, func() (bool, string) {
		got := pendingReason(e.pod(gang[0]))
		return contains(got, `topology "dc2" does not exist`), got
	})
	if got := e.why(gang[0]); !contains(got, "Topology dc2: required rack (example.com/rack).") || !contains(got, "Topology dc2 does not exist") {
		t.Errorf("kubectl tessera why %s:\n%s", gang[0], got)
	}
	if err := e.createTopology("dc2", labelBlock, labelRack); err != nil {
		t.Fatal(err)
	}
	e.waitBound(gang...)
	if got := e.domainsOf(gang...); len(got) != 1 || !got["b2/r2"] {
		t.Fatalf("required-rack gang placed in %v, want b2/r2 only", got)
	}
	// kubectl tessera why names the gang's domain.
	if got := e.why(gang[0]); !contains(got, "Placed in rack b2/r2 (4 pods).") {
		t.Errorf("kubectl tessera why %s:\n%s", gang[0], got)
	}

	// 9 GPUs left: 6 in b1, 3 in b2. A gang of 7 preferring a block
	// fits no block whole and spills over both.
	if err := e.createTopoGroup("blockgang", "", 7, map[string]any{"name": "dc", "preferred": labelBlock}); err != nil {
		t.Fatal(err)
	}
	spill := podNames("blockgang", 7)
	for _, n := range spill {
		e.createPod(podSpec{name: n, group: "blockgang", claim: &gpuClaim{}})
	}
	e.waitBound(spill...)
	blocks := map[string]bool{}
	for d := range e.domainsOf(spill...) {
		blocks[strings.Split(d, "/")[0]] = true
	}
	if len(blocks) != 2 {
		t.Fatalf("preferred-block gang in blocks %v; 7 GPUs fit no block, so it spills over both", blocks)
	}

	// A single pod's topology annotations: why names them and the pod's
	// domain, or that the Topology it names is missing.
	e.createPod(podSpec{name: "solo-missing", claim: &gpuClaim{}, annotations: map[string]string{
		kube.AnnotationTopology: "nope", kube.AnnotationTopologyPreferred: labelRack}})
	e.createPod(podSpec{name: "solo", claim: &gpuClaim{}, annotations: map[string]string{
		kube.AnnotationTopology: "dc", kube.AnnotationTopologyRequired: labelRack}})
	e.waitBound("solo")
	var soloRack string
	for d := range e.domainsOf("solo") {
		soloRack = d
	}
	if got := e.why("solo"); !contains(got, "Group: none, scheduled alone.\n  Topology dc: required rack (example.com/rack).\n  Placed in rack "+soloRack+" (1 pod).") {
		t.Errorf("kubectl tessera why solo:\n%s", got)
	}
	e.eventually("the pod waiting for its Topology", 30*time.Second, func() (bool, string) {
		got := pendingReason(e.pod("solo-missing"))
		return contains(got, `topology "nope" does not exist`), got
	})
	if got := e.why("solo-missing"); !contains(got, "  Topology nope: preferred rack (example.com/rack).\n  Topology nope does not exist: the pod waits until it does.") {
		t.Errorf("kubectl tessera why solo-missing:\n%s", got)
	}
	e.checkNoDoubleAllocation()
}

// TestTopologyReclaim: queue low fills the 16 GPUs (4 racks of 4) with
// preemptible pods, the newest of them one per rack, so they come first
// in victim order; queue high (quota 4) asks for a gang of 4 GPUs in one
// rack. Topology-blind reclaim would take the 4 newest, one in each rack,
// and spread the gang over all four; with the rack required it evicts the
// 4 pods of one rack, no other, and the gang runs there.
func TestTopologyReclaim(t *testing.T) {
	e := newEnv(t)
	racks := e.addRackNodes()
	e.createQueue("low", "", "0", "", 100)
	e.createQueue("high", "", "4", "", 100)
	e.startScheduler(core.Config{})
	where := map[string]string{}
	place := func(name, node string) {
		e.createPod(podSpec{name: name, queue: "low", priority: "tessera-train", claim: &gpuClaim{},
			nodeSelector: map[string]string{"kubernetes.io/hostname": node}})
		where[name] = node
	}
	var old, newest []string
	for d, nodes := range racks {
		r := strings.ReplaceAll(d, "/", "-")
		for i, node := range []string{nodes[0], nodes[0], nodes[1]} {
			place(fmt.Sprintf("old-%s-%d", r, i), node)
			old = append(old, fmt.Sprintf("old-%s-%d", r, i))
		}
	}
	e.waitBound(old...)
	// Victim order takes the newest job first; creation times have a
	// resolution of one second.
	time.Sleep(1100 * time.Millisecond)
	for d, nodes := range racks {
		n := "new-" + strings.ReplaceAll(d, "/", "-")
		place(n, nodes[1])
		newest = append(newest, n)
	}
	e.waitBound(newest...)
	if err := e.createTopoGroup("gang", "high", 4, map[string]any{"name": "dc", "required": labelRack}); err != nil {
		t.Fatal(err)
	}
	gang := podNames("gang", 4)
	for _, n := range gang {
		e.createPod(podSpec{name: n, group: "gang", queue: "high", claim: &gpuClaim{}})
	}
	e.waitBound(gang...)
	domains := e.domainsOf(gang...)
	if len(domains) != 1 {
		t.Fatalf("required-rack gang placed in racks %v, want one (topology-blind reclaim spreads it over the 4 newest pods' racks)", domains)
	}
	// Exactly the 4 pods of the gang's rack were evicted.
	var evicted []string
	for _, n := range append(old, newest...) {
		p, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, n, metav1.GetOptions{})
		if gone := err != nil || p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed; !gone {
			continue
		}
		evicted = append(evicted, n)
		node, err := e.Client.CoreV1().Nodes().Get(e.Ctx, where[n], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d := node.Labels[labelBlock] + "/" + node.Labels[labelRack]; !domains[d] {
			t.Errorf("%s evicted in %s, outside the gang's rack %v", n, d, domains)
		}
	}
	if len(evicted) != 4 {
		t.Errorf("evicted %v, want the 4 pods of one rack", evicted)
	}
	e.checkNoDoubleAllocation()
}

// TestCliqueTopology: gb200-nvl72 nodes in two NVLink cliques label
// themselves nvidia.com/gpu.clique; a gang that requires the clique level
// lands in the clique with room.
func TestCliqueTopology(t *testing.T) {
	e := newEnv(t)
	nodes := map[string]string{"tray-a0": "1", "tray-a1": "1", "tray-b0": "2", "tray-b1": "2"}
	for name, clique := range nodes {
		e.CP.AddKwokNodeWith(t, &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: v1.NodeStatus{Capacity: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
			}},
		})
		e.startTesseraNode(name, "gb200-nvl72", gpu.WithFakeClique(clique))
	}
	for name, clique := range nodes {
		want := gpu.FakeClusterUUID.String() + "." + clique
		e.eventually(name+" labelled with its clique", 30*time.Second, func() (bool, string) {
			n, err := e.Client.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return n.Labels[draname.LabelClique] == want, fmt.Sprint(n.Labels)
		})
	}
	if err := e.createTopology("nvl", draname.LabelClique, "kubernetes.io/hostname"); err != nil {
		t.Fatal(err)
	}
	e.startScheduler(core.Config{})
	// One GPU used on tray-a0: clique 1 has 7 free, clique 2 has 8.
	e.createPod(podSpec{name: "filler", claim: &gpuClaim{}, nodeSelector: map[string]string{"kubernetes.io/hostname": "tray-a0"}})
	e.waitBound("filler")
	if err := e.createTopoGroup("nvl", "", 4, map[string]any{"name": "nvl", "required": draname.LabelClique}); err != nil {
		t.Fatal(err)
	}
	gang := podNames("nvl", 4)
	for _, n := range gang {
		e.createPod(podSpec{name: n, group: "nvl", claim: &gpuClaim{count: 2}})
	}
	e.waitBound(gang...)
	for _, n := range gang {
		if node := e.pod(n).Spec.NodeName; !strings.HasPrefix(node, "tray-b") {
			t.Errorf("%s on %s, outside clique 2 (the only one with 8 GPUs free)", n, node)
		}
	}
}

const labelZone = "example.com/zone"

// TestTopologyZonesSubGroup on 8 kwok nodes of 2 GPUs in zones z1, z2,
// each one block b1 of racks r1, r2 of 2 nodes (zone > block > rack >
// hostname; the names repeat, the domain is the path). One GPU is used in
// z1/b1/r1, z2/b1/r1 and z2/b1/r2: z2 (6 free) is the fullest zone that
// holds 6 pods, but none of its racks holds 4. A gang of 6 required in one
// zone whose subgroup of 4 workers requires one rack lands in z1, the
// workers in z1/b1/r2; without the subgroup's constraint it would take z2.
func TestTopologyZonesSubGroup(t *testing.T) {
	e := newEnv(t)
	nodes := map[string]string{}
	for _, z := range []string{"z1", "z2"} {
		for _, r := range []string{"r1", "r2"} {
			for i := 0; i < 2; i++ {
				name := fmt.Sprintf("%s-b1-%s-%d", z, r, i)
				e.CP.AddKwokNodeWith(t, &v1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelZone: z, labelBlock: "b1", labelRack: r}},
					Status: v1.NodeStatus{Capacity: v1.ResourceList{
						v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
					}},
				})
				e.startTesseraNode(name, "l4-2")
				nodes[name] = z + "/b1/" + r
			}
		}
	}
	if err := e.createTopology("dc4", labelZone, labelBlock, labelRack, "kubernetes.io/hostname"); err != nil {
		t.Fatal(err)
	}
	e.startScheduler(core.Config{})
	var fillers []string
	for _, node := range []string{"z1-b1-r1-0", "z2-b1-r1-0", "z2-b1-r2-0"} {
		e.createPod(podSpec{name: "filler-" + node, claim: &gpuClaim{}, nodeSelector: map[string]string{"kubernetes.io/hostname": node}})
		fillers = append(fillers, "filler-"+node)
	}
	e.waitBound(fillers...)

	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "train", "namespace": e.NS},
		"spec": map[string]any{
			"minMember": int64(6),
			"topology":  map[string]any{"name": "dc4", "required": labelZone},
			"subGroups": []any{
				map[string]any{"name": "workers", "minMember": int64(4), "topology": map[string]any{"name": "dc4", "required": labelRack}},
				map[string]any{"name": "ps", "minMember": int64(2)},
			},
		},
	}}
	if _, err := e.Dyn.Resource(kube.PodGroupGVR).Namespace(e.NS).Create(e.Ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	workers, ps := podNames("worker", 4), podNames("ps", 2)
	for _, n := range workers {
		e.createPod(podSpec{name: n, group: "train", claim: &gpuClaim{}, annotations: map[string]string{kube.AnnotationPodSubGroup: "workers"}})
	}
	for _, n := range ps {
		e.createPod(podSpec{name: n, group: "train", claim: &gpuClaim{}, annotations: map[string]string{kube.AnnotationPodSubGroup: "ps"}})
	}
	e.waitBound(append(workers, ps...)...)
	where := func(names []string) map[string]bool {
		out := map[string]bool{}
		for _, n := range names {
			out[nodes[e.pod(n).Spec.NodeName]] = true
		}
		return out
	}
	if got := where(workers); len(got) != 1 || !got["z1/b1/r2"] {
		t.Errorf("workers (one rack required) in %v, want z1/b1/r2 only", got)
	}
	for d := range where(ps) {
		if !strings.HasPrefix(d, "z1/") {
			t.Errorf("ps pod in %s, outside the gang's zone z1", d)
		}
	}
	// kubectl tessera why names the gang's zone and the subgroup's rack.
	if got := e.why(workers[0]); !contains(got, "  Topology dc4: required zone (example.com/zone).\n  Placed in zone z1 (6 pods).\n") ||
		!contains(got, "  Subgroup workers: Topology dc4: required rack (example.com/rack).\n    Placed in rack z1/b1/r2 (4 pods).\n") {
		t.Errorf("kubectl tessera why %s:\n%s", workers[0], got)
	}
	e.checkNoDoubleAllocation()
}

// TestUpstreamTopology: an upstream scheduling.k8s.io PodGroup (gate
// TopologyAwareWorkloadScheduling) whose schedulingConstraints.topology
// names the rack label is a gang required in one rack of the Topology
// that lists the label: with one GPU used in every rack but b2/r2, its 4
// one-GPU pods land in b2/r2, where bin-packing alone would fill the
// partly used nodes of the other racks.
func TestUpstreamTopology(t *testing.T) {
	e := newEnvWith(t, controlplane.Options{
		Workloads:    controlplane.WorkloadAPI{Serve: true},
		FeatureGates: map[string]bool{"TopologyAwareWorkloadScheduling": true},
	})
	racks := e.addRackNodes()
	e.startScheduler(core.Config{})
	e.eventually("upstream PodGroups watched", 30*time.Second, func() (bool, string) {
		return e.sched.UpstreamGroupsServed(), "not served"
	})
	var fillers []string
	for _, d := range []string{"b1/r1", "b1/r2", "b2/r1"} {
		n := "filler-" + strings.ReplaceAll(d, "/", "-")
		e.createPod(podSpec{name: n, claim: &gpuClaim{}, nodeSelector: map[string]string{"kubernetes.io/hostname": racks[d][0]}})
		fillers = append(fillers, n)
	}
	e.waitBound(fillers...)
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: e.NS},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 4}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: labelRack}}},
		},
	}
	got, err := e.Client.SchedulingV1beta1().PodGroups(e.NS).Create(e.Ctx, pg, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.SchedulingConstraints == nil || len(got.Spec.SchedulingConstraints.Topology) != 1 {
		t.Fatalf("the API server dropped schedulingConstraints (gate off?): %+v", got.Spec)
	}
	gang := podNames("train", 4)
	for _, n := range gang {
		e.createPod(podSpec{name: n, upstreamGroup: "train", claim: &gpuClaim{}})
	}
	e.waitBound(gang...)
	if got := e.domainsOf(gang...); len(got) != 1 || !got["b2/r2"] {
		t.Fatalf("upstream rack gang placed in %v, want b2/r2 only", got)
	}
	// kubectl tessera why names the Topology the key was read against and
	// the gang's rack.
	if got := e.why(gang[0]); !contains(got, "  Topology dc: required rack (example.com/rack), from spec.schedulingConstraints.\n  Placed in rack b2/r2 (4 pods).\n") {
		t.Errorf("kubectl tessera why %s:\n%s", gang[0], got)
	}
	// A key no Topology lists is a level of its own.
	row := pg.DeepCopy()
	row.Name, row.Spec.SchedulingPolicy.Gang.MinCount = "row", 1
	row.Spec.SchedulingConstraints.Topology[0].Key = "example.com/row"
	if _, err := e.Client.SchedulingV1beta1().PodGroups(e.NS).Create(e.Ctx, row, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createPod(podSpec{name: "row-0", upstreamGroup: "row", claim: &gpuClaim{}})
	if got := e.why("row-0"); !contains(got, "  Topology: required row (example.com/row), from spec.schedulingConstraints; no Topology lists the key, so it is the only level.") {
		t.Errorf("kubectl tessera why row-0:\n%s", got)
	}
}
