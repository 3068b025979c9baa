package framework

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/test/controlplane"
)

// EnvOperatorsDir names the folder hack/build-operators.sh prints: a link
// <name> to each controller's cache folder (binary, crds/, webhook/). `make
// test` sets it, so the script runs once per run.
const EnvOperatorsDir = "TESSERA_OPERATORS_DIR"

// The workload controllers hack/build-operators.sh builds, by the name of
// their folder under test/tools.
const (
	TrainingOperator = "training-operator" // Kubeflow training-operator v1 (PyTorchJob, ...)
	KubeRay          = "kuberay"           // KubeRay's ray-operator (RayCluster, RayJob, RayService)
	JobSet           = "jobset"            // JobSet
	LWS              = "lws"               // LeaderWorkerSet
	Trainer          = "trainer"           // Kubeflow trainer v2 (TrainJob, through JobSet)
)

// Operator is a workload controller running as a process beside the control
// plane, as the admin, leader election off, its health port and webhook
// server on free loopback ports.
type Operator struct {
	*controlplane.Child
	// Dir is its cache folder: the binary, crds/, webhook/ (and runtimes/).
	Dir string
	// HealthAddr serves /healthz and /readyz; WebhookAddr its webhooks
	// (empty when the test does not use them).
	HealthAddr, WebhookAddr string

	cp *controlplane.ControlPlane
}

var (
	operatorsOnce sync.Once
	operatorsDir  string
	operatorsErr  error
)

// OperatorsDir is $TESSERA_OPERATORS_DIR, else what hack/build-operators.sh
// prints (it builds the controllers on first use, a few minutes each). It
// skips the test under -short.
func OperatorsDir(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the workload controllers built by hack/build-operators.sh and a real control plane; skipped with -short")
	}
	if dir := os.Getenv(EnvOperatorsDir); dir != "" {
		return dir
	}
	operatorsOnce.Do(func() { operatorsDir, operatorsErr = runOperatorsBuild() })
	if operatorsErr != nil {
		t.Fatalf("workload controllers: %v", operatorsErr)
	}
	return operatorsDir
}

// FindOperatorsDir is OperatorsDir for a program (the local demo): the
// folder linking to the controllers named, $TESSERA_OPERATORS_DIR when it
// holds them all, else built by hack/build-operators.sh — only those named,
// each cached by version.
func FindOperatorsDir(names ...string) (string, error) {
	if dir := os.Getenv(EnvOperatorsDir); dir != "" {
		missing := false
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n, n)); err != nil {
				missing = true
			}
		}
		if !missing {
			return dir, nil
		}
	}
	return runOperatorsBuild(names...)
}

func runOperatorsBuild(names ...string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "hack", "build-operators.sh")
	cmd := exec.Command(script, names...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr // a cold build takes minutes; show its progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("running %s %s: %w", script, strings.Join(names, " "), err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// moduleRoot walks up from the working directory (go test runs in the
// package's folder) to Tessera's go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
			strings.Contains(string(data), "module github.com/tessera-gpu/tessera\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no Tessera go.mod above %s; set %s", wd, EnvOperatorsDir)
		}
	}
}

// operatorSetup is what one controller needs besides the common parts.
type operatorSetup struct {
	args, env []string
	// webhooks: apply the release's webhook configurations, pointed at the
	// process by URL.
	webhooks bool
	// fixedCertDir: the controller writes its serving certs to
	// /tmp/k8s-webhook-server/serving-certs whatever it is told, so only one
	// such process may run on the machine at a time.
	fixedCertDir bool
}

// StartOperator installs the CRDs of controller name (one of the constants
// above) from its module, starts it and waits until it is ready and, where
// it needs them, its webhooks answer through the API server. It is stopped
// at t's cleanup.
func StartOperator(t testing.TB, cp *controlplane.ControlPlane, name string) *Operator {
	t.Helper()
	return StartOperatorIn(t, cp, OperatorsDir(t), name)
}

// StartOperatorIn is StartOperator with the controllers' folder given
// (FindOperatorsDir), for a program that is not a test.
func StartOperatorIn(t testing.TB, cp *controlplane.ControlPlane, operatorsDir, name string) *Operator {
	t.Helper()
	dir := filepath.Join(operatorsDir, name)
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is not built (run hack/build-operators.sh %s): %v", name, name, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	if err := InstallCRDsFrom(ctx, dyn, filepath.Join(dir, "crds")); err != nil {
		t.Fatalf("%s CRDs: %v", name, err)
	}
	op := &Operator{Dir: dir, HealthAddr: mustFreePort(t), WebhookAddr: mustFreePort(t), cp: cp}
	pki, err := newWebhookPKI(name, op.WebhookAddr)
	if err != nil {
		t.Fatalf("%v", err)
	}
	setup, err := op.setup(ctx, cp, name, pki)
	if err != nil {
		t.Fatalf("setting up %s: %v", name, err)
	}
	if setup.webhooks {
		// Before the process starts, so the API server has them loaded by
		// the time it is ready.
		if err := applyWebhooks(ctx, dyn, name, filepath.Join(dir, "webhook"), "https://"+op.WebhookAddr, pki.caPEM); err != nil {
			t.Fatalf("%s webhooks: %v", name, err)
		}
	}
	if setup.fixedCertDir {
		mountFixedCertDir(t, name, pki)
	}
	env := append([]string{"KUBECONFIG=" + cp.KubeconfigPath}, setup.env...)
	op.Child = cp.StartChild(t, controlplane.ChildOptions{Name: name, Bin: bin, Args: setup.args, Env: env})
	var paths []string
	if setup.webhooks {
		if paths, err = webhookPaths(filepath.Join(dir, "webhook")); err != nil {
			t.Fatalf("%s webhooks: %v", name, err)
		}
	}
	if err := op.waitReady(ctx, paths, pki); err != nil {
		t.Fatalf("%s: %v; last lines of its log:\n%s", name, err, op.Tail(30))
	}
	return op
}

func mustFreePort(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return addr
}

// setup writes what controller name reads (config file, certs, the Secret
// its cert rotator takes over) and returns its flags.
func (op *Operator) setup(ctx context.Context, cp *controlplane.ControlPlane, name string, pki *webhookPKI) (operatorSetup, error) {
	_, wport, _ := net.SplitHostPort(op.WebhookAddr)
	switch name {
	case TrainingOperator:
		// Its webhooks only validate; the tests do without them, but its
		// cert rotator must find its Secret before it starts the controllers.
		err := seedRotatorSecret(ctx, cp, "kubeflow", "training-operator-webhook-cert", pki)
		return operatorSetup{args: []string{
			"--metrics-bind-address=0", "--health-probe-bind-address=" + op.HealthAddr,
			"--leader-elect=false", "--webhook-server-port=" + wport, "--zap-log-level=info",
		}, env: []string{"MY_POD_NAMESPACE=kubeflow"}, fixedCertDir: true}, err
	case KubeRay:
		return operatorSetup{args: []string{
			"--metrics-addr=0", "--health-probe-bind-address=" + op.HealthAddr,
			"--enable-leader-election=false", "--log-stdout-encoder=console",
		}}, nil
	case JobSet, LWS:
		cfg, err := op.writeConfig(cp, name, pki)
		return operatorSetup{args: []string{"--config=" + cfg, "--leader-elect=false",
			"--metrics-bind-address=0", "--health-probe-bind-address=" + op.HealthAddr}, webhooks: true}, err
	case Trainer:
		err := seedRotatorSecret(ctx, cp, "kubeflow-system", "kubeflow-trainer-webhook-cert", pki)
		return operatorSetup{args: []string{
			"--metrics-bind-address=0", "--health-probe-bind-address=" + op.HealthAddr,
			"--leader-elect=false", "--webhook-server-port=" + wport,
		}, webhooks: true, fixedCertDir: true}, err
	}
	return operatorSetup{}, fmt.Errorf("unknown controller %q (known: %s, %s, %s, %s, %s)", name, TrainingOperator, KubeRay, JobSet, LWS, Trainer)
}

// writeConfig writes the Configuration file JobSet and LWS read (same
// shape, their own API group): webhook on the loopback with the harness's
// certs, their own cert management off.
func (op *Operator) writeConfig(cp *controlplane.ControlPlane, name string, pki *webhookPKI) (string, error) {
	group := map[string]string{JobSet: "config.jobset.x-k8s.io", LWS: "config.lws.x-k8s.io"}[name]
	certDir := filepath.Join(cp.Dir, name+"-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), pki.certPEM, 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), pki.keyPEM, 0o600); err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(op.WebhookAddr)
	cfg := fmt.Sprintf(`apiVersion: %s/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
health:
  healthProbeBindAddress: %q
metrics:
  bindAddress: "0"
webhook:
  host: %q
  port: %s
  certDir: %q
internalCertManagement:
  enable: false
`, group, op.HealthAddr, host, port, certDir)
	path := filepath.Join(cp.Dir, name+"-config.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// seedRotatorSecret creates the namespace and the Secret an
// open-policy-agent cert rotator keeps its CA and serving cert in, filled
// with the harness's, which it accepts as valid and writes to its cert dir:
// so its server's cert names 127.0.0.1, which the webhook URL uses.
func seedRotatorSecret(ctx context.Context, cp *controlplane.ControlPlane, ns, name string, pki *webhookPKI) error {
	client, err := kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{
		"ca.crt": pki.caPEM, "ca.key": pki.caKeyPEM, "tls.crt": pki.certPEM, "tls.key": pki.keyPEM,
	}}
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Secret %s/%s: %w", ns, name, err)
	}
	return nil
}

// fixedCertDir is where training-operator and trainer read their serving
// certs, whatever they are told: in a pod, their Secret is mounted there.
const fixedCertDir = "/tmp/k8s-webhook-server/serving-certs"

// mountFixedCertDir does the kubelet's part: it writes the cert and key of
// the rotator's Secret to fixedCertDir, which the rotator waits for. One
// such process may run on the machine at a time, so it holds a machine-wide
// lock until t's cleanup (registered before the child's, so the lock is
// released and the files removed after the process stopped).
func mountFixedCertDir(t testing.TB, name string, pki *webhookPKI) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "tessera-k8s-webhook-server.lock")
	f, err := lockFixedCertDir(path, name, fixedCertDirWait)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	if err := os.MkdirAll(fixedCertDir, 0o700); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { os.RemoveAll(fixedCertDir) })
	for file, data := range map[string][]byte{"tls.crt": pki.certPEM, "tls.key": pki.keyPEM, "ca.crt": pki.caPEM} {
		if err := os.WriteFile(filepath.Join(fixedCertDir, file), data, 0o600); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// fixedCertDirWait bounds the wait for fixedCertDir's lock: a test waits
// for another test's controller, not for a demo kept running for hours.
const fixedCertDirWait = 10 * time.Minute

// lockFixedCertDir takes the lock at path, waiting up to wait, and records
// who holds it (pid and command), so whoever waits can say who it waits
// for: a kept demo (`make demo-down` ends it) or another test.
func lockFixedCertDir(path, name string, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: opening %s: %w", name, path, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			holder, _ := os.ReadFile(path)
			f.Close()
			return nil, fmt.Errorf("%s: %s is locked (held by %s): %w; it needs %s to itself",
				name, path, strings.TrimSpace(string(holder)), err, fixedCertDir)
		}
		time.Sleep(time.Second)
	}
	holder := fmt.Sprintf("pid %d, %s for %s", os.Getpid(), filepath.Base(os.Args[0]), name)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder+"\n"), 0)
	}
	return f, nil
}

// waitReady waits until /readyz answers 200 and, with webhooks (their
// paths), the webhook server serves the harness's cert on its address and
// has every path registered: JobSet, for one, starts its server before it
// registers its webhooks, and the API server's calls then fail with 404.
func (op *Operator) waitReady(ctx context.Context, paths []string, pki *webhookPKI) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.caPEM)
	for {
		if done, code := op.Exited(); done {
			return fmt.Errorf("exited with code %d before it was ready", code)
		}
		err := probeHTTP(hc, "http://"+op.HealthAddr+"/readyz")
		if err == nil && len(paths) > 0 {
			err = probeTLS(op.WebhookAddr, pool)
		}
		if err == nil && len(paths) > 0 {
			err = probeWebhookPaths(op.WebhookAddr, paths, pool)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last probe: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func probeHTTP(hc *http.Client, url string) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// probeWebhookPaths posts an empty object to each webhook path: a
// registered webhook answers (an AdmissionReview refusing it, or 400), an
// unregistered path 404.
func probeWebhookPaths(addr string, paths []string, pool *x509.CertPool) error {
	host, _, _ := net.SplitHostPort(addr)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	for _, path := range paths {
		resp, err := hc.Post("https://"+addr+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			return fmt.Errorf("webhook %s: %w", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("webhook %s: not registered yet (%s)", path, resp.Status)
		}
	}
	return nil
}

func probeTLS(addr string, pool *x509.CertPool) error {
	host, _, _ := net.SplitHostPort(addr)
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12})
	if err != nil {
		return fmt.Errorf("webhook server %s: %w", addr, err)
	}
	return conn.Close()
}

// WebhookRequests reads the API server's count of admission webhook calls
// by webhook name (apiserver_admission_webhook_request_total): proof that
// the API server reached a controller's webhooks by their URL.
func WebhookRequests(ctx context.Context, client kubernetes.Interface) (map[string]float64, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	out := map[string]float64{}
	const family = "apiserver_admission_webhook_request_total{"
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, family) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(family):], "} ")
		if !ok {
			continue
		}
		var name string
		for _, kv := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && k == "name" {
				name = strings.Trim(v, `"`)
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[name] += v
	}
	return out, nil
}
