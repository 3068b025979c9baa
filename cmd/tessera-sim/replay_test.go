package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/controller/scenario"
)

// replayFile is controller/kube's replay test cluster (TestReplay writes
// it): n1 runs team-a's 2+2 GPUs over its quota, team-b wants 2 more (a
// reclaim), a/picky waits on a CEL selector, a/huge fits nowhere.
const replayFile = "../../controller/kube/testdata/replay/cluster.yaml"

func runReplay(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := replayCmd(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestReplayPrints(t *testing.T) {
	code, out, stderr := runReplay(t, replayFile)
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{
		"b/want-b → n1 GPUs [2 3] (reclaim, once its victims are gone)",
		"a/run-a2 on n1: reclaim: reclaimed by queue team-b",
		"a/picky: no schedulable node passes its constraints",
		"team-b: 5 (allocated 5)",
	} {
		assert.Contains(t, out, want)
	}
}

// withDecisions writes the test cluster with decisions changed by edit.
func withDecisions(t *testing.T, edit func(*kube.Decisions)) string {
	data, err := os.ReadFile(replayFile)
	require.NoError(t, err)
	d, err := kube.ParseDump(data)
	require.NoError(t, err)
	dec, err := kube.Replay(t.Context(), d)
	require.NoError(t, err)
	edit(dec)
	d.Decisions = dec
	b, err := kube.MarshalDump(d)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

func TestReplayComparesWithController(t *testing.T) {
	code, out, _ := runReplay(t, withDecisions(t, func(*kube.Decisions) {}))
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "agrees with the controller's decisions")

	code, out, _ = runReplay(t, withDecisions(t, func(d *kube.Decisions) { d.Binds[0].Node = "n2" }))
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "DISAGREES")
	assert.Contains(t, out, "~ bind b/want-b → n2")
}

func TestReplayWhatIf(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"a quota that covers team-a ends the reclaim", []string{"--set", "queue/team-a.gpu.quota=4"},
			[]string{"- bind b/want-b", "- eviction a/run-a2", "+ pending b/want-b", "~ queue team-a: fair share 1 GPUs"}},
		{"a node more places team-b without evicting", []string{"--add-nodes=n2:1"},
			[]string{"~ bind b/want-b → n1", "→ b/want-b → n2-whatif-1", "- eviction a/run-a2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, stderr := runReplay(t, append([]string{replayFile}, c.args...)...)
			require.Equal(t, 0, code, stderr)
			_, diff, _ := strings.Cut(out, "what changes with")
			for _, w := range c.want {
				assert.Contains(t, diff, w)
			}
		})
	}
}

func TestReplayBadFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"unknown queue": {[]string{"--set", "queue/nope.gpu.quota=1"}, `no Queue "nope"`},
		"unknown field": {[]string{"--set", "queue/team-a.gpu.share=1"}, `field "share"`},
		"bad quantity":  {[]string{"--set", "queue/team-a.gpu.quota=lots"}, `quota "lots"`},
		"unknown node":  {[]string{"--add-nodes", "n9:1"}, `no node "n9"`},
		"no count":      {[]string{"--add-nodes", "n1"}, "want NODE:N"},
		"missing file":  {[]string{"--set", "queue/team-a.gpu.quota=1"}, "usage"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			args := append([]string{replayFile}, c.args...)
			if name == "missing file" {
				args = c.args
			}
			code, _, stderr := runReplay(t, args...)
			assert.Equal(t, 2, code)
			assert.Contains(t, stderr, c.want)
		})
	}
}

func TestReplayToScenario(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s.yaml")
	code, _, stderr := runReplay(t, replayFile, "--to-scenario", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "dropped: per-pod node and GPU constraints (CEL selectors")
	assert.Contains(t, stderr, "a/picky")
	assert.Contains(t, stderr, "dropped: pods asking more GPUs than the largest node has (the format refuses them): a/huge")
	specs, err := scenario.LoadFile(out)
	require.NoError(t, err, "the scenario reads")
	require.Len(t, specs, 1)
	s := specs[0]
	assert.Len(t, s.Nodes, 2)
	running := 0
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			if p.Running != nil {
				running++
			}
		}
	}
	assert.Equal(t, 3, running, "run-a, run-a2 and run-b run where they run")
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal(data, &raw))
}
