package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	schedv1 "github.com/tessera-gpu/tessera/api/scheduling/v1alpha1"
	"github.com/tessera-gpu/tessera/controller/kube"
	"github.com/tessera-gpu/tessera/internal/fairplot"
)

// sampleEvery is how often the demo reads the Queues' status for its
// picture.
const sampleEvery = 2 * time.Second

// watcher samples, while the story runs, what tessera-controller wrote in
// each Queue's status: GPUs allocated and fair share, and the quota.
type watcher struct {
	mu      sync.Mutex
	start   time.Time
	x       []float64
	samples []map[string]queueSample
	stop    context.CancelFunc
	done    chan struct{}
}

type queueSample struct{ allocated, share, quota float64 }

// watchQueues starts sampling until the returned watcher's finish.
func (d *demo) watchQueues(ctx context.Context) *watcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &watcher{start: time.Now(), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			if s, err := d.queueSamples(ctx); err == nil {
				w.mu.Lock()
				w.x = append(w.x, time.Since(w.start).Seconds())
				w.samples = append(w.samples, s)
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (d *demo) queueSamples(ctx context.Context) (map[string]queueSample, error) {
	list, err := d.dyn.Resource(kube.QueueGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]queueSample{}
	for i := range list.Items {
		q := &schedv1.Queue{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, q); err != nil {
			continue
		}
		st, ok := q.Status.Resources["gpu"]
		if !ok {
			continue
		}
		s := queueSample{allocated: st.Allocated.AsApproximateFloat64(), share: st.FairShare.AsApproximateFloat64()}
		if g := q.Spec.Resources.GPU; g != nil && g.Quota != nil {
			s.quota = g.Quota.AsApproximateFloat64()
		}
		out[q.Name] = s
	}
	return out, nil
}

// finish stops sampling and draws the picture to path (SVG or PNG by its
// extension): the queues that held GPUs at some sample, in name order.
func (w *watcher) finish(path string) error {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range w.samples {
		for q, v := range s {
			seen[q] = seen[q] || v.allocated > 0
		}
	}
	var names []string
	for q, used := range seen {
		if used {
			names = append(names, q)
		}
	}
	sort.Strings(names)
	c := &fairplot.Chart{Title: "make demo", XLabel: "second", X: w.x}
	for _, q := range names {
		fq := fairplot.Queue{Name: q}
		for _, s := range w.samples {
			fq.Allocated = append(fq.Allocated, s[q].allocated)
			fq.FairShare = append(fq.FairShare, s[q].share)
			fq.Quota = append(fq.Quota, s[q].quota)
		}
		c.Queues = append(c.Queues, fq)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("the demo's picture: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return fairplot.Save(c, path)
}
