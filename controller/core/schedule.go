package core

import "errors"

// Schedule runs one scheduling cycle on the snapshot: stale-gang eviction,
// fair share, then allocate → consolidate → reclaim → preempt, each simulated
// on a transaction and committed only when its plan holds. It never modifies
// the snapshot. It returns an error, naming the offending object, when the
// snapshot is inconsistent (unknown queue or parent, a job in a parent queue,
// duplicate names, a pod placed on an unknown node or GPU).
func Schedule(s *Snapshot, cfg Config) (*Result, error) {
	return nil, errors.New("core: not implemented yet")
}
