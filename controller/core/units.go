package core

import (
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// mulDiv returns floor(a*b/c) for non-negative a, b and positive c without
// overflow: memory in bytes times a weight easily exceeds 2^63.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		// The quotient does not fit; callers only pass a ≤ c or b ≤ c.
		return int64(^uint64(0) >> 1)
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// ceilDiv returns ceil(a/b) for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// formatMilli writes a milli-unit amount as a decimal ("8", "0.5", "0.125").
func formatMilli(v int64) string {
	if v%1000 == 0 {
		return strconv.FormatInt(v/1000, 10)
	}
	s := fmt.Sprintf("%d.%03d", v/1000, v%1000)
	for s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return s
}

// formatBytes writes bytes for a person: exactly with the largest binary
// suffix that divides them when that is Mi or larger ("20Gi", "1536Mi");
// otherwise (a node's allocatable such as 263853748Ki, a decimal request such
// as 550G) in the largest binary unit it reaches, to two decimals
// ("251.63Gi"), since a count of Ki or bytes is unreadable in a message.
func formatBytes(v int64) string {
	units := []struct {
		s string
		n int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}}
	for _, u := range units[:3] {
		if v != 0 && v%u.n == 0 {
			return strconv.FormatInt(v/u.n, 10) + u.s
		}
	}
	for _, u := range units {
		if v >= u.n {
			s := strconv.FormatFloat(float64(v)/float64(u.n), 'f', 2, 64)
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
			return s + u.s
		}
	}
	return strconv.FormatInt(v, 10)
}

// formatAmount writes an amount of a resource the way a person reads it:
// "8 GPUs", "1 GPU", "0.5 GPUs", "4 CPUs", "64Gi memory".
func formatAmount(r Resource, v int64) string {
	switch r {
	case ResGPU:
		// Only exactly one is singular: "0.5 GPUs", as for any decimal.
		if v == 1000 {
			return formatMilli(v) + " GPU"
		}
		return formatMilli(v) + " GPUs"
	case ResCPU:
		if v == 1000 {
			return "1 CPU"
		}
		return formatMilli(v) + " CPUs"
	default:
		return formatBytes(v) + " memory"
	}
}

// plural writes a count and a noun, adding "s" only when the count is not 1
// ("1 free GPU", "4 free GPUs").
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// FormatGPU writes milli-GPU as GPU units ("8", "0.5") for reports.
func FormatGPU(milli int64) string { return formatMilli(milli) }

func sortFunc[T any](s []T, c func(a, b T) int) { slices.SortFunc(s, c) }
