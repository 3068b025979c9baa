package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
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
}

// newDebugServer binds DebugAddr and builds the delegated authenticator and
// authorizer of k8s.io/apiserver (the ones aggregated API servers and
// kube-rbac-proxy use): bearer tokens go to a TokenReview, the request to a
// SubjectAccessReview, both cached briefly.
func (c *Controller) newDebugServer() (*debugServer, error) {
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  c.client.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 10 * time.Second,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("app: debug server authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: c.client.AuthorizationV1(),
		AllowCacheTTL:             10 * time.Second,
		DenyCacheTTL:              5 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("app: debug server authorizer: %w", err)
	}
	cert, err := debugCertificate(c.cfg.DebugCertDir)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", c.cfg.DebugAddr)
	if err != nil {
		return nil, fmt.Errorf("app: listening on %s: %w", c.cfg.DebugAddr, err)
	}
	d := &debugServer{ln: ln, authn: authn, authz: authz}
	mux := http.NewServeMux()
	mux.Handle(SnapshotPath, d.authorised(SnapshotReaderRole, http.HandlerFunc(c.serveSnapshot)))
	if c.cfg.Shadow != nil {
		mux.Handle(ShadowPath, d.authorised(ShadowReaderRole, ShadowHandler(c.scheduler)))
	}
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return d, nil
}

// debugCertificate reads tls.crt and tls.key of dir, or, without a dir,
// makes a self-signed pair for this process (the plugin reaches the server
// through an authenticated port-forward, where the tunnel is what it
// trusts; cmd/kubectl-tessera/README.md).
func debugCertificate(dir string) (tls.Certificate, error) {
	if dir == "" {
		host, _ := os.Hostname()
		crt, key, err := selfsigned.GenerateFor("tessera-controller-debug", 365*24*time.Hour, "localhost", "127.0.0.1", host)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("app: debug server certificate: %w", err)
		}
		return tls.X509KeyPair(crt, key)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("app: debug server certificate in %s: %w", dir, err)
	}
	return cert, nil
}

// authorised lets a request through when its bearer token authenticates and
// the user may get its path: 401 without a valid token, 403 naming role,
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
			http.Error(w, "Unauthorized: present a bearer token the API server accepts", http.StatusUnauthorized)
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
	go func() {
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.srv.Shutdown(shutCtx)
	}()
	klog.FromContext(ctx).Info("Serving", "endpoints", "debug", "address", d.ln.Addr().String())
	if err := d.srv.ServeTLS(d.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.FromContext(ctx).Error(err, "HTTP server failed", "endpoints", "debug")
	}
}

// DebugAddr is the bound address of the debug server ("" when not served).
func (c *Controller) DebugAddr() string {
	if c.debug == nil {
		return ""
	}
	return c.debug.ln.Addr().String()
}
