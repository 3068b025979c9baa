package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// stubLock answers every write with err.
type stubLock struct {
	resourcelock.Interface
	err error
}

func (l stubLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }
func (l stubLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }

// TestLeaseFence: writes are allowed only while the Lease names us and our
// last successful renewal was sent less than the renew deadline ago; the
// send time counts, not the answer's, and failed renewals do not extend it.
func TestLeaseFence(t *testing.T) {
	const me, deadline = "me", 3 * time.Second
	t0 := time.Now()
	type write struct {
		at     time.Duration // when it is sent, after t0
		took   time.Duration // until its answer
		holder string
		err    error
	}
	cases := []struct {
		name   string
		writes []write
		check  time.Duration // when Check runs, after t0
		want   string        // "" = allowed, else part of the refusal
	}{
		{"never acquired", nil, 0, "does not name me"},
		{"fresh", []write{{0, 0, me, nil}}, 2 * time.Second, ""},
		{"at the deadline", []write{{0, 0, me, nil}}, deadline, "past the renew deadline"},
		{"paused past the deadline", []write{{0, 0, me, nil}}, 10 * time.Second, "past the renew deadline"},
		{"renewed since", []write{{0, 0, me, nil}, {2 * time.Second, 0, me, nil}}, 4 * time.Second, ""},
		{"failed renewal does not extend", []write{{0, 0, me, nil}, {2 * time.Second, 0, me, errors.New("timeout")}}, 4 * time.Second, "past the renew deadline"},
		{"slow answer counts from the send", []write{{0, 2500 * time.Millisecond, me, nil}}, 3500 * time.Millisecond, "past the renew deadline"},
		{"released", []write{{0, 0, me, nil}, {time.Second, 0, "", nil}}, 2 * time.Second, "does not name me"},
		{"someone else's record", []write{{0, 0, "other", nil}}, time.Second, "does not name me"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newLeaseFence(me, deadline)
			var now time.Duration
			f.now = func() time.Time { return t0.Add(now) }
			for _, w := range tc.writes {
				now = w.at
				lock := fencedLock{Interface: slowLock{stubLock{err: w.err}, func() { now += w.took }}, fence: f}
				_ = lock.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: w.holder})
			}
			now = tc.check
			err := f.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
}

// slowLock runs elapse during each write (the request's round trip).
type slowLock struct {
	stubLock
	elapse func()
}

func (l slowLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	l.elapse()
	return l.stubLock.Update(ctx, r)
}
