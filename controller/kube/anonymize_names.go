package kube

import (
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// An anonymised snapshot renames every user-chosen name *segment by
// segment*: a segment is a maximal run of bytes at or above '0' (letters,
// digits, '_', ':' ...), a separator any byte below '0' ('-', '.', '/', ' '
// ...), kept as it is. Each segment maps to one token, the same everywhere,
// and the map is strictly order-preserving on segments with tokens made of
// bytes at or above '0'. Then any two strings made of renamed names, kept
// separators and kept text compare (byte-wise) as the originals did — names,
// `ns/name` keys, `node/device`, `<external>/ns/pod` — as long as a renamed
// name is followed by a separator or ends the string (docs/DESIGN.md, "Cycle
// snapshots and replay", says why). The core's tie-breaks on names therefore
// fall the same way, and a replay of the anonymised file decides the same.

// AnonymizeKeyVersion names the key file's format.
const AnonymizeKeyVersion = "tessera.dev/anonymize-key/v1"

// fixedSegments keep their text: the adapter and the core compare names
// against them (the implicit default queue, the external queue).
var fixedSegments = []string{DefaultQueue, externalQueue}

// tokenAlphabet is ascending byte order; every byte is at or above '0'.
// A token is a prefix from it and a fixed-width decimal number: digits
// make tokens unlike the words of a reason, so Restore finds them in text.
const tokenAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

// minTokenDigits: tokens have at least this many digits after the prefix.
const minTokenDigits = 2

// AnonymizeKey maps original name segments to their tokens. It is written
// to a file of its own (never into the snapshot) so that an admin can map a
// developer's findings back.
type AnonymizeKey struct {
	Version string `json:"version"`
	// Segments: original segment -> token.
	Segments map[string]string `json:"segments"`
	inverse  map[string]string
}

// segments splits s into its segments (runs of bytes >= '0'), in order.
func segments(s string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		if i < len(s) && isSegmentByte(s[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			out = append(out, s[start:i])
			start = -1
		}
	}
	return out
}

// mapSegments rewrites each segment of s through m; separators and
// segments m does not hold stay.
func mapSegments(s string, m map[string]string) string {
	return mapRuns(s, isSegmentByte, func(seg string) string {
		if t, ok := m[seg]; ok {
			return t
		}
		return seg
	})
}

func isSegmentByte(c byte) bool { return c >= '0' }

// mapRuns rewrites each maximal run of bytes for which in holds through f;
// the bytes between runs stay as they are.
func mapRuns(s string, in func(byte) bool, f func(string) string) string {
	var b strings.Builder
	start := -1
	for i := 0; i <= len(s); i++ {
		if i < len(s) && in(s[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			b.WriteString(f(s[start:i]))
			start = -1
		}
		if i < len(s) {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// newAnonymizeKey gives every segment a token, in one order-preserving map
// with fixedSegments mapping to themselves.
func newAnonymizeKey(segs map[string]bool) (*AnonymizeKey, error) {
	all := make([]string, 0, len(segs)+len(fixedSegments))
	fixed := map[string]bool{}
	for _, f := range fixedSegments {
		fixed[f] = true
		all = append(all, f)
	}
	for s := range segs {
		if !fixed[s] {
			all = append(all, s)
		}
	}
	sort.Strings(all)
	k := &AnonymizeKey{Version: AnonymizeKeyVersion, Segments: map[string]string{}}
	lo, gap := "", []string(nil)
	fill := func(hi string, hasHi bool) error {
		if len(gap) == 0 {
			return nil
		}
		toks, err := tokensBetween(lo, hi, hasHi, len(gap))
		if err != nil {
			return err
		}
		for i, s := range gap {
			k.Segments[s] = toks[i]
		}
		gap = gap[:0]
		return nil
	}
	for _, s := range all {
		if !fixed[s] {
			gap = append(gap, s)
			continue
		}
		if err := fill(s, true); err != nil {
			return nil, err
		}
		if segs[s] {
			k.Segments[s] = s
		}
		lo = s
	}
	if err := fill("", false); err != nil {
		return nil, err
	}
	return k, k.check()
}

// tokensBetween returns n ascending tokens, each above lo and (with hasHi)
// below hi: a prefix and a fixed-width decimal number.
func tokensBetween(lo, hi string, hasHi bool, n int) ([]string, error) {
	w := minTokenDigits
	for c := 100; c < n; c *= 10 {
		w++
	}
	var prefix string
	// A first byte strictly between lo's and hi's, the lowest letter that fits.
	for i := len(tokenAlphabet) - 1; i >= 0; i-- {
		c := tokenAlphabet[i]
		if (lo == "" || c > lo[0]) && (!hasHi || c < hi[0]) && (prefix == "" || c >= 'a') {
			prefix = string(c)
		}
	}
	switch {
	case prefix != "" && prefix[0] < 'a':
		prefix += "x" // a digit then a letter: no number in a reason looks like it
	case prefix != "":
	case !hasHi || !strings.HasPrefix(hi, lo):
		prefix = lo // lo's extensions are above lo and, lo not being a prefix of hi, below it
	default:
		p, rest := lo, hi[len(lo):]
		for rest != "" && rest[0] == '0' {
			p, rest = p+"0", rest[1:]
		}
		if rest == "" {
			return nil, fmt.Errorf("no token fits between name segments %q and %q", lo, hi)
		}
		prefix = p + "0"
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%0*d", prefix, w, i)
	}
	return out, nil
}

// check verifies what the equivalence rests on: one token per segment, no
// token shared, tokens of bytes >= '0', order kept.
func (k *AnonymizeKey) check() error {
	orig := make([]string, 0, len(k.Segments))
	k.inverse = map[string]string{}
	for o, t := range k.Segments {
		if o == "" || t == "" || len(segments(o)) != 1 || segments(o)[0] != o || len(segments(t)) != 1 || segments(t)[0] != t {
			return fmt.Errorf("anonymize key: %q -> %q is not one name segment to one token", o, t)
		}
		if prev, dup := k.inverse[t]; dup {
			return fmt.Errorf("anonymize key: %q and %q both map to %q", prev, o, t)
		}
		k.inverse[t] = o
		orig = append(orig, o)
	}
	sort.Strings(orig)
	for i := 1; i < len(orig); i++ {
		if k.Segments[orig[i-1]] >= k.Segments[orig[i]] {
			return fmt.Errorf("anonymize key: %q < %q but their tokens %q, %q are not in that order",
				orig[i-1], orig[i], k.Segments[orig[i-1]], k.Segments[orig[i]])
		}
	}
	return nil
}

// Anonymize renames s's segments as the snapshot's names were renamed.
func (k *AnonymizeKey) Anonymize(s string) string { return mapSegments(s, k.Segments) }

// Restore maps an anonymised name or text (a reason) back: every token of
// the key becomes its original segment; other text stays.
func (k *AnonymizeKey) Restore(s string) string {
	if k.inverse == nil {
		_ = k.check()
	}
	// Tokens are runs of [0-9a-z] (and fill a whole segment in a name); in
	// text a byte at or above '0' may follow one ("pod x:"), so runs of
	// token bytes are looked up, not segments.
	isToken := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' }
	return mapRuns(s, isToken, func(run string) string {
		if o, ok := k.inverse[run]; ok {
			return o
		}
		return run
	})
}

// RestoreDecisions maps decisions taken on an anonymised snapshot back to
// the original names.
func (k *AnonymizeKey) RestoreDecisions(d *Decisions) *Decisions {
	return renameDecisions(d, k.Restore, k.Restore)
}

// MarshalAnonymizeKey writes k as YAML.
func MarshalAnonymizeKey(k *AnonymizeKey) ([]byte, error) {
	data, err := yaml.Marshal(k)
	if err != nil {
		return nil, fmt.Errorf("writing anonymize key: %w", err)
	}
	// YAML cannot carry every byte (a DEL, say) that a string Kubernetes does
	// not validate, such as an image, may hold: refuse a key that would not
	// read back rather than write one that loses the mapping.
	if _, err := ParseAnonymizeKey(data); err != nil {
		return nil, fmt.Errorf("the anonymize key would not read back (a name holds a character YAML cannot carry): %w", err)
	}
	return data, nil
}

// ParseAnonymizeKey reads a key file, strictly: another version, an unknown
// field, a token used twice or a map that does not keep order is an error.
func ParseAnonymizeKey(data []byte) (*AnonymizeKey, error) {
	var k AnonymizeKey
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		return nil, fmt.Errorf("reading anonymize key: %w", err)
	}
	if k.Version != AnonymizeKeyVersion {
		return nil, fmt.Errorf("anonymize key version %q: this tool reads %q", k.Version, AnonymizeKeyVersion)
	}
	if err := k.check(); err != nil {
		return nil, err
	}
	return &k, nil
}

// renameDecisions renames d's names with name and its reasons with text.
func renameDecisions(d *Decisions, name, text func(string) string) *Decisions {
	if d == nil {
		return nil
	}
	out := &Decisions{}
	for _, b := range d.Binds {
		b.Pod, b.Job, b.Node = name(b.Pod), name(b.Job), name(b.Node)
		out.Binds = append(out.Binds, b)
	}
	for _, e := range d.Evictions {
		e.Pod, e.Node, e.MoveTo, e.Reason = name(e.Pod), name(e.Node), name(e.MoveTo), text(e.Reason)
		out.Evictions = append(out.Evictions, e)
	}
	for _, p := range d.Pending {
		p.Pod, p.Reason = name(p.Pod), text(p.Reason)
		out.Pending = append(out.Pending, p)
	}
	if d.FairShare != nil {
		out.FairShare = map[string]ShareDecision{}
		for q, s := range d.FairShare {
			out.FairShare[name(q)] = s
		}
	}
	return out
}
