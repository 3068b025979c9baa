package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/tessera-gpu/tessera/controller/kube"
)

// The names the snapshot command shares with tessera-controller's debug
// server and deploy/rbac (controller/app: SnapshotPath, SnapshotReaderRole;
// the plugin does not import the controller's app package).
const (
	snapshotPath       = "/debug/tessera/snapshot"
	snapshotReaderRole = "tessera-snapshot-reader"
	portForwardRole    = "tessera-snapshot-portforward"
	defaultLease       = "tessera-controller"
	defaultDebugPort   = 8443
)

// snapshotOptions are the snapshot command's flags.
type snapshotOptions struct {
	output, address, namespace, lease, caFile string
	port                                      int
	insecure                                  bool
}

func parseSnapshotFlags(args []string) (*snapshotOptions, error) {
	o := &snapshotOptions{}
	fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.output, "o", "-", "file to write the snapshot to (- for standard output)")
	fs.StringVar(&o.output, "output", "-", "file to write the snapshot to")
	fs.StringVar(&o.address, "address", "", "the debug server's host:port, reached directly (default: a port-forward to the leader pod)")
	fs.StringVar(&o.namespace, "controller-namespace", DefaultControllerNamespace, "tessera-controller's namespace")
	fs.StringVar(&o.lease, "lease", defaultLease, "tessera-controller's leader Lease")
	fs.IntVar(&o.port, "port", defaultDebugPort, "the debug server's port in the controller pod")
	fs.StringVar(&o.caFile, "certificate-authority", "", "CA of the debug server's certificate (with --address)")
	fs.BoolVar(&o.insecure, "insecure-skip-tls-verify", false, "do not verify the debug server's certificate (with --address)")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("snapshot takes no arguments, got %q", fs.Args())
	}
	if o.address != "" && o.caFile == "" && !o.insecure {
		return nil, errors.New("snapshot --address needs --certificate-authority or --insecure-skip-tls-verify: the debug server's certificate is self-signed unless the chart was given one")
	}
	return o, nil
}

// snapshot fetches the next cycle's snapshot from tessera-controller's
// debug server with the user's own credentials (bearer token, from the
// kubeconfig as kubectl uses it), checks it parses, and writes it.
func snapshot(ctx context.Context, c Clients, args []string, out io.Writer) error {
	o, err := parseSnapshotFlags(args)
	if err != nil {
		return err
	}
	if c.RestConfig == nil {
		return errors.New("snapshot: no client configuration")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	addr, trusted, stop, err := o.reach(ctx, c)
	if err != nil {
		return err
	}
	defer stop()
	data, err := fetchSnapshot(ctx, c.RestConfig, addr, o, trusted)
	if err != nil {
		return err
	}
	if _, err := kube.ParseDump(data); err != nil {
		return fmt.Errorf("the controller's answer is not a cycle snapshot: %w", err)
	}
	if o.output == "-" {
		_, err = out.Write(data)
		return err
	}
	if err := os.WriteFile(o.output, data, 0o600); err != nil {
		return fmt.Errorf("writing the snapshot: %w", err)
	}
	fmt.Fprintf(out, "Wrote the cycle snapshot to %s (%d bytes)\n", o.output, len(data))
	return nil
}

// reach returns the debug server's address: --address as given, else a
// local port forwarded to the leader pod through the API server. trusted
// says the connection is the API server's authenticated tunnel to the pod
// we named, so the pod's self-signed certificate need not be verified.
func (o *snapshotOptions) reach(ctx context.Context, c Clients) (addr string, trusted bool, stop func(), err error) {
	if o.address != "" {
		return o.address, false, func() {}, nil
	}
	pod, err := leaderPod(ctx, c, o)
	if err != nil {
		return "", false, nil, err
	}
	local, stop, err := forward(c.RestConfig, o.namespace, pod, o.port)
	if err != nil {
		return "", false, nil, err
	}
	return local, true, stop, nil
}

// leaderPod is the pod that holds the controller's Lease: only the leader
// runs cycles. The Lease holder is "<hostname>_<uuid>", the hostname the
// pod's name.
func leaderPod(ctx context.Context, c Clients, o *snapshotOptions) (string, error) {
	lease, err := c.Kube.CoordinationV1().Leases(o.namespace).Get(ctx, o.lease, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("tessera-controller not found: no Lease %s/%s (is it installed with leader election in that namespace? --controller-namespace, --lease; or reach it with --address)", o.namespace, o.lease)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("may not read the Lease %s/%s to find the leader: bind the Role %s in %s (and the ClusterRole %s): %w", o.namespace, o.lease, portForwardRole, o.namespace, snapshotReaderRole, err)
	case err != nil:
		return "", fmt.Errorf("reading the Lease %s/%s: %w", o.namespace, o.lease, err)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	i := strings.LastIndex(holder, "_")
	if i <= 0 {
		return "", fmt.Errorf("tessera-controller has no leader now (Lease %s/%s holder %q)", o.namespace, o.lease, holder)
	}
	return holder[:i], nil
}

// forward opens a port-forward to the pod's port on a free local port, as
// kubectl port-forward does (WebSocket, falling back to SPDY).
func forward(cfg *rest.Config, namespace, pod string, port int) (string, func(), error) {
	u, err := url.Parse(strings.TrimRight(cfg.Host, "/") + cfg.APIPath)
	if err != nil {
		return "", nil, fmt.Errorf("the API server's address %q: %w", cfg.Host, err)
	}
	u.Path = strings.TrimRight(u.Path, "/") + fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", namespace, pod)
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("port-forward: %w", err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	if ws, err := portforward.NewSPDYOverWebsocketDialer(u, cfg); err == nil {
		// client-go's WebSocket transport reports a refused upgrade as
		// k8s.io/streaming's UpgradeFailureError (as kubectl checks it);
		// apimachinery's type of the same name never matches it, and
		// then SPDY is never tried.
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
		})
	}
	stopCh, ready := make(chan struct{}), make(chan struct{})
	pf, err := portforward.New(dialer, []string{"0:" + strconv.Itoa(port)}, stopCh, ready, io.Discard, io.Discard)
	if err != nil {
		return "", nil, fmt.Errorf("port-forward to pod %s/%s: %w", namespace, pod, err)
	}
	errCh := make(chan error, 1)
	go func() { errCh <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errCh:
		return "", nil, fmt.Errorf("port-forward to pod %s/%s (needs pods/portforward there: the Role %s): %w", namespace, pod, portForwardRole, err)
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stopCh)
		return "", nil, fmt.Errorf("port-forward to pod %s/%s: no local port: %v", namespace, pod, err)
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), func() { close(stopCh) }, nil
}

// fetchSnapshot GETs the snapshot with the user's credentials: the
// kubeconfig's user as client-go presents it to the API server (a bearer
// token, a token file, an exec plugin's token), over TLS to the debug
// server instead.
func fetchSnapshot(ctx context.Context, user *rest.Config, addr string, o *snapshotOptions, trusted bool) ([]byte, error) {
	cfg := rest.AnonymousClientConfig(user)
	cfg.BearerToken, cfg.BearerTokenFile = user.BearerToken, user.BearerTokenFile
	cfg.ExecProvider, cfg.AuthProvider, cfg.AuthConfigPersister = user.ExecProvider, user.AuthProvider, user.AuthConfigPersister
	cfg.Impersonate = rest.ImpersonationConfig{}
	cfg.TLSClientConfig = rest.TLSClientConfig{CAFile: o.caFile, Insecure: trusted || o.insecure}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("credentials for the debug server: %w", err)
	}
	u := url.URL{Scheme: "https", Host: addr, Path: snapshotPath}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching tessera-controller's debug server at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("reading the snapshot: %w", err)
	}
	msg := strings.TrimSpace(string(body))
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("not authenticated by the debug server: it takes a bearer token the API server validates (TokenReview); your kubeconfig's user presents none (a client certificate is not forwarded): %s", msg)
	case http.StatusForbidden:
		return nil, fmt.Errorf("not authorised to take a snapshot: bind the ClusterRole %s to your user: %s", snapshotReaderRole, msg)
	}
	return nil, fmt.Errorf("the debug server answered %s: %s", resp.Status, msg)
}
