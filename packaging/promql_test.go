package packaging

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// The rules and the dashboard are checked against the metrics a running
// agent serves, so the test needs the metric names each PromQL expression
// selects. Prometheus's own parser (promql/parser) would bring the
// Prometheus server module into ferry's go.mod; promtool checks the
// expressions' syntax (TestAlertRules, TestDashboard), and this small
// lexer only has to find the names. It knows PromQL's tokens: strings
// (skipped, so label values such as "$job" never count), label matchers
// in braces (a `__name__="x"` matcher names x; a regular expression on
// __name__ is refused rather than guessed), ranges and subqueries in
// brackets, numbers and durations, the label lists after by, without, on,
// ignoring, group_left and group_right, operators, keywords and
// aggregations, and function calls (a name followed by "("). Every other
// identifier is a metric name.

// promqlAggregations and promqlKeywords are never metric names.
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "start": true, "end": true, "step": true,
}

// promqlLabelLists are the keywords followed by a parenthesised list of labels.
var promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// promqlMetricNames returns the metric names expr selects, sorted, once each.
func promqlMetricNames(expr string) ([]string, error) {
	names := map[string]bool{}
	s := expr
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
			j++
		}
		return j
	}
	// skipString returns the index after the string literal starting at j.
	skipString := func(j int) (int, error) {
		q := s[j]
		for k := j + 1; k < len(s); k++ {
			if s[k] == '\\' && q != '`' {
				k++
				continue
			}
			if s[k] == q {
				return k + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d", j)
	}
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			// label matchers: name op "value", ...
			j := skipSpace(i + 1)
			for {
				if j >= len(s) {
					return nil, fmt.Errorf("unterminated { at %d", i)
				}
				if s[j] == '}' {
					j++
					break
				}
				if s[j] == ',' {
					j = skipSpace(j + 1)
					continue
				}
				if s[j] == '"' {
					// a quoted metric name (UTF-8 names): {"name", ...}
					k, err := skipString(j)
					if err != nil {
						return nil, err
					}
					names[s[j+1:k-1]] = true
					j = skipSpace(k)
					continue
				}
				k := j
				for k < len(s) && isIdentChar(s[k]) {
					k++
				}
				if k == j {
					return nil, fmt.Errorf("unexpected %q in label matchers at %d", s[j], j)
				}
				label := s[j:k]
				k = skipSpace(k)
				op := k
				for k < len(s) && strings.IndexByte("=!~", s[k]) >= 0 {
					k++
				}
				matcher := s[op:k]
				if matcher != "=" && matcher != "!=" && matcher != "=~" && matcher != "!~" {
					return nil, fmt.Errorf("no matcher operator after %s at %d", label, op)
				}
				k = skipSpace(k)
				if k >= len(s) || s[k] != '"' && s[k] != '\'' && s[k] != '`' {
					return nil, fmt.Errorf("no string after %s%s at %d", label, matcher, k)
				}
				end, err := skipString(k)
				if err != nil {
					return nil, err
				}
				if label == "__name__" {
					if matcher != "=" {
						return nil, fmt.Errorf("a %s matcher on __name__ cannot be checked: name the metric", matcher)
					}
					names[s[k+1:end-1]] = true
				}
				j = skipSpace(end)
			}
			i = j
		case c == '[':
			// a range or a subquery: durations, Grafana's $__rate_interval
			for i < len(s) && s[i] != ']' {
				i++
			}
			if i == len(s) {
				return nil, fmt.Errorf("unterminated [ in %q", expr)
			}
			i++
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			// a number (1e3, 0x1f, 1_000) or a duration (5m, 1h30m)
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.' || (s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			word := s[i:j]
			lower := strings.ToLower(word)
			next := skipSpace(j)
			switch {
			case promqlLabelLists[lower]:
				if next < len(s) && s[next] == '(' {
					end := strings.IndexByte(s[next:], ')')
					if end < 0 {
						return nil, fmt.Errorf("unterminated label list after %s", word)
					}
					j = next + end + 1
				}
			case promqlAggregations[lower] || promqlKeywords[lower]:
			case next < len(s) && s[next] == '(':
				// a function call
			default:
				names[word] = true
			}
			i = j
		case c == '$':
			return nil, fmt.Errorf("a variable outside a string or a range at %d of %q: it cannot be checked", i, expr)
		case strings.IndexByte("()+-*/%^=!<>,:@", c) >= 0:
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at %d of %q", c, i, expr)
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

func TestPromQLMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up{job="ferry"} == 0`, []string{"up"}},
		{`sum by (instance, reason) (rate(ferry_exporter_errors_total[5m])) > 0.1`, []string{"ferry_exporter_errors_total"}},
		{`histogram_quantile(0.99, sum by (instance, le) (rate(ferry_x_seconds_bucket{a="b", c=~"d|e"}[5m]))) > 1`, []string{"ferry_x_seconds_bucket"}},
		{`ferry_queue_bytes / ferry_queue_limit_bytes > 0.9 and ferry_queue_limit_bytes > 0`, []string{"ferry_queue_bytes", "ferry_queue_limit_bytes"}},
		{`sum(a) by (le) / on (instance) group_left(version) b`, []string{"a", "b"}},
		{`count(x == 0) or vector(0)`, []string{"x"}},
		{`sum without (job) (increase(y{job=~"$job", instance=~"$instance"}[$__rate_interval]))`, []string{"y"}},
		{`{__name__="named", job="j"} offset 5m`, []string{"named"}},
		{`z @ start() + w[5m:1m] * 1e3 - 0x1F + 1.5e-3`, []string{"w", "z"}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []string{"m"}},
		{`topk(3, sum by (app) (rate(ferry_ratelimit_refused_records_total{app!="", reason='x\'y'}[1h])))`, []string{"ferry_ratelimit_refused_records_total"}},
		{`max by (instance) (deriv(ferry_files_lag_bytes[30m])) > 64 * 1024 * 1024 # lag`, []string{"ferry_files_lag_bytes"}},
		{`a unless on() b`, []string{"a", "b"}},
		{`sum(x) BY (y)`, []string{"x"}},
	} {
		got, err := promqlMetricNames(c.expr)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, %v; want %v", c.expr, got, err, c.want)
		}
	}
	// What it cannot check it refuses, so that no name goes unchecked.
	for _, bad := range []string{`{__name__=~"ferry_.*"}`, `rate(x[5m]) * $factor`, `x{a="b"`, `sum(x{a=})`, `x{a="unterminated}`} {
		if got, err := promqlMetricNames(bad); err == nil {
			t.Errorf("%s: %v, want an error", bad, got)
		}
	}
}
