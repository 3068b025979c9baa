package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/driver"
	"github.com/tessera-gpu/tessera/driver/drivertest"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/internal/assignment"
	"github.com/tessera-gpu/tessera/internal/killpoint"
)

// restart starts tessera-node again after a kill: the dead process' sockets
// are removed first, as a new one would replace them, so the kubelet
// (register) waits for the new process' and not the stale ones.
func (e *nodeEnv) restart(t testing.TB, kubeconfig string, env []string, extraArgs ...string) *proc {
	t.Helper()
	_ = os.Remove(filepath.Join(e.registrar, "gpu.tessera.dev-reg.sock"))
	_ = os.Remove(filepath.Join(e.plugins, "dra.sock"))
	return e.spawn(t, kubeconfig, env, extraArgs...)
}

// killOp is what the kubelet asks when tessera-node dies.
type killOp int

const (
	opPrepare killOp = iota
	opUnprepare
	opReboot   // no call: the node reboots under a running tessera-node
	opAllocate // the device plugin's Allocate
)

func (o killOp) String() string {
	return [...]string{"prepare", "unprepare", "reboot", "allocate"}[o]
}

// killRow is one kill point of TestKillPoints.
type killRow struct {
	spec string // killpoint.Env: the point, #n for its n-th time
	op   killOp
	// left checks what the kill left behind, which shows that the process
	// died where the row says (and is what the restart must clean up).
	left func(t *testing.T, e *nodeEnv, subject string)
}

// TestKillPoints kills a tessera-node subprocess (SIGKILL, from a test hook,
// see internal/killpoint) at each point where it has something half-done,
// starts it again, lets the kubelet retry, and checks the node: every claim
// prepared exactly once (one checkpoint entry, one MPS daemon start), no CDI
// spec, MPS daemon or temp file without a claim, and the ledger equal to the
// API server's view. Then the kubelet unprepares everything and nothing may
// be left. The kubelet is played over the real sockets: plugin registration,
// then NodePrepareResources/NodeUnprepareResources on the DRA socket.
func TestKillPoints(t *testing.T) {
	c := cluster(t)
	client := c.Client(t)
	ns := "killpoints"
	c.CreateNamespace(t, ns)
	tempLeft := func(dir string) func(t *testing.T, e *nodeEnv, subject string) {
		return func(t *testing.T, e *nodeEnv, _ string) {
			assert.NotEmpty(t, tempFiles(t, dirOf(e, dir)), "the kill left a temp file in %s", dir)
		}
	}
	stateIs := func(state string) func(t *testing.T, e *nodeEnv, subject string) {
		return func(t *testing.T, e *nodeEnv, subject string) {
			ck := readCheckpoint(t, e)
			require.Contains(t, ck.Claims, subject)
			assert.Equal(t, state, ck.Claims[subject].State)
		}
	}
	rows := []killRow{
		{spec: killpoint.BeforePreparingSave, op: opPrepare, left: func(t *testing.T, e *nodeEnv, subject string) {
			assert.NotContains(t, readCheckpoint(t, e).Claims, subject, "nothing recorded yet")
		}},
		{spec: killpoint.CheckpointRename, op: opPrepare, left: tempLeft("plugins")},
		{spec: killpoint.AfterPreparingSave, op: opPrepare, left: stateIs(driver.StatePreparing)},
		{spec: killpoint.MPSBeforePIDFile, op: opPrepare, left: func(t *testing.T, e *nodeEnv, subject string) {
			stateIs(driver.StatePreparing)(t, e, subject)
			assert.Len(t, drivertest.Daemons(t, e.record)[gpu.FakeUUID(e.name, 3)], 1, "the daemon runs, known only by its pid file")
		}},
		{spec: killpoint.CDISpecWrite, op: opPrepare, left: tempLeft("cdi")},
		{spec: killpoint.BeforePreparedSave, op: opPrepare, left: stateIs(driver.StatePreparing)},
		{spec: killpoint.CheckpointRename + "#2", op: opPrepare, left: tempLeft("plugins")},
		{spec: killpoint.AfterPreparedSave, op: opPrepare, left: stateIs(driver.StatePrepared)},
		{spec: killpoint.UnprepareBeforeSave, op: opUnprepare, left: func(t *testing.T, e *nodeEnv, subject string) {
			stateIs(driver.StatePrepared)(t, e, subject)
			_, err := readSpecErr(e.cdi, subject)
			assert.True(t, os.IsNotExist(err), "undone: the CDI spec is gone")
		}},
		{spec: killpoint.CheckpointRename, op: opUnprepare, left: tempLeft("plugins")},
		{spec: killpoint.AfterUnprepareSave, op: opUnprepare, left: func(t *testing.T, e *nodeEnv, subject string) {
			assert.NotContains(t, readCheckpoint(t, e).Claims, subject)
		}},
		{spec: killpoint.AllocateAfterPreparingSave, op: opAllocate, left: func(t *testing.T, e *nodeEnv, pod string) {
			entry := readCheckpoint(t, e).DevicePlugin[pod]
			require.NotNil(t, entry)
			assert.Equal(t, driver.StatePreparing, entry.State)
		}},
		{spec: killpoint.AllocateBeforeSliceMark, op: opAllocate, left: func(t *testing.T, e *nodeEnv, pod string) {
			entry := readCheckpoint(t, e).DevicePlugin[pod]
			require.NotNil(t, entry)
			assert.Equal(t, driver.StatePrepared, entry.State)
		}},
		{spec: "reboot", op: opReboot},
	}
	for i, row := range rows {
		t.Run(row.op.String()+"/"+strings.ReplaceAll(row.spec, "#", "-"), func(t *testing.T) {
			e := newNodeEnv(t, fmt.Sprintf("kill-%d", i), "h100-sxm-8")
			c.AddKwokNode(t, e.name, nil)
			removeNodeAtEnd(t, client, e.name)
			if row.op == opAllocate {
				runAllocateRow(t, client, c.KubeconfigPath, e, ns, row)
				return
			}
			runKillRow(t, client, c.KubeconfigPath, e, ns, row)
		})
	}
}

func runKillRow(t *testing.T, client kubernetes.Interface, kubeconfig string, e *nodeEnv, ns string, row killRow) {
	subject := createAllocatedClaim(t, client, drivertest.Claim(ns, e.name+"-subject", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-3", "20Gi"),
	}, drivertest.Strategy("MPS")))
	bystander := createAllocatedClaim(t, client, drivertest.Claim(ns, e.name+"-bystander", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-5", "10Gi"),
	}, drivertest.Strategy("MPS")))
	uid := string(subject.UID)
	gpu3 := gpu.FakeUUID(e.name, 3)

	// 1. A healthy tessera-node prepares what the node had before.
	p := e.restart(t, kubeconfig, nil)
	k := register(t, e.registrar)
	k.mustPrepare(t, bystander)
	if row.op != opPrepare {
		k.mustPrepare(t, subject)
	}
	if row.op == opReboot {
		// 2. The node reboots: every process dies, tmpfs (CDI specs, MPS
		// pipe directories) is empty, the boot ID is new.
		require.NoError(t, p.cmd.Process.Kill())
		require.Error(t, p.wait(t, 30*time.Second))
		drivertest.KillDaemons(t, e.record)
		for _, dir := range []string{e.cdi, e.mpsRoot} {
			require.NoError(t, os.RemoveAll(dir))
		}
		require.NoError(t, os.WriteFile(e.bootID, []byte("boot-after-reboot-"+e.name+"\n"), 0o644))
	} else {
		p.stop(t)
		// 2. Killed at the point, in the middle of the kubelet's call.
		p = e.restart(t, kubeconfig, []string{killpoint.Env + "=" + row.spec})
		p.waitOutput(t, "Test kill point armed", 30*time.Second)
		k = register(t, e.registrar)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		if row.op == opPrepare {
			_, err = k.prepare(ctx, subject)
		} else {
			err = k.unprepare(ctx, subject)
		}
		cancel()
		require.Error(t, err, "the process dies mid-call")
		point, _, _ := strings.Cut(row.spec, "#")
		p.killed(t, point)
		if row.left != nil {
			row.left(t, e, uid)
		}
	}

	// 3. Restart; the kubelet retries its call (after a reboot it prepares
	// the claims of the node's pods again).
	p = e.restart(t, kubeconfig, nil)
	k = register(t, e.registrar)
	want := []*resourceapi.ResourceClaim{bystander}
	switch row.op {
	case opPrepare, opReboot:
		res := k.mustPrepare(t, subject)
		res2 := k.mustPrepare(t, subject)
		ck := readCheckpoint(t, e).Claims[uid]
		require.NotNil(t, ck)
		require.Len(t, res[uid].Devices, 1)
		assert.Equal(t, []string{ck.Devices[0].CDIDeviceID}, res[uid].Devices[0].CdiDeviceIds)
		assert.Equal(t, res[uid].Devices[0].CdiDeviceIds, res2[uid].Devices[0].CdiDeviceIds)
		want = append(want, subject)
		starts := 1
		if row.op == opReboot {
			starts = 2 // before the reboot, and after it
		}
		assert.Equal(t, starts, count(drivertest.Record(t, e.record), "start_"+gpu3), "prepared exactly once: one MPS daemon start per boot")
	case opUnprepare:
		k.mustUnprepare(t, subject)
	}
	checkNode(t, client, e, want...)

	// 4. The kubelet unprepares everything: nothing may stay.
	k.mustUnprepare(t, subject, bystander)
	checkNode(t, client, e)
	p.stop(t)
	if t.Failed() {
		t.Logf("MPS stand-in record: %v", drivertest.Record(t, e.record))
	}
}

// unprepare is NodeUnprepareResources for claims; an error of the call or
// of a claim is returned.
func (k *kubelet) unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) error {
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, pbClaim(c))
	}
	resp, err := k.dra.NodeUnprepareResources(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for uid, r := range resp.Claims {
		if r.GetError() != "" {
			return fmt.Errorf("claim %s: %s", uid, r.GetError())
		}
	}
	return nil
}

// checkNode checks the node agrees with want, the claims it must hold
// prepared: the ledger holds exactly them, prepared, and the API server has
// each of them (same UID) allocated on this node; each has its CDI spec and
// no other spec exists; each GPU with MPS claims has one live MPS daemon,
// the one its pid file names, and no other GPU has any; no temp file is
// left in the checkpoint or CDI directory.
func checkNode(t *testing.T, client kubernetes.Interface, e *nodeEnv, want ...*resourceapi.ResourceClaim) {
	t.Helper()
	checkNodeWith(t, client, e, want, nil)
}

// checkNodeWith is checkNode with device-plugin pods: the ledger holds
// exactly pods' entries too, prepared, each pod exists in the API server
// with that UID, and each has its CDI spec.
func checkNodeWith(t *testing.T, client kubernetes.Interface, e *nodeEnv, want []*resourceapi.ResourceClaim, pods []*corev1.Pod) {
	t.Helper()
	ck := readCheckpoint(t, e)
	mpsGPUs := map[string]bool{}
	var wantUIDs, gotUIDs, wantPods, gotPods []string
	for _, c := range want {
		wantUIDs = append(wantUIDs, string(c.UID))
	}
	for _, p := range pods {
		wantPods = append(wantPods, string(p.UID))
	}
	for uid, entry := range ck.DevicePlugin {
		gotPods = append(gotPods, uid)
		assert.Equal(t, driver.StatePrepared, entry.State, "pod %s/%s", entry.Namespace, entry.Name)
		live, err := client.CoreV1().Pods(entry.Namespace).Get(context.Background(), entry.Name, metav1.GetOptions{})
		if assert.NoError(t, err, "the ledger's pod %s/%s exists", entry.Namespace, entry.Name) {
			assert.Equal(t, uid, string(live.UID), "the ledger's pod %s/%s is the API server's", entry.Namespace, entry.Name)
		}
		for _, dev := range entry.Devices {
			if dev.Strategy == "MPS" {
				mpsGPUs[dev.GPUUUID] = true
			}
		}
	}
	sort.Strings(wantPods)
	sort.Strings(gotPods)
	assert.Equal(t, wantPods, gotPods, "device-plugin entries of the ledger")
	for uid, cl := range ck.Claims {
		gotUIDs = append(gotUIDs, uid)
		assert.Equal(t, driver.StatePrepared, cl.State, "claim %s/%s", cl.Namespace, cl.Name)
		live, err := client.ResourceV1().ResourceClaims(cl.Namespace).Get(context.Background(), cl.Name, metav1.GetOptions{})
		if assert.NoError(t, err, "the ledger's claim %s/%s exists", cl.Namespace, cl.Name) {
			assert.Equal(t, uid, string(live.UID), "the ledger's claim %s/%s is the API server's", cl.Namespace, cl.Name)
			assert.True(t, allocatedOn(live, e.name), "the ledger's claim %s/%s is allocated on %s", cl.Namespace, cl.Name, e.name)
		}
		for _, dev := range cl.Devices {
			if dev.Strategy == "MPS" {
				mpsGPUs[dev.GPUUUID] = true
			}
		}
	}
	sort.Strings(wantUIDs)
	sort.Strings(gotUIDs)
	assert.Equal(t, wantUIDs, gotUIDs, "claims of the ledger")
	specs := append(slices.Clone(wantUIDs), wantPods...)
	sort.Strings(specs)
	assert.Equal(t, specs, specUIDs(t, e.cdi), "CDI specs")
	daemons := drivertest.Daemons(t, e.record)
	for i := range 8 {
		uuid := gpu.FakeUUID(e.name, i)
		if !mpsGPUs[uuid] {
			assert.Empty(t, daemons[uuid], "no MPS daemon on gpu-%d", i)
			continue
		}
		if assert.Len(t, daemons[uuid], 1, "one MPS daemon on gpu-%d", i) {
			pidFile, err := os.ReadFile(filepath.Join(e.mpsRoot, uuid, "pipe", "nvidia-cuda-mps-control.pid"))
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprint(daemons[uuid][0]), strings.TrimSpace(string(pidFile)), "the daemon of gpu-%d is the one its pid file names", i)
		}
	}
	assert.Empty(t, tempFiles(t, e.plugins), "temp files in the checkpoint directory")
	assert.Empty(t, tempFiles(t, e.cdi), "temp files in the CDI directory")
}

func allocatedOn(c *resourceapi.ResourceClaim, node string) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == driver.DriverName && r.Pool == node {
			return true
		}
	}
	return false
}

// specUIDs lists the claim UIDs of the CDI specs in root.
func specUIDs(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "gpu.tessera.dev-claim_") && strings.HasSuffix(name, ".json") {
			uids = append(uids, strings.TrimSuffix(strings.TrimPrefix(name, "gpu.tessera.dev-claim_"), ".json"))
		}
	}
	sort.Strings(uids)
	return uids
}

// tempFiles lists the files in dir whose name marks a temp file (ours,
// ".<name>.tmp-*", or the CDI library's "spec.*.tmp").
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			out = append(out, e.Name())
		}
	}
	return out
}

func dirOf(e *nodeEnv, which string) string {
	if which == "cdi" {
		return e.cdi
	}
	return e.plugins
}

func count(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if l == s {
			n++
		}
	}
	return n
}

// runAllocateRow is a kill row of the device plugin: a pod bound by
// kube-scheduler gets one whole GPU (gpu-2) through Allocate on the
// nvidia.com/gpu socket, and tessera-node dies in the middle. After the
// restart and the kubelet's retried Allocate the pod holds its GPU exactly
// once, with its CDI spec and the GPU's mark in the ResourceSlice (taint
// and pod UID); the
// pod's deletion releases all of it.
func runAllocateRow(t *testing.T, client kubernetes.Interface, kubeconfig string, e *nodeEnv, ns string, row killRow) {
	bg := context.Background()
	dpKubelet := e.startDevicePluginKubelet(t)
	bystander := createAllocatedClaim(t, client, drivertest.Claim(ns, e.name+"-bystander", "", []resourceapi.DeviceRequestAllocationResult{
		drivertest.Result("gpu", e.name, "gpu-5", "10Gi"),
	}, drivertest.Strategy("MPS")))
	pod, err := client.CoreV1().Pods(ns).Create(bg, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: e.name + "-pod"},
		Spec: corev1.PodSpec{NodeName: e.name, Containers: []corev1.Container{{Name: "c", Image: "busybox",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{assignment.DefaultResourceGPU: resource.MustParse("1")}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	uid := string(pod.UID)
	gpu2 := gpu.FakeUUID(e.name, 2)

	p := e.restart(t, kubeconfig, nil)
	register(t, e.registrar).mustPrepare(t, bystander)
	p.stop(t)

	p = e.restart(t, kubeconfig, []string{killpoint.Env + "=" + row.spec})
	p.waitOutput(t, "Test kill point armed", 30*time.Second)
	whole := e.wholeClient(t, dpKubelet)
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	_, err = allocateIDs(ctx, whole, gpu2)
	cancel()
	require.Error(t, err, "the process dies mid-call")
	p.killed(t, row.spec)
	if row.left != nil {
		row.left(t, e, uid)
	}

	p = e.restart(t, kubeconfig, nil)
	k := register(t, e.registrar)
	whole = e.wholeClient(t, dpKubelet)
	ctx, cancel = context.WithTimeout(bg, 30*time.Second)
	resp, err := allocateIDs(ctx, whole, gpu2)
	cancel()
	require.NoError(t, err, "the kubelet's retried Allocate")
	entry := readCheckpoint(t, e).DevicePlugin[uid]
	require.NotNil(t, entry)
	require.Len(t, resp.CdiDevices, 1)
	assert.Equal(t, entry.CDIDeviceIDs(), []string{resp.CdiDevices[0].Name})
	assert.Equal(t, []string{gpu2}, entry.DeviceIDs, "the GPU is held once")
	checkNodeWith(t, client, e, []*resourceapi.ResourceClaim{bystander}, []*corev1.Pod{pod})
	// The slice mark: the taint, and the pod the kubelet gave the GPU to.
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		held, _ := dpTaints(s)
		return held["gpu-2"] == driver.TaintValueWhole && dpPods(s)["gpu-2"] == uid
	})

	require.NoError(t, client.CoreV1().Pods(ns).Delete(bg, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	require.Eventually(t, func() bool { return len(readCheckpoint(t, e).DevicePlugin) == 0 }, 30*time.Second, 50*time.Millisecond)
	k.mustUnprepare(t, bystander)
	checkNode(t, client, e)
	waitSlices(t, client, e.name, 30*time.Second, func(s []resourceapi.ResourceSlice) bool {
		held, _ := dpTaints(s)
		return held["gpu-2"] == "" && dpPods(s)["gpu-2"] == ""
	})
	p.stop(t)
}

// wholeClient waits until the whole-GPU plugin registered with k and
// returns a client of its socket.
func (e *nodeEnv) wholeClient(t testing.TB, k *devicePluginKubelet) pluginapi.DevicePluginClient {
	t.Helper()
	require.Eventually(t, func() bool { return k.endpoint(assignment.DefaultResourceGPU) != "" }, 30*time.Second, 20*time.Millisecond)
	return pluginapi.NewDevicePluginClient(dial(t, filepath.Join(e.devicePlugins, k.endpoint(assignment.DefaultResourceGPU))))
}
