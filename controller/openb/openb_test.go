package openb

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/controller/packing"
)

const (
	nodeHdr = "sn,cpu_milli,memory_mib,gpu,model\n"
	podHdr  = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
	dataDir = "../testdata/openb"
)

func write(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadBadFiles(t *testing.T) {
	cases := []struct {
		name, body, want string
		pods             bool
	}{
		{"header", "sn,cpu,memory_mib,gpu,model\n", "nodes.csv:1: header \"sn,cpu,memory_mib,gpu,model\" lacks column(s) cpu_milli (want at least sn,cpu_milli,memory_mib,gpu,model)", false},
		{"dupColumn", "sn,cpu_milli,memory_mib,gpu,model,gpu\n", "nodes.csv:1:35: header column 6 repeats column 4 (\"gpu\")", false},
		{"podColumns", "name,cpu_milli,num_gpu\np0,1,1\n", "lacks column(s) memory_mib,gpu_milli", true},
		{"fields", nodeHdr + "n0,1000,10,2\n", "nodes.csv:2:1: wrong number of fields", false},
		{"int", nodeHdr + "n0,1000,10,2,T4\nn1,lots,10,2,T4\n", "nodes.csv:3:4: cpu_milli: \"lots\" is not an integer", false},
		{"negative", nodeHdr + "n0,1000,-1,2,T4\n", "nodes.csv:2:9: memory_mib: -1 is out of range", false},
		{"overflow", nodeHdr + "n0,99999999999999999999,1,2,T4\n", "nodes.csv:2:4: cpu_milli: 99999999999999999999 is out of range", false},
		{"dup", nodeHdr + "n0,1,1,1,T4\nn0,1,1,1,T4\n", "nodes.csv:3:1: node \"n0\" repeats the one on line 2", false},
		{"model", nodeHdr + "n0,1,1,1,\n", "nodes.csv:2:10: model: empty", false},
		{"empty", "", "nodes.csv: empty file", false},
		{"noRows", nodeHdr, "no nodes", false},
		{"milli", podHdr + "p0,1,1,1,1200,,LS,Running,0,0,0\n", "pods.csv:2:10: gpu_milli: 1200 is out of range", true},
		{"cpuOnlyMilli", podHdr + "p0,1,1,0,500,,LS,Running,0,0,0\n", "pods.csv:2:10: gpu_milli: 500 with num_gpu 0", true},
		{"multiFraction", podHdr + "p0,1,1,2,500,,LS,Running,0,0,0\n", "only a single-GPU pod may take a fraction", true},
		{"spec", podHdr + "p0,1,1,1,500,V100M16||T4,LS,Running,0,0,0\n", "pods.csv:2:14: gpu_spec", true},
		{"quote", podHdr + "p0,1,1,1,5\"00,,LS,Running,0,0,0\n", "pods.csv:2:", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.pods {
				_, err = LoadPods(write(t, "pods.csv", c.body))
			} else {
				_, err = LoadNodes(write(t, "nodes.csv", c.body))
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v; want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := LoadNodes(filepath.Join(t.TempDir(), "missing.csv")); err == nil {
		t.Fatal("missing file: no error")
	}
}

func TestLoadPodSpec(t *testing.T) {
	pods, err := LoadPods(write(t, "pods.csv", podHdr+
		"b,2000,100,1,250,V100M16|V100M32,LS,Running,0,0,0\n"+
		"a,1000,100,0,0,,BE,Failed,0,0,0\n"+
		"c,1000,100,4,1000,,LS,Running,0,0,0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pods[0].Models, ","); got != "V100M16,V100M32" {
		t.Fatalf("models %q", got)
	}
	r := pods[0].Request()
	if r.GPUMilli != 250 || r.GPUs != 0 || len(r.Models) != 2 {
		t.Fatalf("fraction request %+v", r)
	}
	if r := pods[2].Request(); r.GPUs != 4 || r.GPUMilli != 0 {
		t.Fatalf("4-GPU request %+v", r)
	}
	if s := SortByName(pods); s[0].Name != "a" || s[1].Name != "b" || s[2].Name != "c" || pods[0].Name != "b" {
		t.Fatal("SortByName must sort a copy by name")
	}
}

func TestDemandLimitExact(t *testing.T) {
	if got := demandLimit(1.3, 6212000); got != 8075600 {
		t.Fatalf("1.3 × 6212 GPUs = %d milli, want 8075600", got)
	}
	if got := demandLimit(1, 7); got != 7 {
		t.Fatalf("got %d", got)
	}
}

func mkPods(n int) []Pod {
	var pods []Pod
	for i := 0; i < n; i++ {
		p := Pod{Name: string(rune('a'+i%26)) + string(rune('a'+i/26)), CPUMilli: 1000, NumGPU: 1, GPUMilli: 100 * (1 + i%10)}
		if i%7 == 0 {
			p.NumGPU, p.GPUMilli = 0, 0
		}
		pods = append(pods, p)
	}
	return SortByName(pods)
}

func TestArrivalsProtocol(t *testing.T) {
	pods := mkPods(40)
	const capMilli, limit = 20000, 30000
	var trace int64
	for i := range pods {
		trace += pods[i].GPUMilliTotal()
	}
	a := Arrivals(pods, 1.5, capMilli, NewRand(7))
	b := Arrivals(pods, 1.5, capMilli, NewRand(7))
	c := Arrivals(pods, 1.5, capMilli, NewRand(8))
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different arrivals")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same arrivals")
	}
	// Every trace pod exactly once first, shuffled.
	seen := make([]bool, len(pods))
	sorted := true
	for i, pi := range a[:len(pods)] {
		if seen[pi] {
			t.Fatalf("pod %d twice in the trace part", pi)
		}
		seen[pi] = true
		sorted = sorted && pi == i
	}
	if sorted {
		t.Fatal("trace part not shuffled")
	}
	// Copies keep the total within the limit, and the next draw would not.
	total := trace
	for _, pi := range a[len(pods):] {
		total += pods[pi].GPUMilliTotal()
	}
	if total > limit {
		t.Fatalf("total %d over 1.5 × capacity (limit)", total)
	}
	rng := NewRand(7)
	perm := make([]int, len(pods))
	rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	for range a[len(pods):] {
		rng.IntN(len(pods))
	}
	if next := pods[rng.IntN(len(pods))].GPUMilliTotal(); total+next <= limit {
		t.Fatalf("stopped early: total %d, next copy %d", total, next)
	}
}

// Fractions add up exactly, CPU, memory and gpu_spec are respected, and a
// multi-GPU pod needs wholly free GPUs on one node.
func TestReplaySmallCluster(t *testing.T) {
	nodes := []Node{
		{Name: "n0", CPUMilli: 4000, MemoryMiB: 1000, GPUs: 2, Model: "T4"},
		{Name: "n1", CPUMilli: 4000, MemoryMiB: 1000, GPUs: 1, Model: "V100M16"},
	}
	pods := []Pod{
		{Name: "p1", CPUMilli: 1000, NumGPU: 1, GPUMilli: 330},
		{Name: "p2", CPUMilli: 1000, NumGPU: 1, GPUMilli: 330},
		{Name: "p3", CPUMilli: 1000, NumGPU: 1, GPUMilli: 340, Models: []string{"V100M16"}},
		{Name: "p4", CPUMilli: 1000, NumGPU: 2, GPUMilli: 1000},
		{Name: "p5", CPUMilli: 9000},
		{Name: "p6", MemoryMiB: 2000},
	}
	for _, pol := range []packing.Policy{packing.Tessera, packing.FGD, packing.BestFit, packing.FirstFit} {
		res, state, err := replay(nodes, pods, Config{Tune: 0.1, Seed: 1, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		if res.PodsArrived != 6 || res.PodsFailed < 2 {
			t.Fatalf("%v: %+v (p5 and p6 cannot fit)", pol, res)
		}
		var alloc int64
		for i, n := range state {
			if n.FreeCPUMilli < 0 || n.FreeMemory < 0 {
				t.Fatalf("%v: node %d overcommitted: %+v", pol, i, n)
			}
			for _, g := range n.GPUs {
				if g.FreeMilli < 0 {
					t.Fatalf("%v: GPU overcommitted", pol)
				}
				alloc += int64(packing.MilliPerGPU - g.FreeMilli)
			}
		}
		if alloc != res.AllocatedMilli || res.GPUAllocated != float64(alloc)/1000 || res.GPUCapacity != 3 {
			t.Fatalf("%v: allocated %d milli, result %+v", pol, alloc, res)
		}
		if state[1].GPUs[0].FreeMilli != 1000 && state[1].GPUs[0].FreeMilli != 660 && state[1].GPUs[0].FreeMilli != 330 && state[1].GPUs[0].FreeMilli != 0 {
			t.Fatalf("%v: odd V100 state %+v", pol, state[1])
		}
	}
	// Exact fractions: 0.33 + 0.33 + 0.34 of one GPU, nothing else.
	res, err := Replay(nodes[1:], pods[:3], Config{Tune: 0.5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.GPUAllocationRate != 1 || res.GPUAllocated != 1 || res.PodsPlaced != 3 {
		t.Fatalf("fractions: %+v", res)
	}
	if _, err := Replay(nodes, pods, Config{Tune: 0}); err == nil {
		t.Fatal("tune 0: no error")
	}
}

func loadTrace(tb testing.TB) ([]Node, []Pod) {
	nodes, err := LoadNodes(filepath.Join(dataDir, "openb_node_list_gpu_node.csv"))
	if err != nil {
		tb.Fatalf("the trace is in the repo (controller/testdata/openb): %v", err)
	}
	pods, err := LoadPods(filepath.Join(dataDir, "openb_pod_list_default.csv"))
	if err != nil {
		tb.Fatal(err)
	}
	return nodes, pods
}

// The default policy beats BestFit and plain FGD on the real trace (one
// seed, three replays: a few seconds).
func TestRealTraceDefaultBeatsBestFitAndFGD(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the full trace")
	}
	nodes, pods := loadTrace(t)
	if len(nodes) != 1213 || len(pods) != 8152 {
		t.Fatalf("trace: %d nodes, %d pods", len(nodes), len(pods))
	}
	bf, err := Replay(nodes, pods, Config{Tune: 1.3, Seed: 42, Policy: packing.BestFit})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Replay(nodes, pods, Config{Tune: 1.3, Seed: 42, Policy: packing.FGD})
	if err != nil {
		t.Fatal(err)
	}
	fgd, err := Replay(nodes, pods, Config{Tune: 1.3, Seed: 42, Policy: packing.Default})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed 42: bestfit %.2f %%, fgd %.2f %%, default %.2f %%", 100*bf.GPUAllocationRate,
		100*plain.GPUAllocationRate, 100*fgd.GPUAllocationRate)
	if bf.GPUCapacity != 6212 || bf.PodsArrived != fgd.PodsArrived || plain.PodsArrived != fgd.PodsArrived {
		t.Fatalf("bestfit %+v, fgd %+v, default %+v", bf, plain, fgd)
	}
	if fgd.GPUAllocationRate <= plain.GPUAllocationRate {
		t.Errorf("default %.4f does not beat plain FGD %.4f", fgd.GPUAllocationRate, plain.GPUAllocationRate)
	}
	if bf.GPUAllocationRate < 0.925 || bf.GPUAllocationRate > 0.94 {
		t.Errorf("bestfit %.4f strays from the paper's 93.08 %%", bf.GPUAllocationRate)
	}
	if plain.GPUAllocationRate < 0.949 || plain.GPUAllocationRate > 0.959 {
		t.Errorf("fgd %.4f strays from the paper's 95.39 %%", plain.GPUAllocationRate)
	}
	if fgd.GPUAllocationRate <= bf.GPUAllocationRate {
		t.Errorf("default %.4f does not beat bestfit %.4f", fgd.GPUAllocationRate, bf.GPUAllocationRate)
	}
}

// BenchmarkOpenB replays one seed of the default trace with the default
// policy (loading excluded).
func BenchmarkOpenB(b *testing.B) {
	nodes, pods := loadTrace(b)
	b.ReportAllocs()
	var rate float64
	for b.Loop() {
		res, err := Replay(nodes, pods, Config{Tune: 1.3, Seed: 42, Policy: packing.Default})
		if err != nil {
			b.Fatal(err)
		}
		rate = res.GPUAllocationRate
	}
	b.ReportMetric(100*rate, "alloc%")
}

// The trace's multigpu* pod lists have only the first five columns, and a
// file may order its columns as it likes: columns are found by name.
func TestLoadColumnsByName(t *testing.T) {
	five := write(t, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500\np1,2000,20,8,1000\n")
	pods, err := LoadPods(five)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pod{
		{Name: "p0", CPUMilli: 1000, MemoryMiB: 10, NumGPU: 1, GPUMilli: 500},
		{Name: "p1", CPUMilli: 2000, MemoryMiB: 20, NumGPU: 8, GPUMilli: 1000},
	}
	if !slices.EqualFunc(pods, want, podEqual) {
		t.Fatalf("five columns: got %+v, want %+v", pods, want)
	}
	moved := write(t, "pods.csv", "gpu_spec,gpu_milli,num_gpu,memory_mib,cpu_milli,name,extra\nT4|P100,500,1,10,1000,p0,x\n")
	pods, err = LoadPods(moved)
	if err != nil {
		t.Fatal(err)
	}
	want = []Pod{{Name: "p0", CPUMilli: 1000, MemoryMiB: 10, NumGPU: 1, GPUMilli: 500, Models: []string{"T4", "P100"}}}
	if !slices.EqualFunc(pods, want, podEqual) {
		t.Fatalf("reordered columns: got %+v, want %+v", pods, want)
	}
	// A byte-order mark before a quoted header (a spreadsheet's export) is
	// not part of the first column's name.
	bom := write(t, "pods.csv", "\ufeff\"name\",\"cpu_milli\",\"memory_mib\",\"num_gpu\",\"gpu_milli\"\r\n\"p0\",\"1000\",\"10\",\"1\",\"500\"\r\n")
	pods, err = LoadPods(bom)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Pod{{Name: "p0", CPUMilli: 1000, MemoryMiB: 10, NumGPU: 1, GPUMilli: 500}}; !slices.EqualFunc(pods, want, podEqual) {
		t.Fatalf("BOM and quoted header: got %+v, want %+v", pods, want)
	}
	// An error still points at the right column of a reordered file.
	bad := write(t, "pods.csv", "gpu_milli,name,cpu_milli,memory_mib,num_gpu\n1200,p0,1,1,1\n")
	if _, err := LoadPods(bad); err == nil || !strings.Contains(err.Error(), "pods.csv:2:1: gpu_milli: 1200 is out of range") {
		t.Fatalf("error %v; want it to point at line 2 column 1", err)
	}
	nodes := write(t, "nodes.csv", "model,gpu,memory_mib,cpu_milli,sn\nT4,2,100,8000,n0\n,0,100,8000,cpu-only\n")
	ns, err := LoadNodes(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 2 || ns[0] != (Node{Name: "n0", CPUMilli: 8000, MemoryMiB: 100, GPUs: 2, Model: "T4"}) || ns[1].GPUs != 0 {
		t.Fatalf("reordered nodes: got %+v", ns)
	}
}

func podEqual(a, b Pod) bool {
	return a.Name == b.Name && a.CPUMilli == b.CPUMilli && a.MemoryMiB == b.MemoryMiB &&
		a.NumGPU == b.NumGPU && a.GPUMilli == b.GPUMilli && slices.Equal(a.Models, b.Models)
}
