// Package realnode_test runs tessera-node end to end through a real
// kubelet and containerd: a scheduler allocates the claims and binds the
// pods, the kubelet calls tessera-node, containerd applies its CDI specs,
// and busybox containers print what they were given. Every test runs twice
// on one cluster, as subtests: with kube-scheduler (the driver needs no
// tessera-controller) and with tessera-scheduler (the tessera-controller
// binary, as its ServiceAccount with the shipped RBAC).
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
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/cdi"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
	"github.com/tessera-gpu/tessera/test/realnode"
)

const (
	profile  = "h100-sxm-8"
	gpuCount = 8
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binaries builds cmd/tessera-node and cmd/tessera-controller once per test
// binary and returns the folder that holds them.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "tessera-bin-"); err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/tessera-node", "./cmd/tessera-controller")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tessera-node ./cmd/tessera-controller: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
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
// DeviceClasses, tessera-node on the node with fake GPUs, and
// tessera-controller. A test runs on it once per scheduler (see each);
// within a run, c.ns is that run's namespace and c.schedulerName the
// scheduler its pods ask for.
type cluster struct {
	cp     *controlplane.ControlPlane
	node   *realnode.Node
	client kubernetes.Interface
	agent  *daemon
	// controller is tessera-controller, the process of tessera-scheduler.
	controller *daemon
	// mpsRecord is the file the MPS stand-in appends its calls to.
	mpsRecord string

	// Set per run by each.
	ns            string
	schedulerName string // "" for kube-scheduler
	mpsBase       int    // MPS stand-in records before this run
	bindsBase     float64
}

// saUser is tessera-controller's ServiceAccount as the API server sees its
// token; deploy/rbac grants to it.
var saUser = []string{"system:serviceaccount:" + rbac.Namespace + ":" + rbac.ServiceAccount,
	"system:serviceaccounts", "system:serviceaccounts:" + rbac.Namespace, "system:authenticated"}

func setup(t *testing.T) *cluster {
	t.Helper()
	return setupWith(t, setupOptions{})
}

// setupOptions add to the daemons' environments: the test hooks that
// tessera-node and tessera-controller arm from there.
type setupOptions struct {
	agentEnv, controllerEnv []string
}

func setupWith(t *testing.T, opts setupOptions) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("real-node end-to-end test skipped with -short")
	}
	bins := binaries(t)
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
	mpsRoot := drivertest.ShortTempDir(t) // the MPS sockets' paths (sharing.MaxRootLen)
	t.Cleanup(func() { killStandInDaemons(mpsRoot) })

	agentAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	c.agent = &daemon{
		name:    "tessera-node",
		bin:     filepath.Join(bins, "tessera-node"),
		logPath: filepath.Join(node.LogDir, "tessera-node.log"),
		addr:    agentAddr,
		args: []string{
			"--node-name", node.Name,
			"--kubeconfig", cp.KubeconfigPath,
			"--fake-gpus", profile,
			"--kubelet-registrar-dir", node.PluginRegistryDir,
			"--kubelet-plugin-dir", filepath.Join(node.PluginsDir, "gpu.tessera.dev"),
			"--cdi-root", node.CDIDir,
			"--mps-root", mpsRoot,
			"--http-address", agentAddr,
			// The kubelet's device-plugin directory is fixed
			// (/var/lib/kubelet/device-plugins), and this node is the
			// only one using it.
			"--device-plugin-dir", node.DevicePluginsDir,
			"--v", "2",
		},
		env: append([]string{
			"PATH=" + standInDir + ":" + os.Getenv("PATH"),
			drivertest.RecordEnv + "=" + c.mpsRecord,
		}, opts.agentEnv...),
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
	c.startController(t, filepath.Join(bins, "tessera-controller"), opts.controllerEnv)
	c.waitSlices(t)
	c.waitAllocatable(t, gpuCount)
	return c
}

// startController runs the tessera-controller binary as its ServiceAccount
// with the shipped RBAC and the scheduling CRDs, with leader election as in
// a deployment, and waits until it leads.
func (c *cluster) startController(t *testing.T, bin string, env []string) {
	t.Helper()
	start := time.Now()
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(c.cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.InstallCRDs(ctx, dyn); err != nil {
		t.Fatalf("installing CRDs: %v", err)
	}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rbac.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", rbac.Namespace, err)
	}
	if err := framework.ApplyControllerRBAC(ctx, c.client); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	c.controller = &daemon{
		name:    "tessera-controller",
		bin:     bin,
		logPath: filepath.Join(c.node.LogDir, "tessera-controller.log"),
		addr:    addr,
		args: []string{
			"--kubeconfig", c.cp.WriteKubeconfig(t, c.cp.UserConfig(saUser[0], saUser[1:]...)),
			"--interval", "250ms",
			"--metrics-bind-address", addr,
			"--health-probe-bind-address", addr,
			"--leader-elect-namespace", rbac.Namespace,
			"--v", "2",
		},
		env: env,
	}
	t.Cleanup(func() { c.controller.stop(t) })
	c.controller.start(t)
	deadline := time.Now().Add(30 * time.Second)
	for c.controller.metric(t, "tessera_leader", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("tessera-controller not leading after 30s; log:\n%s", tail(c.controller.logPath, 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("tessera-controller leading %s after installing CRDs and RBAC", time.Since(start).Round(10*time.Millisecond))
}

// each runs test once per scheduler on this cluster, as subtests named
// after it, each in its own namespace; a run's pods and claims are deleted
// when it ends (so the GPUs are free again for the next).
func (c *cluster) each(t *testing.T, test func(t *testing.T, c *cluster)) {
	for _, sched := range []string{"kube-scheduler", kube.SchedulerName} {
		t.Run(sched, func(t *testing.T) {
			r := *c
			r.ns = sched
			if sched == kube.SchedulerName {
				r.schedulerName = sched
				r.bindsBase = c.controller.metric(t, "tessera_binds_total", "")
			}
			r.mpsBase = len(drivertest.Record(t, c.mpsRecord))
			if _, err := c.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("creating namespace %s: %v", r.ns, err)
			}
			t.Cleanup(func() { r.clean(t) })
			test(t, &r)
		})
	}
}

// clean deletes the run's pods, waits for the kubelet to finish them
// (unprepared), then deletes its claims and waits for them to go.
func (c *cluster) clean(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	grace := int64(1)
	pods := c.client.CoreV1().Pods(c.ns)
	claims := c.client.ResourceV1().ResourceClaims(c.ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting pods of %s: %v", c.ns, err)
	}
	if !waitEmpty(ctx, t, "pods of "+c.ns, func() (int, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	}) {
		return
	}
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting claims of %s: %v", c.ns, err)
	}
	waitEmpty(ctx, t, "claims of "+c.ns, func() (int, error) {
		l, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		return len(l.Items), nil
	})
}

// waitEmpty polls count until it reports none (true), or fails t when ctx
// ends (false).
func waitEmpty(ctx context.Context, t *testing.T, what string, count func() (int, error)) bool {
	t.Helper()
	for {
		if n, err := count(); err == nil && n == 0 {
			return true
		}
		if ctx.Err() != nil {
			t.Errorf("%s still there after 2m", what)
			return false
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// tessera says whether this run's pods are scheduled by tessera-scheduler.
func (c *cluster) tessera() bool { return c.schedulerName != "" }

// checkBinds checks, in a tessera-scheduler run, that tessera-controller
// bound n pods in this run, with no failed API call and nothing its RBAC
// forbids.
func (c *cluster) checkBinds(t *testing.T, n int) {
	t.Helper()
	if !c.tessera() {
		return
	}
	if got := c.controller.metric(t, "tessera_binds_total", "") - c.bindsBase; got != float64(n) {
		t.Errorf("tessera-controller bound %v pods in this run, want %d", got, n)
	}
	if got := c.controller.metric(t, "tessera_api_errors_total", ""); got != 0 {
		t.Errorf("tessera-controller: %v failed API calls; log:\n%s", got, tail(c.controller.logPath, 40))
	}
	if data, _ := os.ReadFile(c.controller.logPath); bytes.Contains(data, []byte("forbidden")) {
		t.Errorf("tessera-controller was refused by RBAC; log:\n%s", tail(c.controller.logPath, 40))
	}
}

// mpsRecords returns the MPS stand-in's records of this run.
func (c *cluster) mpsRecords(t *testing.T) []string {
	t.Helper()
	return drivertest.Record(t, c.mpsRecord)[c.mpsBase:]
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

// waitAllocatable waits for the kubelet to report gpus whole GPUs and the
// default number of share slots per GPU in the node's allocatable: the
// device plugin's resources.
func (c *cluster) waitAllocatable(t *testing.T, gpus int64) {
	t.Helper()
	want := map[corev1.ResourceName]int64{assignment.DefaultResourceGPU: gpus, assignment.ResourceShare: gpuCount * deviceplugin.DefaultShareSlots}
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := c.client.CoreV1().Nodes().Get(context.Background(), c.node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("getting node %s: %v", c.node.Name, err)
		}
		ok := true
		for r, v := range want {
			q := n.Status.Allocatable[r]
			ok = ok && q.Value() == v
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s allocatable %v after 1m, want %v; tessera-node log:\n%s", c.node.Name, n.Status.Allocatable, want, tail(c.agent.logPath, 30))
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
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}},
	}
	out, err := c.client.ResourceV1().ResourceClaims(c.ns).Create(context.Background(), rc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating claim %s: %v", name, err)
	}
	return out
}

// envScript prints the GPU env and the NVIDIA device nodes the container
// got, then stays up.
const envScript = `env | grep -E '^(NVIDIA|TESSERA|CUDA)_' | sort; echo "nvidia-devices=$(ls /dev | grep -c nvidia)"; echo done-printing; exec sleep 3600`

// gpuPod is a busybox pod using claim, for this run's scheduler to place.
func (c *cluster) gpuPod(t *testing.T, name, claim string) *corev1.Pod {
	t.Helper()
	p := realnode.BusyboxPod(c.ns, name, "", envScript)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	p.Spec.SchedulerName = c.schedulerName
	return p
}

func (c *cluster) create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods(c.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
}

func (c *cluster) waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return realnode.WaitPod(t, c.client, c.ns, name, 2*time.Minute, "Running", realnode.PodPhase(corev1.PodRunning))
}

// printedEnv waits for the pod's container to have printed its env and
// returns it as a map.
func (c *cluster) printedEnv(t *testing.T, pod string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		logs := realnode.PodLogs(t, c.client, c.ns, pod)
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
	rc, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(context.Background(), claim, metav1.GetOptions{})
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
	if err := c.client.CoreV1().Pods(c.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := c.client.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
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

// daemon is a Tessera binary run as a process: tessera-node next to the
// kubelet, or tessera-controller. Both serve /readyz and /metrics on addr.
type daemon struct {
	name, bin, logPath string
	addr               string
	args, env          []string
	cmd                *exec.Cmd
	done               chan struct{}
}

// metric returns the sum of a metric's samples whose line contains match,
// from the daemon's /metrics.
func (d *daemon) metric(t *testing.T, name, match string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		t.Fatalf("reading %s metrics: %v", d.name, err)
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

// start runs the daemon and waits for /readyz.
func (d *daemon) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("%s log: %v", d.name, err)
	}
	fmt.Fprintf(f, "# %s %s\n", d.bin, strings.Join(d.args, " "))
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), d.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", d.name, err)
	}
	d.cmd, d.done = cmd, make(chan struct{})
	done := d.done
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + d.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-d.done:
			t.Fatalf("%s exited while starting; log:\n%s", d.name, tail(d.logPath, 40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 1m; log:\n%s", d.name, tail(d.logPath, 40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the daemon to exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if d.cmd == nil {
		return
	}
	select {
	case <-d.done:
		return
	default:
	}
	_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s ignored SIGTERM for 20s; killing it", d.name)
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
}

// restart stops the daemon and starts it again with the same flags.
func (d *daemon) restart(t *testing.T) {
	t.Helper()
	d.stop(t)
	d.start(t)
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
