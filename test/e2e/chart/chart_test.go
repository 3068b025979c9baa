// Package chart installs the Helm chart on the real node (test/realnode):
// images imported into its containerd, `helm install` into the test control
// plane, then tessera-node's DaemonSet pod registers with the real kubelet
// from its container, tessera-controller takes the Lease and serves its
// webhook with the chart's certificate, the demo's example pods run, an
// upgrade to a second build loses nothing, and an uninstall leaves nothing.
// See README.md.
package chart

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/crdapply"
	"github.com/tessera-gpu/tessera/test/framework"
)

const (
	driverName    = "gpu.tessera.dev"
	webhookSvc    = "tessera-controller-webhook"
	webhookSecret = "tessera-controller-webhook-tls"
	webhookConfig = "tessera-controller"
	// fakeGPUs is the number of GPUs of the fake profile in testdata/values.yaml.
	fakeGPUs = 8
	// shareSlots is the chart's default node.devicePlugin.shareSlots.
	shareSlots = 10
)

// TestChartOnRealNode is the whole story on one cluster, phase after
// phase; a phase that fails stops the ones after it.
func TestChartOnRealNode(t *testing.T) {
	began := time.Now()
	e := setup(t)
	phases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"install", testInstall},
		{"webhook", testWebhook},
		{"examples", testExamples},
		{"snapshot", testSnapshot},
		{"upgrade", testUpgrade},
		{"shadow", testShadow},
		{"uninstall", testUninstall},
	}
	for _, p := range phases {
		start := time.Now()
		ok := t.Run(p.name, func(t *testing.T) { p.run(t, e) })
		t.Logf("phase %s: %s", p.name, time.Since(start).Round(100*time.Millisecond))
		if !ok {
			t.Logf("node logs kept in %s", e.node.LogDir)
			break
		}
	}
	t.Logf("chart e2e: %s in all", time.Since(began).Round(time.Second))
}

// testInstall installs the chart and waits for the node to register and
// publish its GPUs and for the controller to lead.
func testInstall(t *testing.T, e *env) {
	// The CRDs are there already (applied by hand): the install works and
	// its hook takes them over.
	e.preCreateCRDs(t)
	out, err := e.runHelm(append([]string{"install", release, chartDir, "--namespace", namespace, "--create-namespace"}, e.helmValues(tagV1)...)...)
	require.NoError(t, err)
	t.Logf("helm install:\n%s", tailLines(out, 3))
	e.waitNodeAgent(t, tagV1, 3*time.Minute)
	e.waitRegistered(t, fullAllocatable, time.Minute)
	e.waitSlices(t, time.Minute)
	e.waitLeader(t, tagV1, 2*time.Minute)
	require.Contains(t, e.crdManagers(t, queueCRD), crdapply.FieldManager, "the install's CRD hook applied the CRDs")
	require.Empty(t, e.hookLeftovers(t), "the CRD hook's objects are deleted once it succeeded")
}

// waitNodeAgent waits for the DaemonSet's one pod, of the image tag, Ready.
func (e *env) waitNodeAgent(t *testing.T, tag string, timeout time.Duration) *corev1.Pod {
	var pod *corev1.Pod
	framework.Eventually(t, "the tessera-node pod Ready with tag "+tag, timeout, func() (bool, string) {
		pods := e.pods(t, "tessera-node")
		for i := range pods {
			p := &pods[i]
			if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) {
				continue
			}
			if ready(p) {
				pod = p
				return true, ""
			}
			return false, e.describe(t, p)
		}
		return false, fmt.Sprintf("%d tessera-node pods, none of tag %s", len(pods), tag)
	})
	return pod
}

// waitRegistered waits for the kubelet to list the device plugins'
// resources as want (GPUs held by claims are not offered): it does only once tessera-node registered through
// kubelet.sock and the kubelet reached the plugins' sockets, all through
// the chart's hostPath mounts. (The DRA plugin's registration shows when
// a claim is prepared, in testExamples.)
// fullAllocatable is what the device plugins offer with no GPU in use.
var fullAllocatable = map[corev1.ResourceName]int64{"nvidia.com/gpu": fakeGPUs, "tessera.dev/gpu-share": fakeGPUs * shareSlots}

func (e *env) waitRegistered(t *testing.T, want map[corev1.ResourceName]int64, timeout time.Duration) {
	framework.Eventually(t, "the kubelet to offer the device plugins' resources", timeout, func() (bool, string) {
		n, err := e.client.CoreV1().Nodes().Get(context.Background(), e.node.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for r, v := range want {
			q := n.Status.Allocatable[r]
			if q.Value() != v {
				return false, fmt.Sprintf("allocatable %s = %s, want %d", r, q.String(), v)
			}
		}
		return true, ""
	})
}

// waitSlices waits for the node's ResourceSlices to list every GPU.
func (e *env) waitSlices(t *testing.T, timeout time.Duration) {
	framework.Eventually(t, "tessera-node's ResourceSlices", timeout, func() (bool, string) {
		slices := e.slices(t)
		gpus := 0
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				if strings.HasPrefix(d.Name, "gpu-") {
					gpus++
				}
			}
		}
		return gpus == fakeGPUs, fmt.Sprintf("%d slices with %d GPUs", len(slices), gpus)
	})
}

func (e *env) slices(t *testing.T) []resourceapi.ResourceSlice {
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: "spec.driver=" + driverName})
	require.NoError(t, err)
	return list.Items
}

// waitLeader waits for a controller pod of tag to be Ready and to hold the
// Lease (its identity starts with the pod's name, its hostname).
func (e *env) waitLeader(t *testing.T, tag string, timeout time.Duration) {
	e.waitLeaderOf(t, "tessera-controller", tag, timeout)
}

// waitLeaderOf waits for a controller pod of tag to be Ready and to hold
// the Lease named lease (tessera-shadow in shadow mode).
func (e *env) waitLeaderOf(t *testing.T, leaseName, tag string, timeout time.Duration) {
	framework.Eventually(t, "a tessera-controller pod of tag "+tag+" holding the Lease "+leaseName, timeout, func() (bool, string) {
		lease, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), leaseName, metav1.GetOptions{})
		holder := ""
		if err == nil && lease.Spec.HolderIdentity != nil {
			holder = *lease.Spec.HolderIdentity
		}
		why := "lease holder " + holder
		for _, p := range e.pods(t, "tessera-controller") {
			if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) {
				continue
			}
			if !ready(&p) {
				return false, e.describe(t, &p)
			}
			if holder != "" && strings.HasPrefix(holder, p.Name) {
				return true, ""
			}
			why += ", not " + p.Name
		}
		return false, why
	})
}

// testWebhook checks the chart's certificate and that the API server
// calls the webhook with it: a pod in an opted-in namespace gets
// schedulerName tessera-scheduler. With another CA in the webhook
// configuration the same request fails, as it must without a valid
// certificate.
func testWebhook(t *testing.T, e *env) {
	ctx := context.Background()
	sec, err := e.client.CoreV1().Secrets(namespace).Get(ctx, webhookSecret, metav1.GetOptions{})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(sec.Data["ca.crt"]), "the Secret's ca.crt holds a certificate")
	block, _ := pem.Decode(sec.Data["tls.crt"])
	require.NotNil(t, block, "the Secret's tls.crt is PEM")
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	host := webhookSvc + "." + namespace + ".svc"
	_, err = cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool})
	require.NoError(t, err, "the serving certificate is valid for %s under the chart's CA", host)
	mwc, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhookConfig, metav1.GetOptions{})
	require.NoError(t, err)
	for _, w := range mwc.Webhooks {
		require.Equal(t, string(sec.Data["ca.crt"]), string(w.ClientConfig.CABundle), "webhook %s trusts the Secret's CA", w.Name)
	}
	t.Logf("webhook certificate: %s, valid until %s, CA %s", cert.Subject.CommonName, cert.NotAfter.Format(time.DateOnly), cert.Issuer.CommonName)

	_, err = e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "opted-in", Labels: map[string]string{"tessera.dev/scheduler": "enabled"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	e.waitMutated(t, "opted-in")

	// The same request with a CA the serving certificate does not chain to.
	orig := mwc.DeepCopy()
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.CABundle = otherCA(t)
	}
	_, err = e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mwc, metav1.UpdateOptions{})
	require.NoError(t, err)
	framework.Eventually(t, "the API server to refuse the webhook's certificate", 30*time.Second, func() (bool, string) {
		_, err := e.optInPod("opted-in")
		return err != nil && strings.Contains(err.Error(), "x509"), fmt.Sprintf("create: %v", err)
	})
	cur, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhookConfig, metav1.GetOptions{})
	require.NoError(t, err)
	orig.ResourceVersion = cur.ResourceVersion
	_, err = e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, orig, metav1.UpdateOptions{})
	require.NoError(t, err)
	e.waitMutated(t, "opted-in")
}

// waitMutated waits for the webhook to set a new pod's scheduler in ns.
func (e *env) waitMutated(t *testing.T, ns string) {
	framework.Eventually(t, "the webhook to set schedulerName", time.Minute, func() (bool, string) {
		p, err := e.optInPod(ns)
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.SchedulerName == "tessera-scheduler", "schedulerName " + p.Spec.SchedulerName
	})
}

// optInPod creates (dry run: admission runs, nothing is stored) a pod that
// names no scheduler.
func (e *env) optInPod(ns string) (*corev1.Pod, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: e.node.BusyboxImage}}}}
	return e.client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

// otherCA is a self-signed CA certificate (PEM) unrelated to the chart's.
func otherCA(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not-the-chart-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// allocatable is what the kubelet offers of the device plugins' resources.
func (e *env) allocatable(t *testing.T) map[corev1.ResourceName]int64 {
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), e.node.Name, metav1.GetOptions{})
	require.NoError(t, err)
	out := map[corev1.ResourceName]int64{}
	for r := range fullAllocatable {
		q := n.Status.Allocatable[r]
		out[r] = q.Value()
	}
	return out
}
