package kube

import (
	"strings"
	"testing"
)

func TestParseTestCommitHook(t *testing.T) {
	cases := []struct {
		in, point, action, err string
	}{
		{"after-claims=exit", "after-claims", "exit", ""},
		{"between-jobs=pause", "between-jobs", "pause", ""},
		{"mid-evictions=exit", "mid-evictions", "exit", ""},
		{"between-binds=pause", "between-binds", "pause", ""},
		{"after-claims", "", "", "want <point>=<action>"},
		{"nowhere=exit", "", "", "want <point>=<action>"},
		{"after-claims=sleep", "", "", "must be exit or pause"},
	}
	for _, tc := range cases {
		p, a, err := ParseTestCommitHook(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || string(p) != tc.point || a != tc.action {
			t.Errorf("%q: got %q %q %v", tc.in, p, a, err)
		}
	}
}
