package core

import (
	"cmp"
	"container/heap"
	"strings"
)

// jobList is one leaf queue's jobs waiting in an action, in job order.
type jobList struct {
	q    *queueState
	jobs []*jobState
	i    int
	// req is the head job's request, part of the queue's ordering key.
	req Resources
}

// queueHeap orders leaf queues by DESIGN.md's job order: below fair share
// first, then below quota, then queue priority, then smallest dominant
// resource share; ties by name.
type queueHeap struct {
	s     *session
	lists []*jobList
}

func (h *queueHeap) Len() int      { return len(h.lists) }
func (h *queueHeap) Swap(i, j int) { h.lists[i], h.lists[j] = h.lists[j], h.lists[i] }
func (h *queueHeap) Push(x any)    { h.lists = append(h.lists, x.(*jobList)) }
func (h *queueHeap) Pop() any {
	x := h.lists[len(h.lists)-1]
	h.lists = h.lists[:len(h.lists)-1]
	return x
}
func (h *queueHeap) Less(i, j int) bool {
	a, b := h.lists[i], h.lists[j]
	if x, y := belowShare(a.q, a.req), belowShare(b.q, b.req); x != y {
		return x
	}
	if x, y := belowQuota(a.q, a.req), belowQuota(b.q, b.req); x != y {
		return x
	}
	if a.q.priority != b.q.priority {
		return a.q.priority > b.q.priority
	}
	if x, y := h.s.dominantShare(a.q), h.s.dominantShare(b.q); x != y {
		return x < y
	}
	return a.q.name < b.q.name
}

// belowShare: the queue's current allocation is below its fair share in
// every resource the head job contends for. DESIGN.md compares the
// allocation alone, not allocation + request: a queue far below its share
// goes first even when its next job is big (reclaim, not ordering, keeps it
// from overshooting).
func belowShare(q *queueState, req Resources) bool {
	for r := range req {
		if contests(req, Resource(r)) && q.allocated[r] >= q.fairShare[r] {
			return false
		}
	}
	return true
}

// belowQuota is belowShare for the quota; an unlimited quota is never
// reached.
func belowQuota(q *queueState, req Resources) bool {
	for r := range req {
		if contests(req, Resource(r)) && q.quota[r] != Unlimited && q.allocated[r] >= q.quota[r] {
			return false
		}
	}
	return true
}

// contests is contestedResources without the slice (heap comparisons are
// hot): GPU alone for a job asking GPUs, else whatever it asks.
func contests(req Resources, r Resource) bool {
	if req[ResGPU] > 0 {
		return r == ResGPU
	}
	return req[r] > 0
}

// dominantShare is the largest, over resources, of allocated ÷ capacity.
func (s *session) dominantShare(q *queueState) float64 {
	var d float64
	for r := range q.allocated {
		if s.capacity[r] > 0 {
			d = max(d, float64(q.allocated[r])/float64(s.capacity[r]))
		}
	}
	return d
}

// jobCmp orders jobs within a queue: short of minMember first, then
// priority, then creation time, then name.
func jobCmp(a, b *jobState) int {
	as, bs := a.short(), b.short()
	if as != bs {
		if as {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(b.priority, a.priority); c != 0 {
		return c
	}
	if c := a.created.Compare(b.created); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// runOrdered visits jobs in job order across queues. pick selects a queue's
// jobs; need gives a job's next request (ok=false: the job is done); visit
// tries it and reports whether the job stays at the head for another turn.
func (s *session) runOrdered(pick func(j *jobState) bool, need func(j *jobState) (Resources, bool), visit func(j *jobState) (again bool)) {
	h := &queueHeap{s: s}
	for _, q := range s.queues {
		var js []*jobState
		for _, j := range q.jobs {
			if pick(j) {
				js = append(js, j)
			}
		}
		if len(js) == 0 {
			continue
		}
		sortJobs(js)
		l := &jobList{q: q, jobs: js}
		if advance(l, need) {
			h.lists = append(h.lists, l)
		}
	}
	heap.Init(h)
	for h.Len() > 0 {
		l := h.lists[0]
		if !visit(l.jobs[l.i]) {
			l.i++
		}
		if advance(l, need) {
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
		}
	}
}

// advance moves l to its next job with work and sets its request.
func advance(l *jobList, need func(j *jobState) (Resources, bool)) bool {
	for ; l.i < len(l.jobs); l.i++ {
		if r, ok := need(l.jobs[l.i]); ok {
			l.req = r
			return true
		}
	}
	return false
}

func sortJobs(js []*jobState) {
	// Stable insertion of a sort; slices.SortFunc is fine as jobCmp is total.
	sortFunc(js, jobCmp)
}
