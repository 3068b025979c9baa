package controlplane

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/childproc"
)

// StopAPIServer stops kube-apiserver, as a crash (kill: SIGKILL, nothing
// flushed, connections cut) or a clean shutdown (SIGTERM, in-flight
// requests finish). etcd and every other process keep running; their
// requests fail until StartAPIServer. It returns once the process is gone.
func (cp *ControlPlane) StopAPIServer(kill bool) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return fmt.Errorf("stopping kube-apiserver: control plane already stopped")
	}
	if cp.apiDown {
		return fmt.Errorf("stopping kube-apiserver: it is stopped already")
	}
	p := cp.apiServerLocked()
	if p == nil {
		return fmt.Errorf("stopping kube-apiserver: it is not running")
	}
	if kill {
		p.Kill()
	} else {
		p.Stop(15 * time.Second)
	}
	cp.apiDown = true
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer: same flags,
// same port, same etcd and certificates, so every client (the harness's
// configs, kubeconfigs written before, informers of running components)
// reconnects by itself. Its log continues in the same file. It returns once
// /readyz answers.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	if !cp.apiDown {
		cp.mu.Unlock()
		return fmt.Errorf("starting kube-apiserver: it is running (call StopAPIServer first)")
	}
	cp.mu.Unlock()
	var p *process
	var err error
	// The port was ours a moment ago; a client's connection in TIME_WAIT
	// does not block a listener (Go sets SO_REUSEADDR). A few tries cover
	// the old process's socket being released late.
	for try := 0; try < 5; try++ {
		if p, err = cp.replaceAPIServer(); err != nil {
			return err
		}
		if err = cp.waitAPIServerReady(ctx, p); err == nil || !addrInUse(p) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	cp.mu.Lock()
	cp.apiDown = false
	cp.mu.Unlock()
	return nil
}

// replaceAPIServer starts a new kube-apiserver process in the old one's
// place in the start order, so Stop still stops it after its clients.
func (cp *ControlPlane) replaceAPIServer() (*process, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil, fmt.Errorf("starting kube-apiserver: control plane already stopped")
	}
	old := cp.apiServerLocked()
	if old != nil {
		old.Stop(time.Second) // an earlier try that died; reaps it
	}
	p, err := childproc.Start(cp.Dir, "kube-apiserver", filepath.Join(cp.bin, "kube-apiserver"), cp.apiArgs, nil)
	if err != nil {
		return nil, err
	}
	i := slices.Index(cp.procs, old)
	if i < 0 {
		cp.procs = append(cp.procs, p)
	} else {
		cp.procs[i] = p
	}
	return p, nil
}

func (cp *ControlPlane) apiServerLocked() *process {
	for _, p := range cp.procs {
		if p.Name == "kube-apiserver" {
			return p
		}
	}
	return nil
}

// RestartAPIServer stops kube-apiserver (kill: SIGKILL, else SIGTERM), keeps
// it down for down, and starts it again (StartAPIServer). It fails t when
// the API server does not come back within a minute.
func (cp *ControlPlane) RestartAPIServer(t testing.TB, kill bool, down time.Duration) {
	t.Helper()
	if err := cp.StopAPIServer(kill); err != nil {
		t.Fatal(err)
	}
	time.Sleep(down)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
}
