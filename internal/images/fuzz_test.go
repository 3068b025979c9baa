package images

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// FuzzParseStanzas checks that the control-file parser never panics, and
// that what it accepts survives writing back out and parsing again.
func FuzzParseStanzas(f *testing.F) {
	f.Add("Package: libc6\nVersion: 2.36-9+deb12u14\nDescription: GNU C Library\n shared libraries\n .\n")
	f.Add("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\nSHA256:\n ab 1 x\n-----BEGIN PGP SIGNATURE-----\n")
	f.Add("A: b\n\n\nC:d\r\n\tcont\n")
	f.Add(" x\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseStanzas(strings.NewReader(in))
		if err != nil {
			return
		}
		again, err := ParseStanzas(strings.NewReader(render(got)))
		if err != nil {
			t.Fatalf("re-parsing %q: %v", render(got), err)
		}
		if render(again) != render(got) {
			t.Fatalf("round trip changed\n%q\nto\n%q", render(got), render(again))
		}
		for _, s := range got {
			if files, err := ParseReleaseSHA256(s); err == nil {
				for p, f := range files {
					if p != f.Path || len(f.SHA256) != 64 || f.Size < 0 {
						t.Fatalf("bad index file %+v", f)
					}
				}
			}
		}
	})
}

// render writes stanzas back in deb822 form, fields sorted.
func render(stanzas []Stanza) string {
	var b strings.Builder
	for _, s := range stanzas {
		names := make([]string, 0, len(s))
		for n := range s {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			lines := strings.Split(s[n], "\n")
			fmt.Fprintf(&b, "%s: %s\n", n, lines[0])
			for _, l := range lines[1:] {
				if l == "" {
					l = "."
				}
				fmt.Fprintf(&b, " %s\n", l)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// FuzzParseVersion checks that an accepted version is a valid image tag.
func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"0.1.0\n", "v1", "", "a b", "1.0+x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		v, err := ParseVersion(in)
		if err != nil {
			return
		}
		if _, err := Ref(DefaultRegistry, NodeImage, v); err != nil {
			t.Fatalf("ParseVersion accepted %q but it is no tag: %v", in, err)
		}
	})
}
