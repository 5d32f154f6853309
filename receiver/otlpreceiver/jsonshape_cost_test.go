package otlpreceiver

import (
	"net/http"
	"runtime"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestJSONCost: what checkJSONShape says decoding a request takes is at
// least what pdata allocates for it (garbage included, so at least its
// peak), for the shapes that amplify most (arrays of numbers, empty
// objects, empty attributes), and not far above it for ordinary requests.
func TestJSONCost(t *testing.T) {
	list := func(item string, n int) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	ld, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(200, 10)).MarshalJSON()
	td, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalJSON()
	for _, c := range []struct {
		name   string
		sig    encoding.Signal
		body   string
		within float64 // the estimate at most this many times the allocation
	}{
		{"numbers", encoding.Metrics, `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"h","histogram":{"dataPoints":[{"bucketCounts":[` +
			list("1", 1<<20) + `],"explicitBounds":[` + list("1", 1<<20) + `]}]}}]}]}]}`, 0},
		{"empty records", encoding.Logs, `{"resourceLogs":[{"scopeLogs":[{"logRecords":[` + list("{}", 100000) + `]}]}]}`, 0},
		{"quoted numbers", encoding.Metrics, `{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"h","histogram":{"dataPoints":[{"bucketCounts":[` +
			list(`"1"`, 1<<20) + `]}]}}]}]}]}`, 0},
		{"empty attributes", encoding.Logs, `{"resourceLogs":[{"resource":{"attributes":[` + list(`{"key":"a","value":{}}`, 100000) + `]},"scopeLogs":[]}]}`, 0},
		{"logs", encoding.Logs, string(ld), 4},
		{"traces", encoding.Traces, string(td), 4},
	} {
		cost, err := checkJSONShape([]byte(c.body), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		if _, err := jsonToProto(c.sig, []byte(c.body)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		runtime.ReadMemStats(&b)
		alloc := int64(b.TotalAlloc - a.TotalAlloc)
		t.Logf("%s: %d bytes of body, %d allocated, estimated %d", c.name, len(c.body), alloc, cost)
		if cost < alloc {
			t.Errorf("%s: estimated %d bytes, pdata allocated %d", c.name, cost, alloc)
		}
		if c.within > 0 && float64(cost) > c.within*float64(alloc) {
			t.Errorf("%s: estimated %d bytes, %.1f times the %d pdata allocated", c.name, cost, float64(cost)/float64(alloc), alloc)
		}
	}
}

// TestJSONDecodingReserved: decoding an OTLP/JSON request reserves what
// checkJSONShape says it takes, for as long as it runs: a request that
// could never fit beside its body is refused 413, one that does not fit
// now is refused 429 with Retry-After, and the budget holds nothing after.
func TestJSONDecodingReserved(t *testing.T) {
	body := []byte(`{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"h","gauge":{"dataPoints":[` +
		strings.TrimSuffix(strings.Repeat(`{"asInt":"1"},`, 20000), ",") + `]}}]}]}]}`)
	cost, _ := checkJSONShape(body, 1<<30)
	cfg := testConfig()
	cfg.MaxRequestBytes = 4 << 20
	answersWithin(t, cfg, nil, "/v1/metrics", "application/json", body, []budgetCase{
		{cost / 2, 0, http.StatusRequestEntityTooLarge},
		{4 * cost, 4*cost - cost/2, http.StatusTooManyRequests},
		{4 * cost, 0, http.StatusOK},
	})
}
