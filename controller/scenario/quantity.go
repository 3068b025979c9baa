package scenario

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
)

// Quantities are parsed with exact rational arithmetic: the core counts in
// milli-GPU, milli-CPU and bytes, and a value that does not land on a whole
// unit is an error rather than a rounding.

// parseDecimal parses an optionally signed decimal ("2", "0.25", "-1", "1e3").
func parseDecimal(s string) (*big.Rat, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty value")
	}
	if len(s) > maxDecimalLen {
		return nil, fmt.Errorf("%.20q... is longer than %d characters", s, maxDecimalLen)
	}
	if !decimalRE.MatchString(s) {
		if longExponentRE.MatchString(s) {
			return nil, fmt.Errorf("%q has an exponent of more than two digits", s)
		}
		return nil, fmt.Errorf("%q is not a number", s)
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("%q is not a number", s)
	}
	return r, nil
}

// decimalRE is what parseDecimal reads: digits with an optional point and
// an exponent of at most two digits. big.Rat alone would also read
// fractions ("1/3") and hex floats, and expands any exponent it is given:
// "1e1000000" took a quarter second and a million digits, so a file of
// such values loaded for minutes. No field holds a value that needs a
// longer exponent or more than maxDecimalLen characters.
var decimalRE = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,2})?$`)

var longExponentRE = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?[0-9]{3,}$`)

const maxDecimalLen = 64

func ratToInt64(r *big.Rat, what string) (int64, error) {
	if !r.IsInt() {
		return 0, fmt.Errorf("%s is not a whole number of %s", r.FloatString(6), what)
	}
	n := r.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("too large")
	}
	return n.Int64(), nil
}

// parseMilli parses a count of units into thousandths: "0.25" → 250. With
// allowM, a Kubernetes-style "500m" is accepted too (CPU).
func parseMilli(s string, allowM bool) (int64, error) {
	s = strings.TrimSpace(s)
	scale := big.NewRat(1000, 1)
	if allowM && strings.HasSuffix(s, "m") {
		s = strings.TrimSuffix(s, "m")
		scale = big.NewRat(1, 1)
	}
	r, err := parseDecimal(s)
	if err != nil {
		return 0, err
	}
	r.Mul(r, scale)
	if !r.IsInt() {
		return 0, fmt.Errorf("%s is finer than a thousandth", strings.TrimSpace(s))
	}
	return ratToInt64(r, "thousandths")
}

// parseMilliRounded is parseMilli for expected figures: a value finer than a
// thousandth (2.6667 for eight GPUs shared by three) is rounded to the
// nearest thousandth, the precision the report gives, instead of refused.
func parseMilliRounded(s string) (int64, error) {
	r, err := parseDecimal(strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	r.Mul(r, big.NewRat(1000, 1))
	if !r.IsInt() {
		half := big.NewRat(1, 2)
		if r.Sign() < 0 {
			half.Neg(half)
		}
		r.Add(r, half)
		r.SetInt(new(big.Int).Quo(r.Num(), r.Denom())) // truncates toward zero
	}
	return ratToInt64(r, "thousandths")
}

var byteSuffixes = []struct {
	suffix string
	mult   int64
}{
	// Two-letter suffixes first so "Gi" is not read as "G".
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// parseBytes parses a memory size: a plain number of bytes or a number with a
// Kubernetes suffix (Ki, Mi, Gi, Ti, Pi, k, M, G, T, P).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, sf := range byteSuffixes {
		if strings.HasSuffix(s, sf.suffix) {
			s = strings.TrimSuffix(s, sf.suffix)
			mult = sf.mult
			break
		}
	}
	r, err := parseDecimal(s)
	if err != nil {
		return 0, err
	}
	r.Mul(r, big.NewRat(mult, 1))
	if !r.IsInt() {
		return 0, fmt.Errorf("is not a whole number of bytes")
	}
	v, err := ratToInt64(r, "bytes")
	if err != nil {
		return 0, err
	}
	return v, nil
}

// formatMilli writes thousandths as a plain decimal: 8000 → "8", 250 → "0.25".
func formatMilli(m int64) string {
	sign := ""
	if m < 0 {
		sign = "-"
		if m == math.MinInt64 {
			return "-9223372036854775.808"
		}
		m = -m
	}
	whole, frac := m/1000, m%1000
	if frac == 0 {
		return fmt.Sprintf("%s%d", sign, whole)
	}
	return strings.TrimRight(fmt.Sprintf("%s%d.%03d", sign, whole, frac), "0")
}

// formatBytes writes a byte count with the largest binary suffix that divides
// it exactly: 85899345920 → "80Gi".
func formatBytes(b int64) string {
	if b == 0 {
		return "0"
	}
	for _, sf := range []struct {
		s string
		m int64
	}{{"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b%sf.m == 0 {
			return fmt.Sprintf("%d%s", b/sf.m, sf.s)
		}
	}
	return fmt.Sprintf("%d", b)
}
