package main

// A demo you can keep (`make demo KEEP=1`, `make demo-down`): the story runs
// in a detached supervisor process that holds the cluster's processes (they
// die with it: Pdeathsig) until `--down` signals it; the process the user
// started shows the story and returns once the cluster is ready. The state
// folder records what runs (pids with their start times, folders), so
// `--down` ends exactly that, even when the supervisor is gone.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

// Files of the state folder.
const (
	stateFile      = "state.json"     // what runs: written once the cluster is kept
	supervisorFile = "supervisor.pid" // written as soon as the supervisor starts
	readyFile      = "ready"          // the cluster is kept and state.json written
	logFile        = "demo.log"       // the supervisor's output: the story
	kubeconfigFile = "kubeconfig"     // the admin's kubeconfig
	binFolder      = "bin"            // kubectl and kubectl-tessera, for PATH
)

// keptState is state.json.
type keptState struct {
	Supervisor proc   `json:"supervisor"`
	Processes  []proc `json:"processes"`
	// Dirs are the folders the cluster lives in (control plane, nodes),
	// removed by --down when the supervisor could not.
	Dirs       []string `json:"dirs"`
	Kubeconfig string   `json:"kubeconfig"`
	APIServer  string   `json:"apiServer"`
}

// proc is a process by pid and start time (clock ticks since boot, from
// /proc/<pid>/stat), so a pid reused by another program is never signalled.
type proc struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// startTime reads a process's start time; ok is false when it is gone.
func startTime(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command (field 2) may hold spaces; fields after its ')' are plain.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" { // a zombie has ended
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64) // field 22: starttime
	return v, err == nil
}

func (p proc) alive() bool {
	st, ok := startTime(p.Pid)
	return ok && st == p.Start
}

func procOf(name string, pid int) (proc, error) {
	st, ok := startTime(pid)
	if !ok {
		return proc{}, fmt.Errorf("%s (pid %d) is not running", name, pid)
	}
	return proc{Name: name, Pid: pid, Start: st}, nil
}

// readPids lists the processes whose <name>.pid files are in dir: the
// harness (childproc) writes one for every child it starts.
func readPids(dir string) ([]proc, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if p, err := procOf(strings.TrimSuffix(filepath.Base(f), ".pid"), pid); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// keep is where a kept demo stops after its story: it records what runs,
// prints how to use the cluster, says it is ready and waits until ctx ends
// (--down's SIGTERM); Run's teardown then stops everything.
func (d *demo) keep(ctx context.Context) error {
	dir := d.opts.StateDir
	kc, err := os.ReadFile(d.cp.KubeconfigPath)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, kubeconfigFile)
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}
	bin := filepath.Join(dir, binFolder)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for name, target := range map[string]string{"kubectl": d.kubectl, "kubectl-tessera": filepath.Join(d.opts.TesseraBin, "kubectl-tessera")} {
		_ = os.Remove(filepath.Join(bin, name))
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			return err
		}
	}
	st, err := d.keptState(kubeconfig)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, stateFile), data, 0o644); err != nil {
		return err
	}
	d.sayKept(kubeconfig, bin)
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	d.logf("stopping the kept demo (%v)", context.Cause(ctx))
	return nil
}

// findKubectl finds kubectl in binDir, else builds it from its module
// (hack/build-controlplane.sh kubectl: minutes once, then cached by
// version), before the cluster starts.
func (d *demo) findKubectl(binDir string) error {
	if p := filepath.Join(binDir, "kubectl"); isExecutable(p) {
		d.kubectl = p
		return nil
	}
	d.logf("building kubectl from its Go module (a first build takes minutes, then cached in _cache/)")
	p, err := controlplane.Binary("kubectl")
	if err != nil {
		return fmt.Errorf("kubectl for the kept cluster: %w", err)
	}
	d.kubectl = p
	return nil
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func (d *demo) keptState(kubeconfig string) (*keptState, error) {
	self, err := procOf("demo supervisor", os.Getpid())
	if err != nil {
		return nil, err
	}
	st := &keptState{Supervisor: self, Dirs: []string{d.cp.Dir, d.work}, Kubeconfig: kubeconfig, APIServer: d.cp.APIServerURL}
	for _, dir := range st.Dirs {
		ps, err := readPids(dir)
		if err != nil {
			return nil, err
		}
		st.Processes = append(st.Processes, ps...)
	}
	return st, nil
}

func (d *demo) sayKept(kubeconfig, bin string) {
	d.say("\n════ The cluster stays up ════")
	d.say("API server %s; what runs is recorded in %s.", d.cp.APIServerURL, filepath.Join(d.opts.StateDir, stateFile))
	d.say("Use it with the kubectl built from its Go module and the kubectl plugin:\n")
	d.say("  export KUBECONFIG=%s PATH=%s:$PATH", kubeconfig, bin)
	d.say("  kubectl get nodes")
	d.say("  kubectl tessera queues            # or: kubectl tessera nodes, kubectl tessera why -n NS POD")
	d.say("  kubectl apply -f my-workload.yaml # schedulerName: tessera-scheduler, label tessera.dev/queue")
	d.say("\nKwok nodes run no containers: pods are scheduled, bound and marked Running, never started.")
	d.say("Stop everything with:  make demo-down   (or: go run ./demo/local --down --state-dir %s)", d.opts.StateDir)
}

// startKept is --keep without --supervise: it starts this program again as
// a detached supervisor (its own session, so the terminal's signals do not
// reach it), shows its story as it goes and returns once the cluster is
// kept, or the supervisor's failure.
func startKept(ctx context.Context, stateDir string, out io.Writer) error {
	if err := checkNoKept(stateDir); err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{readyFile, logFile, stateFile, supervisorFile} {
		_ = os.Remove(filepath.Join(stateDir, f))
	}
	logPath := filepath.Join(stateDir, logFile)
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append(os.Args[1:], "--supervise")...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the demo's supervisor: %w", err)
	}
	sup, err := procOf("demo supervisor", cmd.Process.Pid)
	if err == nil {
		data, _ := json.Marshal(sup)
		err = os.WriteFile(filepath.Join(stateDir, supervisorFile), data, 0o644)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return followKept(ctx, stateDir, logPath, cmd.Process, exited, out)
}

// followKept copies the supervisor's log to out until the cluster is kept
// (nil), the supervisor fails, or ctx ends (then it stops the supervisor).
func followKept(ctx context.Context, stateDir, logPath string, p *os.Process, exited <-chan error, out io.Writer) error {
	f, err := os.Open(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		_, _ = io.Copy(out, f)
		if _, err := os.Stat(filepath.Join(stateDir, readyFile)); err == nil {
			_, _ = io.Copy(out, f)
			return nil
		}
		select {
		case err := <-exited:
			_, _ = io.Copy(out, f)
			_ = os.Remove(filepath.Join(stateDir, supervisorFile))
			return fmt.Errorf("the demo's supervisor ended before the cluster was kept (%v); its log: %s", err, logPath)
		case <-ctx.Done():
			_ = p.Signal(syscall.SIGTERM)
			err := <-exited
			_, _ = io.Copy(out, f)
			_ = os.Remove(filepath.Join(stateDir, supervisorFile))
			return fmt.Errorf("interrupted; the demo stopped (%v)", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkNoKept fails when a kept demo runs from stateDir, and cleans up
// after one whose supervisor is gone.
func checkNoKept(stateDir string) error {
	sup, ok, err := readSupervisor(stateDir)
	if err != nil || !ok {
		return err
	}
	if sup.alive() {
		return fmt.Errorf("a kept demo runs already (supervisor pid %d, state in %s): stop it with `make demo-down` first", sup.Pid, stateDir)
	}
	_, err = down(stateDir, io.Discard)
	return err
}

// readSupervisor reads the supervisor the state folder names; ok is false
// when it names none.
func readSupervisor(stateDir string) (proc, bool, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, supervisorFile))
	if errors.Is(err, os.ErrNotExist) {
		return proc{}, false, nil
	} else if err != nil {
		return proc{}, false, err
	}
	var p proc
	if err := json.Unmarshal(data, &p); err != nil {
		return proc{}, false, fmt.Errorf("%s: %w", filepath.Join(stateDir, supervisorFile), err)
	}
	return p, true, nil
}

// downResult says what --down did.
type downResult struct {
	Supervisor bool     // a live supervisor was told to stop
	Killed     []string // recorded processes still alive after it, killed
	Removed    []string // folders removed
}

// down stops a kept demo: SIGTERM to its supervisor, which tears everything
// down; then, from state.json, SIGKILL to the process group of any recorded
// process still alive (the supervisor was killed, say) and removal of the
// recorded folders; then the state folder goes.
func down(stateDir string, out io.Writer) (*downResult, error) {
	res := &downResult{}
	sup, ok, err := readSupervisor(stateDir)
	if err != nil {
		return nil, err
	}
	if !ok {
		fmt.Fprintf(out, "No kept demo in %s.\n", stateDir)
		return res, nil
	}
	var st keptState
	if data, err := os.ReadFile(filepath.Join(stateDir, stateFile)); err == nil {
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(stateDir, stateFile), err)
		}
	}
	if sup.alive() {
		res.Supervisor = true
		fmt.Fprintf(out, "Stopping the kept demo (supervisor pid %d) ...\n", sup.Pid)
		_ = syscall.Kill(sup.Pid, syscall.SIGTERM)
		if !waitGone(sup, 90*time.Second) {
			_ = syscall.Kill(sup.Pid, syscall.SIGKILL)
			waitGone(sup, 5*time.Second)
		}
	}
	for _, p := range st.Processes {
		if p.alive() {
			_ = syscall.Kill(-p.Pid, syscall.SIGKILL) // the harness starts each in its own group
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
			waitGone(p, 5*time.Second)
			res.Killed = append(res.Killed, fmt.Sprintf("%s (pid %d)", p.Name, p.Pid))
		}
	}
	for _, dir := range st.Dirs {
		if !ownDir(dir) {
			return nil, fmt.Errorf("%s names folder %q, which the demo does not make; remove it yourself if you must", stateFile, dir)
		}
		if _, err := os.Stat(dir); err == nil {
			if err := os.RemoveAll(dir); err != nil {
				return nil, err
			}
			res.Removed = append(res.Removed, dir)
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "The kept demo is down: %d processes were recorded", len(st.Processes))
	if len(res.Killed) > 0 {
		fmt.Fprintf(out, "; killed, left over: %s", strings.Join(res.Killed, ", "))
	}
	fmt.Fprintf(out, "; %s removed.\n", stateDir)
	return res, nil
}

// ownDir: the folders the demo and the harness make (os.MkdirTemp with
// these prefixes), the only ones --down removes.
func ownDir(dir string) bool {
	base := filepath.Base(dir)
	return filepath.IsAbs(dir) && filepath.Dir(dir) == filepath.Clean(os.TempDir()) &&
		(strings.HasPrefix(base, "tessera-cp-") || strings.HasPrefix(base, "tdemo"))
}

func waitGone(p proc, timeout time.Duration) bool {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !p.alive() {
			return true
		}
	}
	return !p.alive()
}
