package kube

import (
	"fmt"

	"github.com/tessera-gpu/tessera/controller/core"
)

// readQueues adds the Queue objects, an implicit default and the external
// queue to the snapshot.
func (b *snapshotBuild) readQueues() {
	idx := b.idx
	queueObjs, badQueues := b.s.listQueues()
	idx.badQueues = badQueues
	converted := map[string]core.Queue{}
	for _, q := range queueObjs {
		idx.queues[q.Name] = q
		b.children[q.Spec.Parent]++
		cq, err := queueFromObject(q, b.now)
		if err != nil && idx.badQueues[q.Name] == "" {
			idx.badQueues[q.Name] = err.Error()
		}
		if n := nextWindowChange(q, b.now); !n.IsZero() && (idx.nextWindow.IsZero() || n.Before(idx.nextWindow)) {
			idx.nextWindow = n
		}
		converted[q.Name] = cq
	}
	for _, q := range queueObjs {
		if q.Spec.Parent != "" && idx.queues[q.Spec.Parent] == nil || idx.queueProblem(q.Name) != "" {
			// The CRD cannot check this; the core would leave the orphan
			// or the invalid queue out with a less telling reason, so it
			// is left out here and its pods wait with the adapter's.
			continue
		}
		b.snap.Queues = append(b.snap.Queues, converted[q.Name])
	}
	if idx.queues[DefaultQueue] == nil {
		b.snap.Queues = append(b.snap.Queues, core.NewQueue(DefaultQueue, ""))
	}
	ext := core.NewQueue(externalQueue, "")
	for r := range ext.Resources {
		ext.Resources[r] = core.QueueResource{Quota: core.Unlimited, Limit: core.Unlimited}
	}
	b.snap.Queues = append(b.snap.Queues, ext)
}

// leaf says whether a queue can hold workloads, and if not why: it must
// exist (or be the implicit default), have its parent, be readable and have
// no child queues.
func (b *snapshotBuild) leaf(name string) (bool, string) {
	idx := b.idx
	if name == DefaultQueue && idx.queues[name] == nil {
		return true, ""
	}
	q := idx.queues[name]
	if q == nil {
		return false, fmt.Sprintf("queue %s does not exist", name)
	}
	if q.Spec.Parent != "" && idx.queues[q.Spec.Parent] == nil {
		return false, fmt.Sprintf("queue %s has parent %s, which does not exist", name, q.Spec.Parent)
	}
	if why := idx.queueProblem(name); why != "" {
		return false, fmt.Sprintf("queue %s cannot be used: %s", name, why)
	}
	if b.children[name] > 0 {
		return false, fmt.Sprintf("queue %s is a parent queue; only leaf queues hold workloads", name)
	}
	return true, ""
}
