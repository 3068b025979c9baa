package kube

import (
	"context"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ownWrites remembers what the last commit wrote (pods bound, claims
// updated), so the next cycle waits until the informers have seen it. A cycle
// that started from caches missing our own last writes would see a pod we
// just bound as pending and the devices we just allocated as free, and could
// hand those devices to a second claim.
type ownWrites struct {
	mu     sync.Mutex
	pods   map[types.NamespacedName]podMark
	claims map[types.NamespacedName]claimMark
}

type podMark struct{ uid types.UID }

type claimMark struct {
	uid types.UID
	rv  string
}

// ownWritesWait bounds how long a cycle waits for its informers; past it
// the cycle runs anyway (the commit's own checks still refuse a claim that
// was allocated meanwhile).
const ownWritesWait = 5 * time.Second

func (w *ownWrites) bound(ns, name string, uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods == nil {
		w.pods = map[types.NamespacedName]podMark{}
	}
	w.pods[types.NamespacedName{Namespace: ns, Name: name}] = podMark{uid}
}

func (w *ownWrites) claim(ns, name string, uid types.UID, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.claims == nil {
		w.claims = map[types.NamespacedName]claimMark{}
	}
	w.claims[types.NamespacedName{Namespace: ns, Name: name}] = claimMark{uid, rv}
}

// awaitOwnWrites waits until the informers reflect the last commit.
func (s *Scheduler) awaitOwnWrites(ctx context.Context) {
	w := &s.own
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pods) == 0 && len(w.claims) == 0 {
		return
	}
	start := time.Now()
	for {
		for k, m := range w.pods {
			p, err := s.podLister.Pods(k.Namespace).Get(k.Name)
			if err != nil || p.UID != m.uid || p.Spec.NodeName != "" {
				delete(w.pods, k)
			}
		}
		for k, m := range w.claims {
			c, err := s.claimLister.ResourceClaims(k.Namespace).Get(k.Name)
			if err != nil || c.UID != m.uid || !rvBefore(c.ResourceVersion, m.rv) {
				delete(w.claims, k)
			}
		}
		if len(w.pods) == 0 && len(w.claims) == 0 {
			return
		}
		if time.Since(start) > ownWritesWait {
			klog.FromContext(ctx).Info("Informers still miss our last writes; scheduling anyway", "pods", len(w.pods), "claims", len(w.claims))
			w.pods, w.claims = nil, nil
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// rvBefore says whether resource version a is older than b. Resource
// versions are etcd revisions in practice; when they do not parse, only
// equality counts as caught up.
func rvBefore(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return a != b
	}
	return x < y
}
