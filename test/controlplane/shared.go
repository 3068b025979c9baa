package controlplane

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Shared is a control plane that the tests of one package share: the first
// test that asks starts it, TestMain stops it. One start per package keeps
// a run short on small machines; tests keep apart by namespace and names.
//
//	var cluster = &controlplane.Shared{Kwok: true, Setup: setup}
//	func TestMain(m *testing.M) { os.Exit(cluster.Run(m)) }
//	func TestX(t *testing.T) { cp := cluster.Get(t); ... }
type Shared struct {
	// Options are those of New; BinDir defaults to BinDir(t) of the first
	// test.
	Options Options
	// Kwok starts kwok for fake nodes.
	Kwok bool
	// Setup, when set, runs once after the start (CRDs, DeviceClasses,
	// RBAC); an error fails every test that asks for the control plane.
	Setup func(cp *ControlPlane, t testing.TB) error

	once sync.Once
	cp   *ControlPlane
	err  error
}

// Get returns the package's control plane, starting it on first use; it
// skips the test with -short.
func (s *Shared) Get(t testing.TB) *ControlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip(shortSkipReason)
	}
	s.once.Do(func() {
		opts := s.Options
		if opts.BinDir == "" {
			opts.BinDir = BinDir(t)
		}
		// The control plane outlives the first test: log to stderr, not t.
		logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		if s.cp, s.err = New(opts, logf); s.err != nil {
			return
		}
		if s.Kwok {
			s.cp.StartKwok(t)
		}
		if s.Setup != nil {
			s.err = s.Setup(s.cp, t)
		}
	})
	if s.err != nil {
		t.Fatalf("control plane: %v", s.err)
	}
	return s.cp
}

// Run runs the package's tests (m.Run) and then stops the control plane,
// keeping its directory and printing its logs' tails when a test failed, and
// removes what GoBinary built.
// It returns the exit code for os.Exit.
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.cp != nil {
		s.cp.Stop(code != 0)
	}
	RemoveGoBinaries()
	return code
}
