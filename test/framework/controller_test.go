package framework

import (
	"strings"
	"testing"
)

func TestSumMetric(t *testing.T) {
	const text = `# HELP tessera_leader 1 while leading
# TYPE tessera_leader gauge
tessera_leader 1
tessera_leader_extra 7
tessera_evictions_total{reason="preempt"} 2
tessera_evictions_total{reason="reclaim",x="a}b"} 3
tessera_binds_total 4.5e+00
`
	cases := []struct {
		name string
		want float64
		err  string
	}{
		{"tessera_leader", 1, ""},
		{"tessera_evictions_total", 5, ""},
		{"tessera_binds_total", 4.5, ""},
		{"tessera_missing", 0, "no metric tessera_missing"},
	}
	for _, tc := range cases {
		got, err := sumMetric(strings.NewReader(text), tc.name)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got %v, want error %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: got %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
}
