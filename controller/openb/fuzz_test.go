package openb

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// seedCSVs adds the testdata CSVs whose names start with prefix, and the
// bodies of TestLoadBadFiles, to a fuzz target's corpus.
func seedCSVs(f *testing.F, prefix string, extra ...string) {
	files, err := filepath.Glob(filepath.Join("testdata", prefix+"*.csv"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no testdata/%s*.csv seeds: %v", prefix, err)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, e := range extra {
		f.Add([]byte(e))
	}
}

// fuzzNodes and fuzzPods are the fixed other half of a replay: small, so
// that every accepted input replays in well under a millisecond.
var (
	fuzzNodes = []Node{{Name: "a", CPUMilli: 64000, MemoryMiB: 1 << 18, GPUs: 4, Model: "T4"}, {Name: "b", CPUMilli: 32000, MemoryMiB: 1 << 17, GPUs: 2, Model: "V100M32"}}
	fuzzPods  = []Pod{{Name: "p0", CPUMilli: 4000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500}, {Name: "p1", CPUMilli: 8000, MemoryMiB: 4096, NumGPU: 2, GPUMilli: 1000, Models: []string{"T4"}}, {Name: "p2", CPUMilli: 1000, MemoryMiB: 512}}
)

// FuzzReadNodes: a node list is either refused with an error that names the
// file, or read into nodes that keep every rule of the format, that write
// back to a CSV which reads the same, and that replay without breaking the
// replay's accounting.
func FuzzReadNodes(f *testing.F) {
	seedCSVs(f, "nodes", "", nodeHdr, nodeHdr+"n0,99999999999999999999,1,2,T4\n", "sn,cpu_milli,memory_mib,gpu,model,gpu\n")
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes, err := ReadNodes("nodes.csv", bytes.NewReader(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "nodes.csv:") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		checkNodes(t, nodes)
		var buf bytes.Buffer
		w := csv.NewWriter(&buf)
		w.Write(nodeColumns)
		for _, n := range nodes {
			w.Write([]string{n.Name, itoa(n.CPUMilli), itoa(n.MemoryMiB), strconv.Itoa(n.GPUs), n.Model})
		}
		w.Flush()
		again, err := ReadNodes("again.csv", &buf)
		if err != nil || !slices.Equal(again, nodes) {
			t.Fatalf("written back and read again: %+v, %v; want %+v", again, err, nodes)
		}
		if gpus := totalGPUs(nodes); gpus > 0 && gpus <= 64 && len(nodes) <= 64 {
			checkReplay(t, nodes, fuzzPods)
		}
	})
}

// FuzzReadPods is FuzzReadNodes for pod lists.
func FuzzReadPods(f *testing.F) {
	seedCSVs(f, "pods", "", podHdr, podHdr+"p0,1,1,1,1200,,LS,Running,0,0,0\n", podHdr+"p0,1,1,1,500,V100M16||T4,LS,Running,0,0,0\n",
		"gpu_spec,gpu_milli,num_gpu,memory_mib,cpu_milli,name,extra\nT4|P100,500,1,10,1000,p0,x\n")
	f.Fuzz(func(t *testing.T, data []byte) {
		pods, err := ReadPods("pods.csv", bytes.NewReader(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "pods.csv:") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		checkPods(t, pods)
		var buf bytes.Buffer
		w := csv.NewWriter(&buf)
		w.Write(append(podColumns, "gpu_spec"))
		for _, p := range pods {
			w.Write([]string{p.Name, itoa(p.CPUMilli), itoa(p.MemoryMiB), strconv.Itoa(p.NumGPU), strconv.Itoa(p.GPUMilli), strings.Join(p.Models, "|")})
		}
		w.Flush()
		again, err := ReadPods("again.csv", &buf)
		if err != nil || !slices.EqualFunc(again, pods, podEqual) {
			t.Fatalf("written back and read again: %+v, %v; want %+v", again, err, pods)
		}
		if len(pods) <= 64 {
			checkReplay(t, fuzzNodes, pods)
		}
	})
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func totalGPUs(nodes []Node) int {
	n := 0
	for _, nd := range nodes {
		n += nd.GPUs
	}
	return n
}

func checkNodes(t *testing.T, nodes []Node) {
	t.Helper()
	if len(nodes) == 0 {
		t.Fatal("accepted a node list without nodes")
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		switch {
		case n.Name == "" || strings.TrimSpace(n.Name) != n.Name || seen[n.Name]:
			t.Fatalf("node name %q is empty, padded or repeated", n.Name)
		case n.CPUMilli < 0 || n.CPUMilli > 1<<40 || n.MemoryMiB < 0 || n.MemoryMiB > 1<<40:
			t.Fatalf("node %s: cpu %d or memory %d out of range", n.Name, n.CPUMilli, n.MemoryMiB)
		case n.GPUs < 0 || n.GPUs > 1024 || (n.GPUs > 0 && n.Model == ""):
			t.Fatalf("node %s: %d GPUs of model %q", n.Name, n.GPUs, n.Model)
		}
		seen[n.Name] = true
	}
}

func checkPods(t *testing.T, pods []Pod) {
	t.Helper()
	if len(pods) == 0 {
		t.Fatal("accepted a pod list without pods")
	}
	seen := map[string]bool{}
	for _, p := range pods {
		switch {
		case p.Name == "" || strings.TrimSpace(p.Name) != p.Name || seen[p.Name]:
			t.Fatalf("pod name %q is empty, padded or repeated", p.Name)
		case p.CPUMilli < 0 || p.CPUMilli > 1<<40 || p.MemoryMiB < 0 || p.MemoryMiB > 1<<40:
			t.Fatalf("pod %s: cpu %d or memory %d out of range", p.Name, p.CPUMilli, p.MemoryMiB)
		case p.NumGPU < 0 || p.NumGPU > 1024:
			t.Fatalf("pod %s: %d GPUs", p.Name, p.NumGPU)
		case (p.NumGPU == 0) != (p.GPUMilli == 0), p.GPUMilli < 0, p.GPUMilli > packing.MilliPerGPU,
			p.NumGPU > 1 && p.GPUMilli != packing.MilliPerGPU:
			t.Fatalf("pod %s: %d GPUs of %d milli each", p.Name, p.NumGPU, p.GPUMilli)
		}
		for _, m := range p.Models {
			if m == "" || strings.TrimSpace(m) != m || strings.Contains(m, "|") {
				t.Fatalf("pod %s: model %q", p.Name, m)
			}
		}
		seen[p.Name] = true
	}
}

// checkReplay replays at a small tune (few copies) and checks the result's
// accounting: every arrival placed or failed, never more GPU allocated than
// the cluster has.
func checkReplay(t *testing.T, nodes []Node, pods []Pod) {
	t.Helper()
	res, err := Replay(nodes, pods, Config{Tune: 0.5, Seed: 1, Policy: packing.Default})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if res.PodsPlaced+res.PodsFailed != res.PodsArrived || res.PodsArrived < len(pods) {
		t.Fatalf("replay: %d placed + %d failed != %d arrived (%d pods)", res.PodsPlaced, res.PodsFailed, res.PodsArrived, len(pods))
	}
	if res.AllocatedMilli < 0 || res.AllocatedMilli > res.GPUCapacity*packing.MilliPerGPU || res.GPUAllocationRate > 1 {
		t.Fatalf("replay: %d milli-GPU allocated of %d GPUs", res.AllocatedMilli, res.GPUCapacity)
	}
}
