package kube

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/core"
)

// Fuzz targets for what the controller reads from outside: the fraction
// annotations, a pod's resources, Queue and PodGroup objects. Plain `go
// test` runs their seeds (this repo's examples and the values of issue 17);
// `go test -fuzz` explores. Each checks properties, not only "no panic".

// exampleDocs returns, as JSON, the documents of kind in the repo's
// example manifests.
func exampleDocs(t testing.TB, kind string) [][]byte {
	t.Helper()
	files, err := filepath.Glob("../../demo/*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example manifests found: %v", err)
	}
	var out [][]byte
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if doc["kind"] != kind {
				continue
			}
			raw, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, raw)
		}
		f.Close()
	}
	if len(out) == 0 {
		t.Fatalf("no %s in the example manifests", kind)
	}
	return out
}

// FuzzFractionRequest: accepted annotations give a request the core
// accepts (one share, nothing negative or wrapped); refused ones name an
// annotation that is there.
func FuzzFractionRequest(f *testing.F) {
	// present: bit 0 gpu-fraction, bit 1 gpu-memory, bit 2 gpu-sharing.
	for _, s := range []struct {
		present            uint8
		frac, mem, sharing string
	}{
		{1, "0.5", "", ""}, {5, "0.5", "", "mps"}, {2, "", "20Gi", ""}, {6, "", "10Gi", "timeslice"},
		{1, "0.3333", "", ""}, {1, "half", "", ""}, {1, "0.0001", "", ""}, {1, "0.9999", "", ""}, {1, "NaN", "", ""},
		{2, "", "9223372036854775808", ""}, {2, "", "1e19", ""}, {2, "", "10E", ""}, {2, "", "1e100", ""},
		{2, "", "64Ti", ""}, {2, "", "1e9999999", ""}, {2, "", "1e-9999999", ""}, {2, "", "1m", ""}, {2, "", "0", ""}, {2, "", "-1Gi", ""}, {3, "0.5", "1Gi", ""}, {4, "", "", "mps"}, {5, "0.25", "", "mig"},
	} {
		f.Add(s.present, s.frac, s.mem, s.sharing)
	}
	for _, raw := range exampleDocs(f, "Pod") {
		var p v1.Pod
		if json.Unmarshal(raw, &p) == nil {
			a := p.Annotations
			present := uint8(0)
			for i, k := range []string{AnnotationGPUFraction, AnnotationGPUMemory, AnnotationGPUSharing} {
				if _, ok := a[k]; ok {
					present |= 1 << i
				}
			}
			f.Add(present, a[AnnotationGPUFraction], a[AnnotationGPUMemory], a[AnnotationGPUSharing])
		}
	}
	f.Fuzz(func(t *testing.T, present uint8, frac, mem, sharing string) {
		ann := map[string]string{"other": "x"}
		keys := []string{AnnotationGPUFraction, AnnotationGPUMemory, AnnotationGPUSharing}
		for i, v := range []string{frac, mem, sharing} {
			if present&(1<<i) != 0 {
				ann[keys[i]] = v
			}
		}
		req, has, err := FractionRequest(ann)
		if want := present&7 != 0; has != want {
			t.Fatalf("has = %v for annotations %v", has, ann)
		}
		if err != nil {
			named := false
			for _, k := range keys {
				_, ok := ann[k]
				named = named || ok && strings.Contains(err.Error(), k)
			}
			if !named || !strings.Contains(err.Error(), "annotation") {
				t.Fatalf("error %q names no annotation of %v", err, ann)
			}
			return
		}
		if !has {
			return
		}
		if req.GPUMilli != 0 == (req.GPUMemory != 0) {
			t.Fatalf("%v: want exactly one of GPUMilli and GPUMemory, got %+v", ann, req)
		}
		if req.GPUMilli < 0 || req.GPUMilli > 999 || req.GPUMemory < 0 || req.GPUMemory > core.MaxAmount {
			t.Fatalf("%v: out of range: %+v", ann, req)
		}
		if err := core.ValidateRequest(req); err != nil {
			t.Fatalf("%v: accepted here, refused by the core: %v", ann, err)
		}
		if q, perr := resource.ParseQuantity(mem); present&2 != 0 && perr == nil {
			// Exact: the share is the annotation, rounded up to a byte.
			if back := resource.NewQuantity(req.GPUMemory, resource.BinarySI); back.Cmp(q) < 0 {
				t.Fatalf("%v: GPUMemory %d is less than %s", ann, req.GPUMemory, mem)
			}
		}
	})
}

// FuzzPodResources builds pods from fuzzed quantity strings (a container's
// CPU, memory and an extended resource, an init container's CPU, the pod's
// overhead) and reads them as the controller does: accepted amounts are in
// range, exact (rounded up) and accepted by the core; refused ones name the
// resource, and are still counted in range (a bound pod holds its node).
func FuzzPodResources(f *testing.F) {
	for _, s := range [][5]string{
		{"1", "1Gi", "", "", ""}, {"500m", "512Mi", "2", "4", "100m"}, {"64", "512Gi", "8", "", ""},
		{"9223372036854776", "", "", "", ""}, {"", "9223372036854775808", "", "", ""}, {"", "1e19", "", "", ""},
		{"", "", "10E", "", ""}, {"1e100", "1e100", "1e100", "1e100", "1e100"}, {"0.0001", "1m", "1", "", ""},
		{"70368744177664m", "64Ti", "70368744177664", "", ""}, {"70368744177665m", "", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, cpu, mem, widget, initCPU, overhead string) {
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main"}}}}
		reqs := v1.ResourceList{}
		for name, s := range map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem, "example.com/widget": widget} {
			if q, err := resource.ParseQuantity(s); err == nil && q.Sign() >= 0 {
				reqs[name] = q
			}
		}
		pod.Spec.Containers[0].Resources.Requests = reqs
		if q, err := resource.ParseQuantity(initCPU); err == nil && q.Sign() >= 0 {
			pod.Spec.InitContainers = []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: q}}}}
		}
		if q, err := resource.ParseQuantity(overhead); err == nil && q.Sign() >= 0 {
			pod.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: q}
		}
		gotCPU, gotMem, other, err := podResources(pod)
		for name, v := range map[string]int64{"cpu": gotCPU, "memory": gotMem, "example.com/widget": other["example.com/widget"]} {
			if v < 0 || v > core.MaxAmount {
				t.Fatalf("%s read as %d, outside 0..MaxAmount (err %v)", name, v, err)
			}
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "asks for cpu ") && !strings.HasPrefix(msg, "asks for memory ") && !strings.HasPrefix(msg, "asks for example.com/widget ") {
				t.Fatalf("error %q names no resource of the pod", msg)
			}
			return
		}
		if verr := core.ValidateRequest(core.Request{CPU: gotCPU, Memory: gotMem, Other: other}); verr != nil {
			t.Fatalf("accepted here, refused by the core: %v", verr)
		}
		// Exact: what kube-scheduler counts, rounded up to a milli-CPU.
		want := pod.Spec.Containers[0].Resources.Requests.Cpu().DeepCopy()
		if len(pod.Spec.InitContainers) > 0 {
			if i := pod.Spec.InitContainers[0].Resources.Requests.Cpu(); i.Cmp(want) > 0 {
				want = i.DeepCopy()
			}
		}
		if o, ok := pod.Spec.Overhead[v1.ResourceCPU]; ok {
			want.Add(o)
		}
		got := resource.NewMilliQuantity(gotCPU, resource.DecimalSI)
		if got.Cmp(want) < 0 || gotCPU > 0 && resource.NewMilliQuantity(gotCPU-1, resource.DecimalSI).Cmp(want) >= 0 {
			t.Fatalf("cpu read as %dm, want %s rounded up", gotCPU, want.String())
		}
	})
}

// FuzzQueueFromObject decodes a Queue as the informer hands it over
// (unstructured JSON) and converts it: an accepted queue passes the core's
// checks (quota and limit -1 or in range, weight in range); a refused one
// names the queue and the field.
func FuzzQueueFromObject(f *testing.F) {
	for _, raw := range exampleDocs(f, "Queue") {
		f.Add(raw)
	}
	for _, s := range []string{
		`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"Queue","metadata":{"name":"q"},"spec":{"resources":{"gpu":{"quota":"1e100"}}}}`,
		`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"Queue","metadata":{"name":"q"},"spec":{"parent":"org","priority":120,"resources":{"gpu":{"quota":"2.5","limit":"-1","overQuotaWeight":3},"cpu":{"quota":"9223372036854776"},"memory":{"limit":"10E"}}}}`,
		`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"Queue","metadata":{"name":"q"},"spec":{"resources":{"memory":{"quota":"-2","overQuotaWeight":-1}}}}`,
		`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"Queue","metadata":{"name":"q"},"spec":{"reclaimMinRuntime":"30m","preemptionDelay":"5m","schedule":[{"days":["Mon-Fri"],"start":"09:00","end":"17:00","timeZone":"America/New_York","resources":{"gpu":{"quota":"4","limit":"2"}}},{"start":"22:00","end":"06:00","resources":{"cpu":{"quota":"1e100"}}}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var obj map[string]any
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		q, err := fromUnstructured[schedv1.Queue](&unstructured.Unstructured{Object: obj})
		if err != nil {
			return // listQueues leaves it out with the reason
		}
		got, err := queueFromObject(q, time.Date(2026, 3, 9, 14, 0, 0, 0, time.UTC))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "queue "+q.Name+": spec.resources.") && !strings.HasPrefix(err.Error(), "queue "+q.Name+": spec.schedule[") {
				t.Fatalf("error %q does not name the queue and the field", err)
			}
			return
		}
		if verr := core.ValidateQueue(got); verr != nil {
			t.Fatalf("accepted here, refused by the core: %v", verr)
		}
		if got.Name != q.Name || got.Parent != q.Spec.Parent {
			t.Fatalf("name or parent changed: %+v from %+v", got, q.Spec)
		}
	})
}

// FuzzPodGroupSpec decodes a PodGroup as the informer hands it over and
// reads its spec: an accepted group asks for at least one pod; a refused
// one names the group and the field.
func FuzzPodGroupSpec(f *testing.F) {
	for _, raw := range exampleDocs(f, "PodGroup") {
		f.Add(raw)
	}
	f.Add([]byte(`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":0}}`))
	f.Add([]byte(`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":2,"topology":{"name":"dc","required":"example.com/block","preferred":"example.com/rack"},"subGroups":[{"name":"w","minMember":1,"topology":{"name":"dc","required":"example.com/rack"}}]}}`))
	f.Add([]byte(`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":-2147483648,"queue":"q"}}`))
	f.Add([]byte(`{"apiVersion":"scheduling.tessera.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"g","namespace":"ns"},"spec":{"minMember":1,"subGroups":[{"name":"leader","minMember":1},{"name":"workers","minMember":-3}]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var obj map[string]any
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		pg, err := fromUnstructured[schedv1.PodGroup](&unstructured.Unstructured{Object: obj})
		if err != nil {
			return // getPodGroup's error: the pods wait with it
		}
		got, err := podGroupSpec(pg)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "PodGroup "+pg.Namespace+"/"+pg.Name+": spec.minMember ") {
				t.Fatalf("error %q does not name the group and the field", err)
			}
			return
		}
		if got.minMember < 1 || got.minMember != int(pg.Spec.MinMember) || got.queue != pg.Spec.Queue || len(got.subGroups) != len(pg.Spec.SubGroups) ||
			!reflect.DeepEqual(got.topology, constraintOf(pg.Spec.Topology)) {
			t.Fatalf("read %+v from %+v", got, pg.Spec)
		}
		// Subgroups are copied as they are: the core checks them, and its
		// reason names the group.
		for i, g := range pg.Spec.SubGroups {
			if got.subGroups[i].Name != g.Name || got.subGroups[i].MinMember != int(g.MinMember) || !reflect.DeepEqual(got.subGroups[i].Topology, constraintOf(g.Topology)) {
				t.Fatalf("subgroup %d read as %+v from %+v", i, got.subGroups[i], g)
			}
		}
	})
}
