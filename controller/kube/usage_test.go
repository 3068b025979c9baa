package kube

import (
	"bytes"
	"compress/gzip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/controller/core"
)

var testUsageConfig = core.UsageConfig{HalfLife: time.Hour, Window: 4 * time.Hour, Bucket: time.Hour}

// savedHistory is a history of two queues over a few buckets, and what
// they hold.
func savedHistory(t testing.TB) (*core.UsageHistory, map[string]core.Resources, time.Time) {
	t.Helper()
	start := time.Unix(1_800_000_000, 0).Truncate(time.Hour)
	h, err := core.NewUsageHistory(testUsageConfig, start)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]core.Resources{"a": {2000, 500, 1024}, "b": {1000, 0, 0}}
	h.Add(start, start.Add(150*time.Minute), held)
	h.Add(start.Add(150*time.Minute), start.Add(170*time.Minute), map[string]core.Resources{"a": {8000, 0, 0}})
	return h, held, start.Add(170 * time.Minute)
}

// TestUsageRoundTrip: a saved history reads back as it was, so a new leader
// computes the same decayed usage as the one that saved it.
func TestUsageRoundTrip(t *testing.T) {
	h, held, through := savedHistory(t)
	data, err := encodeUsage(h, testUsageConfig.Bucket, held, through, 4)
	if err != nil {
		t.Fatal(err)
	}
	h2, held2, through2, err := decodeUsage(data, testUsageConfig)
	if err != nil {
		t.Fatal(err)
	}
	if !through2.Equal(through) || !h2.Start.Equal(h.Start) || !reflect.DeepEqual(held2, held) {
		t.Errorf("read back through %v start %v held %v; saved %v %v %v", through2, h2.Start, held2, through, h.Start, held)
	}
	if got, want := h2.Decayed(), h.Decayed(); !reflect.DeepEqual(got, want) {
		t.Errorf("decayed usage read back %v, saved %v", got, want)
	}
	if !reflect.DeepEqual(h2.Open, h.Open) {
		t.Errorf("open bucket read back %v, saved %v", h2.Open, h.Open)
	}
	// Both continue alike.
	next := through.Add(3 * time.Hour)
	h.Add(through, next, held)
	h2.Add(through, next, held2)
	if got, want := h2.Decayed(), h.Decayed(); !reflect.DeepEqual(got, want) {
		t.Errorf("after 3 h more: %v, want %v", got, want)
	}
	// Kept to fewer buckets (a save too large), the newest stay.
	data, err = encodeUsage(h, testUsageConfig.Bucket, held, next, 1)
	if err != nil {
		t.Fatal(err)
	}
	h3, _, _, err := decodeUsage(data, testUsageConfig)
	if err != nil {
		t.Fatal(err)
	}
	for q, c := range h3.Closed {
		if len(c) > 1 || len(c) == 1 && c[0] != h.Closed[q][0] {
			t.Errorf("queue %s kept %v, want the newest bucket %v", q, c, h.Closed[q][0])
		}
	}
}

func gz(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.Bytes()
}

// TestDecodeUsageErrors: content that cannot be used is refused with a
// message naming what is wrong.
func TestDecodeUsageErrors(t *testing.T) {
	const ok = `"version":1,"bucketSeconds":3600,"start":1800000000,"through":1800000060`
	for _, tc := range []struct {
		name, json, want string
	}{
		{"not json", `{`, "unexpected EOF"},
		{"unknown field", `{` + ok + `,"extra":1}`, `unknown field "extra"`},
		{"version", `{"version":2,"bucketSeconds":3600,"start":1800000000,"through":1800000000}`, "version 2"},
		{"bucket", `{"version":1,"bucketSeconds":60,"start":1800000000,"through":1800000000}`, "buckets of 60s, configured 1h0m0s"},
		{"start", `{"version":1,"bucketSeconds":3600,"start":1800000001,"through":1800000001}`, "not a bucket boundary"},
		{"through", `{"version":1,"bucketSeconds":3600,"start":1800000000,"through":1800003601}`, "not in the open bucket"},
		{"short vector", `{` + ok + `,"queues":{"a":{"open":[1,2]}}}`, `queue "a": open: 2 amounts, want 3`},
		{"negative", `{` + ok + `,"queues":{"a":{"closed":[[0,0,0],[1,-1,0]]}}}`, `queue "a": closed[1]: amount -1 out of range`},
		{"empty name", `{` + ok + `,"queues":{"":{}}}`, "empty queue name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := decodeUsage(gz(t, tc.json), testUsageConfig)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), usageKey) {
				t.Errorf("got %v, want an error naming %s with %q", err, usageKey, tc.want)
			}
		})
	}
	if _, _, _, err := decodeUsage([]byte("plain"), testUsageConfig); err == nil || !strings.Contains(err.Error(), "not gzip") {
		t.Errorf("plain bytes: %v", err)
	}
}

// FuzzDecodeUsage: whatever the ConfigMap holds, reading it never panics,
// and what it accepts saves and reads back to the same decayed usage.
func FuzzDecodeUsage(f *testing.F) {
	h, held, through := savedHistory(f)
	data, err := encodeUsage(h, testUsageConfig.Bucket, held, through, 4)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(gz(f, `{"version":1,"bucketSeconds":3600,"start":1800000000,"through":1800000060,"queues":{"a":{"held":[1,2,3],"closed":[[4611686018427387904,0,0]]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, held, through, err := decodeUsage(data, testUsageConfig)
		if err != nil {
			return
		}
		again, err := encodeUsage(h, testUsageConfig.Bucket, held, through, 4)
		if err != nil {
			t.Fatal(err)
		}
		h2, _, _, err := decodeUsage(again, testUsageConfig)
		if err != nil {
			t.Fatalf("saved again, cannot be read: %v", err)
		}
		d1, d2 := h.Decayed(), h2.Decayed()
		for q, r := range d1 {
			if r != d2[q] {
				t.Fatalf("queue %s: decayed %v, read back %v", q, r, d2[q])
			}
		}
	})
}
