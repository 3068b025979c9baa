// Package realnode_test runs tessera-node end to end through a real
// kubelet and containerd: kube-scheduler allocates the claims, the kubelet
// calls tessera-node, containerd applies its CDI specs, and busybox
// containers print what they were given.
package realnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/realnode"
)

const (
	ns       = metav1.NamespaceDefault
	profile  = "h100-sxm-8"
	gpuCount = 8
)

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// tesseraNodeBinary builds cmd/tessera-node once per test binary.
func tesseraNodeBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "tessera-node-bin-"); err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(buildDir, "tessera-node")
		cmd := exec.Command("go", "build", "-o", buildBin, "./cmd/tessera-node")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tessera-node: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
			bytes.Contains(data, []byte("module github.com/tessera-gpu/tessera\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no tessera go.mod above %s", wd)
		}
	}
}

// cluster is a control plane with kube-scheduler, one real node, the
// DeviceClasses, and tessera-node on the node with fake GPUs.
type cluster struct {
	cp     *controlplane.ControlPlane
	node   *realnode.Node
	client kubernetes.Interface
	agent  *agent
	// mpsRecord is the file the MPS stand-in appends its calls to.
	mpsRecord string
}

func setup(t *testing.T) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("real-node end-to-end test skipped with -short")
	}
	bin := tesseraNodeBinary(t)
	cp := controlplane.Start(t, controlplane.Options{Scheduler: true})
	node := realnode.Start(t, cp, realnode.Options{})
	c := &cluster{cp: cp, node: node, client: cp.Client(t)}
	ctx := context.Background()

	classes, err := deviceclasses.Load()
	if err != nil {
		t.Fatalf("loading DeviceClasses: %v", err)
	}
	for _, dc := range classes {
		if _, err := c.client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating DeviceClass %s: %v", dc.Name, err)
		}
	}

	// The MPS stand-in is found on PATH, as the real control program would be.
	dir := t.TempDir()
	standInDir := filepath.Join(dir, "bin")
	if err := os.Mkdir(standInDir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, c.mpsRecord = drivertest.MPSStandIn(t, standInDir)
	mpsRoot := filepath.Join(dir, "mps")
	t.Cleanup(func() { killStandInDaemons(mpsRoot) })

	c.agent = &agent{
		bin:     bin,
		logPath: filepath.Join(node.LogDir, "tessera-node.log"),
		args: []string{
			"--node-name", node.Name,
			"--kubeconfig", cp.KubeconfigPath,
			"--fake-gpus", profile,
			"--kubelet-registrar-dir", node.PluginRegistryDir,
			"--kubelet-plugin-dir", filepath.Join(node.PluginsDir, "gpu.tessera.dev"),
			"--cdi-root", node.CDIDir,
			"--mps-root", mpsRoot,
			"--http-address", "127.0.0.1:" + strconv.Itoa(freePort(t)),
			"--v", "2",
		},
		env: []string{
			"PATH=" + standInDir + ":" + os.Getenv("PATH"),
			drivertest.RecordEnv + "=" + c.mpsRecord,
		},
	}
	// Registered once, also for restarts: cleanups run last-in first-out,
	// and the pods must go while tessera-node still runs, since the kubelet
	// needs it to unprepare their claims.
	t.Cleanup(func() { c.agent.stop(t) })
	c.agent.start(t)
	t.Cleanup(func() {
		if err := node.DeletePods(90 * time.Second); err != nil {
			t.Errorf("deleting pods: %v", err)
		}
	})
	c.waitSlices(t)
	return c
}

// waitSlices waits for the node's GPUs in the ResourceSlices, which the
// scheduler needs before it can allocate.
func (c *cluster) waitSlices(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if n := len(c.devices(t)); n == gpuCount {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("ResourceSlices of %s list %d devices after 1m, want %d; tessera-node log:\n%s", c.node.Name, n, gpuCount, tail(c.agent.logPath, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// devices maps device name to GPU UUID from the node's ResourceSlices.
func (c *cluster) devices(t *testing.T) map[string]string {
	t.Helper()
	slices, err := c.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing ResourceSlices: %v", err)
	}
	out := map[string]string{}
	for _, s := range slices.Items {
		if s.Spec.Driver != "gpu.tessera.dev" || s.Spec.NodeName == nil || *s.Spec.NodeName != c.node.Name {
			continue
		}
		for _, d := range s.Spec.Devices {
			for _, k := range []resourceapi.QualifiedName{"gpu.tessera.dev/uuid", "uuid"} {
				if a, ok := d.Attributes[k]; ok && a.StringValue != nil {
					out[d.Name] = *a.StringValue
				}
			}
		}
	}
	return out
}

// claim creates a claim for one device of class on GPU index, with memory
// consumed ("" = the whole GPU).
func (c *cluster) claim(t *testing.T, name, class string, index int, memory string) *resourceapi.ResourceClaim {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{
		DeviceClassName: class,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["gpu.tessera.dev"].index == %d`, index),
		}}},
	}
	if memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory),
		}}
	}
	rc := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}},
	}
	out, err := c.client.ResourceV1().ResourceClaims(ns).Create(context.Background(), rc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating claim %s: %v", name, err)
	}
	return out
}

// envScript prints the GPU env and the NVIDIA device nodes the container
// got, then stays up.
const envScript = `env | grep -E '^(NVIDIA|TESSERA|CUDA)_' | sort; echo "nvidia-devices=$(ls /dev | grep -c nvidia)"; echo done-printing; exec sleep 3600`

// gpuPod is a busybox pod using claim, for the scheduler to place.
func (c *cluster) gpuPod(t *testing.T, name, claim string) *corev1.Pod {
	t.Helper()
	p := realnode.BusyboxPod(ns, name, "", envScript)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return p
}

func (c *cluster) create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
}

func (c *cluster) waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return realnode.WaitPod(t, c.client, ns, name, 2*time.Minute, "Running", realnode.PodPhase(corev1.PodRunning))
}

// printedEnv waits for the pod's container to have printed its env and
// returns it as a map.
func (c *cluster) printedEnv(t *testing.T, pod string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		logs := realnode.PodLogs(t, c.client, ns, pod)
		if strings.Contains(logs, "done-printing") {
			env := map[string]string{}
			for line := range strings.SplitSeq(logs, "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					env[k] = v
				}
			}
			return env
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s printed no env in 20s; logs:\n%s", pod, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkEnv compares what a container printed with what it should have been
// given, reporting every difference.
func checkEnv(got, want map[string]string) error {
	var errs []error
	for k, v := range want {
		if got[k] != v {
			errs = append(errs, fmt.Errorf("%s=%q, want %q", k, got[k], v))
		}
	}
	return errors.Join(errs...)
}

// allocatedUUID returns the GPU UUID the scheduler allocated to a claim.
func (c *cluster) allocatedUUID(t *testing.T, claim string) (device, uuid string) {
	t.Helper()
	rc, err := c.client.ResourceV1().ResourceClaims(ns).Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting claim %s: %v", claim, err)
	}
	if rc.Status.Allocation == nil || len(rc.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one device", claim, rc.Status.Allocation)
	}
	device = rc.Status.Allocation.Devices.Results[0].Device
	uuid = c.devices(t)[device]
	if uuid == "" {
		t.Fatalf("claim %s: device %s has no UUID in the ResourceSlices", claim, device)
	}
	return device, uuid
}

func (c *cluster) specPath(rc *resourceapi.ResourceClaim) string {
	return filepath.Join(c.node.CDIDir, cdi.SpecName(string(rc.UID)))
}

func (c *cluster) deletePod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still there 90s after deletion", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitGone waits for a file to disappear.
func waitGone(t *testing.T, path string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists after %s", path, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metric returns the sum of a metric's samples whose line contains match,
// from tessera-node's /metrics.
func (c *cluster) metric(t *testing.T, name, match string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.agent.httpAddr() + "/metrics")
	if err != nil {
		t.Fatalf("reading tessera-node metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		if rest := strings.TrimPrefix(line, name); rest != "" && rest[0] != ' ' && rest[0] != '{' {
			continue // another metric with this prefix
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// agent is tessera-node as a process next to the kubelet.
type agent struct {
	bin, logPath string
	args, env    []string
	cmd          *exec.Cmd
	done         chan struct{}
}

func (a *agent) httpAddr() string {
	for i, arg := range a.args {
		if arg == "--http-address" {
			return a.args[i+1]
		}
	}
	return ""
}

// start runs tessera-node and waits for /readyz.
func (a *agent) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("tessera-node log: %v", err)
	}
	fmt.Fprintf(f, "# %s %s\n", a.bin, strings.Join(a.args, " "))
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), a.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting tessera-node: %v", err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	done := a.done
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + a.httpAddr() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-a.done:
			t.Fatalf("tessera-node exited while starting; log:\n%s", tail(a.logPath, 40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tessera-node not ready after 1m; log:\n%s", tail(a.logPath, 40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for tessera-node to exit.
func (a *agent) stop(t *testing.T) {
	t.Helper()
	select {
	case <-a.done:
		return
	default:
	}
	_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Errorf("tessera-node ignored SIGTERM for 20s; killing it")
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
	}
}

// restart stops tessera-node and starts it again with the same flags.
func (a *agent) restart(t *testing.T) {
	t.Helper()
	a.stop(t)
	a.start(t)
}

// killStandInDaemons stops the stand-in's daemons (sleeps) that no quit
// reached, by the pids they recorded.
func killStandInDaemons(root string) {
	files, _ := filepath.Glob(filepath.Join(root, "*", "pipe", "nvidia-cuda-mps-control.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == "sleep" {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
