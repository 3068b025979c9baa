package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// httpServer is one bound listener with its handler.
type httpServer struct {
	what string
	ln   net.Listener
	srv  *http.Server
}

// listen binds the metrics and health addresses; one listener serves both
// when they are equal.
func (c *Controller) listen() error {
	type want struct {
		addr            string
		metrics, health bool
	}
	var wants []want
	switch {
	case c.cfg.MetricsAddr != "" && c.cfg.MetricsAddr == c.cfg.HealthAddr:
		wants = append(wants, want{c.cfg.MetricsAddr, true, true})
	default:
		if c.cfg.MetricsAddr != "" {
			wants = append(wants, want{c.cfg.MetricsAddr, true, false})
		}
		if c.cfg.HealthAddr != "" {
			wants = append(wants, want{c.cfg.HealthAddr, false, true})
		}
	}
	for _, w := range wants {
		ln, err := net.Listen("tcp", w.addr)
		if err != nil {
			for _, s := range c.servers {
				_ = s.ln.Close()
			}
			c.servers = nil
			return fmt.Errorf("app: listening on %s: %w", w.addr, err)
		}
		what := "metrics"
		if w.health {
			what = "health"
			if w.metrics {
				what = "metrics and health"
			}
		}
		c.servers = append(c.servers, &httpServer{
			what: what,
			ln:   ln,
			srv:  &http.Server{Handler: c.handler(w.metrics, w.health), ReadHeaderTimeout: 10 * time.Second},
		})
	}
	return nil
}

// MetricsAddr is the bound address of /metrics ("" when not served).
func (c *Controller) MetricsAddr() string {
	for _, s := range c.servers {
		if s.what != "health" {
			return s.ln.Addr().String()
		}
	}
	return ""
}

// HealthAddr is the bound address of /healthz and /readyz ("" when not
// served).
func (c *Controller) HealthAddr() string {
	for _, s := range c.servers {
		if s.what != "metrics" {
			return s.ln.Addr().String()
		}
	}
	return ""
}

func (s *httpServer) serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(shutCtx)
	}()
	klog.FromContext(ctx).Info("Serving", "endpoints", s.what, "address", s.ln.Addr().String())
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.FromContext(ctx).Error(err, "HTTP server failed", "endpoints", s.what)
	}
}

func metricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

func check(w http.ResponseWriter, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok"))
}

func metaFor(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

// WebhookAddr is the bound address of the admission webhook ("" when not
// served).
func (c *Controller) WebhookAddr() string {
	if c.webhook == nil {
		return ""
	}
	return c.webhook.Addr()
}
