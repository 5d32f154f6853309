package packaging

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const (
	rulesFile     = "prometheus/ferry-alerts.yaml"
	rulesTestFile = "prometheus/ferry-alerts.test.yaml"
	dashboardFile = "grafana/ferry.json"
)

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertExprs reads the alerting rules: alert name → expression.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := yaml.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if _, dup := out[r.Alert]; dup {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			out[r.Alert] = r.Expr
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q is not critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: a summary and a description tell the person paged what happened", r.Alert)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no alerts in " + rulesFile)
	}
	return out
}

// TestAlertRules: promtool accepts the rules (check rules: syntax, types,
// templates, duplicates) and its unit tests pass (test rules: each alert
// fires on the series it is meant for, at the time it should, with its
// labels and rendered annotations, and not on the healthy instance beside
// it); every alert has a test in which it fires.
func TestAlertRules(t *testing.T) {
	alerts := alertExprs(t)
	promtool := tool(t, "prometheus-local", "promtool", "promtool-path")
	t.Logf("%s", strings.TrimSpace(run(t, promtool, "check", "rules", rulesFile)))
	out := run(t, promtool, "test", "rules", rulesTestFile)
	t.Logf("%s", strings.TrimSpace(out))

	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			Name  string `yaml:"name"`
			Cases []struct {
				Alert     string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, g := range tests.Tests {
		for _, c := range g.Cases {
			if _, ok := alerts[c.Alert]; !ok {
				t.Errorf("%s tests alert %s, which the rules do not have", rulesTestFile, c.Alert)
			}
			if len(c.ExpAlerts) > 0 {
				fires[c.Alert] = true
			}
		}
	}
	for a := range alerts {
		if !fires[a] {
			t.Errorf("alert %s has no case in %s in which it fires", a, rulesTestFile)
		}
	}
}

// dashboard is the part of Grafana's JSON model the tests read.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardQuery is one PromQL expression of the dashboard: a panel's
// target, or a template variable's label_values() metric.
type dashboardQuery struct{ where, expr string }

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

func dashboardQueries(t *testing.T, d dashboard) []dashboardQuery {
	t.Helper()
	var out []dashboardQuery
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, dashboardQuery{fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		sub := labelValues.FindStringSubmatch(q)
		if sub == nil {
			t.Errorf("variable %s: query %q is not label_values(METRIC, label)", v.Name, q)
			continue
		}
		out = append(out, dashboardQuery{"variable " + v.Name, sub[1]})
	}
	return out
}

// grafanaVars are Grafana's own variables, as Prometheus would see them.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// TestDashboard: the dashboard is Grafana JSON with a Prometheus data
// source chosen by a template variable (every panel and query uses it);
// it has the rows an operator looks for; every query is PromQL that
// promtool accepts (each is checked as a recording rule, Grafana's
// variables replaced) and selects at least one metric.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: both are needed to import it and link to it", d.Title, d.UID)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no template variable \"datasource\" of type datasource (prometheus)")
	}
	rows := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q has no place (gridPos)", p.Title)
		}
		if p.Type == "row" {
			rows[strings.ToLower(p.Title)] = true
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s does not use the datasource variable", p.Title, tg.RefID)
			}
		}
	}
	for _, want := range []string{"overview", "intake per receiver", "per topic", "refusals", "per application", "queue and spool", "kafka export", "files", "doors, syslog, span metrics"} {
		if !rows[want] {
			t.Errorf("no row %q (rows: %v)", want, rows)
		}
	}

	queries := dashboardQueries(t, d)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range queries {
		names, err := promqlMetricNames(q.expr)
		if err != nil || len(names) == 0 {
			t.Errorf("%s: %q: names %v, %v", q.where, q.expr, names, err)
		}
		expr, _ := json.Marshal(grafanaVars.Replace(q.expr)) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, expr)
	}
	if t.Failed() {
		return
	}
	promtool := tool(t, "prometheus-local", "promtool", "promtool-path")
	f := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(f, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d queries: %s", len(queries), strings.TrimSpace(run(t, promtool, "check", "rules", f)))
}

// usedMetrics is every metric name the rules and the dashboard select,
// with where it is used.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for alert, expr := range alertExprs(t) {
		names, err := promqlMetricNames(expr)
		if err != nil {
			t.Fatalf("alert %s: %v", alert, err)
		}
		for _, n := range names {
			used[n] = append(used[n], "alert "+alert)
		}
	}
	for _, q := range dashboardQueries(t, loadDashboard(t)) {
		names, err := promqlMetricNames(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		for _, n := range names {
			used[n] = append(used[n], q.where)
		}
	}
	for _, w := range used {
		sort.Strings(w)
	}
	return used
}
