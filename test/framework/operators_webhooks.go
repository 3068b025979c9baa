package framework

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// webhookPKI is a CA and a serving cert for one controller's webhook server.
// The names are those its own cert rotator would use (CA "<x>-ca", server
// "<service>.<namespace>.svc"), so a rotator seeded with them keeps them;
// the server cert also names 127.0.0.1, the host of the webhook URLs.
type webhookPKI struct {
	caPEM, caKeyPEM, certPEM, keyPEM []byte
}

// rotatorNames are the CA and service DNS names of the controllers whose
// cert rotator checks them (their cmd's defaults and namespaces).
var rotatorNames = map[string][2]string{
	TrainingOperator: {"training-operator-ca", "training-operator.kubeflow.svc"},
	Trainer:          {"kubeflow-trainer-ca", "kubeflow-trainer-controller-manager.kubeflow-system.svc"},
}

// newWebhookPKI issues the certs; valid for a year because the rotators
// replace anything expiring within 90 days.
func newWebhookPKI(name, addr string) (*webhookPKI, error) {
	names, ok := rotatorNames[name]
	if !ok {
		names = [2]string{name + "-ca", name + "-webhook-service." + name + "-system.svc"}
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("webhook address %q: %w", addr, err)
	}
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: []string{names[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("self-signing the %s webhook CA: %w", name, err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: names[1]},
		DNSNames: []string{names[1]}, IPAddresses: []net.IP{net.ParseIP(host)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the %s webhook cert: %w", name, err)
	}
	return &webhookPKI{
		caPEM: pemBlock("CERTIFICATE", caDER), certPEM: pemBlock("CERTIFICATE", der),
		caKeyPEM: rsaKeyPEM(caKey), keyPEM: rsaKeyPEM(key),
	}, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// rsaKeyPEM writes "RSA PRIVATE KEY" (PKCS #1): the cert rotators parse
// their CA key only in that form.
func rsaKeyPEM(k *rsa.PrivateKey) []byte {
	return pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k))
}

// kustomization is the part of a release's webhook kustomization.yaml that
// says what it ships: the manifests and the JSON patches applied to them.
type kustomization struct {
	Resources []string `json:"resources"`
	Patches   []struct {
		Path   string `json:"path"`
		Target struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"target"`
	} `json:"patches"`
}

var webhookGVR = map[string]schema.GroupVersionResource{
	"MutatingWebhookConfiguration":   {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"},
	"ValidatingWebhookConfiguration": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"},
}

// applyWebhooks creates the webhook configurations of a release's webhook
// folder as its kustomization builds them (its patches applied), each
// webhook's Service replaced by url + the Service's path, trusting caPEM.
// Configurations the release leaves generically named get the controller's
// name as prefix, as its own install does.
func applyWebhooks(ctx context.Context, dyn dynamic.Interface, name, dir, url string, caPEM []byte) error {
	objs, err := loadWebhookConfigs(dir)
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		return fmt.Errorf("%s holds no webhook configuration", dir)
	}
	for _, u := range objs {
		if strings.HasSuffix(u.GetName(), "-webhook-configuration") {
			u.SetName(name + "-" + u.GetName())
		}
		if err := pointWebhooksAt(u, url, caPEM); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		_, err := dyn.Resource(webhookGVR[u.GetKind()]).Create(ctx, u, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// A controller started again in the same cluster: its new
			// address and CA replace the old ones.
			var old *unstructured.Unstructured
			if old, err = dyn.Resource(webhookGVR[u.GetKind()]).Get(ctx, u.GetName(), metav1.GetOptions{}); err == nil {
				u.SetResourceVersion(old.GetResourceVersion())
				_, err = dyn.Resource(webhookGVR[u.GetKind()]).Update(ctx, u, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// webhookPaths are the paths of every webhook the release's configurations
// in dir call.
func webhookPaths(dir string) ([]string, error) {
	objs, err := loadWebhookConfigs(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, u := range objs {
		hooks, _, err := unstructured.NestedSlice(u.Object, "webhooks")
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		for _, h := range hooks {
			if m, ok := h.(map[string]any); ok {
				if path, _, _ := unstructured.NestedString(m, "clientConfig", "service", "path"); path != "" {
					paths = append(paths, path)
				}
			}
		}
	}
	return paths, nil
}

func loadWebhookConfigs(dir string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, res := range k.Resources {
		docs, err := readYAMLDocs(filepath.Join(dir, res))
		if err != nil {
			return nil, err
		}
		for _, u := range docs {
			if _, ok := webhookGVR[u.GetKind()]; ok {
				objs = append(objs, u)
			}
		}
	}
	for _, p := range k.Patches {
		raw, err := os.ReadFile(filepath.Join(dir, p.Path))
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Path, err)
		}
		patch, err := jsonpatch.DecodePatch(js)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Path, err)
		}
		for i, u := range objs {
			if u.GetKind() != p.Target.Kind || (p.Target.Name != "" && u.GetName() != p.Target.Name) {
				continue
			}
			if objs[i], err = applyJSONPatch(u, patch); err != nil {
				return nil, fmt.Errorf("%s on %s: %w", p.Path, u.GetName(), err)
			}
		}
	}
	return objs, nil
}

func applyJSONPatch(u *unstructured.Unstructured, patch jsonpatch.Patch) (*unstructured.Unstructured, error) {
	doc, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	out, err := patch.Apply(doc)
	if err != nil {
		return nil, err
	}
	res := &unstructured.Unstructured{}
	return res, json.Unmarshal(out, &res.Object)
}

func pointWebhooksAt(u *unstructured.Unstructured, url string, caPEM []byte) error {
	hooks, _, err := unstructured.NestedSlice(u.Object, "webhooks")
	if err != nil {
		return err
	}
	for i, h := range hooks {
		m, ok := h.(map[string]any)
		if !ok {
			return fmt.Errorf("webhook %d is not an object", i)
		}
		path, _, _ := unstructured.NestedString(m, "clientConfig", "service", "path")
		if path == "" {
			return fmt.Errorf("webhook %v has no service path", m["name"])
		}
		m["clientConfig"] = map[string]any{"url": url + path, "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
		hooks[i] = m
	}
	return unstructured.SetNestedSlice(u.Object, hooks, "webhooks")
}

// readYAMLDocs decodes every non-empty document of a YAML file.
func readYAMLDocs(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// InstallCRDsFrom creates every CRD in the YAML files of dir (a controller's
// crds/ folder), leaving ones that exist already (JobSet's serves both
// JobSet and trainer), and waits until the API server serves them.
func InstallCRDsFrom(ctx context.Context, dyn dynamic.Interface, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRD in %s", dir)
	}
	var names []string
	for _, f := range files {
		docs, err := readYAMLDocs(f)
		if err != nil {
			return err
		}
		for _, u := range docs {
			if u.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if _, err := dyn.Resource(CRDGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating CRD %s: %w", u.GetName(), err)
			}
			names = append(names, u.GetName())
		}
	}
	for _, name := range names {
		for !established(ctx, dyn, name) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
