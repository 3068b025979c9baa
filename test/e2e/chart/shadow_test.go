package chart

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/debugapi"
	"github.com/tessera-gpu/tessera/test/framework"
)

// shadowNS holds the pods kube-scheduler places for the shadow phase; the
// shadow controller takes only this namespace's pods, so the report is
// about them alone.
const shadowNS = "shadow-demo"

// The shadow phase's pods, both kube-scheduler's: one runs on a whole GPU,
// one waits for a GPU model the node lacks.
var (
	shadowRunning = examplePod{ns: shadowNS, name: "ks-gpu"}
	shadowWaiting = examplePod{ns: shadowNS, name: "ks-b200"}
)

// testShadow turns the release into shadow mode (`helm upgrade` with
// controller.shadow.enabled: the controller pod now runs as tessera-shadow
// with its Lease tessera-shadow) and reads its report with `kubectl tessera
// shadow` (the plugin's binary, a token-only kubeconfig) through the
// plugin's port-forward to the shadow pod's debug port. A user bound to the
// chart's tessera-shadow-reader only is told to bind
// tessera-shadow-portforward; bound to both and nothing else, the report
// comes over WebSocket (audit log: get 101) and says what kube-scheduler's
// two pods imply: one running where Tessera would put it, one pending for
// both, a GPU held in the namespace's queue.
func testShadow(t *testing.T, e *env) {
	out, err := e.runHelm(append([]string{"upgrade", release, chartDir, "--namespace", namespace}, e.helmValues(tagV2,
		"--set", "controller.shadow.enabled=true", "--set", "controller.shadow.namespaces={"+shadowNS+"}")...)...)
	require.NoError(t, err)
	t.Logf("helm upgrade to shadow mode:\n%s", tailLines(out, 3))
	e.waitLeaderOf(t, debugapi.Shadow.Lease, tagV2, 2*time.Minute)
	framework.Eventually(t, "one tessera-controller pod", 2*time.Minute, func() (bool, string) {
		n := len(e.pods(t, "tessera-controller"))
		return n == 1, fmt.Sprintf("%d pods", n)
	})
	e.createShadowPods(t)
	defer e.deletePods(t, []examplePod{shadowRunning, shadowWaiting})
	e.runPods(t, []examplePod{{ns: shadowNS, name: shadowRunning.name, gpus: 1}})

	nobody := e.debugUser(t, "shadow-nobody", debugapi.Shadow.ReaderRole)
	out, err = e.plugin(t, nobody, "shadow", "-o", "json")
	require.Error(t, err, "shadow without the port-forward Role: %s", out)
	require.Contains(t, out, "bind the Role "+debugapi.Shadow.PortForwardRole+" in "+namespace)

	user := e.debugUser(t, "shadow-user", debugapi.Shadow.ReaderRole)
	e.bindRole(t, debugapi.Shadow.PortForwardRole, "shadow-user")
	var rep kube.ShadowReport
	framework.Eventually(t, "kubectl tessera shadow's report of both pods", 2*time.Minute, func() (bool, string) {
		out, err := e.plugin(t, user, "shadow", "-o", "json")
		if err != nil {
			return false, out
		}
		rep = kube.ShadowReport{}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		return rep.Pods == 2, out
	})
	pf := e.portForwards(t, "shadow-user")
	require.Equal(t, "get 101", pf[len(pf)-1], "the chart Role's user's port-forwards (verb, code): %v", pf)
	checkShadowReport(t, &rep)
}

// checkShadowReport: what kube-scheduler's two pods imply on the one node.
func checkShadowReport(t *testing.T, rep *kube.ShadowReport) {
	running, waiting := shadowNS+"/"+shadowRunning.name, shadowNS+"/"+shadowWaiting.name
	require.Equal(t, []int{2, 1, 1, 1, 1}, []int{rep.Pods, rep.Running, rep.Pending, rep.WouldPlace, rep.Agree},
		"pods, running, pending, would place, agree")
	require.Empty(t, rep.Moved)
	require.Empty(t, rep.LeftPending)
	require.Empty(t, rep.WouldStart)
	require.Len(t, rep.StillPending, 1)
	require.Equal(t, waiting, rep.StillPending[0].Pod)
	require.NotEmpty(t, rep.StillPending[0].Reason)
	q, ok := rep.Queues[shadowNS]
	require.True(t, ok, "the namespace is the queue: %+v", rep.Queues)
	require.Equal(t, int64(1000), q.AllocatedGPUMilli, "%s holds one GPU", running)
	require.Equal(t, int64(1000), q.WouldAllocateGPUMilli, "Tessera would give it one GPU")
	t.Logf("shadow report: %d pods (%d running, %d pending), Tessera places %d, %d where they run; %s waits: %q",
		rep.Pods, rep.Running, rep.Pending, rep.WouldPlace, rep.Agree, waiting, rep.StillPending[0].Reason)
}

// createShadowPods creates kube-scheduler's two pods and their claim
// templates in shadowNS.
func (e *env) createShadowPods(t *testing.T) {
	ctx := context.Background()
	_, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shadowNS}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, p := range []struct {
		pod examplePod
		cel string
	}{{shadowRunning, ""}, {shadowWaiting, `device.attributes["gpu.tessera.dev"].productName == "NVIDIA B200"`}} {
		tmpl := gpuTemplate(shadowNS, p.pod.name, p.cel)
		_, err := e.client.ResourceV1().ResourceClaimTemplates(shadowNS).Create(ctx, tmpl, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = e.client.CoreV1().Pods(shadowNS).Create(ctx, e.gpuPod(p.pod, "", tmpl.Name), metav1.CreateOptions{})
		require.NoError(t, err)
	}
}
