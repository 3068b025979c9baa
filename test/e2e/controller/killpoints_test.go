package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// gpuMemory is the memory of every GPU addGPUNode publishes.
var gpuMemory = resource.MustParse("80Gi")

// staleGang is the --stale-gang-timeout of the kill-point replicas: a gang
// left below minMember must be evicted within it (plus a few cycles).
const staleGang = 10 * time.Second

// killEnv is one kill-point case's world: its namespace, what it created,
// and the pods that may legitimately be gone at the end (victims).
type killEnv struct {
	cp      *controlplane.ControlPlane
	client  kubernetes.Interface
	dyn     dynamic.Interface
	ns      string
	node    string
	pods    []string
	victims map[string]bool
	// devicePlugin: the pods get GPUs through the device plugin, no claims.
	devicePlugin bool
}

// killCase kills the controller (a real process) at a commit hook point.
// workload creates what makes the commit reach the point; atKill checks,
// after the exit, that the cluster is in the state that point leaves (so
// the case tests what it says); done says when the restarted controller
// has finished.
type killCase struct {
	name     string
	point    kube.HookPoint
	workload func(t *testing.T, e *killEnv)
	atKill   func(t *testing.T, e *killEnv)
	done     func(e *killEnv) (bool, string)
}

// TestControllerKillPoints kills tessera-controller (exit at a commit hook
// point: nothing runs after it, as with SIGKILL) between a claim's
// allocation and the binding, between two pods of a DRA gang and of a
// device-plugin gang, and in the middle of an eviction plan; then restarts
// it (as its kubelet would). After each: the restarted leader finishes or
// rolls back; no device is over its capacity across claims and
// device-plugin assignments; no gang is half-bound (see checkGangs); no pod
// is lost (only eviction victims may be gone).
func TestControllerKillPoints(t *testing.T) {
	cases := []killCase{
		{
			name: "claim allocated, pod not bound", point: kube.HookAfterClaims,
			workload: func(t *testing.T, e *killEnv) {
				createTemplate(t, e.client, e.ns, "one-gpu", 1)
				e.createPod(t, "solo", "", e.draPod)
			},
			atKill: func(t *testing.T, e *killEnv) { e.wantBound(t, 0) },
			done:   func(e *killEnv) (bool, string) { return e.allBound() },
		},
		{
			name: "DRA gang between binds", point: kube.HookBetweenBinds,
			workload: func(t *testing.T, e *killEnv) {
				createTemplate(t, e.client, e.ns, "one-gpu", 1)
				e.createGroup(t, "gang", 3)
				for i := range 3 {
					e.createPod(t, fmt.Sprintf("gang-%d", i), "gang", e.draPod)
				}
			},
			atKill: func(t *testing.T, e *killEnv) { e.wantBound(t, 1) },
			done:   func(e *killEnv) (bool, string) { return e.allBound() },
		},
		{
			name: "device-plugin gang between binds", point: kube.HookBetweenBinds,
			workload: func(t *testing.T, e *killEnv) {
				e.devicePlugin = true
				e.advertiseDevicePluginGPUs(t, 4)
				e.createGroup(t, "dpgang", 3)
				for i := range 3 {
					e.createPod(t, fmt.Sprintf("dpgang-%d", i), "dpgang", e.dpPod)
				}
			},
			atKill: func(t *testing.T, e *killEnv) { e.wantBound(t, 1) },
			done:   func(e *killEnv) (bool, string) { return e.gangsSettled() },
		},
		{
			name: "mid eviction plan", point: kube.HookMidEvictions,
			workload: func(t *testing.T, e *killEnv) {
				createTemplate(t, e.client, e.ns, "one-gpu", 1)
				createTemplate(t, e.client, e.ns, "four-gpus", 4)
				for i := range 4 {
					e.createPod(t, fmt.Sprintf("low-%d", i), "", e.draPodWith("one-gpu", "test-low"))
					e.victims[fmt.Sprintf("low-%d", i)] = true
				}
				eventually(t, "the low-priority pods bound", 60*time.Second, func() (bool, string) {
					n := countBound(t, e.client, e.ns)
					return n == 4, fmt.Sprintf("%d bound", n)
				})
				e.createPod(t, "big", "", e.draPodWith("four-gpus", "test-high"))
			},
			atKill: func(t *testing.T, e *killEnv) {
				gone := 0
				for p := range e.victims {
					if _, err := e.client.CoreV1().Pods(e.ns).Get(t.Context(), p, metav1.GetOptions{}); err != nil {
						gone++
					}
				}
				if gone == 0 || gone == len(e.victims) {
					t.Fatalf("%d of %d victims gone at the kill, want some but not all", gone, len(e.victims))
				}
			},
			done: func(e *killEnv) (bool, string) { return e.podBound("big") },
		},
	}
	cp := cluster(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newKillEnv(t, cp, fmt.Sprintf("kill-%d", i))
			runKillCase(t, e, tc)
		})
	}
}

func newKillEnv(t *testing.T, cp *controlplane.ControlPlane, name string) *killEnv {
	client := cp.Client(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	e := &killEnv{cp: cp, client: client, dyn: dyn, ns: cp.CreateNamespace(t, name).Name, node: name + "-node", victims: map[string]bool{}}
	t.Cleanup(func() { deletePods(t, client, e.ns) })
	addGPUNode(t, cp, e.node, 4)
	return e
}

func runKillCase(t *testing.T, e *killEnv, tc killCase) {
	ctx := t.Context()
	hook := kube.EnvTestCommitHook + "=" + string(tc.point) + "=" + kube.HookExit
	args := []string{"--workers=1", "--stale-gang-timeout=" + staleGang.String()}
	c := framework.StartController(t, e.cp, framework.ControllerOptions{Name: "kill-" + e.ns, Args: args, Env: []string{hook}})
	c.WaitLeader(t, 60*time.Second)
	tc.workload(t, e)
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	code, err := c.Wait(waitCtx)
	if err != nil || code != 3 {
		t.Fatalf("the controller did not exit at %s (code %d, %v); last lines:\n%s", tc.point, code, err, c.Tail(30))
	}
	tc.atKill(t, e)
	e.checkInvariants(t, false)

	began := time.Now()
	if err := c.RestartWithEnv([]string{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted controller finishes", 90*time.Second, func() (bool, string) {
		ok, msg := tc.done(e)
		if ok {
			ok, msg = e.gangsSettled()
		}
		return ok, msg
	})
	t.Logf("%s: settled %v after the restart", tc.point, time.Since(began).Round(100*time.Millisecond))
	e.checkInvariants(t, true)
}

// draPod is a one-GPU DRA pod pinned to the case's node.
func (e *killEnv) draPod(name string) *v1.Pod { return e.draPodWith("one-gpu", "")(name) }

func (e *killEnv) draPodWith(template, priorityClass string) func(string) *v1.Pod {
	return func(name string) *v1.Pod {
		p := gpuPod(e.ns, name, template)
		p.Spec.NodeSelector = map[string]string{v1.LabelHostname: e.node}
		p.Spec.PriorityClassName = priorityClass
		return p
	}
}

// dpPod is a device-plugin pod (one nvidia.com/gpu) pinned to the node.
func (e *killEnv) dpPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1.PodSpec{
			SchedulerName: kube.SchedulerName, TerminationGracePeriodSeconds: ptr.To(int64(0)),
			NodeSelector: map[string]string{v1.LabelHostname: e.node},
			Containers: []v1.Container{{
				Name: "c", Image: "busybox",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("1")}},
			}},
		},
	}
}

func (e *killEnv) createPod(t *testing.T, name, group string, make func(string) *v1.Pod) {
	t.Helper()
	p := make(name)
	if group != "" {
		p.Annotations = map[string]string{kube.AnnotationPodGroup: group}
	}
	if _, err := e.client.CoreV1().Pods(e.ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	e.pods = append(e.pods, name)
}

func (e *killEnv) createGroup(t *testing.T, name string, minMember int64) {
	t.Helper()
	createUnstructured(t, e.dyn, map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec":     map[string]any{"minMember": minMember},
	})
}

// advertiseDevicePluginGPUs makes the node advertise n nvidia.com/gpu, as
// tessera-node's device plugin would.
func (e *killEnv) advertiseDevicePluginGPUs(t *testing.T, n int64) {
	t.Helper()
	node, err := e.client.CoreV1().Nodes().Get(t.Context(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Capacity[assignment.DefaultResourceGPU] = *resource.NewQuantity(n, resource.DecimalSI)
	node.Status.Allocatable[assignment.DefaultResourceGPU] = *resource.NewQuantity(n, resource.DecimalSI)
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *killEnv) listPods(ctx context.Context) (map[string]*v1.Pod, error) {
	l, err := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]*v1.Pod{}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp == nil {
			out[l.Items[i].Name] = &l.Items[i]
		}
	}
	return out, nil
}

func (e *killEnv) wantBound(t *testing.T, n int) {
	t.Helper()
	if got := countBound(t, e.client, e.ns); got != n {
		t.Fatalf("%d pods bound at the kill, want %d", got, n)
	}
}

func (e *killEnv) podBound(name string) (bool, string) {
	p, err := e.client.CoreV1().Pods(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	return p.Spec.NodeName != "", name + " not bound"
}

// allBound: every pod the case created that is not a victim is bound.
func (e *killEnv) allBound() (bool, string) {
	pods, err := e.listPods(context.Background())
	if err != nil {
		return false, err.Error()
	}
	var waiting []string
	for _, name := range e.pods {
		if p := pods[name]; !e.victims[name] && (p == nil || p.Spec.NodeName == "") {
			waiting = append(waiting, name)
		}
	}
	return len(waiting) == 0, fmt.Sprintf("not bound: %v", waiting)
}

// gangsSettled: every PodGroup of the namespace has either no member bound
// or at least minMember bound. A gang may pass through a half-bound state
// (a kill between its binds); it must leave it — completed by adoption or
// its bound members evicted by the stale-gang rule — within the
// stale-gang timeout plus a few cycles, which the caller's eventually
// bounds.
func (e *killEnv) gangsSettled() (bool, string) {
	ctx := context.Background()
	groups, err := e.dyn.Resource(podGroupGVR).Namespace(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	pods, err := e.listPods(ctx)
	if err != nil {
		return false, err.Error()
	}
	for _, g := range groups.Items {
		minMember, _, _ := unstructured.NestedInt64(g.Object, "spec", "minMember")
		bound := 0
		for _, p := range pods {
			if p.Annotations[kube.AnnotationPodGroup] == g.GetName() && p.Spec.NodeName != "" {
				bound++
			}
		}
		if bound > 0 && int64(bound) < minMember {
			return false, fmt.Sprintf("gang %s half-bound: %d of minMember %d", g.GetName(), bound, minMember)
		}
	}
	return true, ""
}

// checkInvariants: no device over its capacity across DRA claims and
// device-plugin assignments (cluster-wide), and no pod lost (every pod the
// case made exists, victims aside). final adds what must hold once the
// controller has finished: each allocated claim of the namespace reserved
// for one bound pod on its node, and every bound pod with its claim.
func (e *killEnv) checkInvariants(t *testing.T, final bool) {
	t.Helper()
	checkDevices(t, e.client)
	pods, err := e.listPods(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range e.pods {
		if pods[name] == nil && !e.victims[name] {
			t.Errorf("pod %s was lost", name)
		}
	}
	if final && !e.devicePlugin {
		checkAllocations(t, e.client, e.ns, gpuMemory)
	}
}

// checkDevices fails t when a GPU is given beyond its memory across every
// allocated claim and every bound device-plugin pod's assignment (a whole
// GPU takes all of it).
func checkDevices(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	used := map[string]int64{}
	users := map[string][]string{}
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			mem := gpuMemory.Value()
			if q, ok := r.ConsumedCapacity["memory"]; ok {
				mem = q.Value()
			}
			k := r.Pool + "/" + r.Device
			used[k] += mem
			users[k] = append(users[k], "claim "+c.Namespace+"/"+c.Name)
		}
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		a, ok, err := assignment.Of(p.Annotations)
		if !ok || err != nil || p.Spec.NodeName == "" {
			continue
		}
		for _, g := range a.GPUs {
			mem := gpuMemory.Value()
			if a.IsShare() {
				mem = a.MemoryBytes
			}
			k := fmt.Sprintf("%s/gpu-%d", p.Spec.NodeName, g)
			used[k] += mem
			users[k] = append(users[k], "pod "+p.Namespace+"/"+p.Name)
		}
	}
	var over []string
	for k, m := range used {
		if m > gpuMemory.Value() {
			over = append(over, fmt.Sprintf("%s (%d bytes) to %v", k, m, users[k]))
		}
	}
	slices.Sort(over)
	if len(over) > 0 {
		t.Errorf("doubled devices:\n%s", strings.Join(over, "\n"))
	}
}

// TestControllerAPIServerRestart kills kube-apiserver (SIGKILL) under two
// controller replicas (real processes) in the middle of a stream of pods,
// and keeps it down longer than the renew deadline: the leader cannot
// renew, stops writing (its commits are fenced once the deadline passes)
// and exits; the test restarts every replica that exited, as a kubelet
// would. Once the API server is back a replica leads again and schedules
// the rest: every pod bound with its claim, no device doubled, no pod lost.
func TestControllerAPIServerRestart(t *testing.T) {
	cp := cluster(t)
	e := newKillEnv(t, cp, "apirestart")
	createTemplate(t, e.client, e.ns, "one-gpu", 1)
	var replicas []*framework.Controller
	for _, name := range []string{"apirestart-a", "apirestart-b"} {
		replicas = append(replicas, framework.StartController(t, cp, framework.ControllerOptions{Name: name}))
	}
	eventually(t, "a leader", 60*time.Second, func() (bool, string) {
		for _, r := range replicas {
			if r.IsLeader() {
				return true, ""
			}
		}
		return false, "no replica leads"
	})
	const total = 8 // the node has 4 GPUs: half the pods must wait
	for i := range total / 2 {
		e.createPod(t, fmt.Sprintf("p-%d", i), "", e.draPod)
	}
	down := framework.ControllerRenewDeadline + 2*time.Second
	if err := cp.StopAPIServer(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(down)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	restarts := 0
	for _, r := range replicas {
		if done, code := r.Exited(); done {
			t.Logf("%s exited with %d while the API server was down; restarting it", r.Name, code)
			restarts++
			if err := r.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := total / 2; i < total; i++ {
		e.createPod(t, fmt.Sprintf("p-%d", i), "", e.draPod)
	}
	// Four fit on the node's four GPUs; the others wait.
	eventually(t, "four pods bound, four waiting", 90*time.Second, func() (bool, string) {
		n := countBound(t, e.client, e.ns)
		return n == 4, fmt.Sprintf("%d bound", n)
	})
	e.checkInvariants(t, true)
	if restarts == 0 {
		t.Errorf("no replica exited during a %v outage: the leader should give up after its renew deadline %v", down, framework.ControllerRenewDeadline)
	}
}
