package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/internal/gpufault"
	"github.com/tessera-gpu/tessera/test/realnode"
)

// TestKubeletChoosesOtherGPUs: the real kubelet gives a tessera-scheduler
// pod other GPUs than its assignment, tessera-node records what the kubelet
// gave, and tessera-controller counts that (issue 17, "the node's truth").
//
// Made deterministic with two test-only hooks: tessera-controller stops
// itself (SIGSTOP) once it has written the pod's assignment (GPUs A) and
// before it binds the pod (kube.EnvTestCommitHook, after-claims=pause);
// meanwhile the test makes A unhealthy through tessera-node's fault file
// (gpufault.Env) and waits until the kubelet's device manager no longer
// counts A allocatable (its pod-resources API answers from the same state
// its allocation reads). Resumed, the controller binds the pod; the kubelet
// allocates from its healthy devices only (devicemanager's
// devicesToAllocate: available = healthy − in use), so it must give the
// pod two other GPUs B. Checked: the kubelet's own record of the pod's
// devices (pod-resources), the node's ResourceSlice record, the container's
// env, the controller's disagreement counted once; then A recovers, and a
// pod of 6 GPUs binds and runs on the 6 GPUs other than B — the controller
// counts B once, not the assignment A besides (which left 4 free).
func TestKubeletChoosesOtherGPUs(t *testing.T) {
	faults := filepath.Join(t.TempDir(), "gpu-faults")
	c := setupWith(t, setupOptions{
		agentEnv:      []string{gpufault.Env + "=" + faults},
		controllerEnv: []string{kube.EnvTestCommitHook + "=" + string(kube.HookAfterClaims) + "=" + kube.HookPause},
	})
	c.each(t, func(t *testing.T, c *cluster) { testKubeletChoosesOtherGPUs(t, c, faults) })
}

func testKubeletChoosesOtherGPUs(t *testing.T, c *cluster, faults string) {
	if !c.tessera() {
		t.Skip("only tessera-scheduler writes assignments; a kube-scheduler pod has none to differ from")
	}
	uuids := c.devices(t) // "gpu-3" → UUID
	index := map[string]int{}
	for name, u := range uuids {
		index[u], _ = strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	}
	toUUIDs := func(gpus []int) []string {
		var out []string
		for _, g := range gpus {
			out = append(out, uuids[deviceName(g)])
		}
		slices.Sort(out)
		return out
	}
	toIndexes := func(us []string) []int {
		var out []int
		for _, u := range us {
			out = append(out, index[u])
		}
		slices.Sort(out)
		return out
	}
	all := make([]int, gpuCount)
	for i := range all {
		all[i] = i
	}
	pr := c.node.PodResources(t)
	c.waitKubeletAllocatable(t, pr, toUUIDs(all))
	t.Cleanup(func() { c.controller.resume(t) }) // never leave it stopped

	c.create(t, c.dpPod("assigned", assignment.DefaultResourceGPU, 2, nil))
	c.controller.waitStopped(t, 30*time.Second)
	if p := c.pod(t, "assigned"); p.Spec.NodeName != "" {
		t.Fatalf("setup: pod assigned is bound to %s while tessera-controller stopped before binding", p.Spec.NodeName)
	}
	assigned := c.assignmentOf(t, "assigned").GPUs
	slices.Sort(assigned)
	writeFaults(t, faults, assigned)
	healthy := slices.DeleteFunc(slices.Clone(all), func(g int) bool { return slices.Contains(assigned, g) })
	c.waitKubeletAllocatable(t, pr, toUUIDs(healthy))
	c.controller.resume(t)
	c.waitRunning(t, "assigned")

	gave := toIndexes(c.kubeletDevices(t, pr, "assigned", 2))
	if slices.ContainsFunc(gave, func(g int) bool { return slices.Contains(assigned, g) }) {
		t.Fatalf("the kubelet gave pod assigned GPUs %v, which overlap its assignment %v that it held unhealthy", gave, assigned)
	}
	t.Logf("assigned GPUs %v, made unhealthy; the kubelet gave %v", assigned, gave)
	if rec := c.recordOf(t, "assigned", 2); !slices.Equal(rec, gave) {
		t.Errorf("the node's ResourceSlice records GPUs %v for pod assigned, the kubelet gave %v", rec, gave)
	}
	env := c.printedEnv(t, "assigned")
	for _, k := range []string{"TESSERA_GPU_UUIDS", "NVIDIA_VISIBLE_DEVICES"} {
		if got := strings.Split(env[k], ","); !sameSet(got, toUUIDs(gave)) {
			t.Errorf("pod assigned's container got %s=%q, want the kubelet's GPUs %v", k, env[k], toUUIDs(gave))
		}
	}
	c.waitMetric(t, c.controller, "tessera_device_plugin_disagreements_total", 1)

	// A recovers: 6 GPUs are free in truth, and a pod of 6 gets them.
	writeFaults(t, faults, nil)
	c.waitKubeletAllocatable(t, pr, toUUIDs(all))
	c.create(t, c.dpPod("six", assignment.DefaultResourceGPU, 6, nil))
	realnode.WaitPod(t, c.client, c.ns, "six", time.Minute, "Running (6 GPUs free once the kubelet's choice is counted, not the assignment too)",
		realnode.PodPhase(corev1.PodRunning))
	rest := slices.DeleteFunc(slices.Clone(all), func(g int) bool { return slices.Contains(gave, g) })
	if six := toIndexes(c.kubeletDevices(t, pr, "six", 6)); !slices.Equal(six, rest) {
		t.Errorf("the kubelet gave the pod of 6 GPUs %v, want %v (all but pod assigned's %v)", six, rest, gave)
	}
	if rec := c.recordOf(t, "six", 6); !slices.Equal(rec, rest) {
		t.Errorf("the node records GPUs %v for the pod of 6, want %v", rec, rest)
	}
	if n := c.controller.metric(t, "tessera_device_plugin_disagreements_total", ""); n != 1 {
		t.Errorf("tessera_device_plugin_disagreements_total = %v, want 1 (pod assigned's, counted once)", n)
	}
	c.checkBinds(t, 2)
}

// writeFaults lists the GPUs tessera-node is to hold unhealthy
// (gpufault.Env); it replaces the file in one rename, so no poll reads half
// of it.
func writeFaults(t *testing.T, path string, gpus []int) {
	t.Helper()
	var parts []string
	for _, g := range gpus {
		parts = append(parts, strconv.Itoa(g))
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(parts, ",")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitKubeletAllocatable waits until the kubelet's device manager holds
// exactly want (UUIDs, sorted) allocatable as whole GPUs.
func (c *cluster) waitKubeletAllocatable(t *testing.T, pr podresourcesv1.PodResourcesListerClient, want []string) {
	t.Helper()
	var got []string
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got, err = realnode.AllocatableDevices(context.Background(), pr, string(assignment.DefaultResourceGPU))
		if err == nil && slices.Equal(got, want) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the kubelet's allocatable %s after 30s: %v (%v), want %v; tessera-node log:\n%s",
		assignment.DefaultResourceGPU, got, err, want, tail(c.agent.logPath, 30))
}

// kubeletDevices returns the UUIDs of the whole GPUs the kubelet gave the
// run's pod, as its device manager records them; n of them.
func (c *cluster) kubeletDevices(t *testing.T, pr podresourcesv1.PodResourcesListerClient, pod string, n int) []string {
	t.Helper()
	got, err := realnode.ContainerDevices(context.Background(), pr, c.ns, pod, string(assignment.DefaultResourceGPU))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("the kubelet records GPUs %v for pod %s, want %d", got, pod, n)
	}
	return got
}

func (c *cluster) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting pod %s: %v", name, err)
	}
	return p
}

// recordOf waits for the node's record of a pod (its UID on the GPUs it
// holds whole, draname.AttrDevicePluginPod) to list n GPUs, and returns
// their indices, ascending.
func (c *cluster) recordOf(t *testing.T, pod string, n int) []int {
	t.Helper()
	ctx := context.Background()
	uid := string(c.pod(t, pod).UID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out []int
		sl, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node.Name})
		if err != nil {
			t.Fatalf("listing slices: %v", err)
		}
		for _, s := range sl.Items {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[draname.AttrDevicePluginPod]; ok && a.StringValue != nil && *a.StringValue == uid {
					i, _ := strconv.Atoi(strings.TrimPrefix(d.Name, "gpu-"))
					out = append(out, i)
				}
			}
		}
		slices.Sort(out)
		if len(out) == n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node records GPUs %v for pod %s after 30s, want %d", out, pod, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitMetric waits up to 10s for a daemon's metric to reach want.
func (c *cluster) waitMetric(t *testing.T, d *daemon, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := d.metric(t, name, "")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s = %v after 10s, want %v; log:\n%s", d.name, name, got, want, tail(d.logPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitStopped waits until the daemon's process is stopped (SIGSTOP, state
// T in /proc), as its test commit hook leaves it.
func (d *daemon) waitStopped(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		state, err := procState(d.cmd.Process.Pid)
		if err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		if state == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not stopped by its test hook after %s (state %s); log:\n%s", d.name, timeout, state, tail(d.logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resume lets a stopped daemon go on (SIGCONT); a running one is left be.
func (d *daemon) resume(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		return // exited: its pid may be another process's now
	default:
	}
	if err := syscall.Kill(d.cmd.Process.Pid, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
		t.Errorf("resuming %s: %v", d.name, err)
	}
}

// procState is the state letter of process pid (/proc/<pid>/stat).
func procState(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", fmt.Errorf("reading its state: %w", err)
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data)[i+1:])
	if i < 0 || len(f) == 0 {
		return "", fmt.Errorf("unexpected /proc/%d/stat %q", pid, data)
	}
	return f[0], nil
}
