// Package promnames finds the metric names a Grafana dashboard and a
// Prometheus rule file query, and the names a /metrics page exposes, so a
// test can check that every series the chart's dashboard and alerts read is
// one the programs emit.
package promnames

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Use is one metric name read by a query, and where the query is.
type Use struct {
	Metric string
	Where  string // "panel \"GPUs by queue\"", "alert TesseraQueueStarved", …
}

// promql parses with Prometheus' own parser; the zero options are those of
// a default Prometheus server.
var promql = parser.NewParser(parser.Options{})

var (
	// Grafana's interval variables ($__rate_interval, $__interval, …) stand
	// for durations.
	grafanaInterval = regexp.MustCompile(`\$__[A-Za-z_]+`)
	// Other variables ($queue, ${queue}, ${queue:regex}, [[queue]]) stand
	// in matcher values in Tessera's dashboard.
	grafanaVariable = regexp.MustCompile(`\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\]`)
	// A variable as a range ([$interval]) stands for a duration.
	grafanaRange = regexp.MustCompile(`\[\s*(\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\])\s*\]`)
)

// FromExpr returns the metric names of a PromQL expression, Grafana
// variables replaced first (as Grafana does before it sends a query). A
// selector without a literal metric name is an error: nothing could check
// what it reads.
func FromExpr(expr string) ([]string, error) {
	q := grafanaInterval.ReplaceAllString(expr, "5m")
	q = grafanaRange.ReplaceAllString(q, "[5m]")
	q = grafanaVariable.ReplaceAllString(q, "x")
	e, err := promql.ParseExpr(q)
	if err != nil {
		return nil, fmt.Errorf("PromQL %q: %w", expr, err)
	}
	seen := map[string]bool{}
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			bad = fmt.Errorf("PromQL %q: selector %s names no metric", expr, vs)
			return nil
		}
		seen[name] = true
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	return sortedKeys(seen), nil
}

// dashboard is the part of a Grafana dashboard's JSON model that holds
// queries: panels (rows nest theirs) with targets, and templating variables.
type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// FromDashboard returns the metric names a Grafana dashboard's panels and
// query variables read. A dashboard without panels, a target without an
// expression or a query variable in a form it does not know is an error.
func FromDashboard(data []byte) ([]Use, error) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("dashboard JSON: %w", err)
	}
	if len(d.Panels) == 0 {
		return nil, fmt.Errorf("dashboard %q has no panels", d.Title)
	}
	var uses []Use
	var walk func(ps []panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			if err := walk(p.Panels); err != nil {
				return err
			}
			for _, t := range p.Targets {
				where := fmt.Sprintf("panel %q target %s", p.Title, t.RefID)
				if strings.TrimSpace(t.Expr) == "" {
					return fmt.Errorf("%s: no expr", where)
				}
				names, err := FromExpr(t.Expr)
				if err != nil {
					return fmt.Errorf("%s: %w", where, err)
				}
				uses = appendUses(uses, names, where)
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %q", v.Name)
		names, err := fromVariable(v.Query)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		uses = appendUses(uses, names, where)
	}
	return uses, nil
}

// labelValues is Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// fromVariable reads a query variable: a string, or Grafana's newer object
// {"query": "…"}; label_values(selector, label) and query_result(expr).
func fromVariable(raw json.RawMessage) ([]string, error) {
	var q string
	if err := json.Unmarshal(raw, &q); err != nil {
		var obj struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("query is neither a string nor {\"query\": string}: %s", raw)
		}
		q = obj.Query
	}
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return FromExpr(m[1])
	}
	if rest, ok := strings.CutPrefix(strings.TrimSpace(q), "query_result("); ok && strings.HasSuffix(rest, ")") {
		return FromExpr(strings.TrimSuffix(rest, ")"))
	}
	return nil, fmt.Errorf("query %q: want label_values(<metric selector>, <label>) or query_result(<expr>)", q)
}

// ruleFile is a Prometheus rule file (rule_files:), the groups a
// PrometheusRule's spec holds too.
type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			KeepFiring  string            `json:"keep_firing_for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// FromRules returns the metric names the rules of a Prometheus rule file
// read, less those its own recording rules make. Unknown fields, rules
// without a name or expression, and bad durations are errors.
func FromRules(data []byte) ([]Use, error) {
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("rule file: %w", err)
	}
	if len(f.Groups) == 0 {
		return nil, errors.New("rule file has no groups")
	}
	recorded := map[string]bool{}
	var uses []Use
	for _, g := range f.Groups {
		for i, r := range g.Rules {
			where := fmt.Sprintf("group %q rule %d", g.Name, i)
			switch {
			case r.Alert != "" && r.Record == "":
				where = "alert " + r.Alert
			case r.Record != "" && r.Alert == "":
				where = "record " + r.Record
				recorded[r.Record] = true
			default:
				return nil, fmt.Errorf("%s: needs exactly one of alert and record", where)
			}
			for _, d := range []string{r.For, r.KeepFiring} {
				if _, err := model.ParseDuration(d); d != "" && err != nil {
					return nil, fmt.Errorf("%s: duration %q: %w", where, d, err)
				}
			}
			names, err := FromExpr(r.Expr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			uses = appendUses(uses, names, where)
		}
	}
	out := uses[:0]
	for _, u := range uses {
		if !recorded[u.Metric] {
			out = append(out, u)
		}
	}
	return out, nil
}

// Exposed returns the sample names of a /metrics page in Prometheus' text
// format: a counter or gauge by its name, a histogram by its _bucket, _sum
// and _count series, a summary by its name, _sum and _count.
func Exposed(r io.Reader) (map[string]bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics text: %w", err)
	}
	out := map[string]bool{}
	for name, f := range fams {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = true, true, true
		default:
			out[name] = true
		}
	}
	return out, nil
}

// Missing returns the uses whose metric none of the exposed sets holds.
func Missing(uses []Use, exposed ...map[string]bool) []Use {
	var out []Use
	for _, u := range uses {
		found := false
		for _, e := range exposed {
			found = found || e[u.Metric]
		}
		if !found {
			out = append(out, u)
		}
	}
	return out
}

func appendUses(uses []Use, names []string, where string) []Use {
	for _, n := range names {
		uses = append(uses, Use{Metric: n, Where: where})
	}
	return uses
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
