package promnames

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromExpr(t *testing.T) {
	tests := []struct {
		expr    string
		want    []string
		wantErr string
	}{
		{expr: `tessera_pending_pods`, want: []string{"tessera_pending_pods"}},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(tessera_cycle_duration_seconds_bucket[$__rate_interval])))`, want: []string{"tessera_cycle_duration_seconds_bucket"}},
		{expr: `tessera_queue_allocated{queue=~"$queue", resource="gpu"} < tessera_queue_quota{queue=~"${queue:regex}"} and tessera_queue_pending > 0`,
			want: []string{"tessera_queue_allocated", "tessera_queue_pending", "tessera_queue_quota"}},
		{expr: `{__name__="tessera_leader"} == 1`, want: []string{"tessera_leader"}},
		{expr: `sum(rate(tessera_binds_total[[[interval]]]))`, want: []string{"tessera_binds_total"}},
		{expr: `sum(rate(tessera_binds_total[$interval])) + rate(tessera_api_errors_total[${interval}])`, want: []string{"tessera_api_errors_total", "tessera_binds_total"}},
		{expr: `{__name__=~"tessera_.*"}`, wantErr: "names no metric"},
		{expr: `rate(tessera_binds_total[5m]`, wantErr: `PromQL "rate(tessera_binds_total[5m]"`},
		{expr: ``, wantErr: "PromQL"},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := FromExpr(tc.expr)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestFromDashboard(t *testing.T) {
	good := `{"title": "t", "panels": [
	  {"title": "row", "type": "row", "panels": [{"title": "in row", "targets": [{"refId": "A", "expr": "tessera_node_mps_daemons"}]}]},
	  {"title": "GPUs", "targets": [{"refId": "A", "expr": "tessera_queue_allocated{queue=~\"$queue\"}"}, {"refId": "B", "expr": "tessera_queue_quota"}]}],
	 "templating": {"list": [
	  {"name": "queue", "type": "query", "query": {"query": "label_values(tessera_queue_allocated{resource=\"gpu\"}, queue)", "refId": "q"}},
	  {"name": "node", "type": "query", "query": "query_result(tessera_node_prepared_claims)"},
	  {"name": "datasource", "type": "datasource", "query": "prometheus"}]}}`
	uses, err := FromDashboard([]byte(good))
	require.NoError(t, err)
	require.Equal(t, []Use{
		{"tessera_node_mps_daemons", `panel "in row" target A`},
		{"tessera_queue_allocated", `panel "GPUs" target A`},
		{"tessera_queue_quota", `panel "GPUs" target B`},
		{"tessera_queue_allocated", `variable "queue"`},
		{"tessera_node_prepared_claims", `variable "node"`},
	}, uses)

	for name, tc := range map[string]struct{ json, err string }{
		"not JSON":         {`{"panels": [`, "dashboard JSON"},
		"no panels":        {`{"title": "empty"}`, `dashboard "empty" has no panels`},
		"empty expr":       {`{"panels": [{"title": "p", "targets": [{"refId": "A"}]}]}`, `panel "p" target A: no expr`},
		"bad PromQL":       {`{"panels": [{"title": "p", "targets": [{"refId": "A", "expr": "sum("}]}]}`, `panel "p" target A: PromQL`},
		"unknown variable": {`{"panels": [{"title": "p", "targets": [{"refId": "A", "expr": "up"}]}], "templating": {"list": [{"name": "v", "type": "query", "query": "metrics(tessera_)"}]}}`, `variable "v": query "metrics(tessera_)": want label_values`},
		"variable object":  {`{"panels": [{"title": "p", "targets": [{"refId": "A", "expr": "up"}]}], "templating": {"list": [{"name": "v", "type": "query", "query": 7}]}}`, `variable "v": query is neither`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromDashboard([]byte(tc.json))
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestFromRules(t *testing.T) {
	good := `
groups:
- name: tessera
  rules:
  - record: tessera:queue_gpu_deficit
    expr: tessera_queue_quota{resource="gpu"} - tessera_queue_allocated{resource="gpu"}
  - alert: Starved
    expr: tessera:queue_gpu_deficit > 0 and tessera_queue_pending > 0
    for: 15m
    labels: {severity: warning}
    annotations: {summary: "queue {{ $labels.queue }}"}
`
	uses, err := FromRules([]byte(good))
	require.NoError(t, err)
	require.Equal(t, []Use{
		{"tessera_queue_allocated", "record tessera:queue_gpu_deficit"},
		{"tessera_queue_quota", "record tessera:queue_gpu_deficit"},
		{"tessera_queue_pending", "alert Starved"},
	}, uses, "the recorded series is not asked of the programs")

	for name, tc := range map[string]struct{ yaml, err string }{
		"no groups":  {`groups: []`, "no groups"},
		"typo":       {"groups:\n- name: g\n  rules:\n  - alert: A\n    exp: up\n", `unknown field "exp"`},
		"no name":    {"groups:\n- name: g\n  rules:\n  - expr: up\n", `group "g" rule 0: needs exactly one of alert and record`},
		"both names": {"groups:\n- name: g\n  rules:\n  - alert: A\n    record: r\n    expr: up\n", "needs exactly one"},
		"bad for":    {"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: ten minutes\n", `alert A: duration "ten minutes"`},
		"bad PromQL": {"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: rate(up[5m]\n", "alert A: PromQL"},
		"not YAML":   {"groups: [", "rule file"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromRules([]byte(tc.yaml))
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestExposedAndMissing(t *testing.T) {
	page := `# HELP tessera_binds_total Pods bound.
# TYPE tessera_binds_total counter
tessera_binds_total 3
# HELP tessera_cycle_duration_seconds Cycle.
# TYPE tessera_cycle_duration_seconds histogram
tessera_cycle_duration_seconds_bucket{le="1"} 1
tessera_cycle_duration_seconds_bucket{le="+Inf"} 1
tessera_cycle_duration_seconds_sum 0.5
tessera_cycle_duration_seconds_count 1
# HELP go_gc_duration_seconds GC.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.1
go_gc_duration_seconds_sum 0.1
go_gc_duration_seconds_count 1
`
	got, err := Exposed(strings.NewReader(page))
	require.NoError(t, err)
	require.Equal(t, map[string]bool{
		"tessera_binds_total":                   true,
		"tessera_cycle_duration_seconds_bucket": true, "tessera_cycle_duration_seconds_sum": true, "tessera_cycle_duration_seconds_count": true,
		"go_gc_duration_seconds": true, "go_gc_duration_seconds_sum": true, "go_gc_duration_seconds_count": true,
	}, got)
	uses := []Use{{"tessera_binds_total", "a"}, {"tessera_cycle_duration_seconds", "b"}, {"tessera_node_mps_daemons", "c"}}
	require.Equal(t, []Use{{"tessera_cycle_duration_seconds", "b"}, {"tessera_node_mps_daemons", "c"}}, Missing(uses, got),
		"a histogram's base name is no series; another set may hold the rest")
	require.Empty(t, Missing(uses[2:], got, map[string]bool{"tessera_node_mps_daemons": true}))

	_, err = Exposed(strings.NewReader("tessera_binds_total{ 3\n"))
	require.ErrorContains(t, err, "metrics text")
}

// FuzzFromDashboard: any input gives names or an error, never a panic, and
// every name it returns is non-empty.
func FuzzFromDashboard(f *testing.F) {
	f.Add([]byte(`{"panels": [{"title": "p", "targets": [{"refId": "A", "expr": "sum(rate(x_total[$__rate_interval]))"}]}]}`))
	f.Add([]byte(`{"panels": [{"panels": [{"targets": [{"expr": "{__name__=\"a\"}"}]}]}], "templating": {"list": [{"type": "query", "query": "label_values(a, b)"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		uses, err := FromDashboard(data)
		if err != nil {
			return
		}
		for _, u := range uses {
			if u.Metric == "" {
				t.Fatalf("empty metric name at %s", u.Where)
			}
		}
	})
}

// FuzzFromRules is FuzzFromDashboard for rule files.
func FuzzFromRules(f *testing.F) {
	f.Add([]byte("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: increase(x_total[10m]) > 0\n    for: 5m\n"))
	f.Add([]byte("groups:\n- name: g\n  rules:\n  - record: r\n    expr: sum(x)\n  - alert: B\n    expr: r > 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		uses, err := FromRules(data)
		if err != nil {
			return
		}
		for _, u := range uses {
			if u.Metric == "" {
				t.Fatalf("empty metric name at %s", u.Where)
			}
		}
	})
}
