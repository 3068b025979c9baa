package webhook

import (
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

	"k8s.io/klog/v2"
)

// Options configure a Server.
type Options struct {
	// Addr to listen on ("host:port"; port 0 picks a free one).
	Addr string
	// CertDir holds tls.crt and tls.key (a kubernetes.io/tls Secret
	// mounted as a volume). They are read again when they change, so a
	// renewed certificate is served without a restart.
	CertDir string
}

// Server serves the webhook over TLS.
type Server struct {
	ln    net.Listener
	srv   *http.Server
	certs *certReloader
}

// New loads the certificate (an error when it cannot be read) and binds the
// address, so Addr is known before Run.
func New(o Options) (*Server, error) {
	if o.CertDir == "" {
		return nil, errors.New("webhook: a certificate directory is required")
	}
	certs := &certReloader{crt: filepath.Join(o.CertDir, "tls.crt"), key: filepath.Join(o.CertDir, "tls.key")}
	if err := certs.load(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("webhook: listening on %s: %w", o.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, Handler())
	mux.Handle(SchedulePath, ScheduleHandler())
	return &Server{ln: ln, certs: certs, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get},
	}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(shutCtx)
	}()
	klog.FromContext(ctx).Info("Serving the admission webhook", "address", s.Addr(), "path", Path)
	if err := s.srv.ServeTLS(s.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("webhook: %w", err)
	}
	return nil
}

// certReloader serves the key pair of two files, read again (at most once a
// second) when either file's modification time changes. A pair that cannot
// be read (half-written during a rotation) keeps the previous one.
type certReloader struct {
	crt, key string

	mu        sync.Mutex
	cert      *tls.Certificate
	crtMod    time.Time
	keyMod    time.Time
	lastCheck time.Time
}

func (c *certReloader) load() error {
	crtInfo, err := os.Stat(c.crt)
	if err != nil {
		return err
	}
	keyInfo, err := os.Stat(c.key)
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(c.crt, c.key)
	if err != nil {
		return fmt.Errorf("loading %s and %s: %w", c.crt, c.key, err)
	}
	c.cert, c.crtMod, c.keyMod = &cert, crtInfo.ModTime(), keyInfo.ModTime()
	return nil
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.lastCheck) >= time.Second {
		c.lastCheck = now
		crtInfo, err1 := os.Stat(c.crt)
		keyInfo, err2 := os.Stat(c.key)
		if err1 == nil && err2 == nil && (!crtInfo.ModTime().Equal(c.crtMod) || !keyInfo.ModTime().Equal(c.keyMod)) {
			if err := c.load(); err != nil {
				klog.ErrorS(err, "Reloading the webhook's certificate; serving the previous one")
			} else {
				klog.InfoS("Reloaded the webhook's certificate", "file", c.crt)
			}
		}
	}
	return c.cert, nil
}
