package chart

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tessera-gpu/tessera/internal/selfsigned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/internal/crdapply"
)

// certManagerModule is the cert-manager release whose CRDs the test
// installs (deploy/crds of its Go module, from the module proxy).
const certManagerModule = "github.com/cert-manager/cert-manager@v1.19.1"

// certManagerCRDs downloads cert-manager's module (cached by the go
// command) and returns the CRDs the chart uses.
func certManagerCRDs(t *testing.T) []*unstructured.Unstructured {
	out, err := exec.Command("go", "mod", "download", "-json", certManagerModule).Output()
	if err != nil {
		t.Skipf("cert-manager's CRDs come from its Go module %s, which the module proxy did not give: %v", certManagerModule, err)
	}
	var mod struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &mod))
	var crds []*unstructured.Unstructured
	for _, f := range []string{"cert-manager.io_issuers.yaml", "cert-manager.io_clusterissuers.yaml", "cert-manager.io_certificates.yaml", "cert-manager.io_certificaterequests.yaml"} {
		path := filepath.Join(mod.Dir, "deploy", "crds", f)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		c, err := crdapply.Parse(path, data)
		require.NoError(t, err)
		crds = append(crds, c...)
	}
	return crds
}

// TestChartCertManagerOnAPIServer installs the chart with
// controller.webhook.certManager.enabled on a real API server that has
// cert-manager's CRDs (so its Issuer and Certificate pass cert-manager's
// schemas), then plays cert-manager's two parts as they work: its
// controller issues the Certificate into the Secret it names (the
// SelfSigned issuer: the certificate is its own CA, in ca.crt), and its CA
// injector copies that ca.crt into every webhook's caBundle of the
// configuration annotated cert-manager.io/inject-ca-from. The controller's
// Deployment mounts that Secret, and the injected caBundle trusts the
// served certificate for the webhook Service's name. (cert-manager's own
// controller is not run: building it from its module takes too long here.)
func TestChartCertManagerOnAPIServer(t *testing.T) {
	helm(t)
	crds := certManagerCRDs(t)
	ctx, cp, client := releaseAPIServer(t)
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	require.NoError(t, err)
	require.NoError(t, crdapply.Apply(ctx, dyn, crds, time.Minute))

	out := runHelm(t, "template", "tessera", chartDir, "--namespace", namespace, "--include-crds",
		"-f", "../demo/kind/values.yaml", "--set", "controller.webhook.certManager.enabled=true")
	require.NotContains(t, out, "kind: Secret", "cert-manager makes the Secret, not Helm")
	createRendered(ctx, t, cp, out)

	// cert-manager's controller: issue the Certificate.
	certRes := schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}
	cert, err := dyn.Resource(certRes).Namespace(namespace).Get(ctx, "tessera-controller-webhook", metav1.GetOptions{})
	require.NoError(t, err)
	issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	iss, err := dyn.Resource(schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "issuers"}).Namespace(namespace).Get(ctx, issuer, metav1.GetOptions{})
	require.NoError(t, err, "the Certificate's Issuer is the chart's")
	_, selfSigned, _ := unstructured.NestedMap(iss.Object, "spec", "selfSigned")
	require.True(t, selfSigned)
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	crt, key := selfSignedCert(t, dnsNames)
	_, err = client.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: namespace,
			Annotations: map[string]string{"cert-manager.io/certificate-name": cert.GetName(), "cert-manager.io/issuer-name": issuer}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": crt},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// cert-manager's CA injector: inject-ca-from names the Certificate;
	// its Secret's ca.crt goes into every webhook's caBundle.
	mwc, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-controller", metav1.GetOptions{})
	require.NoError(t, err)
	from := mwc.Annotations["cert-manager.io/inject-ca-from"]
	require.Equal(t, namespace+"/"+cert.GetName(), from)
	for _, w := range mwc.Webhooks {
		require.Empty(t, w.ClientConfig.CABundle, "the chart leaves %s's caBundle to the injector", w.Name)
	}
	fromNS, fromName, _ := strings.Cut(from, "/")
	injected, err := dyn.Resource(certRes).Namespace(fromNS).Get(ctx, fromName, metav1.GetOptions{})
	require.NoError(t, err)
	injSecret, _, _ := unstructured.NestedString(injected.Object, "spec", "secretName")
	sec, err := client.CoreV1().Secrets(fromNS).Get(ctx, injSecret, metav1.GetOptions{})
	require.NoError(t, err)
	var ops []map[string]any
	for i := range mwc.Webhooks {
		ops = append(ops, map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), "value": sec.Data["ca.crt"]})
	}
	patch, err := json.Marshal(ops)
	require.NoError(t, err)
	mwc, err = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, mwc.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)

	// What the controller serves (the Deployment's Secret volume) is
	// trusted by what the API server was told, for the Service's name.
	dep, err := client.AppsV1().Deployments(namespace).Get(ctx, "tessera-controller", metav1.GetOptions{})
	require.NoError(t, err)
	var mounted string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			mounted = v.Secret.SecretName
		}
	}
	require.Equal(t, secretName, mounted, "the controller serves the Secret cert-manager writes")
	served, err := client.CoreV1().Secrets(namespace).Get(ctx, mounted, metav1.GetOptions{})
	require.NoError(t, err)
	block, _ := pem.Decode(served.Data["tls.crt"])
	require.NotNil(t, block)
	leaf, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	for _, w := range mwc.Webhooks {
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(w.ClientConfig.CABundle), "webhook %s has a caBundle", w.Name)
		host := w.ClientConfig.Service.Name + "." + w.ClientConfig.Service.Namespace + ".svc"
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
		require.NoError(t, err, "webhook %s trusts the served certificate for %s", w.Name, host)
	}
}

// selfSignedCert is what cert-manager's SelfSigned issuer makes: a
// certificate for dnsNames signed by its own key (internal/selfsigned, the
// chart's own generator, makes the same kind).
func selfSignedCert(t *testing.T, dnsNames []string) (crt, key []byte) {
	require.NotEmpty(t, dnsNames)
	crt, key, err := selfsigned.Generate(dnsNames[0], dnsNames...)
	require.NoError(t, err)
	return crt, key
}
