package framework

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/deploy/rbac"
	"github.com/tessera-gpu/tessera/test/controlplane"
)

// ControllerUser is the identity deploy/rbac grants to, as the API server
// sees a token of tessera-controller's ServiceAccount: user, then groups.
var ControllerUser = []string{"system:serviceaccount:" + rbac.Namespace + ":" + rbac.ServiceAccount,
	"system:serviceaccounts", "system:serviceaccounts:" + rbac.Namespace, "system:authenticated"}

// ControllerConfig is a client config that authenticates as
// tessera-controller's ServiceAccount (a client cert with its user and
// groups), so its requests meet exactly the RBAC the manifests grant
// (ApplyControllerRBAC).
func ControllerConfig(cp *controlplane.ControlPlane) *rest.Config {
	return cp.UserConfig(ControllerUser[0], ControllerUser[1:]...)
}

// Test timings of the leader election: a crashed leader is replaced within
// about ControllerLeaseDuration.
const (
	ControllerLeaseDuration = 4 * time.Second
	ControllerRenewDeadline = 3 * time.Second
	ControllerRetryPeriod   = 500 * time.Millisecond
)

// ControllerOptions say how StartController runs a replica.
type ControllerOptions struct {
	// Name names the replica's log (Dir/<Name>.log); unique per control
	// plane. Default "tessera-controller".
	Name string
	// Args are appended to the defaults (a later flag wins): the
	// ServiceAccount's kubeconfig, leader election on the Lease of
	// deploy/rbac with the Controller* timings above, --interval=200ms,
	// metrics and health on one free loopback port, -v=2.
	Args []string
	// Env is added to the test's environment, e.g. the commit test hook
	// (tessera-controller's test hooks).
	Env []string
	// User, when set, is the identity it runs as (user, then groups)
	// instead of ControllerUser: ShadowUser for shadow mode.
	User []string
}

// ShadowUser is the identity deploy/rbac's shadow manifests grant to
// (ApplyShadowRBAC), as the API server sees a token of its ServiceAccount.
var ShadowUser = []string{"system:serviceaccount:" + rbac.Namespace + ":" + rbac.ShadowServiceAccount,
	"system:serviceaccounts", "system:serviceaccounts:" + rbac.Namespace, "system:authenticated"}

// Controller is tessera-controller running as a real process: killable
// (Kill), freezable (Pause, Resume) and restartable (Restart), its log in
// the control plane's Dir and tailed when the test fails.
type Controller struct {
	*controlplane.Child
	// MetricsAddr serves /metrics, /healthz and /readyz.
	MetricsAddr string
}

// StartController builds ./cmd/tessera-controller (once per test binary)
// and starts it as tessera-controller's ServiceAccount. The control plane
// needs the CRDs, the DeviceClasses and the RBAC manifests applied
// (InstallCRDs, ApplyDeviceClasses, ApplyControllerRBAC in rbac.Namespace).
func StartController(t testing.TB, cp *controlplane.ControlPlane, opts ControllerOptions) *Controller {
	t.Helper()
	if opts.Name == "" {
		opts.Name = "tessera-controller"
	}
	bin := controlplane.GoBinary(t, "./cmd/tessera-controller")
	cfg := ControllerConfig(cp)
	if len(opts.User) > 0 {
		cfg = cp.UserConfig(opts.User[0], opts.User[1:]...)
	}
	kubeconfig := cp.WriteKubeconfig(t, cfg)
	addr, err := FreeAddr()
	if err != nil {
		t.Fatalf("%v", err)
	}
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=true",
		"--leader-elect-namespace=" + rbac.Namespace,
		"--leader-elect-lease-duration=" + ControllerLeaseDuration.String(),
		"--leader-elect-renew-deadline=" + ControllerRenewDeadline.String(),
		"--leader-elect-retry-period=" + ControllerRetryPeriod.String(),
		"--interval=200ms",
		"--metrics-bind-address=" + addr,
		"--health-probe-bind-address=" + addr,
		"-v=2",
	}, opts.Args...)
	c := cp.StartChild(t, controlplane.ChildOptions{Name: opts.Name, Bin: bin, Args: args, Env: opts.Env})
	return &Controller{Child: c, MetricsAddr: addr}
}

// FreeAddr is a loopback address with a port free now, for a process to
// listen on.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Metric sums the samples of one metric family (counter or gauge) from the
// replica's /metrics; an error when it does not answer within 2 s (a paused
// or dead process) or does not export the family.
func (c *Controller) Metric(name string) (float64, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + c.MetricsAddr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", c.Name, err)
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name)
}

// sumMetric reads Prometheus' text format and sums family name's samples.
func sumMetric(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another family sharing the prefix
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no metric %s", name)
	}
	return sum, nil
}

// IsLeader says whether the replica answers that it leads (tessera_leader 1).
func (c *Controller) IsLeader() bool {
	v, err := c.Metric("tessera_leader")
	return err == nil && v == 1
}

// WaitLeader waits until the replica leads; it fails t after timeout or when
// the process exits.
func (c *Controller) WaitLeader(t testing.TB, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for !c.IsLeader() {
		if done, code := c.Exited(); done {
			t.Fatalf("%s exited (code %d) before leading; last lines:\n%s", c.Name, code, c.Tail(30))
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not lead within %v; last lines:\n%s", c.Name, timeout, c.Tail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var identityRE = regexp.MustCompile(`"Starting tessera-controller" identity="([^"]+)"`)

// Identity is the replica's identity in the Lease, read from its log (of its
// latest run); "" before it logged it.
func (c *Controller) Identity() string {
	m := identityRE.FindAllStringSubmatch(c.Log(), -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}
