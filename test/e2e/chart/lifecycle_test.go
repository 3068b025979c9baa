package chart

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/sharing"
	"github.com/tessera-gpu/tessera/test/framework"
)

// podState is what must not change about a running pod across an upgrade.
type podState struct {
	uid      string
	started  time.Time
	restarts int32
}

// snapshot is the node's prepared state at one moment.
type snapshot struct {
	pods     map[string]podState // ns/name
	claims   map[string]string   // claim UID -> ns/name, of the running pods
	prepares map[string]int      // claim UID -> NodePrepareResources calls (kubelet log)
	unprep   map[string]int      // claim UID -> NodeUnprepareResources calls
	cdi      map[string]string   // CDI spec file -> sha256 of its content
}

func (e *env) snapshot(t *testing.T, pods []examplePod) snapshot {
	ctx := context.Background()
	s := snapshot{pods: map[string]podState{}, claims: map[string]string{}, cdi: map[string]string{}}
	for _, p := range pods {
		pod, err := e.client.CoreV1().Pods(p.ns).Get(ctx, p.name, metav1.GetOptions{})
		require.NoError(t, err)
		require.Len(t, pod.Status.ContainerStatuses, 1)
		cs := pod.Status.ContainerStatuses[0]
		require.NotNil(t, cs.State.Running, "%s/%s is not running: %s", p.ns, p.name, e.describe(t, pod))
		s.pods[p.ns+"/"+p.name] = podState{uid: string(pod.UID), started: cs.State.Running.StartedAt.Time, restarts: cs.RestartCount}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			c, err := e.client.ResourceV1().ResourceClaims(p.ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			require.NoError(t, err)
			s.claims[string(c.UID)] = p.ns + "/" + c.Name
		}
		for _, rc := range pod.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil {
				c, err := e.client.ResourceV1().ResourceClaims(p.ns).Get(ctx, *rc.ResourceClaimName, metav1.GetOptions{})
				require.NoError(t, err)
				s.claims[string(c.UID)] = p.ns + "/" + c.Name
			}
		}
	}
	s.prepares, s.unprep = e.kubeletCalls(t, s.claims)
	ents, err := os.ReadDir(e.node.CDIDir)
	require.NoError(t, err)
	for _, ent := range ents {
		b, err := os.ReadFile(filepath.Join(e.node.CDIDir, ent.Name()))
		require.NoError(t, err)
		sum := sha256.Sum256(b)
		s.cdi[ent.Name()] = hex.EncodeToString(sum[:8])
	}
	return s
}

// kubeletCalls counts the kubelet's NodePrepareResources and
// NodeUnprepareResources calls per claim UID, from its log
// (--vmodule=dra_plugin=4 logs each call with its request).
func (e *env) kubeletCalls(t *testing.T, claims map[string]string) (prep, unprep map[string]int) {
	b, err := os.ReadFile(filepath.Join(e.node.LogDir, "kubelet.log"))
	require.NoError(t, err)
	prep, unprep = map[string]int{}, map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		var m map[string]int
		switch {
		case strings.Contains(l, "Calling NodePrepareResources rpc"):
			m = prep
		case strings.Contains(l, "Calling NodeUnprepareResources rpc"):
			m = unprep
		default:
			continue
		}
		for uid := range claims {
			if strings.Contains(l, uid) {
				m[uid]++
			}
		}
	}
	return prep, unprep
}

// errNoSeries: the metric has no series (a vector with none set).
var errNoSeries = errors.New("no series of metric")

// nodeMetric reads one metric (summed over its series) of the tessera-node pod at its pod IP
// (the node's bridge is reachable from the host).
func (e *env) nodeMetric(t *testing.T, ip, name string) (float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + ip + ":8080/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	// The sum over the metric's series (labelled or not).
	sum, found := 0.0, false
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return 0, fmt.Errorf("metric %s: %w", f[0], err)
			}
			sum, found = sum+v, true
		}
	}
	if !found {
		return 0, fmt.Errorf("%w %s", errNoSeries, name)
	}
	return sum, nil
}

// testUpgrade upgrades the release to the second build with the sharing
// pods running: the pods keep running in the same containers, and the
// kubelet neither unprepares nor prepares their claims again; the new
// tessera-node adopts them (its prepared-claims gauge) and prepares a new
// claim.
func testUpgrade(t *testing.T, e *env) {
	before := e.snapshot(t, sharingPods)
	require.NotEmpty(t, before.claims)
	require.NotEmpty(t, before.cdi, "CDI specs of the prepared claims")
	old := e.waitNodeAgent(t, tagV1, time.Minute)
	daemons := mpsDaemons(t)
	require.NotEmpty(t, daemons, "MPS daemons of the chat pair under %s", mpsRoot)
	offered := e.allocatable(t)
	// The new chart's Queue CRD has one more field: Helm does not upgrade
	// crds/, the chart's pre-upgrade hook does.
	newChart := changedChart(t)
	require.False(t, e.servedField(t), "the field is new")
	upgradeAt := time.Now()
	out, err := e.runHelm(append([]string{"upgrade", release, newChart, "--namespace", namespace}, e.helmValues(tagV2)...)...)
	require.NoError(t, err)
	t.Logf("helm upgrade:\n%s", tailLines(out, 3))
	require.True(t, e.servedField(t), "the upgrade's CRD change reached the API server")
	require.Empty(t, e.hookLeftovers(t), "the CRD hook's objects are deleted once it succeeded")
	t.Logf("CRD %s has spec.%s after the upgrade (the pre-upgrade hook applied it)", queueCRD, probeField)
	agent := e.waitNodeAgent(t, tagV2, 3*time.Minute)
	require.NotEqual(t, old.UID, agent.UID, "the DaemonSet replaced its pod")
	e.waitRegistered(t, offered, time.Minute)
	e.waitSlices(t, time.Minute)
	e.waitLeader(t, tagV2, 2*time.Minute)
	// The new tessera-node adopted every prepared claim.
	e.waitPrepared(t, len(before.claims))
	// A claim is prepared by the new build: its DRA plugin registered.
	all := e.readManifests(t)
	e.apply(t, all, "03-team-a-sweep.yaml", "sweep-1")
	e.runPods(t, []examplePod{{"team-a", "sweep-1", "", 1}})

	after := e.snapshot(t, sharingPods)
	t.Logf("across the upgrade (%s → %s, at %s):", tagV1, tagV2, upgradeAt.Format(time.TimeOnly))
	for uid, name := range before.claims {
		t.Logf("  claim %-22s NodePrepareResources calls %d → %d, NodeUnprepareResources %d → %d",
			name, before.prepares[uid], after.prepares[uid], before.unprep[uid], after.unprep[uid])
		// A claim two pods share may be prepared once per pod start.
		require.NotZero(t, before.prepares[uid], "claim %s prepared before the upgrade", name)
		require.Equal(t, before.prepares[uid], after.prepares[uid], "claim %s prepared again", name)
		require.Zero(t, after.unprep[uid], "claim %s unprepared", name)
	}
	now := time.Now()
	for name, b := range before.pods {
		a := after.pods[name]
		t.Logf("  pod %-14s up %s before the upgrade, %s after (container started %s both times: %t; restarts %d → %d)",
			name, upgradeAt.Sub(b.started).Round(time.Second), now.Sub(a.started).Round(time.Second),
			b.started.Format(time.TimeOnly), a.started.Equal(b.started), b.restarts, a.restarts)
		require.Equal(t, b, a, "pod %s is the same pod with the same container", name)
	}
	for f, sum := range before.cdi {
		require.Equal(t, sum, after.cdi[f], "CDI spec %s unchanged", f)
	}
	// The MPS daemons live in tessera-mps, which the upgrade leaves alone.
	for gpu, pid := range daemons {
		t.Logf("  MPS daemon of %s: pid %s before the upgrade, %s after", gpu, pid, mpsDaemons(t)[gpu])
	}
	require.Equal(t, daemons, mpsDaemons(t), "the MPS daemons are the same processes after the upgrade")
}

// mpsRoot is the chart's default node.sharing.mpsRoot.
const mpsRoot = "/run/tessera/mps"

// mpsDaemons is each GPU's MPS daemon pid whose process is alive, by GPU
// UUID, read from the pid files the daemons write.
func mpsDaemons(t *testing.T) map[string]string {
	files, err := filepath.Glob(filepath.Join(mpsRoot, "*", "pipe", sharing.PIDFile))
	require.NoError(t, err)
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		pid := strings.TrimSpace(string(data))
		if _, err := os.Stat(filepath.Join("/proc", pid)); err == nil {
			out[filepath.Base(filepath.Dir(filepath.Dir(f)))] = pid
		}
	}
	return out
}

// testUninstall deletes the GPU pods (what an admin does first, see
// README.md), uninstalls the release and checks that nothing of Tessera's
// is left on the node or in the API.
func testUninstall(t *testing.T, e *env) {
	pods := append(append([]examplePod{}, sharingPods...), examplePod{"team-a", "sweep-1", "", 1})
	e.deletePods(t, pods)
	e.waitPrepared(t, 0)
	e.waitNodeMetric(t, "tessera_node_deviceplugin_pods", 0)
	out, err := e.runHelm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "3m")
	require.NoError(t, err)
	t.Logf("helm uninstall:\n%s", tailLines(out, 3))
	framework.Eventually(t, "no tessera pods", 2*time.Minute, func() (bool, string) {
		n := len(e.pods(t, "tessera-node")) + len(e.pods(t, "tessera-controller"))
		return n == 0, fmt.Sprintf("%d pods", n)
	})
	framework.Eventually(t, "no MPS daemon left", time.Minute, func() (bool, string) {
		d := mpsDaemons(t)
		return len(d) == 0, fmt.Sprintf("alive: %v", d)
	})
	framework.Eventually(t, "no ResourceSlices of "+driverName, 2*time.Minute, func() (bool, string) {
		n := len(e.slices(t))
		return n == 0, fmt.Sprintf("%d slices", n)
	})
	framework.Eventually(t, "no CDI specs", time.Minute, func() (bool, string) {
		left := leftovers(e.node.CDIDir)
		return len(left) == 0, strings.Join(left, ", ")
	})
	// tessera-node saw its DaemonSet deleted and removed its checkpoint,
	// lock and plugin directory; tessera-mps removed the MPS directories;
	// the sockets went with the plugins.
	var left []string
	left = append(left, leftovers(filepath.Join(e.node.PluginsDir, driverName), mpsRoot)...)
	for _, dir := range []string{e.node.PluginRegistryDir, e.node.DevicePluginsDir} {
		for _, f := range leftovers(dir) {
			if strings.Contains(filepath.Base(f), "tessera") {
				left = append(left, f)
			}
		}
	}
	// Helm never deletes CRDs (nor the hook): the Queues and PodGroups stay.
	require.NotEmpty(t, e.crdManagers(t, queueCRD), "the CRDs outlive the uninstall")
	t.Logf("left on the node after uninstall: %v", left)
	require.Empty(t, left, "nothing of Tessera's left on the node")
	_, err = os.Stat(filepath.Join(e.node.PluginsDir, driverName))
	require.True(t, os.IsNotExist(err), "the plugin directory is gone: %v", err)
}

// leftovers lists what is in dirs (an absent dir holds nothing).
func leftovers(dirs ...string) []string {
	var left []string
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			left = append(left, fmt.Sprintf("%s: %v", dir, err))
		}
		for _, ent := range ents {
			left = append(left, filepath.Join(dir, ent.Name()))
		}
	}
	return left
}
