package kube

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controller/core"
)

// UsageOptions turn the usage history on (Options.Usage): per leaf queue
// and resource, what the queue's pods held over time (core.UsageHistory,
// the simulator's arithmetic), persisted in the ConfigMap
// Namespace/Name so a restarted or new leader continues from it
// (DESIGN.md, "Usage history in the controller").
type UsageOptions struct {
	Config core.UsageConfig
	// Namespace and Name of the ConfigMap (Name default
	// DefaultUsageConfigMap).
	Namespace, Name string
	// SaveEvery bounds how much of the open bucket a restart loses
	// (default DefaultUsageSaveEvery); a closed bucket is saved at once.
	SaveEvery time.Duration
	// MaxGap is the longest time between the last save and a new leader's
	// first cycle that is counted as held as it was saved (default
	// DefaultUsageMaxGap); a longer gap counts as nothing held.
	MaxGap time.Duration
}

// Defaults of UsageOptions.
const (
	DefaultUsageConfigMap = "tessera-usage"
	DefaultUsageSaveEvery = time.Minute
	DefaultUsageMaxGap    = 5 * time.Minute
)

// usageKeeper is the scheduler's usage history: fed after each cycle with
// what the leaf queues held (the core's allocation), read before the next
// one for fair share (Snapshot.Usage), Queue status and metrics. Touched
// only by the cycle goroutine.
type usageKeeper struct {
	opts UsageOptions
	s    *Scheduler
	hist *core.UsageHistory
	// last is when usage is counted until (whole seconds: the history
	// counts whole seconds, and a cycle is shorter than one).
	last time.Time
	// held is what each leaf queue held after the last cycle.
	held map[string]core.Resources
	// decayed is hist.Decayed(), recomputed when a bucket closes
	// (decayedAt is hist.Start when it was).
	decayed   map[string]core.Resources
	decayedAt time.Time
	// loaded: the ConfigMap has been read (at the first cycle of a leader).
	loaded bool
	// rv is the ConfigMap's resourceVersion ("" while there is none), so a
	// replica that lost the lead cannot overwrite its successor's save.
	rv        string
	savedAt   time.Time
	savedOpen time.Time // hist.Start at the last save
	// recreate: the ConfigMap was deleted under a save; the next save
	// creates it again and says so in an event.
	recreate bool
	// rejected is saved content that could not be read, kept in the next
	// save so that nothing is lost without a person seeing it.
	rejected []byte
}

func newUsageKeeper(s *Scheduler, o *UsageOptions) (*usageKeeper, error) {
	if o == nil {
		return nil, nil
	}
	opts := *o
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("kube: usage history: %w", err)
	}
	if opts.Namespace == "" {
		return nil, fmt.Errorf("kube: usage history: Namespace is required")
	}
	if opts.Name == "" {
		opts.Name = DefaultUsageConfigMap
	}
	if opts.SaveEvery <= 0 {
		opts.SaveEvery = DefaultUsageSaveEvery
	}
	if opts.MaxGap <= 0 {
		opts.MaxGap = DefaultUsageMaxGap
	}
	return &usageKeeper{opts: opts, s: s, held: map[string]core.Resources{}}, nil
}

// begin counts what the queues held since the last cycle until now and
// gives fair share the decayed usage when the core weighs it. The first
// cycle of a leader reads the saved history.
func (u *usageKeeper) begin(ctx context.Context, now time.Time, snap *core.Snapshot) {
	if u == nil {
		return
	}
	if !u.loaded {
		u.load(ctx, now)
	}
	if secs := now.Sub(u.last) / time.Second; secs > 0 {
		t1 := u.last.Add(secs * time.Second)
		u.hist.Add(u.last, t1, u.held)
		u.last = t1
	}
	if u.decayed == nil || !u.hist.Start.Equal(u.decayedAt) {
		u.decayed, u.decayedAt = u.hist.Decayed(), u.hist.Start
	}
	if u.s.opts.Core.UsageCoefficient > 0 {
		snap.Usage = u.decayed
	}
}

// fresh starts an empty history at now, its first bucket aligned to the
// bucket length (so every replica's buckets begin at the same instants).
func (u *usageKeeper) fresh(now time.Time) {
	u.hist, _ = core.NewUsageHistory(u.opts.Config, now.Truncate(u.opts.Config.Bucket)) // validated in newUsageKeeper
	u.last = now.Truncate(time.Second)
	u.held = map[string]core.Resources{}
	u.decayed = nil
}

// end takes what each leaf queue holds after the cycle (the core's
// allocation: bound and running pods, and this cycle's binds), for the
// time until the next cycle; memory in MiB as the history counts it.
func (u *usageKeeper) end(snap *core.Snapshot, res *core.Result) {
	if u == nil {
		return
	}
	parents := map[string]bool{}
	for _, q := range snap.Queues {
		if q.Parent != "" {
			parents[q.Parent] = true
		}
	}
	held := map[string]core.Resources{}
	for name, q := range res.Queues {
		if name == externalQueue || parents[name] {
			continue
		}
		a := q.Allocated
		a[core.ResMemory] >>= 20
		if a != (core.Resources{}) {
			held[name] = a
		}
	}
	u.held = held
}

// usageOf is each queue's decayed usage, a parent's its subtree's sum;
// nil without a history.
func (u *usageKeeper) usageOf(snap *core.Snapshot) map[string]core.Resources {
	if u == nil {
		return nil
	}
	parent := map[string]string{}
	for _, q := range snap.Queues {
		parent[q.Name] = q.Parent
	}
	out := map[string]core.Resources{}
	for name, r := range u.decayed {
		for q, hops := name, 0; q != "" && hops < 64; q, hops = parent[q], hops+1 {
			o := out[q]
			for i := range r {
				o[i] = min(o[i]+r[i], 1<<62)
			}
			out[q] = o
		}
	}
	return out
}

// logger is the keeper's contextual logger.
func (u *usageKeeper) logger(ctx context.Context) klog.Logger {
	return klog.FromContext(ctx).WithValues("configMap", klog.KRef(u.opts.Namespace, u.opts.Name))
}
