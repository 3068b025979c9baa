package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/demo/examples"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/childproc"
	"github.com/tessera-gpu/tessera/internal/draname"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// Options of one demo run.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager and kwok
	// (hack/build-controlplane.sh); empty: found or built by the harness.
	BinDir string
	// TesseraBin holds tessera-node and tessera-controller; empty: go build
	// them into a temporary folder.
	TesseraBin string
	// OperatorsDir links to the workload controllers
	// (hack/build-operators.sh); empty: $TESSERA_OPERATORS_DIR, else the
	// script builds training-operator, the only one the demo runs.
	OperatorsDir string
	// Keep leaves the cluster running after the story until ctx ends,
	// recording what runs in StateDir (keep.go); NoStory skips the acts
	// but the teams' queues.
	Keep, NoStory bool
	StateDir      string
	// Nodes are the fake GPU nodes: name → fake GPU profile.
	Nodes []Node
	// Out receives the story; Log the progress lines (both may be the same).
	Out, Log io.Writer
	// Picture, when set, is where the story's picture goes (.svg or .png):
	// each queue's GPUs allocated, fair share and quota over the run, as
	// tessera-controller wrote them in the Queues' status.
	Picture string
}

// Node is one kwok node with a tessera-node in fake mode.
type Node struct{ Name, Profile string }

// DefaultNodes: two 8 × H100 nodes (one NVSwitch domain each) and one
// 4 × A100 node (NVLink bridges in pairs): 20 GPUs.
var DefaultNodes = []Node{
	{"gpu-h100-a", "h100-sxm-8"},
	{"gpu-h100-b", "h100-sxm-8"},
	{"gpu-a100-a", "a100-pcie-4"},
}

// Result is what the demo saw, for its test.
type Result struct {
	// Picture is where the story's picture was written ("" for none).
	Picture string
	// Act1, Act2 and Act3 map "namespace/pod" to its placement after each act.
	Act1, Act2, Act3 map[string]Placement
	// Evicted are the pods that act 2's reclaim removed.
	Evicted []string
	// Allocated1 and Allocated2 are each Queue's allocated GPUs (status)
	// after each act.
	Allocated1, Allocated2 map[string]resource.Quantity
	// JobWaiting are the Indexed Job's pods while its gang cannot start
	// whole (act 4), JobWhy what `kubectl tessera why` said of one of them,
	// and JobBound the same pods once room appeared.
	JobWaiting, JobBound map[string]Placement
	JobWhy               string
	// PyTorchWaiting, PyTorchWhy and PyTorchBound are the same for act 5's
	// PyTorchJob; PyTorchGroup is the group its pods were given.
	PyTorchWaiting, PyTorchBound map[string]Placement
	PyTorchWhy, PyTorchGroup     string
}

// Placement is where a pod landed, or why it waits.
type Placement struct {
	Node    string
	Devices []string // "pool/device" (+ " 20Gi" for a fraction)
	Pending string   // PodScheduled=False message when not bound
	Queue   string
	BoundAt time.Time // PodScheduled=True's transition (1 s resolution)
}

type demo struct {
	opts   Options
	start  time.Time
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	work   string // temp dir: tessera-node dirs, child logs
	procs  []*childproc.Process
	metric string // controller metrics address
	// tb stands in for a test's testing.TB when the demo calls the test
	// harness; its cleanups run at teardown.
	tb       *programTB
	operator *framework.Operator
	// opDone delivers startOperator's result; opErr keeps it.
	opDone  chan error
	opErr   error
	kubectl string // a kept demo's kubectl
}

// Run runs the whole demo and tears everything down before it returns.
func Run(ctx context.Context, opts Options) (res *Result, err error) {
	if opts.Out == nil {
		opts.Out = os.Stdout
	}
	if opts.Log == nil {
		opts.Log = opts.Out
	}
	// The training-operator starts in the background while the first acts
	// run, and logs as it goes: one lock for both writers.
	var mu sync.Mutex
	opts.Out, opts.Log = &lockedWriter{mu: &mu, w: opts.Out}, &lockedWriter{mu: &mu, w: opts.Log}
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes
	}
	d := &demo{opts: opts, start: time.Now(), tb: &programTB{}}
	// Short path: unix sockets are limited to 108 bytes.
	d.work, err = os.MkdirTemp("", "tdemo")
	if err != nil {
		return nil, err
	}
	defer func() {
		if werr := d.waitOperator(); werr != nil && err == nil {
			err = werr
		}
		d.teardown(err != nil)
		if err != nil {
			d.logf("failed: %v", err)
		}
	}()
	return d.run(ctx)
}

func (d *demo) logf(format string, args ...any) {
	fmt.Fprintf(d.opts.Log, "[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.opts.Out, format+"\n", args...) }

func (d *demo) run(ctx context.Context) (*Result, error) {
	if err := d.buildTessera(); err != nil {
		return nil, err
	}
	binDir := d.opts.BinDir
	if binDir == "" {
		d.logf("finding the control-plane binaries (a first build takes ~15 minutes, then cached in _cache/)")
		var err error
		if binDir, err = controlplane.FindBinDir(); err != nil {
			return nil, err
		}
	}
	if d.opts.Keep {
		if err := d.findKubectl(binDir); err != nil {
			return nil, err
		}
	}
	d.logf("starting the control plane: etcd, kube-apiserver, kube-controller-manager (binaries in %s)", binDir)
	cp, err := controlplane.New(controlplane.Options{BinDir: binDir}, func(string, ...any) {})
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	d.cp = cp
	d.logf("control plane up at %s", cp.APIServerURL)
	if d.client, err = kubernetes.NewForConfig(cp.AdminConfig); err != nil {
		return nil, err
	}
	if d.dyn, err = dynamic.NewForConfig(cp.AdminConfig); err != nil {
		return nil, err
	}
	if err := d.install(ctx); err != nil {
		return nil, err
	}
	if err := d.startNodes(ctx); err != nil {
		return nil, err
	}
	if err := d.startController(); err != nil {
		return nil, err
	}

	d.startOperatorAsync()
	res := &Result{}
	if d.opts.NoStory {
		if err := d.apply(ctx, func(name string) bool { return name < "02" }); err != nil {
			return nil, err
		}
		if err := d.waitOperator(); err != nil {
			return nil, err
		}
	} else {
		var w *watcher
		if d.opts.Picture != "" {
			w = d.watchQueues(ctx)
		}
		if err := d.story5(ctx, res); err != nil {
			return nil, err
		}
		if w != nil {
			if err := w.finish(d.opts.Picture); err != nil {
				return nil, err
			}
			res.Picture = d.opts.Picture
			d.say("\nThe queues over the run (GPUs allocated, fair share, quota, as the controller wrote them in each Queue's status): %s", d.opts.Picture)
		}
	}
	if d.opts.Keep {
		return res, d.keep(ctx)
	}
	return res, nil
}

// story5 runs the story's five acts.
func (d *demo) story5(ctx context.Context, res *Result) (err error) {
	d.say("\n════ Act 1: team-a has the cluster to itself ════")
	if err := d.apply(ctx, func(name string) bool { return name < "10" }); err != nil {
		return err
	}
	d.logf("waiting for tessera-controller to place the pods")
	if res.Act1, err = d.settle(ctx, nil); err != nil {
		return err
	}
	if res.Allocated1, err = d.story(ctx, res.Act1); err != nil {
		return err
	}

	d.say("\n════ Act 2: team-b arrives and wants its quota back ════")
	if err := d.apply(ctx, func(name string) bool { return name >= "10" && name < "20" }); err != nil {
		return err
	}
	d.logf("waiting for the reclaim: team-b's gang bound")
	if res.Act2, err = d.settle(ctx, []string{"team-b/vision-train-0", "team-b/vision-train-1", "team-b/vision-train-2"}); err != nil {
		return err
	}
	for pod := range res.Act1 {
		if _, ok := res.Act2[pod]; !ok {
			res.Evicted = append(res.Evicted, pod)
		}
	}
	sort.Strings(res.Evicted)
	if len(res.Evicted) > 0 {
		d.say("\nEvicted to give team-b its guaranteed GPUs (preemptible pods of queues above their quota; a queue never goes below it):")
		for _, p := range res.Evicted {
			d.say("  ✗ %-22s was on %s %s", p, res.Act1[p].Node, strings.Join(res.Act1[p].Devices, " "))
		}
	}
	if res.Allocated2, err = d.story(ctx, res.Act2); err != nil {
		return err
	}

	d.say("\n════ Act 3: team-b adds a 20Gi share through the device plugin, no claim ════")
	if err := d.apply(ctx, func(name string) bool { return name >= "20" && name < "30" }); err != nil {
		return err
	}
	d.logf("waiting for the device-plugin pod team-b/embed")
	if res.Act3, err = d.settle(ctx, []string{"team-b/embed"}); err != nil {
		return err
	}
	if _, err = d.story(ctx, res.Act3); err != nil {
		return err
	}
	if err := d.jobAct(ctx, res); err != nil {
		return err
	}
	if err := d.waitOperator(); err != nil {
		return err
	}
	return d.pytorchAct(ctx, res)
}

// buildTessera builds tessera-node, tessera-controller and the kubectl
// plugin unless given.
func (d *demo) buildTessera() error {
	if d.opts.TesseraBin != "" {
		// The children run in the work folder: a relative path would not do.
		abs, err := filepath.Abs(d.opts.TesseraBin)
		if err != nil {
			return err
		}
		d.opts.TesseraBin = abs
		for _, b := range []string{"tessera-node", "tessera-controller"} {
			if _, err := os.Stat(filepath.Join(d.opts.TesseraBin, b)); err != nil {
				return fmt.Errorf("--tessera-bin: %w", err)
			}
		}
		return nil
	}
	dir := filepath.Join(d.work, "bin")
	d.logf("building tessera-node, tessera-controller and kubectl-tessera (go build)")
	cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/tessera-gpu/tessera/cmd/tessera-node",
		"github.com/tessera-gpu/tessera/cmd/tessera-controller", "github.com/tessera-gpu/tessera/cmd/kubectl-tessera")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	d.opts.TesseraBin = dir
	return nil
}

// install puts in what the chart installs: CRDs, DeviceClasses,
// PriorityClasses, the default Queue and the controller's RBAC.
func (d *demo) install(ctx context.Context) error {
	d.logf("installing CRDs (Queue, PodGroup), DeviceClasses, PriorityClasses, RBAC")
	if err := framework.InstallCRDs(ctx, d.dyn); err != nil {
		return err
	}
	if err := framework.ApplyDeviceClasses(ctx, d.client); err != nil {
		return err
	}
	for _, pc := range []struct {
		name  string
		value int32
	}{{"tessera-train", 50}, {"tessera-build", 100}, {"tessera-inference", 125}} {
		_, err := d.client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
			ObjectMeta: metav1.ObjectMeta{Name: pc.name}, Value: pc.value,
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
	}
	if _, err := d.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rbac.Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	dc := discovery.NewDiscoveryClientForConfigOrDie(d.cp.AdminConfig)
	d.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	if err := d.applyYAML(ctx, "deploy/rbac/tessera-controller.yaml", rbac.ControllerYAML); err != nil {
		return err
	}
	// The chart's default Queue: no quota, no limit.
	return d.applyYAML(ctx, "default queue", []byte(`apiVersion: scheduling.tessera.dev/v1alpha1
kind: Queue
metadata: {name: default}
spec: {resources: {gpu: {quota: 0, limit: -1}}}
`))
}

// startNodes adds the kwok nodes and a tessera-node process for each.
func (d *demo) startNodes(ctx context.Context) error {
	d.logf("starting kwok (fake kubelets)")
	if err := d.tbCall(func(t testing.TB) { d.cp.StartKwok(t) }); err != nil {
		return err
	}
	var want int
	for _, n := range d.opts.Nodes {
		node, err := framework.FakeGPUNode(n.Name, n.Profile, map[string]string{"nvidia.com/gpu.present": "true"})
		if err != nil {
			return err
		}
		err = d.tbCall(func(t testing.TB) { d.cp.AddKwokNodeWith(t, node) })
		if err != nil {
			return err
		}
		// The node's own identity: the Node authorizer lets it write only
		// its own ResourceSlices, as a kubelet plugin may.
		var kubeconfig string
		if err := d.tbCall(func(t testing.TB) {
			kubeconfig = d.cp.WriteKubeconfig(t, d.cp.UserConfig("system:node:"+n.Name, "system:nodes"))
		}); err != nil {
			return err
		}
		p, err := d.startChild("tessera-node-"+n.Name, filepath.Join(d.opts.TesseraBin, "tessera-node"),
			framework.FakeTesseraNodeArgs(n.Name, n.Profile, kubeconfig, filepath.Join(d.work, n.Name))...)
		if err != nil {
			return err
		}
		d.logf("node %s: kwok node + tessera-node --fake-gpus=%s (pid %d)", n.Name, n.Profile, p.Cmd.Process.Pid)
		gpus := node.Status.Capacity[assignment.DefaultResourceGPU]
		want += int(gpus.Value())
	}
	d.logf("waiting for the ResourceSlices (%d GPUs)", want)
	return d.poll(ctx, 60*time.Second, "ResourceSlices", func() (bool, string) {
		sl, err := d.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Spec.Devices)
		}
		return n >= want, fmt.Sprintf("%d of %d devices published", n, want)
	})
}

// startController runs tessera-controller as its ServiceAccount, with the
// RBAC of deploy/rbac and leader election on.
func (d *demo) startController() error {
	user := "system:serviceaccount:" + rbac.Namespace + ":" + rbac.ServiceAccount
	var kubeconfig string
	if err := d.tbCall(func(t testing.TB) {
		kubeconfig = d.cp.WriteKubeconfig(t, d.cp.UserConfig(user, "system:serviceaccounts", "system:serviceaccounts:"+rbac.Namespace))
	}); err != nil {
		return err
	}
	metrics, err := framework.FreeAddr()
	if err != nil {
		return err
	}
	health, err := framework.FreeAddr()
	if err != nil {
		return err
	}
	d.metric = metrics
	p, err := d.startChild("tessera-controller", filepath.Join(d.opts.TesseraBin, "tessera-controller"),
		"--kubeconfig="+kubeconfig,
		"--leader-elect-namespace="+rbac.Namespace,
		"--metrics-bind-address="+metrics,
		"--health-probe-bind-address="+health,
		"--interval=1s",
		// Recent usage (kubectl tessera queues, tessera_queue_usage) within
		// the demo's minutes: 10-second buckets.
		"--usage-bucket=10s", "--usage-window=1h",
	)
	if err != nil {
		return err
	}
	d.logf("tessera-controller running as %s (pid %d, metrics http://%s/metrics)", user, p.Cmd.Process.Pid, metrics)
	return d.poll(context.Background(), 60*time.Second, "tessera-controller ready", func() (bool, string) {
		if done, _ := p.Exited(); done {
			return false, "exited"
		}
		resp, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// apply creates the example manifests whose file names pass keep, in name order.
func (d *demo) apply(ctx context.Context, keep func(string) bool) error {
	files, err := fs.Glob(examples.FS, "*.yaml")
	if err != nil {
		return err
	}
	sort.Strings(files)
	for _, f := range files {
		if !keep(f) {
			continue
		}
		data, err := examples.FS.ReadFile(f)
		if err != nil {
			return err
		}
		if err := d.applyYAML(ctx, "demo/examples/"+f, data); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) applyYAML(ctx context.Context, what string, data []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var made []string
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			d.mapper.Reset()
			if m, err = d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return fmt.Errorf("%s: %s: %w", what, gvk, err)
			}
		}
		var ri dynamic.ResourceInterface = d.dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ns := u.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = d.dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: creating %s %s: %w", what, gvk.Kind, u.GetName(), err)
		}
		made = append(made, strings.ToLower(gvk.Kind)+"/"+u.GetName())
	}
	d.logf("applied %s: %s", what, strings.Join(made, ", "))
	return nil
}

// settle waits until every pod of tessera-scheduler is bound or says why it
// waits, the pods named in need are bound, and nothing has changed for a
// few cycles; it returns the placements.
func (d *demo) settle(ctx context.Context, need []string) (map[string]Placement, error) {
	var last string
	stable := 0
	var out map[string]Placement
	err := d.poll(ctx, 3*time.Minute, "the pods to settle", func() (bool, string) {
		pl, err := d.placements(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range need {
			if pl[n].Node == "" {
				stable = 0
				return false, n + " not bound: " + pl[n].Pending
			}
		}
		var b strings.Builder
		for _, k := range sortedKeys(pl) {
			p := pl[k]
			if p.Node == "" && p.Pending == "" {
				stable = 0
				return false, k + " not looked at yet"
			}
			fmt.Fprintf(&b, "%s=%s %v %s;", k, p.Node, p.Devices, p.Pending)
		}
		if b.String() == last {
			stable++
		} else {
			stable, last = 0, b.String()
		}
		out = pl
		return stable >= 3, "placements still changing"
	})
	return out, err
}

func (d *demo) poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		for _, p := range d.procs {
			if done, werr := p.Exited(); done {
				return fmt.Errorf("%s exited (%v) while waiting for %s; its log:\n%s", p.Name, werr, what, p.Tail(30))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s: %s", timeout, what, msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// placements reads every tessera-scheduler pod and its claims' allocations.
func (d *demo) placements(ctx context.Context) (map[string]Placement, error) {
	pods, err := d.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]Placement{}
	for _, pod := range pods.Items {
		if pod.Spec.SchedulerName != "tessera-scheduler" || pod.DeletionTimestamp != nil {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		p := Placement{Node: pod.Spec.NodeName, Queue: pod.Labels["tessera.dev/queue"]}
		if p.Queue == "" {
			p.Queue = "default"
		}
		for _, c := range pod.Status.Conditions {
			if c.Type != corev1.PodScheduled {
				continue
			}
			if c.Status == corev1.ConditionTrue {
				p.BoundAt = c.LastTransitionTime.Time
			} else if p.Node == "" {
				p.Pending = c.Message
				if p.Pending == "" {
					p.Pending = c.Reason
				}
			}
		}
		if p.Node != "" {
			devs, err := d.devices(ctx, &pod)
			if err != nil {
				return nil, err
			}
			p.Devices = devs
		}
		out[key] = p
	}
	return out, nil
}

// devices lists the GPUs a bound pod's claims were allocated, or its
// device-plugin assignment gives it.
func (d *demo) devices(ctx context.Context, pod *corev1.Pod) ([]string, error) {
	var names []string
	if a, ok, err := assignment.Of(pod.Annotations); err != nil {
		return nil, err
	} else if ok {
		for _, g := range a.GPUs {
			s := draname.DeviceName(g)
			if a.IsShare() {
				s += " (" + resource.NewQuantity(a.MemoryBytes, resource.BinarySI).String() + " " + strings.ToUpper(a.Sharing) + ", device plugin)"
			} else {
				s += " (device plugin)"
			}
			names = append(names, s)
		}
	}
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue // not made (yet)
		}
		claim, err := d.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, err
		}
		if claim.Status.Allocation == nil {
			continue
		}
		mode := ""
		for _, r := range claim.Spec.Devices.Requests {
			if r.Exactly != nil && r.Exactly.DeviceClassName != draname.ClassExclusive {
				mode = strings.TrimSuffix(r.Exactly.DeviceClassName, "."+draname.Driver)
			}
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			s := r.Device
			if m, ok := r.ConsumedCapacity[draname.CapacityMemory]; ok && mode != "" {
				s += " (" + m.String() + " " + strings.ToUpper(mode) + ")"
			}
			names = append(names, s)
		}
	}
	return names, nil
}

// story prints where each pod landed, what waits and why, and the queues;
// it returns each queue's allocated GPUs.
func (d *demo) story(ctx context.Context, pl map[string]Placement) (map[string]resource.Quantity, error) {
	gpus, err := d.gpuInfo(ctx)
	if err != nil {
		return nil, err
	}
	d.say("\nWhere the pods run (GPUs from each pod's ResourceClaim allocation):")
	w := tabwriter.NewWriter(d.opts.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  POD\tQUEUE\tNODE\tGPUs")
	var pending []string
	for _, k := range sortedKeys(pl) {
		p := pl[k]
		if p.Node == "" {
			pending = append(pending, k)
			continue
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", k, p.Queue, p.Node, strings.Join(p.Devices, ", ")+gpus[p.Node])
	}
	w.Flush()
	if len(pending) > 0 {
		d.say("\nWaiting, and why (PodScheduled=False):")
		for _, k := range pending {
			d.say("  … %-22s %s", k, pl[k].Pending)
		}
	}
	qs, err := d.dyn.Resource(schema.GroupVersionResource{Group: "scheduling.tessera.dev", Version: "v1alpha1", Resource: "queues"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	allocated := map[string]resource.Quantity{}
	for _, q := range qs.Items {
		g, _, _ := unstructured.NestedMap(q.Object, "status", "resources", "gpu")
		if a, ok := g["allocated"].(string); ok {
			if v, err := resource.ParseQuantity(a); err == nil {
				allocated[q.GetName()] = v
			}
		}
	}
	// The operator's view, as the kubectl plugin prints it.
	clients := ctl.Clients{Kube: d.client, Dynamic: d.dyn}
	for _, cmd := range []string{"queues", "nodes"} {
		d.say("\n$ kubectl tessera %s", cmd)
		if err := ctl.Run(ctx, clients, []string{cmd}, d.opts.Out); err != nil {
			return nil, err
		}
	}
	if lines := d.metrics("tessera_binds_total", "tessera_evictions_total"); len(lines) > 0 {
		d.say("\ntessera-controller /metrics:")
		for _, l := range lines {
			d.say("  %s", l)
		}
	}
	return allocated, nil
}

// gpuInfo returns " — <product>" per node, from its ResourceSlices.
func (d *demo) gpuInfo(ctx context.Context) (map[string]string, error) {
	sl, err := d.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range sl.Items {
		if s.Spec.NodeName == nil {
			continue
		}
		for _, dev := range s.Spec.Devices {
			a := dev.Attributes[draname.AttrProductName]
			if a.StringValue != nil {
				out[*s.Spec.NodeName] = "  [" + *a.StringValue + "]"
			}
		}
	}
	return out, nil
}

// metrics returns the /metrics lines of the controller with these prefixes.
func (d *demo) metrics(prefixes ...string) []string {
	resp, err := http.Get("http://" + d.metric + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for _, p := range prefixes {
			if strings.HasPrefix(sc.Text(), p) {
				out = append(out, sc.Text())
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// teardown stops the children, then the control plane, and removes the
// temporary folder (kept, with the logs, when the demo failed).
func (d *demo) teardown(failed bool) {
	what := ""
	if d.operator != nil {
		what = d.operator.Name + ", "
	}
	d.logf("tearing down: %stessera-controller, tessera-node ×%d, kwok, control plane", what, max(len(d.procs)-1, 0))
	d.tb.runCleanups()
	for i := len(d.procs) - 1; i >= 0; i-- {
		d.procs[i].Stop(15 * time.Second)
	}
	if d.cp != nil {
		d.cp.Stop(failed)
	}
	if failed {
		d.logf("logs kept in %s", d.work)
		return
	}
	os.RemoveAll(d.work)
	d.logf("done: no processes left")
}

// startChild starts a process of the demo in its own process group, killed
// with the demo (Pdeathsig), its output in the work folder.
func (d *demo) startChild(name, binary string, args ...string) (*childproc.Process, error) {
	c, err := childproc.Start(d.work, name, binary, args, nil)
	if err != nil {
		return nil, err
	}
	d.procs = append(d.procs, c)
	return c, nil
}

// tbCall runs f, a harness helper written for tests, with a testing.TB
// whose Fatal ends f and turns into the returned error, and whose cleanups
// run at teardown.
func (d *demo) tbCall(f func(t testing.TB)) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fe, ok := r.(fatal); ok {
				err = errors.New(string(fe))
				return
			}
			panic(r)
		}
	}()
	f(d.tb)
	return nil
}

type fatal string

// lockedWriter serializes writes to w with mu (shared by Out and Log).
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// programTB is the part of testing.TB the harness's helpers use, for a
// program that is not a test: Fatal panics (tbCall recovers), Cleanup
// records what runCleanups runs.
type programTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

// Cleanup records f; runCleanups runs the recorded functions last first.
func (p *programTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *programTB) runCleanups() {
	p.mu.Lock()
	fs := p.cleanups
	p.cleanups = nil
	p.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func (*programTB) Helper()                        {}
func (*programTB) Logf(string, ...any)            {}
func (*programTB) Failed() bool                   { return false }
func (*programTB) Name() string                   { return "demo" }
func (*programTB) Fatalf(format string, a ...any) { panic(fatal(fmt.Sprintf(format, a...))) }
func (*programTB) Fatal(a ...any)                 { panic(fatal(fmt.Sprint(a...))) }
func (*programTB) Errorf(format string, a ...any) { panic(fatal(fmt.Sprintf(format, a...))) }
func (*programTB) Skip(a ...any)                  { panic(fatal(fmt.Sprint(a...))) }
func (*programTB) Skipf(format string, a ...any)  { panic(fatal(fmt.Sprintf(format, a...))) }
func (*programTB) TempDir() string                { d, _ := os.MkdirTemp("", "tdemo"); return d }
func (*programTB) Setenv(key, value string)       { os.Setenv(key, value) }
func (*programTB) Context() context.Context       { return context.Background() }
func (*programTB) Log(a ...any)                   {}
func (*programTB) Error(a ...any)                 { panic(fatal(fmt.Sprint(a...))) }
func (*programTB) FailNow()                       { panic(fatal("failed")) }
func (*programTB) Fail()                          { panic(fatal("failed")) }
func (*programTB) Skipped() bool                  { return false }
func (*programTB) SkipNow()                       { panic(fatal("skipped")) }
func (*programTB) Output() io.Writer              { return io.Discard }
func (*programTB) Attr(string, string)            {}
