package core

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFairShareWithHistory: the over-quota split weighs each queue's share
// of past usage against its share of weight (DESIGN.md, "Fair share with
// history"); quota stays a guarantee, limits caps, and coefficient 0 or no
// usage is the split by weight alone.
func TestFairShareWithHistory(t *testing.T) {
	gpu := func(v int64) Resources { var r Resources; r[ResGPU] = v; return r }
	two := []Queue{queue("a", "", 0, -1, 1), queue("b", "", 0, -1, 1)}
	both := []Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 8)}
	cases := []struct {
		name   string
		k      int64
		queues []Queue
		usage  map[string]Resources
		want   map[string]int64
	}{
		{"coefficient 0 ignores usage", 0, two, map[string]Resources{"a": gpu(1000)}, map[string]int64{"a": 4000, "b": 4000}},
		{"no usage: by weight", 1000, two, nil, map[string]int64{"a": 4000, "b": 4000}},
		// e = 1/2 each; u_a = 1, u_b = 0; k = 0.5: a 1.5·½ − 0.5 = ¼, b ¾.
		{"all usage on a, k 0.5", 500, two, map[string]Resources{"a": gpu(5000)}, map[string]int64{"a": 2000, "b": 6000}},
		// k = 1: a's weight falls to 0: b takes all it wants.
		{"all usage on a, k 1", 1000, two, map[string]Resources{"a": gpu(5000)}, map[string]int64{"a": 0, "b": 8000}},
		// What b does not want goes to a by weight alone.
		{"idle capacity stays usable", 1000, two, map[string]Resources{"a": gpu(5000)}, map[string]int64{"a": 5000, "b": 3000}},
		// usage in proportion to weight: no change.
		{"usage as entitled", 1000, two, map[string]Resources{"a": gpu(300), "b": gpu(300)}, map[string]int64{"a": 4000, "b": 4000}},
		// a's quota of 3 is a guarantee: history moves only the rest.
		{"quota stays a guarantee", 1000, []Queue{queue("a", "", 3, -1, 1), queue("b", "", 0, -1, 1)}, map[string]Resources{"a": gpu(9)},
			map[string]int64{"a": 3000, "b": 5000}},
		// b's limit of 5 caps it; what it cannot take goes to a.
		{"limit stays a cap", 1000, []Queue{queue("a", "", 0, -1, 1), queue("b", "", 0, 5, 1)}, map[string]Resources{"a": gpu(9)},
			map[string]int64{"a": 3000, "b": 5000}},
		// A parent's usage is its children's: org used, other did not.
		{"parents sum their children", 500, []Queue{queue("org", "", 0, -1, 1), queue("x", "org", 0, -1, 1), queue("other", "", 0, -1, 1)},
			map[string]Resources{"x": gpu(7)}, map[string]int64{"org": 2000, "x": 2000, "other": 6000}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jobs := both
			if strings.HasPrefix(tc.name, "idle") {
				jobs = []Job{pendingJob("ja", "a", 8), pendingJob("jb", "b", 3)}
			}
			if tc.queues[1].Name == "x" {
				jobs = []Job{pendingJob("jx", "x", 8), pendingJob("jo", "other", 8)}
			}
			res := mustSchedule(t, &Snapshot{Nodes: nodes("n", 1, 8), Queues: tc.queues, Jobs: jobs, Usage: tc.usage}, Config{UsageCoefficient: tc.k})
			for q, w := range tc.want {
				assert.Equal(t, w, res.Queues[q].FairShare[ResGPU], "queue %s", q)
			}
		})
	}
}

// TestUsageCoefficientRange: a coefficient out of range is a Config error.
func TestUsageCoefficientRange(t *testing.T) {
	for _, k := range []int64{-1, MaxUsageCoefficient + 1} {
		_, err := Schedule(&Snapshot{}, Config{UsageCoefficient: k})
		require.ErrorContains(t, err, "usage coefficient")
	}
}

// TestDecayFactorsExact pins the fixed-point bits: 2^32 · 2^(-age/halfLife).
func TestDecayFactorsExact(t *testing.T) {
	c := UsageConfig{HalfLife: 2 * time.Hour, Window: 6 * time.Hour, Bucket: time.Hour}
	// 2^32/√2 = 3037000499.98 → 3037000500; 2^31; 2^32/√8 = 1518500249.99 → 1518500250 …
	assert.Equal(t, []int64{1 << 32, 3037000500, 1 << 31, 1518500250, 1 << 30, 759250125}, c.DecayFactors())
	c.HalfLife = 0
	assert.Equal(t, []int64{1 << 32, 1 << 32, 1 << 32, 1 << 32, 1 << 32, 1 << 32}, c.DecayFactors())
	c = UsageConfig{HalfLife: 24 * time.Hour, Window: 7 * 24 * time.Hour, Bucket: time.Hour}
	f := c.DecayFactors()
	assert.Len(t, f, 168)
	assert.Equal(t, int64(1<<31), f[24])
	assert.Equal(t, int64(1<<26), f[144])
}

// TestUsageHistory: time splits at bucket boundaries, buckets beyond the
// window are dropped, and the decayed sum weighs closed buckets only.
func TestUsageHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h, err := NewUsageHistory(UsageConfig{HalfLife: time.Hour, Window: 3 * time.Hour, Bucket: time.Hour}, t0)
	require.NoError(t, err)
	held := map[string]Resources{"a": {ResGPU: 2000}}
	h.Add(t0, t0.Add(90*time.Minute), held) // 1 h in bucket 0, 30 min open in bucket 1
	assert.Equal(t, int64(2000*3600), h.Decayed()["a"][ResGPU])
	h.AdvanceTo(t0.Add(2 * time.Hour))
	// bucket 1 (30 min) weighs 1, bucket 0 (1 h) ½.
	assert.Equal(t, int64(2000*1800+2000*3600/2), h.Decayed()["a"][ResGPU])
	h.AdvanceTo(t0.Add(4 * time.Hour)) // bucket 0 falls out of the 3-hour window
	assert.Len(t, h.Closed["a"], 3)
	assert.Equal(t, int64(2000*1800/4), h.Decayed()["a"][ResGPU])
	for _, bad := range []UsageConfig{{Window: time.Hour}, {Bucket: time.Hour, Window: 90 * time.Minute}, {Bucket: time.Second, Window: time.Hour}, {Bucket: time.Hour, Window: time.Hour, HalfLife: -time.Hour}} {
		_, err := NewUsageHistory(bad, t0)
		assert.Error(t, err, "%+v", bad)
	}
}
