package sharing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// The MPS supervisor (`tessera-node mps-supervisor`, the tessera-mps
// DaemonSet) runs the MPS control daemons for tessera-node, so that they
// live in its pod instead of tessera-node's container: an upgrade or a
// crash of tessera-node replaces its container, and the container runtime
// kills every process in it. The supervisor's pod is not touched by
// upgrades (updateStrategy OnDelete) and does nothing but this, so it has
// little reason to change or crash. tessera-node asks it over a Unix socket
// in the MPS root (not in any pipe directory, so MPS clients never see it).
// The supervisor keeps no state of its own: the pid files in the pipe
// directories are the record, tessera-node's checkpoint says which GPUs
// need a daemon, and tessera-node's check loop restarts dead ones.

// SupervisorSocket is the supervisor's socket name in the MPS root.
const SupervisorSocket = "supervisor.sock"

// maxRequest bounds a request body; a valid one is under 200 bytes.
const maxRequest = 4096

// SupervisorRequest is the body of every supervisor call.
type SupervisorRequest struct {
	// GPU is the GPU's UUID, also its directory below the MPS root.
	GPU string `json:"gpu"`
	// PID is the daemon's pid as the caller knows it (alive only).
	PID int `json:"pid,omitempty"`
}

// SupervisorResponse is the body of every supervisor answer.
type SupervisorResponse struct {
	PID     int    `json:"pid,omitempty"`
	Alive   bool   `json:"alive,omitempty"`
	PipeDir string `json:"pipeDir,omitempty"`
	Error   string `json:"error,omitempty"`
}

// DecodeSupervisorRequest reads and checks one request.
func DecodeSupervisorRequest(r io.Reader) (SupervisorRequest, error) {
	var req SupervisorRequest
	body, err := io.ReadAll(io.LimitReader(r, maxRequest+1))
	if err != nil {
		return req, fmt.Errorf("reading MPS supervisor request: %w", err)
	}
	if len(body) > maxRequest {
		return req, fmt.Errorf("MPS supervisor request is over %d bytes", maxRequest)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return SupervisorRequest{}, fmt.Errorf("MPS supervisor request %.100q: %w", body, err)
	}
	if dec.More() {
		return SupervisorRequest{}, fmt.Errorf("MPS supervisor request %.100q: data after the JSON object", body)
	}
	if err := ValidateGPU(req.GPU); err != nil {
		return SupervisorRequest{}, fmt.Errorf("MPS supervisor request: %w", err)
	}
	if req.PID < 0 {
		return SupervisorRequest{}, fmt.Errorf("MPS supervisor request for GPU %s: negative pid %d", req.GPU, req.PID)
	}
	return req, nil
}

// Supervisor serves the supervisor's socket.
type Supervisor struct {
	// Root is the MPS root; each GPU's daemon uses <Root>/<uuid>/{pipe,log}.
	Root   string
	Runner *ProcessRunner

	mu sync.Mutex // one start or stop at a time
}

func (s *Supervisor) spec(gpuUUID string) DaemonSpec {
	return DaemonSpec{GPU: gpuUUID, PipeDir: filepath.Join(s.Root, gpuUUID, "pipe"), LogDir: filepath.Join(s.Root, gpuUUID, "log")}
}

// Handler serves POST /v1/start, /v1/alive and /v1/stop.
func (s *Supervisor) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/start", s.handle(func(ctx context.Context, d DaemonSpec, _ int) (SupervisorResponse, error) {
		if err := checkPipeDir(d.PipeDir); err != nil {
			return SupervisorResponse{}, err
		}
		pid, err := s.Runner.Start(ctx, d)
		return SupervisorResponse{PID: pid, PipeDir: d.PipeDir}, err
	}))
	mux.HandleFunc("POST /v1/alive", s.handle(func(_ context.Context, d DaemonSpec, pid int) (SupervisorResponse, error) {
		// The pid must still be the one in the GPU's pid file, so that a
		// reused pid does not pass for the daemon.
		filePID, err := readPID(filepath.Join(d.PipeDir, PIDFile))
		return SupervisorResponse{Alive: err == nil && filePID == pid && alive(pid), PipeDir: d.PipeDir}, nil
	}))
	mux.HandleFunc("POST /v1/stop", s.handle(func(ctx context.Context, d DaemonSpec, _ int) (SupervisorResponse, error) {
		// The pid file, not the caller, says which process to stop.
		pid, err := readPID(filepath.Join(d.PipeDir, PIDFile))
		if err != nil {
			return SupervisorResponse{PipeDir: d.PipeDir}, nil // no daemon
		}
		return SupervisorResponse{PID: pid, PipeDir: d.PipeDir}, s.Runner.Stop(ctx, d, pid)
	}))
	return mux
}

func (s *Supervisor) handle(op func(context.Context, DaemonSpec, int) (SupervisorResponse, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		req, err := DecodeSupervisorRequest(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(SupervisorResponse{Error: err.Error()})
			return
		}
		ctx := klog.NewContext(r.Context(), klog.FromContext(r.Context()).WithValues("gpu", req.GPU, "call", r.URL.Path))
		s.mu.Lock()
		resp, err := op(ctx, s.spec(req.GPU), req.PID)
		s.mu.Unlock()
		if err != nil {
			klog.FromContext(ctx).Error(err, "MPS supervisor call failed")
			resp.Error = err.Error()
			w.WriteHeader(http.StatusInternalServerError)
		}
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// Serve listens on <Root>/supervisor.sock until ctx is done, then stops
// every daemon below Root: the supervisor's pod goes away only when the
// chart is uninstalled (or an admin deletes it), and then no daemon may
// stay behind.
func (s *Supervisor) Serve(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(s.Root, 0o755); err != nil {
		return fmt.Errorf("creating MPS root %s: %w", s.Root, err)
	}
	sock := filepath.Join(s.Root, SupervisorSocket)
	_ = os.Remove(sock) // left by an earlier life
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("MPS supervisor: listening on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("MPS supervisor: %w", err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("MPS supervisor serving", "socket", sock, "root", s.Root)
	select {
	case err := <-errc:
		return fmt.Errorf("MPS supervisor: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = srv.Shutdown(shutdownCtx)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	stopped, err := s.Runner.StopAll(context.WithoutCancel(ctx), s.Root)
	logger.Info("MPS supervisor stopped; daemons quit", "gpus", stopped)
	if err != nil {
		return err
	}
	// Stopped on uninstall, or by an admin replacing it (OnDelete), when
	// no MPS claim is prepared: nothing below the root is needed any more.
	return RemoveDaemonDirs(s.Root)
}

// SupervisorClient is the DaemonRunner of tessera-node when the supervisor
// runs the daemons.
type SupervisorClient struct {
	socket string
	root   string
	http   *http.Client
}

// NewSupervisorClient returns a client of the supervisor at socket; root is
// tessera-node's MPS root, which must be the supervisor's.
func NewSupervisorClient(socket, root string, timeout time.Duration) *SupervisorClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	// A start waits up to the supervisor's own timeout for the daemon.
	return &SupervisorClient{socket: socket, root: root, http: &http.Client{Transport: tr, Timeout: timeout + 10*time.Second}}
}

func (c *SupervisorClient) call(ctx context.Context, op string, d DaemonSpec, pid int) (SupervisorResponse, error) {
	body, err := json.Marshal(SupervisorRequest{GPU: d.GPU, PID: pid})
	if err != nil {
		return SupervisorResponse{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mps-supervisor/v1/"+op, bytes.NewReader(body))
	if err != nil {
		return SupervisorResponse{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return SupervisorResponse{}, fmt.Errorf("MPS on GPU %s: the MPS supervisor at %s is not reachable (is the tessera-mps pod running on this node?): %w", d.GPU, c.socket, err)
	}
	defer resp.Body.Close()
	var out SupervisorResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return SupervisorResponse{}, fmt.Errorf("MPS on GPU %s: reading the MPS supervisor's %s answer (HTTP %d): %w", d.GPU, op, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("MPS on GPU %s: MPS supervisor %s: %s", d.GPU, op, out.Error)
	}
	if out.PipeDir != d.PipeDir {
		return out, fmt.Errorf("MPS on GPU %s: the MPS supervisor uses pipe directory %s, tessera-node %s: give both the same --mps-root", d.GPU, out.PipeDir, d.PipeDir)
	}
	return out, nil
}

// Start implements DaemonRunner.
func (c *SupervisorClient) Start(ctx context.Context, d DaemonSpec) (int, error) {
	out, err := c.call(ctx, "start", d, 0)
	if err != nil {
		return 0, err
	}
	if out.PID <= 0 {
		return 0, fmt.Errorf("MPS on GPU %s: the MPS supervisor started no daemon (pid %d)", d.GPU, out.PID)
	}
	return out.PID, nil
}

// Alive implements DaemonRunner.
func (c *SupervisorClient) Alive(ctx context.Context, d DaemonSpec, pid int) (bool, error) {
	out, err := c.call(ctx, "alive", d, pid)
	return out.Alive, err
}

// Stop implements DaemonRunner.
func (c *SupervisorClient) Stop(ctx context.Context, d DaemonSpec, pid int) error {
	_, err := c.call(ctx, "stop", d, pid)
	return err
}
