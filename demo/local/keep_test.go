package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestKeep runs the demo as a newcomer does with `make demo KEEP=1` (the
// scene only, --no-story, to keep the test short): the command returns with
// the cluster up; the kubectl built from its module and the kubectl plugin
// work against it through the kubeconfig and PATH it printed, and a pod
// applied with that kubectl is scheduled by tessera-controller. Then
// `--down` leaves no recorded process, nor any process in their process
// groups, and removes the folders and the state.
func TestKeep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane, kwok nodes, tessera-node, tessera-controller and training-operator; skipped with -short")
	}
	binDir := controlplane.BinDir(t)
	opsDir := framework.OperatorsDir(t)
	demoBin := controlplane.GoBinary(t, "./demo/local")
	controlplane.GoBinary(t, "./cmd/tessera-node") // one folder: --tessera-bin
	controlplane.GoBinary(t, "./cmd/tessera-controller")
	tesseraBin := filepath.Dir(controlplane.GoBinary(t, "./cmd/kubectl-tessera"))
	t.Cleanup(controlplane.RemoveGoBinaries)
	state := filepath.Join(t.TempDir(), "state")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	downCmd := func() (string, error) {
		out, err := exec.CommandContext(ctx, demoBin, "--down", "--state-dir", state).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = downCmd() }) // whatever fails below, nothing stays
	start := time.Now()
	out, err := exec.CommandContext(ctx, demoBin, "--keep", "--no-story", "--state-dir", state,
		"--bin-dir", binDir, "--operators-dir", opsDir, "--tessera-bin", tesseraBin).CombinedOutput()
	t.Logf("demo --keep (%v):\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("demo --keep: %v", err)
	}
	kubeconfig, path := printedEnv(t, string(out))
	st := readState(t, state)
	if len(st.Processes) < 7 { // etcd, apiserver, KCM, kwok, 3 × tessera-node, controller, operator
		t.Errorf("state records %d processes, want the cluster's (at least 7): %+v", len(st.Processes), st.Processes)
	}
	for _, p := range append(st.Processes, st.Supervisor) {
		if !p.alive() {
			t.Errorf("%s (pid %d) is not running after demo --keep returned", p.Name, p.Pid)
		}
	}

	// The kubectl the printed PATH finds (exec.Command would look it up in
	// this process's PATH, where another kubectl may be).
	kubectlBin := lookPath(t, "kubectl", path)
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectlBin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+path)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if v := kubectl("", "version"); !strings.Contains(v, "Client Version: "+controlplane.KubeVersion) {
		t.Errorf("kubectl version: want the client built from its module (%s):\n%s", controlplane.KubeVersion, v)
	}
	if nodes := kubectl("", "get", "nodes", "-o", "name"); strings.Count(nodes, "node/") != len(DefaultNodes) {
		t.Errorf("kubectl get nodes: want %d nodes:\n%s", len(DefaultNodes), nodes)
	}
	if q := kubectl("", "tessera", "queues"); !strings.Contains(q, "team-a") || !strings.Contains(q, "team-b") {
		t.Errorf("kubectl tessera queues: want the teams' queues:\n%s", q)
	}
	kubectl(helloPod, "apply", "-f", "-")
	kubectl("", "wait", "-n", "team-a", "--for=condition=PodScheduled", "pod/hello", "--timeout=2m")
	t.Logf("kubectl tessera why:\n%s", kubectl("", "tessera", "why", "-n", "team-a", "hello"))

	downOut, err := downCmd()
	t.Logf("demo --down:\n%s", downOut)
	if err != nil {
		t.Fatalf("demo --down: %v", err)
	}
	checkAllGone(t, st)
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state folder %s still there after --down (%v)", state, err)
	}
}

// helloPod is a newcomer's own manifest: one whole GPU in team-a's queue.
const helloPod = `apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: team-a, labels: {tessera.dev/queue: team-a}}
spec:
  schedulerName: tessera-scheduler
  containers:
  - {name: c, image: busybox:1.36, resources: {limits: {nvidia.com/gpu: 1}}}
`

// printedEnv reads the KUBECONFIG and PATH the demo printed ("export
// KUBECONFIG=... PATH=...:$PATH") and resolves $PATH.
func printedEnv(t *testing.T, out string) (kubeconfig, path string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "export" && strings.HasPrefix(f[1], "KUBECONFIG=") && strings.HasPrefix(f[2], "PATH=") {
			kubeconfig = strings.TrimPrefix(f[1], "KUBECONFIG=")
			path = strings.ReplaceAll(strings.TrimPrefix(f[2], "PATH="), "$PATH", os.Getenv("PATH"))
			return kubeconfig, path
		}
	}
	t.Fatalf("the demo printed no `export KUBECONFIG=... PATH=...` line")
	return "", ""
}

// lookPath finds name in the folders of path, as a shell would.
func lookPath(t *testing.T, name, path string) string {
	t.Helper()
	for _, dir := range filepath.SplitList(path) {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p
		}
	}
	t.Fatalf("no %s in PATH %s", name, path)
	return ""
}

func readState(t *testing.T, dir string) keptState {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st keptState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// checkAllGone: no recorded process runs, no process is left in their
// process groups (what they spawned), and their folders are removed.
func checkAllGone(t *testing.T, st keptState) {
	t.Helper()
	groups := map[int]string{st.Supervisor.Pid: st.Supervisor.Name}
	for _, p := range st.Processes {
		if p.alive() {
			t.Errorf("%s (pid %d) still runs after --down", p.Name, p.Pid)
		}
		groups[p.Pid] = p.Name
	}
	if st.Supervisor.alive() {
		t.Errorf("the supervisor (pid %d) still runs after --down", st.Supervisor.Pid)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range procs {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if pgrp, ok := processGroup(f); ok && groups[pgrp] != "" {
			if _, alive := startTime(pid); alive {
				t.Errorf("pid %d is still in the process group of %s after --down", pid, groups[pgrp])
			}
		}
	}
	for _, d := range st.Dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("folder %s still there after --down (%v)", d, err)
		}
	}
}

// processGroup reads field 5 (pgrp) of a /proc/<pid>/stat file.
func processGroup(statFile string) (int, bool) {
	data, err := os.ReadFile(statFile)
	if err != nil {
		return 0, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if i < 0 || len(f) < 3 {
		return 0, false
	}
	pgrp, err := strconv.Atoi(f[2])
	return pgrp, err == nil
}

// TestDownWithoutSupervisor: when the supervisor is gone (killed, say),
// --down still ends every process the state records, by pid and start time
// (a recorded pid now running something else is left alone), and removes
// the demo's own folders, never another one.
func TestDownWithoutSupervisor(t *testing.T) {
	state := t.TempDir()
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	running, err := procOf("sleep", child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	reused := running
	reused.Name, reused.Start = "reused pid", running.Start+1 // same pid, another start: not ours
	work, err := os.MkdirTemp("", "tdemo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	cases := []struct {
		name      string
		st        keptState
		wantErr   string
		wantKill  int
		wantAlive bool
	}{
		{"pid reused by another program", keptState{Supervisor: proc{Name: "gone", Pid: 1 << 22}, Processes: []proc{reused}}, "", 0, true},
		{"folder not the demo's", keptState{Supervisor: proc{Name: "gone", Pid: 1 << 22}, Dirs: []string{state}}, "which the demo does not make", 0, true},
		{"left-over process and folder", keptState{Supervisor: proc{Name: "gone", Pid: 1 << 22}, Processes: []proc{running}, Dirs: []string{work}}, "", 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(state, strings.ReplaceAll(tc.name, " ", "-"))
			writeState(t, dir, tc.st)
			res, err := down(dir, os.Stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("down: err %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("down: %v", err)
			} else if len(res.Killed) != tc.wantKill {
				t.Errorf("killed %v, want %d", res.Killed, tc.wantKill)
			}
			if got := running.alive(); got != tc.wantAlive {
				t.Errorf("sleep alive: %v, want %v", got, tc.wantAlive)
			}
		})
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("%s not removed (%v)", work, err)
	}
}

func writeState(t *testing.T, dir string, st keptState) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for file, v := range map[string]any{supervisorFile: st.Supervisor, stateFile: st} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
