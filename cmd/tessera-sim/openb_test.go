package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseSeeds(t *testing.T) {
	got, err := parseSeeds("1,42-44")
	if err != nil || !slices.Equal(got, []uint64{1, 42, 43, 44}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"x", "5-3", "1-", "", "0-10000", "1,1", "0-9999,10000"} {
		if _, err := parseSeeds(bad); err == nil {
			t.Errorf("parseSeeds(%q): no error", bad)
		}
	}
}

func TestOpenBJSON(t *testing.T) {
	dir := t.TempDir()
	nodes := filepath.Join(dir, "nodes.csv")
	pods := filepath.Join(dir, "pods.csv")
	os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1000,2,T4\n"), 0o644)
	os.WriteFile(pods, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"+
		"p0,1000,10,1,500,,LS,Running,0,0,0\np1,1000,10,1,1000,,LS,Running,0,0,0\n"), 0o644)
	var out, errb bytes.Buffer
	if rc := openbMain([]string{"--nodes", nodes, "--pods", pods, "--json", "--tune", "1"}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	for _, k := range []string{"gpuAllocationRate", "gpuCapacity", "gpuAllocated", "podsArrived", "podsPlaced", "podsFailed", "seed", "tune"} {
		if _, ok := m[k]; !ok {
			t.Errorf("key %s missing in %s", k, out.String())
		}
	}
	if len(m) != 8 || m["gpuCapacity"].(float64) != 2 || m["seed"].(float64) != 42 {
		t.Errorf("report %s", out.String())
	}

	// --ceiling and --bound add rows after the policies', never below them:
	// here the bound is exact (1.5 GPUs: the pool cannot do better than
	// the 500 and the whole pod).
	out.Reset()
	if rc := openbMain([]string{"--nodes", nodes, "--pods", pods, "--json", "--tune", "1", "--ceiling", "--bound"}, &out, &errb); rc != 0 {
		t.Fatalf("--ceiling: rc %d: %s", rc, errb.String())
	}
	rates := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r struct {
			Policy string  `json:"policy"`
			Rate   float64 `json:"gpuAllocationRate"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("--ceiling: %v: %s", err, line)
		}
		rates[r.Policy] = r.Rate
	}
	// The bound is certified, not rounded: a solver's last digits may
	// loosen it by a hair, never tighten it.
	if len(rates) != 3 || rates["ceiling"] < rates["tessera"] || rates["tessera"] == 0 || rates["bound"] < 0.75 || rates["bound"] > 0.75+1e-6 {
		t.Errorf("--ceiling --bound: rates %v", rates)
	}
	cpuNodes := filepath.Join(dir, "cpu-nodes.csv")
	os.WriteFile(cpuNodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nc0,8000,1000,0,\n"), 0o644)
	// Bad flags and files: exit 2, a message naming what is wrong, and
	// nothing on stdout (no table that starts and then stops).
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown policy", []string{"--policy", "random"}, "unknown placement policy"},
		{"empty policy", []string{"--policy", "bestfit,"}, `--policy "bestfit,": an empty policy name`},
		{"policy twice", []string{"--policy", "fgd,bestfit,fgd"}, "fgd is listed twice"},
		{"huge tune", []string{"--tune", "1e9"}, "--tune: tune 1e+09 must be a number above 0 and at most 100"},
		{"seed and seeds", []string{"--seed", "1", "--seeds", "2-3"}, "--seed and --seeds: give one of them"},
		{"seed twice", []string{"--seeds", "1-3,2"}, "seed 2 is listed twice"},
		{"too many seeds", []string{"--seeds", "0-18446744073709551615"}, "more than 10000 seeds"},
		{"too many seeds in all", []string{"--seeds", "0-9999,10000-10001"}, "more than 10000 seeds"},
		{"missing nodes file", []string{"--nodes", filepath.Join(dir, "missing.csv")}, "tessera-sim openb: --nodes: open "},
		{"bad pods file", []string{"--pods", nodes}, "nodes.csv:1:"},
		{"no GPU nodes", []string{"--nodes", cpuNodes, "--seeds", "1-2"}, "tessera-sim openb: --nodes: " + cpuNodes + " lists no node with GPUs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--nodes", nodes, "--pods", pods}, c.args...)
			var out, errb bytes.Buffer
			if rc := openbMain(args, &out, &errb); rc != 2 || !strings.Contains(errb.String(), c.want) || out.Len() > 0 {
				t.Errorf("rc %d, stderr %q, stdout %q; want 2, %q, nothing", rc, errb.String(), out.String(), c.want)
			}
		})
	}
}
