package grouper_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/kube"
)

const labelRack = "example.com/rack"

// addRacks adds 4 nodes of 2 GPUs in racks r1, r2, the Topology dc (rack,
// hostname) and the claim template one-gpu, starts the controller and uses
// one GPU on each node of r1 (r1 2 free, one a node; r2 4 free). It
// returns each node's rack.
func (e *env) addRacks() map[string]string {
	e.T.Helper()
	rackOf := map[string]string{}
	for _, r := range []string{"r1", "r2"} {
		for i := 0; i < 2; i++ {
			name := fmt.Sprintf("n-%s-%d", r, i)
			e.addGPUNode(name, "l4-2")
			patch := []byte(`{"metadata":{"labels":{"` + labelRack + `":"` + r + `"}}}`)
			if _, err := e.Client.CoreV1().Nodes().Patch(e.Ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				e.T.Fatal(err)
			}
			rackOf[name] = r
		}
	}
	topo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Topology", "metadata": map[string]any{"name": "dc"},
		"spec": map[string]any{"levels": []any{map[string]any{"nodeLabel": labelRack}, map[string]any{"nodeLabel": "kubernetes.io/hostname"}}},
	}}
	if _, err := e.Dyn.Resource(kube.TopologyGVR).Create(e.Ctx, topo, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	e.gpuTemplate("one-gpu", 1)
	e.startController()
	for _, node := range []string{"n-r1-0", "n-r1-1"} {
		tmpl := podTemplate("one-gpu", nil)
		tmpl.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "filler-" + node, Namespace: e.NS}, Spec: tmpl.Spec}
		if _, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, p, metav1.CreateOptions{}); err != nil {
			e.T.Fatal(err)
		}
		e.eventually(p.Name+" bound", 30*time.Second, func() (bool, string) {
			got, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return got.Spec.NodeName != "", scheduledReason(got)
		})
	}
	return rackOf
}

// waitJobBound waits until the Job's n pods are bound and returns the
// racks they are in, with how many pods each.
func (e *env) waitJobBound(job string, n int, rackOf map[string]string) map[string]int {
	e.T.Helper()
	e.eventually(fmt.Sprintf("the Job's %d pods bound", n), 60*time.Second, func() (bool, string) {
		pods := e.jobPods(job)
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return len(pods) == n && bound == n, summary(pods)
	})
	racks := map[string]int{}
	for _, p := range e.jobPods(job) {
		racks[rackOf[p.Spec.NodeName]]++
	}
	return racks
}

// TestJobTopologyAnnotation: an Indexed Job of 3 one-GPU pods annotated
// tessera.dev/topology: dc, tessera.dev/topology-required: rack becomes a
// gang through the pod grouper, which carries the constraint to the
// PodGroup it makes. With r1's 2 free GPUs on partly used nodes,
// bin-packing alone would take them and one of r2; the gang lands in r2
// only.
func TestJobTopologyAnnotation(t *testing.T) {
	e := newEnv(t)
	rackOf := e.addRacks()
	e.indexedJob("train", 3, "one-gpu", map[string]string{
		kube.AnnotationTopology: "dc", kube.AnnotationTopologyRequired: labelRack,
	})
	if racks := e.waitJobBound("train", 3, rackOf); len(racks) != 1 || racks["r2"] != 3 {
		t.Errorf("pods by rack %v; the gang requires one rack and only r2 holds 3 GPUs", racks)
	}
}

// TestJobTopologyPreferred: a preferred level (not required) on a
// grouper gang packs it into one domain when one has room and spreads it
// when none has. Job pack (3 pods preferring a rack) lands in r2 alone,
// where bin-packing alone would fill r1's partly used nodes first; then
// r1 has 2 GPUs free and r2 1, and Job spread (3 pods preferring a rack)
// still starts, over both racks, where a required rack would wait.
// kubectl tessera why names the preference and both racks.
func TestJobTopologyPreferred(t *testing.T) {
	e := newEnv(t)
	rackOf := e.addRacks()
	preferRack := map[string]string{kube.AnnotationTopology: "dc", kube.AnnotationTopologyPreferred: labelRack}
	e.indexedJob("pack", 3, "one-gpu", preferRack)
	if racks := e.waitJobBound("pack", 3, rackOf); len(racks) != 1 || racks["r2"] != 3 {
		t.Fatalf("pack's pods by rack %v; preferring a rack, all 3 fit in r2 and belong there", racks)
	}
	e.indexedJob("spread", 3, "one-gpu", preferRack)
	if racks := e.waitJobBound("spread", 3, rackOf); racks["r1"] != 2 || racks["r2"] != 1 {
		t.Fatalf("spread's pods by rack %v, want r1 2 and r2 1: no rack holds 3, a preference does not hold the gang back", racks)
	}
	var out bytes.Buffer
	if err := ctl.Run(e.Ctx, ctl.Clients{Kube: e.Client, Dynamic: e.Dyn, Namespace: e.NS}, []string{"why", e.jobPods("spread")[0].Name}, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "  Topology dc: preferred rack (example.com/rack).\n  Placed in rack r1 (2 pods), rack r2 (1 pod).\n") {
		t.Errorf("kubectl tessera why:\n%s", got)
	}
}
