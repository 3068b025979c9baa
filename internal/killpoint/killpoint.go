// Package killpoint names the places where tessera-node may die with
// something half-done, and lets a test kill the process at one of them.
//
// Production code calls Reach at each point; it does nothing unless a hook
// is set. tessera-node sets one from the environment (Env) once it has
// started, and the hook kills the process (SIGKILL, no deferred cleanup),
// so the end-to-end tests restart it and check what the restart recovers.
// driver/README.md ("Kill points") says what each restart guarantees.
package killpoint

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Env holds the point to die at, "<point>" or "<point>#<n>" (the n-th time
// the point is reached; 1 when left out).
const Env = "TESSERA_TEST_KILL_AT"

// The points, in the order a claim or a device-plugin pod meets them.
const (
	// BeforePreparingSave: a claim is planned and checked, nothing written.
	BeforePreparingSave = "before-preparing-save"
	// AfterPreparingSave: the claim is recorded "preparing", nothing done.
	AfterPreparingSave = "after-preparing-save"
	// MPSBeforePIDFile: the MPS control daemon was started; its pid file is
	// not read yet (the daemon is not recorded anywhere).
	MPSBeforePIDFile = "mps-before-pid-file"
	// CDISpecWrite: a CDI spec's temp file is written, not yet renamed.
	CDISpecWrite = "cdi-spec-write"
	// BeforePreparedSave: sharing and CDI spec are done, the claim is still
	// recorded "preparing".
	BeforePreparedSave = "before-prepared-save"
	// AfterPreparedSave: recorded "prepared"; the kubelet has no answer yet.
	AfterPreparedSave = "after-prepared-save"
	// UnprepareBeforeSave: a claim's sharing and CDI spec are undone, the
	// checkpoint still records it.
	UnprepareBeforeSave = "unprepare-before-save"
	// AfterUnprepareSave: the claim is gone from the checkpoint; the kubelet
	// has no answer yet.
	AfterUnprepareSave = "after-unprepare-save"
	// AllocateAfterPreparingSave: inside the device plugin's Allocate, the
	// pod is recorded "preparing", nothing done.
	AllocateAfterPreparingSave = "allocate-after-preparing-save"
	// AllocateBeforeSliceMark: the pod's allocation is done and recorded
	// "prepared"; its GPUs are not yet marked in the ResourceSlice, and the
	// kubelet has no answer.
	AllocateBeforeSliceMark = "allocate-before-slice-mark"
	// CheckpointRename: a checkpoint's temp file is written and synced, not
	// yet renamed over checkpoint.json (every checkpoint write meets it).
	CheckpointRename = "checkpoint-rename"
)

// Points lists every point, for validating Env.
var Points = []string{
	BeforePreparingSave, AfterPreparingSave, MPSBeforePIDFile, CDISpecWrite,
	BeforePreparedSave, AfterPreparedSave, UnprepareBeforeSave, AfterUnprepareSave,
	AllocateAfterPreparingSave, AllocateBeforeSliceMark, CheckpointRename,
}

var hook atomic.Pointer[func(point string)]

// Reach runs the hook, if one is set, at a named point.
func Reach(point string) {
	if f := hook.Load(); f != nil {
		(*f)(point)
	}
}

// Set installs the hook (nil removes it).
func Set(f func(point string)) {
	if f == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&f)
}

// Parse reads a spec of Env: the point and which time it is reached.
func Parse(spec string) (point string, nth int, err error) {
	point, count, hasCount := strings.Cut(spec, "#")
	nth = 1
	if hasCount {
		if nth, err = strconv.Atoi(count); err != nil || nth < 1 {
			return "", 0, fmt.Errorf("%s=%q: the count after # must be a positive integer", Env, spec)
		}
	}
	for _, p := range Points {
		if p == point {
			return point, nth, nil
		}
	}
	return "", 0, fmt.Errorf("%s=%q: unknown kill point %q (known: %s)", Env, spec, point, strings.Join(Points, ", "))
}

// OnNth returns a hook that calls die the nth time point is reached.
func OnNth(point string, nth int, die func(point string)) func(string) {
	var mu sync.Mutex
	seen := 0
	return func(p string) {
		if p != point {
			return
		}
		mu.Lock()
		seen++
		now := seen == nth
		mu.Unlock()
		if now {
			die(p)
		}
	}
}
