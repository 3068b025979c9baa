package scheduler_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
	"github.com/tessera-gpu/tessera/controller/app"
	"github.com/tessera-gpu/tessera/controller/core"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/driver/deviceclasses"
	"github.com/tessera-gpu/tessera/internal/selfsigned"
	"github.com/tessera-gpu/tessera/test/controlplane"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestSnapshotEndpoint: tessera-controller, running as its ServiceAccount
// under exactly deploy/rbac's grants, serves the cycle snapshot on its
// HTTPS debug server to a user the ClusterRole tessera-snapshot-reader is
// bound to, and refuses others (403 naming the role; 401 without a token).
// `kubectl tessera snapshot` (ctl.Run, as a user would) writes the file, and
// `tessera-sim replay` on it agrees with what the controller decided.
func TestSnapshotEndpoint(t *testing.T) {
	e := newEnv(t)
	e.CP.CreateNamespace(t, rbac.Namespace)
	if err := framework.ApplyControllerRBAC(e.Ctx, e.Client); err != nil {
		t.Fatal(err)
	}
	e.addGPUNode("snap-0", "h100-sxm-8")
	e.createQueue("team-a", "", "4", "", 100)
	for i := 0; i < 3; i++ {
		e.createPod(podSpec{name: fmt.Sprintf("a-%d", i), queue: "team-a", priority: "tessera-train", claim: &gpuClaim{}})
	}
	e.createPod(podSpec{name: "af-0", queue: "team-a", priority: "tessera-train", claim: &gpuClaim{class: deviceclasses.MPS, memory: "20Gi"}})
	e.createPod(podSpec{name: "picky", queue: "team-a", claim: &gpuClaim{cel: `device.attributes["gpu.tessera.dev"].productName == "NVIDIA B200"`}})
	for _, n := range []string{"a-0", "a-1", "a-2", "af-0", "picky"} {
		e.waitClaim(n)
	}
	c := startDebugController(t, e)

	reader := e.serviceAccountToken("snapshot-reader")
	nobody := e.serviceAccountToken("nobody")
	e.bindClusterRole(app.SnapshotReaderRole, "snapshot-reader")

	// Refusals, straight at the endpoint.
	for _, tc := range []struct {
		name, token string
		status      int
		body        string
	}{
		{"no token", "", http.StatusUnauthorized, "bearer token"},
		{"a forged token", "not-a-token", http.StatusUnauthorized, "bearer token"},
		{"a user without the role", nobody, http.StatusForbidden, app.SnapshotReaderRole},
	} {
		status, body := getSnapshot(t, c.DebugAddr(), tc.token)
		if status != tc.status || !strings.Contains(body, tc.body) {
			t.Errorf("%s: got %d %q, want %d naming %q", tc.name, status, body, tc.status, tc.body)
		}
	}
	// The plugin, as that user: a clear error naming the role.
	err := ctl.Run(e.Ctx, e.userClients(nobody), []string{"snapshot", "--address", c.DebugAddr(), "--insecure-skip-tls-verify"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bind the ClusterRole "+app.SnapshotReaderRole) {
		t.Errorf("kubectl tessera snapshot without the role: want an error naming %s, got %v", app.SnapshotReaderRole, err)
	}

	// Without --address the plugin looks for the leader in the Lease: a
	// user without the port-forward Role is told to bind it; with it, this
	// controller (no leader election) has no Lease to find.
	noAddr := []string{"snapshot", "--controller-namespace", rbac.Namespace}
	err = ctl.Run(e.Ctx, e.userClients(reader), noAddr, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bind the Role tessera-snapshot-portforward in "+rbac.Namespace) {
		t.Errorf("kubectl tessera snapshot without the port-forward Role: want an error naming it, got %v", err)
	}
	e.bindRole(rbac.Namespace, "tessera-snapshot-portforward", "snapshot-reader")
	e.eventually("a not-found error naming the Lease", 30*time.Second, func() (bool, string) {
		err := ctl.Run(e.Ctx, e.userClients(reader), noAddr, io.Discard)
		return err != nil && strings.Contains(err.Error(), "tessera-controller not found: no Lease "+rbac.Namespace+"/"), fmt.Sprint(err)
	})

	// The plugin, as a reader.
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	var out bytes.Buffer
	if err := ctl.Run(e.Ctx, e.userClients(reader), []string{"snapshot", "-o", file, "--address", c.DebugAddr(), "--insecure-skip-tls-verify"}, &out); err != nil {
		t.Fatalf("kubectl tessera snapshot: %v", err)
	}
	t.Logf("kubectl tessera snapshot: %s", strings.TrimSpace(out.String()))
	d := readDump(t, file)
	if d.Decisions == nil || len(d.Objects.Pods) < 5 {
		t.Fatalf("the snapshot lacks the cluster's pods or the cycle's decisions: %d pods, decisions %+v", len(d.Objects.Pods), d.Decisions)
	}
	if !hasPending(d.Decisions, e.NS+"/picky") {
		t.Fatalf("picky should wait for its CEL selector in the snapshot's cycle: %+v", d.Decisions)
	}
	sim := controlplane.GoBinary(t, "./cmd/tessera-sim")
	res, err := exec.Command(sim, "replay", file).CombinedOutput()
	if err != nil {
		t.Fatalf("tessera-sim replay %s: %v\n%s", file, err, res)
	}
	if !strings.Contains(string(res), "agrees") {
		t.Fatalf("tessera-sim replay does not say it agrees with the controller:\n%s", res)
	}
	t.Logf("tessera-sim replay:\n%s", res)
	checkAnonymizedSnapshots(t, e, c.DebugAddr(), reader, sim)
}

// checkAnonymizedSnapshots: ?anonymize=true answers a snapshot that replays
// to the controller's decisions renamed and holds none of the test's names;
// `kubectl tessera snapshot --anonymize --anonymize-key` writes the key
// apart, and tessera-sim replay --key prints the original names again.
func checkAnonymizedSnapshots(t *testing.T, e *env, addr, reader, sim string) {
	names := []string{e.NS, "snap-0", "team-a", "a-0", "a-1", "a-2", "af-0", "picky"}
	status, body := getSnapshot(t, addr+"?anonymize=true", reader)
	if status != http.StatusOK {
		t.Fatalf("?anonymize=true: %d %s", status, body)
	}
	checkAnonymized(t, []byte(body), nil, nil, names...)
	if status, body := getSnapshot(t, addr+"?anonymize=maybe", reader); status != http.StatusBadRequest || !strings.Contains(body, "want true or false") {
		t.Errorf("?anonymize=maybe: got %d %q, want 400", status, body)
	}

	dir := t.TempDir()
	file, keyFile := filepath.Join(dir, "anon.yaml"), filepath.Join(dir, "key.yaml")
	var out bytes.Buffer
	args := []string{"snapshot", "-o", file, "--anonymize", "--anonymize-key", keyFile, "--address", addr, "--insecure-skip-tls-verify"}
	if err := ctl.Run(e.Ctx, e.userClients(reader), args, &out); err != nil {
		t.Fatalf("kubectl tessera snapshot --anonymize: %v", err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := kube.ParseAnonymizeKey(kb)
	if err != nil {
		t.Fatal(err)
	}
	d := checkAnonymized(t, data, key, nil, names...)
	if back := key.RestoreDecisions(d.Decisions); !hasPending(back, e.NS+"/picky") {
		t.Fatalf("the controller's decisions mapped back through the key lack %s/picky waiting: %+v", e.NS, back)
	}
	res, err := exec.Command(sim, "replay", file, "--key", keyFile).CombinedOutput()
	if err != nil || !strings.Contains(string(res), "agrees") || !strings.Contains(string(res), e.NS+"/picky") {
		t.Fatalf("tessera-sim replay --key on the anonymised file: %v\n%s", err, res)
	}
}

// TestDebugServerCertificates: users whose kubeconfig holds a client
// certificate (no token) use the debug server: the controller trusts the
// cluster's client CA, read from kube-system's
// extension-apiserver-authentication ConfigMap with deploy/rbac's
// RoleBinding to extension-apiserver-authentication-reader. A certificate
// user bound to tessera-snapshot-reader gets the snapshot through the
// plugin, one without the role is told to bind it (403), a certificate of
// another CA gets 401. The serving certificate of --debug-cert-dir is
// replaced on disk and served without a restart.
func TestDebugServerCertificates(t *testing.T) {
	e := newEnv(t)
	e.CP.CreateNamespace(t, rbac.Namespace)
	if err := framework.ApplyControllerRBAC(e.Ctx, e.Client); err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	writeServingCert(t, certDir, "debug-a")
	c := startDebugControllerWith(t, e, func(cfg *app.Config) {
		cfg.DebugCertDir, cfg.DebugClientCAFromCluster = certDir, true
	})
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: e.NS + "-alice"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: app.SnapshotReaderRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}
	if _, err := e.Client.RbacV1().ClusterRoleBindings().Create(e.Ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	direct := []string{"snapshot", "--address", c.DebugAddr(), "--insecure-skip-tls-verify"}
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	alice := e.clientsFor(e.CP.UserConfig("alice"))
	e.eventually("alice's client certificate gets the snapshot", time.Minute, func() (bool, string) {
		err := ctl.Run(e.Ctx, alice, append(direct, "-o", file), io.Discard)
		return err == nil, fmt.Sprint(err)
	})
	if d := readDump(t, file); d.Decisions == nil {
		t.Fatalf("the snapshot has no decisions")
	}
	err := ctl.Run(e.Ctx, e.clientsFor(e.CP.UserConfig("bob")), direct, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "bind the ClusterRole "+app.SnapshotReaderRole) || !strings.Contains(err.Error(), `"bob"`) {
		t.Errorf("a certificate user without the role: want an error naming bob and %s, got %v", app.SnapshotReaderRole, err)
	}
	crt, key, err := selfsigned.GenerateFor("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := getWithCert(t, c.DebugAddr(), foreign); status != http.StatusUnauthorized {
		t.Errorf("a certificate of another CA: got %d %q, want 401", status, body)
	}

	if cn := servedCN(t, c.DebugAddr()); cn != "debug-a" {
		t.Fatalf("the debug server serves %q, want debug-a from %s", cn, certDir)
	}
	writeServingCert(t, certDir, "debug-b")
	e.eventually("the rotated certificate served", time.Minute, func() (bool, string) {
		cn := servedCN(t, c.DebugAddr())
		return cn == "debug-b", cn
	})
}

// writeServingCert writes a self-signed tls.crt and tls.key for cn in dir,
// each by a rename (as a Secret volume changes).
func writeServingCert(t *testing.T, dir, cn string) {
	t.Helper()
	crt, key, err := selfsigned.GenerateFor(cn, time.Hour, "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.key": key, "tls.crt": crt} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// servedCN is the common name of the certificate the server at addr serves.
func servedCN(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// getWithCert GETs the snapshot presenting a client certificate.
func getWithCert(t *testing.T, addr string, cert tls.Certificate) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
	resp, err := client.Get("https://" + addr + app.SnapshotPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// startDebugController runs tessera-controller in-process as its
// ServiceAccount (deploy/rbac's grants), with the debug server on loopback.
func startDebugController(t *testing.T, e *env) *app.Controller {
	return startDebugControllerWith(t, e, func(*app.Config) {})
}

// startDebugControllerWith is startDebugController with set changing the
// configuration first.
func startDebugControllerWith(t *testing.T, e *env, set func(*app.Config)) *app.Controller {
	t.Helper()
	cfg := app.Config{RestConfig: framework.ControllerConfig(e.CP), Interval: 200 * time.Millisecond,
		Core: core.Config{DisableConsolidation: true}, DebugAddr: "127.0.0.1:0"}
	set(&cfg)
	c, err := app.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.eventually("the controller leads and is ready", time.Minute, func() (bool, string) {
		err := c.Ready()
		return err == nil, fmt.Sprint(err)
	})
	return c
}

// serviceAccountToken creates a ServiceAccount in the test's namespace and
// returns a token of it (TokenRequest), as a user's kubeconfig holds one.
func (e *env) serviceAccountToken(name string) string {
	e.T.Helper()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.Client.CoreV1().ServiceAccounts(e.NS).Create(e.Ctx, sa, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	tr, err := e.Client.CoreV1().ServiceAccounts(e.NS).CreateToken(e.Ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return tr.Status.Token
}

// bindClusterRole binds a ClusterRole to a ServiceAccount of the test's
// namespace.
func (e *env) bindClusterRole(role, sa string) {
	e.T.Helper()
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: e.NS + "-" + sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: e.NS}}}
	if _, err := e.Client.RbacV1().ClusterRoleBindings().Create(e.Ctx, b, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
}

// bindRole binds a Role of namespace ns to a ServiceAccount of the test's
// namespace.
func (e *env) bindRole(ns, role, sa string) {
	e.T.Helper()
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: e.NS + "-" + sa, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: e.NS}}}
	if _, err := e.Client.RbacV1().RoleBindings(ns).Create(e.Ctx, b, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
}

// userClients are the plugin's clients for a user holding token.
func (e *env) userClients(token string) ctl.Clients {
	cfg := rest.AnonymousClientConfig(e.CP.AdminConfig)
	cfg.BearerToken = token
	return e.clientsFor(cfg)
}

// clientsFor are the plugin's clients for a user's client configuration.
func (e *env) clientsFor(cfg *rest.Config) ctl.Clients {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.T.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		e.T.Fatal(err)
	}
	return ctl.Clients{Kube: kc, Dynamic: dc, Namespace: e.NS, RestConfig: cfg}
}

// getSnapshot GETs the snapshot endpoint with a bearer token ("" for none).
func getSnapshot(t *testing.T, addr, token string) (int, string) {
	t.Helper()
	// addr may carry a query: host:port?anonymize=true.
	host, query, _ := strings.Cut(addr, "?")
	path := app.SnapshotPath
	if query != "" {
		path += "?" + query
	}
	status, body, err := getDebug(host, path, token)
	if err != nil {
		t.Fatal(err)
	}
	return status, body
}

// getDebug GETs a path of the debug server with a bearer token ("" for
// none), not verifying its self-signed certificate.
func getDebug(addr, path, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func readDump(t *testing.T, file string) *kube.Dump {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	d, err := kube.ParseDump(data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func hasPending(d *kube.Decisions, pod string) bool {
	for _, p := range d.Pending {
		if p.Pod == pod {
			return true
		}
	}
	return false
}
