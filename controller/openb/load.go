// Package openb loads the Alibaba "openb" GPU trace (cluster-trace-gpu-v2023,
// published with the FGD paper, USENIX ATC'23) and replays it on the
// paper's protocol, as docs/SCENARIOS.md spells it. The trace itself is in
// controller/testdata/openb (README.md there: source and attribution).
package openb

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/controller/packing"
)

// Node is one row of openb_node_list_gpu_node.csv.
type Node struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// Pod is one row of openb_pod_list_*.csv; only the columns that placement
// uses are kept (the times, QoS and phase are read but not needed).
type Pod struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	NumGPU    int
	GPUMilli  int // per GPU; < 1000 only for a fractional pod (NumGPU 1)
	Models    []string
}

// Request is the pod as the packing package sees it.
func (p *Pod) Request() packing.Request {
	r := packing.Request{CPUMilli: p.CPUMilli, Memory: p.MemoryMiB, Models: p.Models}
	switch {
	case p.NumGPU == 1 && p.GPUMilli < packing.MilliPerGPU:
		r.GPUMilli = p.GPUMilli
	case p.NumGPU > 0:
		r.GPUs = p.NumGPU
	}
	return r
}

// GPUMilliTotal is the pod's GPU request in milli-GPU.
func (p *Pod) GPUMilliTotal() int64 { return int64(p.NumGPU) * int64(p.GPUMilli) }

// The columns each file must have; others (a pod list's qos, pod_phase and
// times) are read past. A pod list's gpu_spec is optional: the trace's
// multigpu* lists have only the first five columns, and a missing gpu_spec
// means any model, as an empty one does.
var (
	nodeColumns = []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}
	podColumns  = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
)

// table reads a CSV file whose header names its columns, and reports
// errors as file:line:column.
type table struct {
	path string
	r    *csv.Reader
	rec  []string
	col  map[string]int // header name -> index
}

// newTable reads the header of the CSV in r (named name in errors) and
// checks that it has every column of required, each once. Columns may come
// in any order.
func newTable(name string, in io.Reader, required []string) (*table, error) {
	// A byte-order mark (spreadsheets write one) is not part of the first
	// column's name; drop it before the CSV reader sees a quote after it.
	br := bufio.NewReader(in)
	if bom, err := br.Peek(3); err == nil && string(bom) == "\ufeff" {
		br.Discard(3)
	}
	r := csv.NewReader(br)
	r.FieldsPerRecord = 0 // every row as wide as the header
	r.ReuseRecord = true
	t := &table{path: name, r: r, col: map[string]int{}}
	h, err := r.Read()
	t.rec = h
	if err != nil {
		return nil, t.wrap(err)
	}
	for i, c := range h {
		if prev, dup := t.col[c]; dup {
			return nil, t.errAt(i, "header column %d repeats column %d (%q)", i+1, prev+1, c)
		}
		t.col[c] = i
	}
	var missing []string
	for _, c := range required {
		if _, ok := t.col[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s:1: header %q lacks column(s) %s (want at least %s)",
			name, strings.Join(h, ","), strings.Join(missing, ","), strings.Join(required, ","))
	}
	return t, nil
}

// field returns the value of the named column in the current record, and
// its index (-1 and "" when the file has no such column).
func (t *table) field(name string) (string, int) {
	i, ok := t.col[name]
	if !ok {
		return "", -1
	}
	return t.rec[i], i
}

// next reads one record; it returns io.EOF at the end.
func (t *table) next() error {
	rec, err := t.r.Read()
	t.rec = rec // with csv.ErrFieldCount, the record read comes with the error
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return t.wrap(err)
	}
	return nil
}

func (t *table) wrap(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		if errors.Is(pe.Err, csv.ErrFieldCount) {
			return fmt.Errorf("%s:%d:%d: %w: %d, want %d", t.path, pe.Line, pe.Column, pe.Err, len(t.rec), t.r.FieldsPerRecord)
		}
		return fmt.Errorf("%s:%d:%d: %w", t.path, pe.Line, pe.Column, pe.Err)
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: empty file (no header)", t.path)
	}
	return fmt.Errorf("%s: %w", t.path, err)
}

func (t *table) errAt(col int, format string, args ...any) error {
	line, c := t.r.FieldPos(col)
	return fmt.Errorf("%s:%d:%d: %s", t.path, line, c, fmt.Sprintf(format, args...))
}

// int reads the named column as an integer in [lo, hi].
func (t *table) int(name string, lo, hi int64) (int64, error) {
	s, col := t.field(name)
	v, err := strconv.ParseInt(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 0, t.errAt(col, "%s: %s is out of range [%d, %d]", name, s, lo, hi)
	}
	if err != nil {
		return 0, t.errAt(col, "%s: %q is not an integer", name, s)
	}
	if v < lo || v > hi {
		return 0, t.errAt(col, "%s: %d is out of range [%d, %d]", name, v, lo, hi)
	}
	return v, nil
}

// name reads the named column as a unique name of a what.
func (t *table) name(column, what string, seen map[string]int) (string, error) {
	s, col := t.field(column)
	if s == "" || strings.TrimSpace(s) != s {
		return "", t.errAt(col, "%s: %q is empty or has surrounding spaces", what, s)
	}
	line, _ := t.r.FieldPos(col)
	if prev, dup := seen[s]; dup {
		return "", t.errAt(col, "%s %q repeats the one on line %d", what, s, prev)
	}
	seen[s] = line
	return s, nil
}

// LoadNodes reads a node list (sn,cpu_milli,memory_mib,gpu,model).
func LoadNodes(path string) ([]Node, error) { return load(path, ReadNodes) }

// ReadNodes reads a node list from r; name is the file's name in errors.
func ReadNodes(name string, r io.Reader) ([]Node, error) {
	return readRows(name, r, nodeColumns, "nodes", func(t *table, seen map[string]int) (Node, error) {
		var n Node
		var err error
		if n.Name, err = t.name("sn", "node", seen); err != nil {
			return n, err
		}
		if n.CPUMilli, n.MemoryMiB, err = t.cpuMemory(); err != nil {
			return n, err
		}
		g, err := t.int("gpu", 0, 1024)
		if err != nil {
			return n, err
		}
		n.GPUs = int(g)
		var mcol int
		n.Model, mcol = t.field("model")
		if n.GPUs > 0 && n.Model == "" {
			return n, t.errAt(mcol, "model: empty for a node with %d GPUs", n.GPUs)
		}
		return n, nil
	})
}

// LoadPods reads a pod list. gpu_spec is empty (any model) or models
// joined by "|", e.g. "V100M16|V100M32".
func LoadPods(path string) ([]Pod, error) { return load(path, ReadPods) }

// ReadPods reads a pod list from r; name is the file's name in errors.
func ReadPods(name string, r io.Reader) ([]Pod, error) {
	return readRows(name, r, podColumns, "pods", readPod)
}

func readPod(t *table, seen map[string]int) (Pod, error) {
	var p Pod
	var err error
	if p.Name, err = t.name("name", "pod", seen); err != nil {
		return p, err
	}
	if p.CPUMilli, p.MemoryMiB, err = t.cpuMemory(); err != nil {
		return p, err
	}
	ng, err := t.int("num_gpu", 0, 1024)
	if err != nil {
		return p, err
	}
	gm, err := t.int("gpu_milli", 0, packing.MilliPerGPU)
	if err != nil {
		return p, err
	}
	p.NumGPU, p.GPUMilli = int(ng), int(gm)
	switch {
	case p.NumGPU == 0 && p.GPUMilli != 0:
		return p, t.errAt(t.col["gpu_milli"], "gpu_milli: %d with num_gpu 0", p.GPUMilli)
	case p.NumGPU > 0 && p.GPUMilli == 0:
		return p, t.errAt(t.col["gpu_milli"], "gpu_milli: 0 with num_gpu %d", p.NumGPU)
	case p.NumGPU > 1 && p.GPUMilli != packing.MilliPerGPU:
		return p, t.errAt(t.col["gpu_milli"], "gpu_milli: %d with num_gpu %d (only a single-GPU pod may take a fraction)", p.GPUMilli, p.NumGPU)
	}
	if spec, scol := t.field("gpu_spec"); spec != "" {
		for _, m := range strings.Split(spec, "|") {
			if m == "" || strings.TrimSpace(m) != m {
				return p, t.errAt(scol, "gpu_spec: %q has an empty or padded model name (want models joined by |)", spec)
			}
			p.Models = append(p.Models, m)
		}
	}
	return p, nil
}

// cpuMemory reads the cpu_milli and memory_mib columns both lists have.
func (t *table) cpuMemory() (cpuMilli, memoryMiB int64, err error) {
	if cpuMilli, err = t.int("cpu_milli", 0, 1<<40); err != nil {
		return 0, 0, err
	}
	if memoryMiB, err = t.int("memory_mib", 0, 1<<40); err != nil {
		return 0, 0, err
	}
	return cpuMilli, memoryMiB, nil
}

// load opens path and reads it with read.
func load[T any](path string, read func(string, io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // os names the path
	}
	defer f.Close()
	return read(path, f)
}

// readRows reads a table of columns from r, one T a row, with unique
// names (seen); none at all is an error naming what.
func readRows[T any](name string, r io.Reader, columns []string, what string, row func(*table, map[string]int) (T, error)) ([]T, error) {
	t, err := newTable(name, r, columns)
	if err != nil {
		return nil, err
	}
	var out []T
	seen := map[string]int{}
	for {
		if err := t.next(); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		v, err := row(t, seen)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no %s", name, what)
	}
	return out, nil
}

// UnknownModels lists the GPU models that GPU pods' gpu_spec names but no
// node with GPUs has, and counts the pods that may use none but such
// models (a CPU-only pod's gpu_spec constrains nothing).
func UnknownModels(nodes []Node, pods []Pod) (models []string, n int) {
	have := map[string]bool{}
	for _, nd := range nodes {
		if nd.GPUs > 0 {
			have[nd.Model] = true
		}
	}
	missing := map[string]bool{}
	for _, p := range pods {
		if len(p.Models) == 0 || p.NumGPU == 0 {
			continue
		}
		usable := false
		for _, m := range p.Models {
			usable = usable || have[m]
		}
		if !usable {
			n++
			for _, m := range p.Models {
				missing[m] = true
			}
		}
	}
	for m := range missing {
		models = append(models, m)
	}
	sort.Strings(models)
	return models, n
}
