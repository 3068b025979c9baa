package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseSeeds feeds parseSeeds what `tessera-sim openb --seeds` gets. A
// list is refused with an error that quotes the flag, or it is 1 to
// maxSeeds distinct seeds that, written as a comma list, parse back the same.
func FuzzParseSeeds(f *testing.F) {
	for _, s := range []string{"42-51", "1,5,9", "1,42-44", " 7 ", "0-9999", "0-10000", "5-1", "1,1", "18446744073709551615",
		"18446744073709551614-18446744073709551615", "18446744073709551616", "-", ",", "1-2-3", "3,1-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		seeds, err := parseSeeds(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--seeds "+strconv.Quote(s)+": ") {
				t.Fatalf("error does not quote the flag: %v", err)
			}
			return
		}
		if len(seeds) == 0 || len(seeds) > maxSeeds {
			t.Fatalf("%q: %d seeds", s, len(seeds))
		}
		sorted := slices.Clone(seeds)
		slices.Sort(sorted)
		if len(slices.Compact(sorted)) != len(seeds) {
			t.Fatalf("%q: a seed twice in %v", s, seeds)
		}
		parts := make([]string, len(seeds))
		for i, v := range seeds {
			parts[i] = strconv.FormatUint(v, 10)
		}
		back, err := parseSeeds(strings.Join(parts, ","))
		if err != nil || !slices.Equal(back, seeds) {
			t.Fatalf("%q: %v written back parses to %v, %v", s, seeds, back, err)
		}
	})
}
