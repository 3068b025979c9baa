package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/debugapi"
	"github.com/tessera-gpu/tessera/internal/selfsigned"
)

// SnapshotPath is the debug server's cycle-snapshot endpoint: a
// non-resource URL, so RBAC grants it with nonResourceURLs and verb get
// (the ClusterRole SnapshotReaderRole of deploy/rbac).
const SnapshotPath = debugapi.SnapshotPath

// SnapshotReaderRole is the ClusterRole that grants SnapshotPath; a 403
// names it.
const SnapshotReaderRole = debugapi.SnapshotReaderRole

// debugServer serves the cycle snapshot (and, in shadow mode, the shadow
// report) over HTTPS to callers the API server authenticates (TokenReview)
// and authorises (SubjectAccessReview).
type debugServer struct {
	ln    net.Listener
	srv   *http.Server
	authn authenticator.Request
	authz authorizer.Authorizer
	// runners keep the serving certificate and the client CAs current
	// (files watched, the ConfigMap informed); run while serving.
	runners []dynamiccertificates.ControllerRunner
	// clientCAConfigMap is set when the client CA comes from the cluster:
	// serve checks once that it can be read and says what to bind if not.
	clientCAConfigMap bool
}

// newDebugServer binds DebugAddr and builds the delegated authenticator and
// authorizer of k8s.io/apiserver (the ones aggregated API servers and
// kube-rbac-proxy use): a client certificate is verified against the
// cluster's client CA, a bearer token goes to a TokenReview, the request
// to a SubjectAccessReview, both reviews cached briefly.
func (c *Controller) newDebugServer() (*debugServer, error) {
	d := &debugServer{}
	clientCA, err := d.clientCAs(c)
	if err != nil {
		return nil, err
	}
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	d.authn, _, err = authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:            c.client.AuthenticationV1(),
		TokenAccessReviewTimeout:           10 * time.Second,
		WebhookRetryBackoff:                backoff,
		CacheTTL:                           10 * time.Second,
		ClientCertificateCAContentProvider: clientCA,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("app: debug server authenticator: %w", err)
	}
	d.authz, err = authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: c.client.AuthorizationV1(),
		AllowCacheTTL:             10 * time.Second,
		DenyCacheTTL:              5 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("app: debug server authorizer: %w", err)
	}
	getCert, err := d.servingCertificate(c.cfg.DebugCertDir)
	if err != nil {
		return nil, err
	}
	if d.ln, err = net.Listen("tcp", c.cfg.DebugAddr); err != nil {
		return nil, fmt.Errorf("app: listening on %s: %w", c.cfg.DebugAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(SnapshotPath, d.authorised(SnapshotReaderRole, http.HandlerFunc(c.serveSnapshot)))
	if c.cfg.Shadow != nil {
		mux.Handle(ShadowPath, d.authorised(ShadowReaderRole, ShadowHandler(c.scheduler)))
	}
	// RequestClientCert: a certificate is asked for but not required nor
	// checked by TLS; the x509 authenticator verifies it against the
	// current client CAs (so a token user without one still gets in).
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{GetCertificate: getCert, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}}
	return d, nil
}

// clientCAs is the CA bundle client certificates are verified against:
// DebugClientCAFile (reloaded when it changes) and/or the cluster's client
// CA, which the API server publishes in kube-system's
// extension-apiserver-authentication ConfigMap (watched), as aggregated
// API servers read it. nil: client certificates are not accepted.
func (d *debugServer) clientCAs(c *Controller) (dynamiccertificates.CAContentProvider, error) {
	var cas []dynamiccertificates.CAContentProvider
	if f := c.cfg.DebugClientCAFile; f != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("debug-client-ca", f)
		if err != nil {
			return nil, fmt.Errorf("app: debug server client CA %s: %w", f, err)
		}
		cas = append(cas, ca)
		d.runners = append(d.runners, ca)
	}
	if c.cfg.DebugClientCAFromCluster {
		ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("debug-client-ca",
			debugapi.ClientCANamespace, debugapi.ClientCAConfigMap, debugapi.ClientCAKey, c.client)
		if err != nil {
			return nil, fmt.Errorf("app: debug server client CA from the cluster: %w", err)
		}
		cas = append(cas, ca)
		d.runners = append(d.runners, ca)
		d.clientCAConfigMap = true
	}
	switch len(cas) {
	case 0:
		return nil, nil
	case 1:
		return cas[0], nil
	}
	return dynamiccertificates.NewUnionCAContentProvider(cas...), nil
}

// servingCertificate serves tls.crt and tls.key of dir, read again when
// they change (a rotated Secret is served without a restart), or, without
// a dir, a self-signed pair made for this process (the plugin reaches the
// server through an authenticated port-forward, where the tunnel is what
// it trusts; cmd/kubectl-tessera/README.md).
func (d *debugServer) servingCertificate(dir string) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	if dir == "" {
		host, _ := os.Hostname()
		crt, key, err := selfsigned.GenerateFor("tessera-controller-debug", 365*24*time.Hour, "localhost", "127.0.0.1", host)
		if err != nil {
			return nil, fmt.Errorf("app: debug server certificate: %w", err)
		}
		cert, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("app: debug server certificate: %w", err)
		}
		return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }, nil
	}
	files, err := dynamiccertificates.NewDynamicServingContentFromFiles("debug-serving",
		filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("app: debug server certificate in %s: %w", dir, err)
	}
	d.runners = append(d.runners, files)
	cache := &certCache{}
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return cache.get(files.CurrentCertKeyContent())
	}, nil
}

// certCache parses a certificate and key once per content, not per
// handshake.
type certCache struct {
	mu       sync.Mutex
	crt, key []byte
	cert     *tls.Certificate
}

func (c *certCache) get(crt, key []byte) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && bytes.Equal(crt, c.crt) && bytes.Equal(key, c.key) {
		return c.cert, nil
	}
	cert, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, fmt.Errorf("app: debug server certificate: %w", err)
	}
	c.crt, c.key, c.cert = crt, key, &cert
	return c.cert, nil
}

// authorised lets a request through when its client certificate or bearer
// token authenticates and the user may get its path: 401 without valid
// credentials, 403 naming role,
// the ClusterRole to bind, otherwise.
func (d *debugServer) authorised(role string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context()).WithValues("path", r.URL.Path)
		if r.Method != http.MethodGet {
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		resp, ok, err := d.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			logger.V(2).Info("Debug request not authenticated", "err", err)
			http.Error(w, "Unauthorized: present a bearer token the API server accepts, or a client certificate of the cluster's client CA", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: resp.User, Verb: "get", Path: r.URL.Path}
		decision, reason, err := d.authz.Authorize(r.Context(), attrs)
		if err != nil || decision != authorizer.DecisionAllow {
			logger.Info("Debug request forbidden", "user", resp.User.GetName(), "reason", reason, "err", err)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not get %s; bind the ClusterRole %s to it",
				resp.User.GetName(), r.URL.Path, role), http.StatusForbidden)
			return
		}
		logger.V(2).Info("Debug request authorised", "user", resp.User.GetName())
		next.ServeHTTP(w, r)
	})
}

// serveSnapshot answers with the next cycle's snapshot (a dump taken inside
// the cycle, so it cannot race the informers).
func (c *Controller) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	if !c.leader.Load() {
		http.Error(w, "this replica does not lead, so it runs no cycles; ask the Lease holder "+c.cfg.LeaseName, http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	data, err := c.scheduler.Snapshot(ctx)
	if err != nil {
		http.Error(w, "taking the snapshot: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	var ok bool
	if data, ok = anonymizeAnswer(ctx, w, r, data); !ok { // ?anonymize=true
		return
	}
	klog.FromContext(ctx).Info("Served a cycle snapshot", "bytes", len(data))
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(data)
}

func (d *debugServer) serve(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, r := range d.runners {
		if err := r.RunOnce(ctx); err != nil {
			logger.Error(err, "Loading the debug server's certificates")
		}
		go r.Run(ctx, 1)
	}
	go func() {
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.srv.Shutdown(shutCtx)
	}()
	logger.Info("Serving", "endpoints", "debug", "address", d.ln.Addr().String())
	if err := d.srv.ServeTLS(d.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error(err, "HTTP server failed", "endpoints", "debug")
	}
}

// checkClientCA says, once, when the cluster's client CA cannot be read:
// until it can, client certificates are refused (401) and only bearer
// tokens work.
func (d *debugServer) checkClientCA(ctx context.Context, client kubernetes.Interface) {
	if !d.clientCAConfigMap {
		return
	}
	_, err := client.CoreV1().ConfigMaps(debugapi.ClientCANamespace).Get(ctx, debugapi.ClientCAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		klog.FromContext(ctx).Error(err, "The debug server cannot read the cluster's client CA, so it accepts no client certificates: bind the Role "+
			debugapi.ClientCAReaderRole+" in "+debugapi.ClientCANamespace+" to this controller's identity (deploy/rbac)")
	case err != nil:
		klog.FromContext(ctx).Error(err, "The debug server cannot read the cluster's client CA yet; client certificates are refused until it can",
			"configMap", klog.KRef(debugapi.ClientCANamespace, debugapi.ClientCAConfigMap))
	}
}

// DebugAddr is the bound address of the debug server ("" when not served).
func (c *Controller) DebugAddr() string {
	if c.debug == nil {
		return ""
	}
	return c.debug.ln.Addr().String()
}
