package grouper_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// TestJobTopologyAnnotation: an Indexed Job of 3 one-GPU pods annotated
// tessera.dev/topology: dc, tessera.dev/topology-required: rack becomes a
// gang through the pod grouper, which carries the constraint to the
// PodGroup it makes. On 4 nodes of 2 GPUs in racks r1, r2, one GPU used on
// each node of r1: bin-packing alone would take r1's 2 free GPUs and one
// of r2; the gang lands in r2 only.
func TestJobTopologyAnnotation(t *testing.T) {
	const labelRack = "example.com/rack"
	e := newEnv(t)
	rackOf := map[string]string{}
	for _, r := range []string{"r1", "r2"} {
		for i := 0; i < 2; i++ {
			name := fmt.Sprintf("n-%s-%d", r, i)
			e.addGPUNode(name, "l4-2")
			patch := []byte(`{"metadata":{"labels":{"` + labelRack + `":"` + r + `"}}}`)
			if _, err := e.Client.CoreV1().Nodes().Patch(e.Ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			rackOf[name] = r
		}
	}
	topo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Topology", "metadata": map[string]any{"name": "dc"},
		"spec": map[string]any{"levels": []any{map[string]any{"nodeLabel": labelRack}, map[string]any{"nodeLabel": "kubernetes.io/hostname"}}},
	}}
	if _, err := e.Dyn.Resource(kube.TopologyGVR).Create(e.Ctx, topo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.gpuTemplate("one-gpu", 1)
	e.startController()
	for _, node := range []string{"n-r1-0", "n-r1-1"} {
		tmpl := podTemplate("one-gpu", nil)
		tmpl.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "filler-" + node, Namespace: e.NS}, Spec: tmpl.Spec}
		if _, err := e.Client.CoreV1().Pods(e.NS).Create(e.Ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.eventually(p.Name+" bound", 30*time.Second, func() (bool, string) {
			got, err := e.Client.CoreV1().Pods(e.NS).Get(e.Ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return got.Spec.NodeName != "", scheduledReason(got)
		})
	}

	e.indexedJob("train", 3, "one-gpu", map[string]string{
		kube.AnnotationTopology: "dc", kube.AnnotationTopologyRequired: labelRack,
	})
	e.eventually("the Job's 3 pods bound", 60*time.Second, func() (bool, string) {
		pods := e.jobPods("train")
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return len(pods) == 3 && bound == 3, summary(pods)
	})
	for _, p := range e.jobPods("train") {
		if r := rackOf[p.Spec.NodeName]; r != "r2" {
			t.Errorf("%s on %s in rack %s; the gang requires one rack and only r2 holds 3 GPUs", p.Name, p.Spec.NodeName, r)
		}
	}
}
