package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/tessera-gpu/tessera/internal/debugapi"
)

// The transport of the commands that read tessera-controller's debug
// server (snapshot, shadow): the API server's service and pod proxies drop
// the caller's Authorization header, so the plugin finds the leader pod
// from its Lease, port-forwards to its debug port, and presents the user's
// own credentials over TLS; or goes to --address directly.

// DefaultControllerNamespace is where the chart installs tessera-controller.
const DefaultControllerNamespace = "tessera-system"

// debugFlags say how a command reaches the debug server.
type debugFlags struct {
	address, namespace, lease, caFile string
	port                              int
	insecure                          bool
	query                             string // the URL's query, set by the command
}

// register adds the transport's flags to fs, the Lease defaulting to the
// endpoint's controller's.
func (d *debugFlags) register(fs *flag.FlagSet, e debugapi.Endpoint) {
	fs.StringVar(&d.address, "address", "", "the debug server's host:port, reached directly (default: a port-forward to the leader pod)")
	fs.StringVar(&d.namespace, "controller-namespace", DefaultControllerNamespace, "tessera-controller's namespace")
	fs.StringVar(&d.lease, "lease", e.Lease, "tessera-controller's leader Lease")
	fs.IntVar(&d.port, "port", debugapi.DefaultPort, "the debug server's port in the controller pod")
	fs.StringVar(&d.caFile, "certificate-authority", "", "CA of the debug server's certificate (with --address)")
	fs.BoolVar(&d.insecure, "insecure-skip-tls-verify", false, "do not verify the debug server's certificate (with --address)")
}

// check refuses a direct address without a way to trust its certificate.
func (d *debugFlags) check(cmd string) error {
	if d.address != "" && d.caFile == "" && !d.insecure {
		return fmt.Errorf("%s --address needs --certificate-authority or --insecure-skip-tls-verify: the debug server's certificate is self-signed unless the chart was given one", cmd)
	}
	return nil
}

// getDebug GETs the endpoint from the debug server as the user.
func getDebug(ctx context.Context, c Clients, d *debugFlags, e debugapi.Endpoint) ([]byte, error) {
	if c.RestConfig == nil {
		return nil, errors.New("no client configuration")
	}
	addr, trusted, stop, err := d.reach(ctx, c, e)
	if err != nil {
		return nil, err
	}
	defer stop()
	return d.fetch(ctx, c.RestConfig, addr, trusted, e)
}

// reach returns the debug server's address: --address as given, else a
// local port forwarded to the leader pod through the API server. trusted
// says the connection is the API server's authenticated tunnel to the pod
// we named, so the pod's self-signed certificate need not be verified.
func (d *debugFlags) reach(ctx context.Context, c Clients, e debugapi.Endpoint) (addr string, trusted bool, stop func(), err error) {
	if d.address != "" {
		return d.address, false, func() {}, nil
	}
	pod, err := d.leaderPod(ctx, c, e)
	if err != nil {
		return "", false, nil, err
	}
	local, stop, err := forward(c.RestConfig, d.namespace, pod, d.port, e)
	if err != nil {
		return "", false, nil, err
	}
	return local, true, stop, nil
}

// leaderPod is the pod that holds the controller's Lease: only the leader
// runs cycles. The Lease holder is "<hostname>_<uuid>", the hostname the
// pod's name.
func (d *debugFlags) leaderPod(ctx context.Context, c Clients, e debugapi.Endpoint) (string, error) {
	lease, err := c.Kube.CoordinationV1().Leases(d.namespace).Get(ctx, d.lease, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("tessera-controller not found: no Lease %s/%s (is it installed with leader election in that namespace? --controller-namespace, --lease; or reach it with --address)", d.namespace, d.lease)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("may not read the Lease %s/%s to find the leader: bind the Role %s in %s (and the ClusterRole %s): %w", d.namespace, d.lease, e.PortForwardRole, d.namespace, e.ReaderRole, err)
	case err != nil:
		return "", fmt.Errorf("reading the Lease %s/%s: %w", d.namespace, d.lease, err)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	i := strings.LastIndex(holder, "_")
	if i <= 0 {
		return "", fmt.Errorf("tessera-controller has no leader now (Lease %s/%s holder %q)", d.namespace, d.lease, holder)
	}
	return holder[:i], nil
}

// forward opens a port-forward to the pod's port on a free local port, as
// kubectl port-forward does (WebSocket, falling back to SPDY).
func forward(cfg *rest.Config, namespace, pod string, port int, e debugapi.Endpoint) (string, func(), error) {
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
		// client-go flattens the API server's answer into a string.
		if strings.Contains(err.Error(), "forbidden") {
			return "", nil, fmt.Errorf("port-forward to pod %s/%s (needs pods/portforward there: the Role %s): %w", namespace, pod, e.PortForwardRole, err)
		}
		return "", nil, fmt.Errorf("port-forward to pod %s/%s, the leader its Lease names: %w", namespace, pod, err)
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		close(stopCh)
		return "", nil, fmt.Errorf("port-forward to pod %s/%s: no local port: %v", namespace, pod, err)
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), func() { close(stopCh) }, nil
}

// debugTransport presents the user's credentials to the debug server: the
// kubeconfig's user as client-go presents it to the API server (a bearer
// token, a token file, an exec plugin's token or certificate), over TLS to
// the debug server instead; without a token, the kubeconfig's client
// certificate, which the server checks against the cluster's client CA.
func (d *debugFlags) debugTransport(user *rest.Config, trusted bool) (http.RoundTripper, error) {
	cfg := rest.AnonymousClientConfig(user)
	cfg.BearerToken, cfg.BearerTokenFile = user.BearerToken, user.BearerTokenFile
	cfg.ExecProvider, cfg.AuthProvider, cfg.AuthConfigPersister = user.ExecProvider, user.AuthProvider, user.AuthConfigPersister
	cfg.Impersonate = rest.ImpersonationConfig{}
	cfg.TLSClientConfig = rest.TLSClientConfig{CAFile: d.caFile, Insecure: trusted || d.insecure}
	if !hasToken(user) {
		tc := user.TLSClientConfig
		cfg.TLSClientConfig.CertFile, cfg.TLSClientConfig.KeyFile = tc.CertFile, tc.KeyFile
		cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData = tc.CertData, tc.KeyData
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("credentials for the debug server: %w", err)
	}
	return rt, nil
}

// hasToken says whether the kubeconfig's user authenticates with a token
// (or an exec or auth provider, which may give one).
func hasToken(user *rest.Config) bool {
	return user.BearerToken != "" || user.BearerTokenFile != "" || user.ExecProvider != nil || user.AuthProvider != nil
}

// fetch GETs the endpoint at addr and turns refusals into errors that say
// what to do.
func (d *debugFlags) fetch(ctx context.Context, user *rest.Config, addr string, trusted bool, e debugapi.Endpoint) ([]byte, error) {
	rt, err := d.debugTransport(user, trusted)
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "https", Host: addr, Path: e.Path, RawQuery: d.query}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil && trusted {
		// Nothing on the pod's port, or not TLS: the tunnel only says EOF.
		return nil, fmt.Errorf("reaching tessera-controller's debug server through a port-forward to port %d of the leader pod (is it served there? --port; the chart's controller.debug.enabled and .port): %w", d.port, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reaching tessera-controller's debug server at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", e.What, err)
	}
	msg := strings.TrimSpace(string(body))
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("not authenticated by the debug server: it takes a bearer token the API server validates (TokenReview) or a client certificate of the cluster's client CA; your kubeconfig's user presents neither, or one it does not accept: %s", msg)
	case http.StatusForbidden:
		return nil, fmt.Errorf("not authorised to read %s: bind the ClusterRole %s to your user: %s", e.What, e.ReaderRole, msg)
	}
	return nil, fmt.Errorf("the debug server answered %s for %s: %s", resp.Status, e.What, msg)
}
