package core

import (
	"fmt"
	"testing"
	"time"
)

// benchAllocateSnapshot: nodes×gpus empty GPUs and pods pending one-GPU
// pods, each its own job, spread over 10 queues.
func benchAllocateSnapshot(nodeCount, gpus, pods int) *Snapshot {
	s := &Snapshot{Nodes: nodes("n", nodeCount, gpus)}
	for q := 0; q < 10; q++ {
		s.Queues = append(s.Queues, queue(fmt.Sprintf("q%d", q), "", 0, -1, 1))
	}
	for i := 0; i < pods; i++ {
		s.Jobs = append(s.Jobs, Job{Name: fmt.Sprintf("j%05d", i), Queue: fmt.Sprintf("q%d", i%10), Priority: 50, Preemptible: true,
			CreatedAt: time.Unix(int64(i), 0), Pods: []Pod{{Name: fmt.Sprintf("p%05d", i), Request: Request{GPUs: 1}}}})
	}
	return s
}

// fullCluster: every GPU of nodeCount×gpus runs a one-GPU preemptible pod
// of queue a, each its own job.
func fullCluster(nodeCount, gpus int) *Snapshot {
	s := &Snapshot{Nodes: nodes("n", nodeCount, gpus), Queues: []Queue{queue("a", "", 0, -1, 1)}}
	k := 0
	for _, n := range s.Nodes {
		for g := range n.GPUs {
			s.Jobs = append(s.Jobs, Job{Name: fmt.Sprintf("a%05d", k), Queue: "a", Priority: 50, Preemptible: true, CreatedAt: time.Unix(int64(k), 0),
				Pods: []Pod{{Name: fmt.Sprintf("a%05d", k), Request: Request{GPUs: 1}, Phase: PodRunning, Placement: Placement{Node: n.Name, GPUs: []int{g}}}}})
			k++
		}
	}
	return s
}

// benchGangSnapshot: a full cluster and one pending gang of 64 × 8 GPUs in
// queue b (fair share 512 GPUs).
func benchGangSnapshot(nodeCount int) *Snapshot {
	s := fullCluster(nodeCount, 8)
	s.Queues = append(s.Queues, queue("b", "", 0, -1, 1))
	g := Job{Name: "gang", Queue: "b", Priority: 50, Preemptible: true, MinMember: 64, CreatedAt: time.Unix(1e6, 0)}
	for i := 0; i < 64; i++ {
		g.Pods = append(g.Pods, Pod{Name: fmt.Sprintf("gang-%02d", i), Request: Request{GPUs: 8, NVLink: NVLinkRequired}})
	}
	s.Jobs = append(s.Jobs, g)
	return s
}

// benchReclaimSnapshot: a full cluster of queue a; queue b, with a quota of
// the whole cluster, has one pending one-GPU pod per GPU.
func benchReclaimSnapshot(nodeCount, gpus int) *Snapshot {
	s := fullCluster(nodeCount, gpus)
	total := nodeCount * gpus
	s.Queues = append(s.Queues, queue("b", "", int64(total), -1, 1))
	for i := 0; i < total; i++ {
		s.Jobs = append(s.Jobs, Job{Name: fmt.Sprintf("b%05d", i), Queue: "b", Priority: 50, Preemptible: true, CreatedAt: time.Unix(int64(1e6+i), 0),
			Pods: []Pod{{Name: fmt.Sprintf("b%05d", i), Request: Request{GPUs: 1}}}})
	}
	return s
}

// benchSearchSnapshot is the gang search's worst case: 1,000 nodes × 8
// GPUs with 48 CPUs, each running a pod of 4 GPUs and 24 CPUs except two
// that run 8 CPUs, and 100 pending gangs of three 1-GPU 30-CPU pods. Each
// pod fits (on those two nodes) and the free totals hold every gang, but no
// gang fits: every search runs until the cycle's budget is spent.
func benchSearchSnapshot() *Snapshot {
	s := &Snapshot{Nodes: nodes("n", 1000, 8), Queues: []Queue{queue("a", "", 0, -1, 1)}}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		n.CPU = 48000
		cpu := int64(24000)
		if i == 300 || i == 700 {
			cpu = 8000
		}
		s.Jobs = append(s.Jobs, Job{Name: fmt.Sprintf("r%04d", i), Queue: "a", CreatedAt: time.Unix(int64(i), 0),
			Pods: []Pod{{Name: fmt.Sprintf("r%04d", i), Request: Request{GPUs: 4, CPU: cpu}, Phase: PodRunning, Placement: Placement{Node: n.Name, GPUs: []int{0, 1, 2, 3}}}}})
	}
	for i := 0; i < 100; i++ {
		g := Job{Name: fmt.Sprintf("g%03d", i), Queue: "a", Priority: 50, Preemptible: true, CreatedAt: time.Unix(int64(1e6+i), 0)}
		for k := 0; k < 3; k++ {
			g.Pods = append(g.Pods, Pod{Name: fmt.Sprintf("g%03d-%d", i, k), Request: Request{GPUs: 1, CPU: 30000}})
		}
		s.Jobs = append(s.Jobs, g)
	}
	return s
}

func TestBenchSnapshotsDoWhatTheySay(t *testing.T) {
	if testing.Short() {
		t.Skip("large")
	}
	r := mustSchedule(t, benchAllocateSnapshot(1000, 8, 10000), Config{})
	if len(r.Binds) != 8000 {
		t.Fatalf("allocate: %d binds, want 8000", len(r.Binds))
	}
	r = mustSchedule(t, withPodSlots(benchAllocateSnapshot(1000, 8, 10000)), Config{})
	if len(r.Binds) != 8000 {
		t.Fatalf("allocate with pod slots: %d binds, want 8000", len(r.Binds))
	}
	r = mustSchedule(t, benchGangSnapshot(1000), Config{})
	if countBinds(r, "gang") != 64 || len(r.Evictions) != 512 {
		t.Fatalf("gang: %d binds, %d evictions; want 64 and 512", countBinds(r, "gang"), len(r.Evictions))
	}
	r = mustSchedule(t, benchSearchSnapshot(), Config{})
	if len(r.Binds) != 0 || len(r.Evictions) != 0 {
		t.Fatalf("search: %d binds, %d evictions; want none", len(r.Binds), len(r.Evictions))
	}
	r = mustSchedule(t, benchReclaimSnapshot(500, 8), Config{})
	if len(r.Evictions) != 4000 || len(r.Binds) != 4000 {
		t.Fatalf("reclaim: %d binds, %d evictions; want 4000 each", len(r.Binds), len(r.Evictions))
	}
}

func benchSchedule(b *testing.B, s *Snapshot) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Schedule(s, Config{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCycle1000x8Allocate10000: a full cycle, 1,000 nodes × 8 GPUs,
// 10,000 pending one-GPU pods (target ≤ 200 ms).
func BenchmarkCycle1000x8Allocate10000(b *testing.B) {
	benchSchedule(b, benchAllocateSnapshot(1000, 8, 10000))
}

// BenchmarkCycle1000x8Allocate10000PodSlots: the same with pod slots, as
// the Kubernetes adapter builds every snapshot (nodes hold "pods": 110,
// each pod asks one): the price of checking other resources, against the
// benchmark above in the same run.
func BenchmarkCycle1000x8Allocate10000PodSlots(b *testing.B) {
	benchSchedule(b, withPodSlots(benchAllocateSnapshot(1000, 8, 10000)))
}

// withPodSlots gives every node 110 pod slots and every pod one.
func withPodSlots(s *Snapshot) *Snapshot {
	for i := range s.Nodes {
		s.Nodes[i].Other = map[string]int64{"pods": 110}
	}
	for i := range s.Jobs {
		for k := range s.Jobs[i].Pods {
			s.Jobs[i].Pods[k].Request.Other = map[string]int64{"pods": 1}
		}
	}
	return s
}

// BenchmarkReclaimGang512At1000Full: one pending 512-GPU gang at 1,000 full
// nodes (target ≤ 1 s).
func BenchmarkReclaimGang512At1000Full(b *testing.B) {
	benchSchedule(b, benchGangSnapshot(1000))
}

// BenchmarkReclaim4000At500: a cycle that reclaims 4,000 one-GPU pods at 500
// nodes (target ≤ 2 s).
func BenchmarkReclaim4000At500(b *testing.B) {
	benchSchedule(b, benchReclaimSnapshot(500, 8))
}

// BenchmarkGangSearchWorstCase: a cycle of benchSearchSnapshot, with the
// gang search and without it (the greedy pass alone), in the same run: the
// price of the search when it can only fail, bounded by the cycle's budget.
func BenchmarkGangSearchWorstCase(b *testing.B) {
	s := benchSearchSnapshot()
	b.Run("search", func(b *testing.B) { benchSchedule(b, s) })
	b.Run("greedy-only", func(b *testing.B) {
		defer func(v int) { sessionSearchBudget = v }(sessionSearchBudget)
		sessionSearchBudget = 0
		benchSchedule(b, s)
	})
}

// topoLevels are the benchmarks' topology: 4 zones × 4 blocks × 4 racks of
// 16 nodes (128 GPUs a rack of 8-GPU nodes, 512 a block).
var topoLevels = []string{"zone", "block", "rack", "kubernetes.io/hostname"}

// labelTopo labels 1,024 nodes into zones, blocks and racks and adds the
// topology "dc".
func labelTopo(s *Snapshot) *Snapshot {
	for i := range s.Nodes {
		n := &s.Nodes[i]
		r := i / 16
		n.Labels = map[string]string{"zone": fmt.Sprintf("z%d", r/16), "block": fmt.Sprintf("b%d", r/4%4), "rack": fmt.Sprintf("r%d", r%4), "kubernetes.io/hostname": n.Name}
	}
	s.Topologies = []Topology{{Name: "dc", Levels: topoLevels}}
	return s
}

// topoGang is a gang of pods × gpus in queue q, requiring level when
// withTopo.
func topoGang(name, q string, pods, gpus int, level string, withTopo bool, created int64) Job {
	g := Job{Name: name, Queue: q, Priority: 50, Preemptible: true, CreatedAt: time.Unix(created, 0)}
	if withTopo {
		g.Topology = &TopologyConstraint{Topology: "dc", Required: level}
	}
	for i := 0; i < pods; i++ {
		g.Pods = append(g.Pods, Pod{Name: fmt.Sprintf("%s-%02d", name, i), Request: Request{GPUs: gpus}})
	}
	return g
}

// benchTopoSnapshot: 1,024 nodes × 8 GPUs in zones, blocks and racks,
// 10,000 pending one-GPU pods (10 queues), and in queue g (quota 2,304
// GPUs: the gangs go first) 20 gangs of 8 × 8 GPUs and 4 of 32 × 8,
// requiring a rack and a block when withTopo.
func benchTopoSnapshot(withTopo bool) *Snapshot {
	s := labelTopo(benchAllocateSnapshot(1024, 8, 10000))
	s.Queues = append(s.Queues, queue("g", "", 2304, -1, 1))
	for i := 0; i < 20; i++ {
		s.Jobs = append(s.Jobs, topoGang(fmt.Sprintf("rack%02d", i), "g", 8, 8, "rack", withTopo, int64(i)))
	}
	for i := 0; i < 4; i++ {
		s.Jobs = append(s.Jobs, topoGang(fmt.Sprintf("block%d", i), "g", 32, 8, "block", withTopo, int64(20+i)))
	}
	return s
}

// benchTopoReclaimSnapshot: 1,024 full nodes × 8 GPUs of one-GPU pods of
// queue a, and in queue b (quota 256 GPUs) one pending gang of 32 × 8
// GPUs, requiring a block when withTopo: reclaim frees half a block.
func benchTopoReclaimSnapshot(withTopo bool) *Snapshot {
	s := labelTopo(fullCluster(1024, 8))
	s.Queues = append(s.Queues, queue("b", "", 256, -1, 1))
	s.Jobs = append(s.Jobs, topoGang("gang", "b", 32, 8, "block", withTopo, 1e6))
	return s
}

// domainsOf says in how many domains of level each job's binds lie.
func domainsOf(s *Snapshot, r *Result, level string) map[string]int {
	labels := map[string]map[string]string{}
	for _, n := range s.Nodes {
		labels[n.Name] = n.Labels
	}
	seen := map[string]map[string]bool{}
	for _, b := range r.Binds {
		l := labels[b.Placement.Node]
		key := l["zone"] + "/" + l["block"]
		if level == "rack" {
			key += "/" + l["rack"]
		}
		if seen[b.Job] == nil {
			seen[b.Job] = map[string]bool{}
		}
		seen[b.Job][key] = true
	}
	out := map[string]int{}
	for j, m := range seen {
		out[j] = len(m)
	}
	return out
}

func TestTopologyBenchSnapshotsDoWhatTheySay(t *testing.T) {
	if testing.Short() {
		t.Skip("large")
	}
	s := benchTopoSnapshot(true)
	r := mustSchedule(t, s, Config{})
	racks, blocks := domainsOf(s, r, "rack"), domainsOf(s, r, "block")
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("rack%02d", i)
		if countBinds(r, name) != 8 || racks[name] != 1 {
			t.Errorf("%s: %d binds in %d racks; want 8 in 1", name, countBinds(r, name), racks[name])
		}
	}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("block%d", i)
		if countBinds(r, name) != 32 || blocks[name] != 1 {
			t.Errorf("%s: %d binds in %d blocks; want 32 in 1", name, countBinds(r, name), blocks[name])
		}
	}
	if len(r.Binds) != 8192-2304+20*8+4*32 {
		t.Errorf("%d binds, want every GPU taken", len(r.Binds))
	}
	s = benchTopoReclaimSnapshot(true)
	r = mustSchedule(t, s, Config{})
	if countBinds(r, "gang") != 32 || len(r.Evictions) != 256 || domainsOf(s, r, "block")["gang"] != 1 {
		t.Errorf("reclaim: %d binds, %d evictions, in %d blocks; want 32, 256, 1", countBinds(r, "gang"), len(r.Evictions), domainsOf(s, r, "block")["gang"])
	}
	blocksEvicted := map[string]bool{}
	for _, e := range r.Evictions {
		var n Node
		for _, x := range s.Nodes {
			if x.Name == e.Node {
				n = x
			}
		}
		blocksEvicted[n.Labels["zone"]+"/"+n.Labels["block"]] = true
	}
	if len(blocksEvicted) != 1 {
		t.Errorf("reclaim evicted in %d blocks, want 1", len(blocksEvicted))
	}
}

// pairedCycles times Schedule on two snapshots alternately, and reports
// each one's time per cycle and their ratio: the same run, the same
// machine state.
func pairedCycles(b *testing.B, with, without *Snapshot) {
	b.ReportAllocs()
	b.ResetTimer()
	var tw, to time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := Schedule(with, Config{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := Schedule(without, Config{}); err != nil {
			b.Fatal(err)
		}
		tw, to = tw+t1.Sub(t0), to+time.Since(t1)
	}
	b.ReportMetric(float64(tw.Nanoseconds())/float64(b.N), "topo-ns/cycle")
	b.ReportMetric(float64(to.Nanoseconds())/float64(b.N), "plain-ns/cycle")
	b.ReportMetric(float64(tw)/float64(to), "ratio")
}

// BenchmarkTopologyCycle1024x8: a full cycle of benchTopoSnapshot with the
// gangs' topology constraints against the same cycle without them (target:
// ratio ≤ 1.5).
func BenchmarkTopologyCycle1024x8(b *testing.B) {
	pairedCycles(b, benchTopoSnapshot(true), benchTopoSnapshot(false))
}

// BenchmarkTopologyReclaimBlock1024x8Full: the cycle in which reclaim
// frees half a block for a 32 × 8 gang requiring a block, at 1,024 full
// nodes, against the same reclaim without the constraint (target: ≤ 1 s).
func BenchmarkTopologyReclaimBlock1024x8Full(b *testing.B) {
	pairedCycles(b, benchTopoReclaimSnapshot(true), benchTopoReclaimSnapshot(false))
}
