package kube

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzAnonymizeOrder: for any two strings, the renaming keeps their order
// (and equality), and Restore undoes it — the property replay-equivalence
// rests on, over names, composite keys and text alike.
func FuzzAnonymizeOrder(f *testing.F) {
	for _, s := range [][2]string{{"pod-9", "pod-10"}, {"a/b", "a-b/c"}, {"a.b", "a-b"}, {"default", "defaul/t"},
		{"<external>/a/b", "a/<external>"}, {"n1/gpu-0", "n-1/gpu-0"}, {"", "0"}, {"A_b", "a"}, {"x:1", "x:"}} {
		f.Add(s[0], s[1], "extra segments team a-0")
	}
	f.Fuzz(func(t *testing.T, a, b, extra string) {
		segs := map[string]bool{}
		for _, s := range append(append(segments(a), segments(b)...), segments(extra)...) {
			segs[s] = true
		}
		k, err := newAnonymizeKey(segs)
		if err != nil {
			return // no token fits (a segment of '0's right after a fixed one): refused, not wrong
		}
		fa, fb := k.Anonymize(a), k.Anonymize(b)
		if strings.Compare(a, b) != strings.Compare(fa, fb) {
			t.Fatalf("order changed: %q vs %q became %q vs %q", a, b, fa, fb)
		}
		if back := k.Restore(fa); back != a {
			t.Fatalf("Restore(%q) = %q, want %q", fa, back, a)
		}
		if !utf8.ValidString(a + b + extra) {
			return // API objects are JSON: valid UTF-8; YAML would not keep the bytes
		}
		data, err := MarshalAnonymizeKey(k)
		if err != nil {
			if !strings.ContainsFunc(a+b+extra, unicode.IsControl) {
				t.Fatalf("a key without control characters was refused: %v", err)
			}
			return // refused with an error, not written unreadable
		}
		if _, err := ParseAnonymizeKey(data); err != nil {
			t.Fatalf("a key we wrote does not read back: %v\n%s", err, data)
		}
	})
}

// FuzzParseAnonymizeKey: any input is a key that passes its checks or an
// error; never a panic.
func FuzzParseAnonymizeKey(f *testing.F) {
	f.Add([]byte("version: " + AnonymizeKeyVersion + "\nsegments: {a: a00, b: a01}\n"))
	f.Add([]byte("version: " + AnonymizeKeyVersion + "\nsegments: {a: a01, b: a00}\n"))
	f.Add([]byte("segments: [1]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseAnonymizeKey(data)
		if err != nil {
			return
		}
		if err := k.check(); err != nil {
			t.Fatalf("parsed a key that fails its check: %v", err)
		}
		_ = k.Restore(string(data))
	})
}

// FuzzRewriteCELStrings: the rewriter never panics; renaming nothing gives
// the expression back; renaming every literal changes only literals.
func FuzzRewriteCELStrings(f *testing.F) {
	for _, s := range []string{`device.attributes["gpu.tessera.dev"].uuid == "GPU-1"`, `a == 'x' || r"y\" == b`,
		`"""multi
line""" + '''x'''`, `x // "comment`, `b"\x00" == br'\d'`, `"unterminated`, `'a\'b'`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		same, lits, err := rewriteCELStrings(expr, func(s string) (string, bool) { return s, false })
		if err != nil {
			if same != expr {
				t.Fatalf("on error the expression must be kept whole")
			}
			return
		}
		if same != expr {
			t.Fatalf("renaming nothing changed %q to %q", expr, same)
		}
		renamed, lits2, err := rewriteCELStrings(expr, func(s string) (string, bool) { return "tok", true })
		if err != nil {
			t.Fatalf("second pass failed: %v", err)
		}
		// Literals that were renamed are no longer reported as kept, and
		// the rewritten expression still scans to as many literals.
		again, lits3, err := rewriteCELStrings(renamed, func(s string) (string, bool) { return s, false })
		if err != nil || again != renamed {
			t.Fatalf("the rewritten expression %q does not scan: %v", renamed, err)
		}
		if len(lits3) < len(lits2) || len(lits) < len(lits2) {
			t.Fatalf("literal counts: %d kept, %d after renaming all, %d rescanned", len(lits), len(lits2), len(lits3))
		}
	})
}
