package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/klog/v2"
)

// ErrFenced is what a commit returns (wrapped, RunOnce and Run too) when
// Options.Fence refused one of its writes: this replica may no longer be
// the leader, so it wrote nothing more and must step down.
var ErrFenced = errors.New("commit fenced: the leader Lease may no longer be ours")

// fence checks Options.Fence before a write of a commit; what names the
// write. The first refusal is logged, counted (tessera_fenced_commits_total)
// and kept in st, so every later write of the commit is refused at once.
// The check reads a clock and a lock, no API call: the window between it
// and the write reaching the API server is as small as it can be.
func (s *Scheduler) fence(ctx context.Context, st *commitStats, what string) error {
	if s.opts.Fence == nil {
		return nil
	}
	if p := st.fenced.Load(); p != nil {
		return *p
	}
	why := s.opts.Fence()
	if why == nil {
		return nil
	}
	err := fmt.Errorf("%w (before %s): %w", ErrFenced, what, why)
	if st.fenced.CompareAndSwap(nil, &err) {
		klog.FromContext(ctx).Error(err, "Commit fenced: not writing; stepping down", "before", what)
		if s.opts.Metrics != nil {
			s.opts.Metrics.fenced.Inc()
		}
	}
	return *st.fenced.Load()
}

// EnvTestCommitHook, set in tessera-controller's environment by a test,
// names a commit point and what the process does when it first gets there:
// "<point>=exit" exits (status 3; a crash at that point) and
// "<point>=pause" stops the process with SIGSTOP (a GC pause or a frozen
// node, until the test sends SIGCONT). Test only: never set it elsewhere.
const EnvTestCommitHook = "TESSERA_TEST_COMMIT_HOOK"

// HookPoint is a point of a commit where Options.Hook is called.
type HookPoint string

// The commit's hook points.
const (
	// HookAfterClaims: a job's claims are allocated and reserved and its
	// device-plugin assignments written; none of its pods is bound yet.
	HookAfterClaims HookPoint = "after-claims"
	// HookBetweenBinds: a job of several pods (a gang) has bound some of
	// them; the next bind is about to be sent.
	HookBetweenBinds HookPoint = "between-binds"
	// HookBetweenJobs: a job of this commit is written whole; the next
	// job's first write is about to be sent (after its fence check). Jobs
	// are written in parallel: with --workers=1 it falls between two jobs.
	HookBetweenJobs HookPoint = "between-jobs"
	// HookMidEvictions: an eviction of this commit is done and another is
	// about to be sent (with --workers=1, strictly one after the other).
	HookMidEvictions HookPoint = "mid-evictions"
)

// HookPoints are the valid hook points.
var HookPoints = []HookPoint{HookAfterClaims, HookBetweenBinds, HookBetweenJobs, HookMidEvictions}

// Hook actions of EnvTestCommitHook.
const (
	HookExit  = "exit"
	HookPause = "pause"
)

// ParseTestCommitHook reads EnvTestCommitHook's value "<point>=<action>".
func ParseTestCommitHook(v string) (HookPoint, string, error) {
	point, action, ok := strings.Cut(v, "=")
	valid := false
	for _, p := range HookPoints {
		valid = valid || HookPoint(point) == p
	}
	switch {
	case !ok || !valid:
		return "", "", fmt.Errorf("%s=%q: want <point>=<action> with a point among %v", EnvTestCommitHook, v, HookPoints)
	case action != HookExit && action != HookPause:
		return "", "", fmt.Errorf("%s=%q: the action must be %s or %s", EnvTestCommitHook, v, HookExit, HookPause)
	}
	return HookPoint(point), action, nil
}

func (s *Scheduler) hook(p HookPoint) {
	if s.opts.Hook != nil {
		s.opts.Hook(p)
	}
}
