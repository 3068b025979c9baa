package controlplane

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/tessera-gpu/tessera/internal/childproc"
)

// process is one child of the harness (etcd, kube-apiserver, ...). Its
// stdout and stderr go to Dir/<name>.log.
type process = childproc.Process

// addrInUse tells whether a process failed because another process took its
// port between our probe and its bind; then the whole start is retried.
func addrInUse(p *process) bool {
	return strings.Contains(p.Tail(50), "address already in use")
}

// portAllocator hands out free loopback ports. It keeps the probe listeners
// of one start open until all ports are chosen, so one start never gets the
// same port twice; other test binaries may still race us, which the retry
// in Start absorbs.
type portAllocator struct {
	mu        sync.Mutex
	listeners []net.Listener
}

func (a *portAllocator) get() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	a.listeners = append(a.listeners, l)
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (a *portAllocator) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.listeners {
		_ = l.Close()
	}
	a.listeners = nil
}

// errExited is returned while waiting for a process that has already died.
var errExited = errors.New("process exited")
