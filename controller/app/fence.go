package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leaseFence knows whether this replica may still write as the leader: the
// Lease holds its identity and it was renewed less than the renew deadline
// ago by the local, monotonic clock.
//
// Why that bound is safe: a standby takes the Lease over only when it has
// seen no change of the record for LeaseDuration, counted from when it
// read the record, which is after the write of our renewal reached the API
// server, which is after we sent it. So while less than LeaseDuration has
// passed since we sent our last successful renewal, nobody else leads. The
// fence allows writes only within RenewDeadline of that send; the rest of
// LeaseDuration (5 s with the defaults) is the margin for the time between
// the check and the write's arrival (DESIGN.md, Fencing).
//
// client-go's elector does not expose when a renewal was sent (its
// observed time is taken after the answer, and IsLeader stays true after a
// pause until the renew loop runs), so fencedLock records it.
type leaseFence struct {
	identity      string
	renewDeadline time.Duration
	now           func() time.Time // time.Now: its monotonic reading is what counts

	mu      sync.Mutex
	holding bool      // our last successful write of the record named us
	renewed time.Time // when that write was sent
}

func newLeaseFence(identity string, renewDeadline time.Duration) *leaseFence {
	return &leaseFence{identity: identity, renewDeadline: renewDeadline, now: time.Now}
}

// Check returns nil while this replica may write, else why not.
func (f *leaseFence) Check() error {
	f.mu.Lock()
	holding, renewed := f.holding, f.renewed
	f.mu.Unlock()
	if !holding {
		return fmt.Errorf("the Lease does not name %s", f.identity)
	}
	if age := f.now().Sub(renewed); age >= f.renewDeadline {
		return fmt.Errorf("the Lease was last renewed %v ago, past the renew deadline %v", age.Round(time.Millisecond), f.renewDeadline)
	}
	return nil
}

// wrote records the outcome of a write of the leader record sent at sent.
// A failed write changes nothing: the deadline runs out by itself.
func (f *leaseFence) wrote(sent time.Time, rec resourcelock.LeaderElectionRecord, err error) {
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holding = rec.HolderIdentity == f.identity
	if f.holding && sent.After(f.renewed) {
		f.renewed = sent
	}
}

// fencedLock is a resource lock that tells a leaseFence about every write of
// the leader record (acquire, renew, release).
type fencedLock struct {
	resourcelock.Interface
	fence *leaseFence
}

func (l fencedLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	sent := l.fence.now()
	err := l.Interface.Create(ctx, rec)
	l.fence.wrote(sent, rec, err)
	return err
}

func (l fencedLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	sent := l.fence.now()
	err := l.Interface.Update(ctx, rec)
	l.fence.wrote(sent, rec, err)
	return err
}
