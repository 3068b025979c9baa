package kube

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controller/core"
)

// The usage ConfigMap: the history, gzip'd JSON (usageState), under
// binaryData[usageKey]; content that could not be read is kept under
// usageRejectedKey, once, when small enough.
const (
	usageKey         = "usage.json.gz"
	usageRejectedKey = "rejected-usage.json.gz"
	usageVersion     = 1
	// maxUsageBytes bounds the saved history (a ConfigMap holds 1 MiB):
	// beyond it the oldest buckets are left out of the save.
	maxUsageBytes = 512 << 10
	// maxUsageJSON bounds what reading the saved history inflates.
	maxUsageJSON = 64 << 20
)

// usageState is the saved history: the open bucket's start and the time
// usage was counted until (Unix seconds), and per leaf queue what it held
// then, its open bucket and its closed buckets (newest first), each a
// vector of core.NumResources amounts (milli-GPU-, milli-CPU-,
// MiB-seconds).
type usageState struct {
	Version       int                        `json:"version"`
	BucketSeconds int64                      `json:"bucketSeconds"`
	Start         int64                      `json:"start"`
	Through       int64                      `json:"through"`
	Queues        map[string]usageQueueState `json:"queues"`
}

type usageQueueState struct {
	Held   []int64   `json:"held,omitempty"`
	Open   []int64   `json:"open,omitempty"`
	Closed [][]int64 `json:"closed,omitempty"`
}

// encodeUsage writes the history, keeping at most keep closed buckets per
// queue; queues with nothing in them are left out.
func encodeUsage(h *core.UsageHistory, bucket time.Duration, held map[string]core.Resources, through time.Time, keep int) ([]byte, error) {
	st := usageState{Version: usageVersion, BucketSeconds: int64(bucket / time.Second), Start: h.Start.Unix(), Through: through.Unix(), Queues: map[string]usageQueueState{}}
	names := map[string]bool{}
	for _, m := range []map[string]core.Resources{held, h.Open} {
		for q := range m {
			names[q] = true
		}
	}
	for q := range h.Closed {
		names[q] = true
	}
	for q := range names {
		var qs usageQueueState
		if r, ok := held[q]; ok && r != (core.Resources{}) {
			qs.Held = r[:]
		}
		if r, ok := h.Open[q]; ok && r != (core.Resources{}) {
			qs.Open = r[:]
		}
		c := h.Closed[q]
		if len(c) > keep {
			c = c[:keep]
		}
		last := -1
		for i, b := range c {
			if b != (core.Resources{}) {
				last = i
			}
		}
		for _, b := range c[:last+1] {
			qs.Closed = append(qs.Closed, append([]int64(nil), b[:]...))
		}
		if qs.Held != nil || qs.Open != nil || qs.Closed != nil {
			st.Queues[q] = qs
		}
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeUsage reads a saved history for cfg. The error names what is wrong.
func decodeUsage(data []byte, cfg core.UsageConfig) (*core.UsageHistory, map[string]core.Resources, time.Time, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("%s: not gzip: %w", usageKey, err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxUsageJSON+1))
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("%s: %w", usageKey, err)
	}
	if len(raw) > maxUsageJSON {
		return nil, nil, time.Time{}, fmt.Errorf("%s: more than %d bytes of JSON", usageKey, maxUsageJSON)
	}
	var st usageState
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("%s: %w", usageKey, err)
	}
	switch {
	case st.Version != usageVersion:
		return nil, nil, time.Time{}, fmt.Errorf("%s: version %d, want %d", usageKey, st.Version, usageVersion)
	case st.BucketSeconds != int64(cfg.Bucket/time.Second):
		return nil, nil, time.Time{}, fmt.Errorf("%s: buckets of %ds, configured %v", usageKey, st.BucketSeconds, cfg.Bucket)
	case st.Start < 0 || st.Start > 1<<40 || st.Start%st.BucketSeconds != 0:
		return nil, nil, time.Time{}, fmt.Errorf("%s: start %d is not a bucket boundary", usageKey, st.Start)
	case st.Through < st.Start || st.Through > st.Start+st.BucketSeconds:
		return nil, nil, time.Time{}, fmt.Errorf("%s: through %d is not in the open bucket [%d, %d]", usageKey, st.Through, st.Start, st.Start+st.BucketSeconds)
	}
	h, err := core.NewUsageHistory(cfg, time.Unix(st.Start, 0))
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	held := map[string]core.Resources{}
	keep := int(cfg.Window / cfg.Bucket)
	for q, qs := range st.Queues {
		if err := readQueueState(h, held, q, qs, keep); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("%s: queue %q: %w", usageKey, q, err)
		}
	}
	return h, held, time.Unix(st.Through, 0), nil
}

// readQueueState checks one queue's saved buckets and puts them in h.
func readQueueState(h *core.UsageHistory, held map[string]core.Resources, q string, qs usageQueueState, keep int) error {
	if q == "" {
		return errors.New("empty queue name")
	}
	vec := func(what string, v []int64) (core.Resources, error) {
		var r core.Resources
		if len(v) != len(r) {
			return r, fmt.Errorf("%s: %d amounts, want %d", what, len(v), len(r))
		}
		for i, x := range v {
			if x < 0 || x > 1<<62 {
				return r, fmt.Errorf("%s: amount %d out of range (0 to 2^62)", what, x)
			}
			r[i] = x
		}
		return r, nil
	}
	var err error
	if qs.Held != nil {
		if held[q], err = vec("held", qs.Held); err != nil {
			return err
		}
	}
	if qs.Open != nil {
		if h.Open[q], err = vec("open", qs.Open); err != nil {
			return err
		}
	}
	if len(qs.Closed) > core.MaxUsageBuckets {
		return fmt.Errorf("%d closed buckets, at most %d", len(qs.Closed), core.MaxUsageBuckets)
	}
	var closed []core.Resources
	for i, b := range qs.Closed {
		r, err := vec(fmt.Sprintf("closed[%d]", i), b)
		if err != nil {
			return err
		}
		if i < keep {
			closed = append(closed, r)
		}
	}
	h.Closed[q] = closed
	return nil
}

// load reads the saved history at a leader's first cycle, and again after
// a save was refused for a conflict (someone else wrote the ConfigMap).
// None saved, or one that cannot be used (another bucket length, bad
// content: logged and told in a Warning event on the ConfigMap with why, the
// content kept under usageRejectedKey), starts empty; a gap since the save
// longer than MaxGap counts as nothing held. A re-read keeps the in-memory
// history unless the saved one is a usable, newer one (another leader's):
// a ConfigMap deleted, recreated empty, corrupted or holding an older copy
// loses nothing, and the next save writes the in-memory history over it. A
// failed read is tried again next cycle.
func (u *usageKeeper) load(ctx context.Context, now time.Time) {
	log := u.logger(ctx)
	had := u.hist != nil
	if !had {
		u.fresh(now)
	}
	cm, err := u.s.client.CoreV1().ConfigMaps(u.opts.Namespace).Get(ctx, u.opts.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && had:
		log.Info("Usage history ConfigMap is gone; saving the in-memory history again (nothing lost)", "through", u.last)
		u.loaded, u.rv, u.savedAt, u.recreate = true, "", time.Time{}, true
		return
	case apierrors.IsNotFound(err):
		log.Info("No usage history saved; starting one")
		u.loaded, u.rv = true, ""
		return
	case err != nil:
		log.Error(err, "Reading the usage history; trying again next cycle")
		return
	}
	u.loaded, u.rv, u.rejected = true, cm.ResourceVersion, nil
	data, err := usageData(cm)
	var h *core.UsageHistory
	var held map[string]core.Resources
	var through time.Time
	if err == nil {
		h, held, through, err = decodeUsage(data, u.opts.Config)
	}
	if err != nil {
		u.reject(ctx, cm, err, had)
		return
	}
	if err := u.usable(h, through, now); err != nil {
		if had {
			log.Info("Saved usage history cannot be continued; keeping the in-memory history and saving it over the ConfigMap", "why", err.Error())
			u.savedAt = time.Time{}
		} else {
			log.Info("Saved usage history cannot be continued; starting over", "why", err.Error())
		}
		return
	}
	switch {
	case had && !through.After(u.last):
		log.Info("Saved usage history is not newer than the in-memory one; keeping the in-memory history and saving it over the ConfigMap",
			"saved", through, "inMemory", u.last)
		u.savedAt = time.Time{}
		return
	}
	u.hist, u.last, u.held, u.decayed = h, through, held, nil
	if now.Sub(through) > u.opts.MaxGap {
		u.held = map[string]core.Resources{}
	}
	log.Info("Continuing the saved usage history", "saved", through, "queues", len(h.Closed), "gap", now.Sub(through).Round(time.Second))
}

// usageData is the saved history's bytes; an error names what is missing.
func usageData(cm *v1.ConfigMap) ([]byte, error) {
	if data, ok := cm.BinaryData[usageKey]; ok {
		return data, nil
	}
	var keys []string
	for k := range cm.BinaryData {
		keys = append(keys, "binaryData."+k)
	}
	for k := range cm.Data {
		keys = append(keys, "data."+k)
	}
	sort.Strings(keys)
	return nil, fmt.Errorf("no binaryData[%s] in the ConfigMap (it has %v)", usageKey, keys)
}

// usable says why a decoded history cannot be continued at now, or nil.
func (u *usageKeeper) usable(h *core.UsageHistory, through, now time.Time) error {
	switch {
	case now.Sub(h.Start) > u.opts.Config.Window+u.opts.Config.Bucket:
		return fmt.Errorf("%s: saved through %s, older than the window (%v)", usageKey, through.UTC().Format(time.RFC3339), u.opts.Config.Window)
	case through.After(now.Add(u.opts.MaxGap)):
		return fmt.Errorf("%s: saved through %s, in the future (clocks apart?)", usageKey, through.UTC().Format(time.RFC3339))
	}
	return nil
}

// reject handles a saved history that cannot be used: the content is kept
// under usageRejectedKey (when small enough) at the next save, and the log
// and a Warning event on the ConfigMap say why and what was lost — the
// saved usage at a leader's start, nothing when an in-memory history is
// kept (had), which the next save writes over the ConfigMap.
func (u *usageKeeper) reject(ctx context.Context, cm *v1.ConfigMap, why error, had bool) {
	data := cm.BinaryData[usageKey]
	if len(data) <= maxUsageBytes/2 {
		u.rejected = data
	}
	kept := "the unreadable content is kept under binaryData[" + usageRejectedKey + "]"
	switch {
	case len(data) == 0:
		kept = "there was no content to keep"
	case u.rejected == nil:
		kept = "the unreadable content is too large to keep and is dropped"
	}
	var msg string
	if had {
		u.savedAt = time.Time{}
		msg = fmt.Sprintf("Saved usage history cannot be used: %v; nothing lost: the in-memory history (through %s) is saved over it; %s",
			why, u.last.UTC().Format(time.RFC3339), kept)
	} else {
		msg = fmt.Sprintf("Saved usage history cannot be used: %v; starting over: the saved usage is lost; %s", why, kept)
	}
	u.logger(ctx).Error(why, msg)
	u.s.recorder.Event(cm, v1.EventTypeWarning, "UsageHistoryRejected", msg)
}

// save writes the history when a bucket closed since the last save or
// SaveEvery has passed. A write refused for a conflict means another
// replica saved: this one reads the history again at its next cycle.
func (u *usageKeeper) save(ctx context.Context, now time.Time) {
	if u == nil || !u.loaded || (u.hist.Start.Equal(u.savedOpen) && now.Sub(u.savedAt) < u.opts.SaveEvery) {
		return
	}
	log := u.logger(ctx)
	u.prune()
	keep := int(u.opts.Config.Window / u.opts.Config.Bucket)
	var data []byte
	for {
		var err error
		if data, err = encodeUsage(u.hist, u.opts.Config.Bucket, u.held, u.last, keep); err != nil {
			log.Error(err, "Encoding the usage history")
			return
		}
		if len(data) <= maxUsageBytes || keep == 0 {
			break
		}
		keep /= 2
		log.Info("Usage history too large to save whole; saving the newest buckets", "buckets", keep, "bytes", len(data))
	}
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.opts.Namespace, Name: u.opts.Name, ResourceVersion: u.rv,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "tessera-controller"}},
		BinaryData: map[string][]byte{usageKey: data},
	}
	if u.rejected != nil {
		cm.BinaryData[usageRejectedKey] = u.rejected
	}
	api := u.s.client.CoreV1().ConfigMaps(u.opts.Namespace)
	var out *v1.ConfigMap
	var err error
	if u.rv == "" {
		out, err = api.Create(ctx, cm, metav1.CreateOptions{})
	} else {
		out, err = api.Update(ctx, cm, metav1.UpdateOptions{})
	}
	switch {
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		log.Error(err, "Usage history saved by someone else; reading it again")
		u.loaded = false
		return
	case apierrors.IsNotFound(err):
		// Deleted under us: create it again at the next save (cycle).
		log.Info("Usage history ConfigMap was deleted; creating it again from the in-memory history (nothing lost)", "through", u.last)
		u.rv, u.recreate = "", true
		return
	case err != nil:
		log.Error(err, "Saving the usage history; trying again next cycle")
		return
	}
	u.rv, u.savedAt, u.savedOpen = out.ResourceVersion, now, u.hist.Start
	if u.recreate {
		u.recreate = false
		u.s.recorder.Eventf(out, v1.EventTypeNormal, "UsageHistoryRecreated",
			"The usage history ConfigMap was deleted; created again from the in-memory history (through %s): nothing lost", u.last.UTC().Format(time.RFC3339))
	}
	log.V(4).Info("Saved the usage history", "bytes", len(data), "through", u.last)
}

// prune forgets queues with nothing left in their window (deleted Queues,
// once their usage has aged out), so the history stays as large as the
// queues that used something.
func (u *usageKeeper) prune() {
	var gone []string
	for q, c := range u.hist.Closed {
		empty := u.hist.Open[q] == (core.Resources{}) && u.held[q] == (core.Resources{})
		for _, b := range c {
			empty = empty && b == (core.Resources{})
		}
		if empty {
			gone = append(gone, q)
		}
	}
	sort.Strings(gone)
	for _, q := range gone {
		delete(u.hist.Closed, q)
		delete(u.hist.Open, q)
	}
}

// SavedUsage reads a usage ConfigMap as a new leader with cfg would and
// gives each queue's decayed usage of resource r, in the unit Queue status
// and tessera_queue_usage show (GPU-seconds, CPU-seconds, byte-seconds): a
// reader outside the package (tests, tools) need not know the format.
func SavedUsage(cm *v1.ConfigMap, cfg core.UsageConfig, r core.Resource) (map[string]float64, error) {
	data, err := usageData(cm)
	if err != nil {
		return nil, err
	}
	h, _, _, err := decodeUsage(data, cfg)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for q, u := range h.Decayed() {
		out[q] = quantity(r, usageAmount(r, u[r]))
	}
	return out, nil
}
