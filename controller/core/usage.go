package core

import (
	"fmt"
	"math/big"
	"time"
)

// UsageConfig says how UsageHistory remembers: usage is summed per bucket
// of Bucket; the buckets of the last Window are kept, each weighed by
// 2^-(age/HalfLife), age being how many whole buckets ago it closed
// (the newest closed bucket weighs 1); HalfLife 0 is no decay.
type UsageConfig struct {
	HalfLife, Window, Bucket time.Duration
}

// Limits of UsageConfig, which bound what a history holds: at most
// MaxUsageBuckets buckets per queue.
const (
	MaxUsageBuckets = 2016 // a week of 5-minute buckets
	minUsageBucket  = time.Second
)

// Validate says what is wrong with c, naming the field.
func (c UsageConfig) Validate() error {
	switch {
	case c.Bucket < minUsageBucket || c.Bucket%time.Second != 0:
		return fmt.Errorf("bucket %v: want whole seconds, at least 1s", c.Bucket)
	case c.Window < c.Bucket || c.Window%c.Bucket != 0:
		return fmt.Errorf("window %v: want a whole number of buckets (%v)", c.Window, c.Bucket)
	case c.Window/c.Bucket > MaxUsageBuckets:
		return fmt.Errorf("window %v: %d buckets of %v, at most %d", c.Window, c.Window/c.Bucket, c.Bucket, MaxUsageBuckets)
	case c.HalfLife < 0 || c.HalfLife%time.Second != 0:
		return fmt.Errorf("halfLife %v: want whole seconds, 0 or more", c.HalfLife)
	}
	return nil
}

// usageOne is 1 in the fixed point of the decay factors.
const usageOne = 1 << 32

// DecayFactors is each bucket's weight by age (0 … Window/Bucket − 1) in
// units of 2^-32: round(2^32 · 2^-(age·Bucket/HalfLife)), computed with
// math/big, so every platform gets the same bits.
func (c UsageConfig) DecayFactors() []int64 {
	n := int(c.Window / c.Bucket)
	out := make([]int64, n)
	for age := range out {
		if c.HalfLife == 0 {
			out[age] = usageOne
			continue
		}
		out[age] = pow2Neg(int64(age)*int64(c.Bucket/time.Second), int64(c.HalfLife/time.Second))
	}
	return out
}

// pow2Neg is round(2^32 · 2^(-p/q)) for p ≥ 0, q > 0: the integer part of
// p/q shifts, the fraction's 40 leading bits multiply 2^(-2^-i), each a
// repeated square root of 1/2, at 200 bits of precision.
func pow2Neg(p, q int64) int64 {
	whole := p / q
	if whole >= 40 {
		return 0
	}
	const prec = 200
	x := new(big.Float).SetPrec(prec).SetInt64(1)
	root := new(big.Float).SetPrec(prec).SetFloat64(0.5)
	rem := p % q
	for i := 1; i <= 40 && rem != 0; i++ {
		root.Sqrt(root) // 2^(-2^-i)
		rem *= 2
		if rem >= q {
			rem -= q
			x.Mul(x, root)
		}
	}
	x.SetMantExp(x, 32-int(whole))
	x.Add(x, new(big.Float).SetPrec(prec).SetFloat64(0.5))
	v, _ := x.Int64()
	return v
}

// UsageHistory keeps per queue and resource what queues held over time, in
// unit-seconds (milli-GPU-seconds, milli-CPU-seconds, MiB-seconds of
// memory, other resources as they are counted), in buckets, and gives the
// decayed sum of the closed ones. It is pure: the simulator and the
// controller feed it what pods held.
type UsageHistory struct {
	cfg     UsageConfig
	factors []int64
	// Start is when the open bucket began.
	Start time.Time
	// Open is the open bucket per queue; Closed the closed ones, newest
	// first, at most Window/Bucket.
	Open   map[string]Resources
	Closed map[string][]Resources
}

// NewUsageHistory starts an empty history whose first bucket begins at
// start.
func NewUsageHistory(cfg UsageConfig, start time.Time) (*UsageHistory, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &UsageHistory{cfg: cfg, factors: cfg.DecayFactors(), Start: start, Open: map[string]Resources{}, Closed: map[string][]Resources{}}, nil
}

// NextBoundary is when the open bucket closes: the decayed usage changes
// then and only then.
func (h *UsageHistory) NextBoundary() time.Time { return h.Start.Add(h.cfg.Bucket) }

// Add records that each queue held held[q] from t0 to t1 (t0 ≥ Start),
// closing buckets as their end passes, so the part of the time in each
// bucket goes to it.
func (h *UsageHistory) Add(t0, t1 time.Time, held map[string]Resources) {
	for t0.Before(t1) {
		end := h.NextBoundary()
		seg := t1
		if end.Before(t1) {
			seg = end
		}
		secs := int64(seg.Sub(t0) / time.Second)
		for q, r := range held {
			o := h.Open[q]
			for i := range r {
				o[i] = satAdd(o[i], satMul(max(r[i], 0), secs))
			}
			h.Open[q] = o
		}
		t0 = seg
		if !t0.Before(end) {
			h.roll()
		}
	}
}

// AdvanceTo closes the buckets that ended by t.
func (h *UsageHistory) AdvanceTo(t time.Time) {
	for !t.Before(h.NextBoundary()) {
		h.roll()
	}
}

func (h *UsageHistory) roll() {
	n := len(h.factors)
	for q := range h.Open {
		if _, ok := h.Closed[q]; !ok {
			h.Closed[q] = nil
		}
	}
	for q, c := range h.Closed {
		c = append([]Resources{h.Open[q]}, c...)
		if len(c) > n {
			c = c[:n]
		}
		h.Closed[q] = c
	}
	h.Open = map[string]Resources{}
	h.Start = h.Start.Add(h.cfg.Bucket)
}

// Decayed is each queue's decayed usage of the closed buckets:
// Σ closed[age] · factor[age] / 2^32, rounded down per bucket.
func (h *UsageHistory) Decayed() map[string]Resources {
	out := map[string]Resources{}
	for q, c := range h.Closed {
		var sum Resources
		for age, b := range c {
			for i := range b {
				sum[i] = satAdd(sum[i], mulDiv(b[i], h.factors[age], usageOne))
			}
		}
		out[q] = sum
	}
	return out
}

// satMul is a·b for non-negative a, b, saturating at 2^62.
func satMul(a, b int64) int64 {
	if b != 0 && a > (1<<62)/b {
		return 1 << 62
	}
	return a * b
}
