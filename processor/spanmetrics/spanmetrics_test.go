package spanmetrics

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/proofs/harness/leaktest"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestMain(m *testing.M) { leaktest.Main(m) }

func testConfig() Config {
	return Config{Enabled: true, Interval: 15 * time.Second, Buckets: DefaultBuckets, MaxSeries: 100, ExpireAfter: 5 * time.Minute}
}

// span is one span to send: its resource's service, name, kind, status, duration.
type span struct {
	svc, name string
	kind      ptrace.SpanKind
	status    ptrace.StatusCode
	d         time.Duration
}

func request(spans ...span) []byte {
	td := ptrace.NewTraces()
	t0 := time.Unix(1700000000, 0)
	for _, s := range spans {
		rs := td.ResourceSpans().AppendEmpty()
		if s.svc != "" {
			rs.Resource().Attributes().PutStr("service.name", s.svc)
		}
		sp := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		sp.SetTraceID(pcommon.TraceID{1, 2, 3})
		sp.SetSpanID(pcommon.SpanID{1})
		sp.SetName(s.name)
		sp.SetKind(s.kind)
		sp.Status().SetCode(s.status)
		sp.SetStartTimestamp(pcommon.NewTimestampFromTime(t0))
		sp.SetEndTimestamp(pcommon.NewTimestampFromTime(t0.Add(s.d)))
	}
	raw, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		panic(err)
	}
	return raw
}

// point is one series as flushed.
type point struct {
	calls      int64
	count      uint64
	sum        float64
	buckets    []uint64
	bounds     []float64
	start, now pcommon.Timestamp
	resSvc     string
}

// decode reads flushed requests into points keyed by their attributes.
func decode(t *testing.T, reqs [][]byte) map[string]*point {
	t.Helper()
	out := map[string]*point{}
	for _, raw := range reqs {
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(raw)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < md.ResourceMetrics().Len(); i++ {
			rm := md.ResourceMetrics().At(i)
			var resSvc string
			if v, ok := rm.Resource().Attributes().Get("service.name"); ok {
				resSvc = v.AsString()
			}
			sm := rm.ScopeMetrics().At(0)
			if sm.Scope().Name() != ScopeName {
				t.Fatalf("scope %q", sm.Scope().Name())
			}
			for j := 0; j < sm.Metrics().Len(); j++ {
				m := sm.Metrics().At(j)
				switch m.Name() {
				case CallsMetric:
					if m.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative || !m.Sum().IsMonotonic() {
						t.Fatal("calls is not a cumulative monotonic sum")
					}
					for k := 0; k < m.Sum().DataPoints().Len(); k++ {
						dp := m.Sum().DataPoints().At(k)
						p := get(out, dp.Attributes())
						p.calls, p.start, p.now, p.resSvc = dp.IntValue(), dp.StartTimestamp(), dp.Timestamp(), resSvc
					}
				case DurationMetric:
					if m.Unit() != "ms" || m.Histogram().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
						t.Fatal("duration is not a cumulative histogram in ms")
					}
					for k := 0; k < m.Histogram().DataPoints().Len(); k++ {
						dp := m.Histogram().DataPoints().At(k)
						p := get(out, dp.Attributes())
						p.count, p.sum, p.buckets, p.bounds = dp.Count(), dp.Sum(), dp.BucketCounts().AsRaw(), dp.ExplicitBounds().AsRaw()
						if dp.StartTimestamp() != p.start {
							t.Fatal("calls and duration disagree on the start time")
						}
					}
				default:
					t.Fatalf("metric %q", m.Name())
				}
			}
		}
	}
	return out
}

func get(out map[string]*point, attrs pcommon.Map) *point {
	var parts []string
	for _, k := range []string{"service.name", "span.name", "span.kind", "status.code", OverflowAttr} {
		if v, ok := attrs.Get(k); ok {
			parts = append(parts, v.AsString())
		} else {
			parts = append(parts, "-")
		}
	}
	k := strings.Join(parts, "|")
	if out[k] == nil {
		out[k] = &point{}
	}
	return out[k]
}

func newProc(t *testing.T, cfg Config) *Processor {
	t.Helper()
	p, err := New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKindsAndStatus(t *testing.T) {
	p := newProc(t, testConfig())
	p.Observe(request(
		span{"cart", "GET /", ptrace.SpanKindServer, ptrace.StatusCodeUnset, time.Millisecond},
		span{"cart", "GET /", ptrace.SpanKindServer, ptrace.StatusCodeUnset, time.Millisecond},
		span{"cart", "GET /", ptrace.SpanKindServer, ptrace.StatusCodeError, time.Millisecond},
		span{"cart", "GET /", ptrace.SpanKindClient, ptrace.StatusCodeOk, time.Millisecond},
		span{"shop", "GET /", ptrace.SpanKindServer, ptrace.StatusCodeUnset, time.Millisecond},
		span{"", "anon", ptrace.SpanKindInternal, ptrace.StatusCodeUnset, time.Millisecond},
	))
	got := decode(t, p.Build())
	want := map[string]int64{
		"cart|GET /|SPAN_KIND_SERVER|STATUS_CODE_UNSET|-": 2,
		"cart|GET /|SPAN_KIND_SERVER|STATUS_CODE_ERROR|-": 1,
		"cart|GET /|SPAN_KIND_CLIENT|STATUS_CODE_OK|-":    1,
		"shop|GET /|SPAN_KIND_SERVER|STATUS_CODE_UNSET|-": 1,
		"-|anon|SPAN_KIND_INTERNAL|STATUS_CODE_UNSET|-":   1,
	}
	if len(got) != len(want) {
		t.Fatalf("series %v", keys(got))
	}
	for k, n := range want {
		g := got[k]
		if g == nil || g.calls != n || g.count != uint64(n) {
			t.Fatalf("%s: %+v, want %d calls", k, g, n)
		}
		if svc := strings.Split(k, "|")[0]; svc != "-" && g.resSvc != svc {
			t.Fatalf("%s: resource service.name %q", k, g.resSvc)
		}
	}
}

func keys(m map[string]*point) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestHistogramBuckets(t *testing.T) {
	p := newProc(t, testConfig())
	ds := []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 2*time.Millisecond + 1, 5 * time.Millisecond,
		999 * time.Millisecond, time.Second, 15 * time.Second, 16 * time.Second, time.Hour}
	var spans []span
	for _, d := range ds {
		spans = append(spans, span{"s", "op", ptrace.SpanKindServer, ptrace.StatusCodeOk, d})
	}
	// A span that ends before it starts counts with duration 0.
	spans = append(spans, span{"s", "op", ptrace.SpanKindServer, ptrace.StatusCodeOk, -time.Second})
	p.Observe(request(spans...))
	g := decode(t, p.Build())["s|op|SPAN_KIND_SERVER|STATUS_CODE_OK|-"]
	// Bounds are upper bounds, inclusive: 2ms goes to the first bucket.
	want := make([]uint64, len(DefaultBuckets)+1)
	want[0] = 4  // 0, 1ms, 2ms, the negative one
	want[1] = 1  // 2ms+1ns
	want[2] = 1  // 5ms
	want[10] = 2 // 999ms, 1s
	want[15] = 1 // 15s
	want[16] = 2 // 16s, 1h
	if fmt.Sprint(g.buckets) != fmt.Sprint(want) {
		t.Fatalf("buckets %v, want %v", g.buckets, want)
	}
	if g.bounds[0] != 2 || g.bounds[len(g.bounds)-1] != 15000 || len(g.bounds) != len(DefaultBuckets) {
		t.Fatalf("bounds %v", g.bounds)
	}
	var sum float64
	for _, d := range ds {
		sum += float64(d) / 1e6
	}
	if g.sum != sum || g.count != uint64(len(ds)+1) {
		t.Fatalf("sum %v count %d, want %v %d", g.sum, g.count, sum, len(ds)+1)
	}
}

func TestCumulativeAcrossFlushes(t *testing.T) {
	p := newProc(t, testConfig())
	s := span{"s", "op", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}
	p.Observe(request(s))
	first := decode(t, p.Build())["s|op|SPAN_KIND_SERVER|STATUS_CODE_OK|-"]
	time.Sleep(time.Millisecond)
	p.Observe(request(s, s))
	second := decode(t, p.Build())["s|op|SPAN_KIND_SERVER|STATUS_CODE_OK|-"]
	if first.calls != 1 || second.calls != 3 || second.start != first.start || second.now <= first.now || first.start > first.now {
		t.Fatalf("first %+v, second %+v", first, second)
	}
}

func TestOverflow(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeries = 2
	p := newProc(t, cfg)
	p.Observe(request(
		span{"a", "1", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond},
		span{"a", "2", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond},
		span{"a", "3", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond},
		span{"a", "4", ptrace.SpanKindServer, ptrace.StatusCodeError, time.Millisecond},
		span{"a", "5", ptrace.SpanKindServer, ptrace.StatusCodeError, time.Millisecond},
		span{"a", "1", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}, // known: not overflow
	))
	got := decode(t, p.Build())
	if got["a|1|SPAN_KIND_SERVER|STATUS_CODE_OK|-"].calls != 2 || got["a|2|SPAN_KIND_SERVER|STATUS_CODE_OK|-"].calls != 1 {
		t.Fatalf("%v", keys(got))
	}
	if o := got["-|-|-|STATUS_CODE_OK|true"]; o == nil || o.calls != 1 || o.resSvc != "" {
		t.Fatalf("ok overflow %+v (%v)", o, keys(got))
	}
	if o := got["-|-|-|STATUS_CODE_ERROR|true"]; o == nil || o.calls != 2 {
		t.Fatalf("error overflow %+v", o)
	}
	if len(got) != 4 || p.Series() != 4 {
		t.Fatalf("%d series", len(got))
	}
	if n := testutil.ToFloat64(p.OverflowCounter()); n != 3 {
		t.Fatalf("overflow counter %v", n)
	}
}

func TestExpiry(t *testing.T) {
	p := newProc(t, testConfig())
	now := time.Unix(1700000000, 0)
	p.now = func() time.Time { return now }
	p.Observe(request(span{"s", "old", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	now = now.Add(4 * time.Minute)
	p.Observe(request(span{"s", "new", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	if got := decode(t, p.Build()); len(got) != 2 {
		t.Fatalf("%v", keys(got))
	}
	now = now.Add(2 * time.Minute) // old idle 6m, new 2m
	got := decode(t, p.Build())
	if len(got) != 1 || got["s|new|SPAN_KIND_SERVER|STATUS_CODE_OK|-"] == nil || p.Series() != 1 {
		t.Fatalf("%v", keys(got))
	}
	// It comes back from zero, with a new start time.
	p.Observe(request(span{"s", "old", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	o := decode(t, p.Build())["s|old|SPAN_KIND_SERVER|STATUS_CODE_OK|-"]
	if o.calls != 1 || o.start != pcommon.NewTimestampFromTime(now) {
		t.Fatalf("%+v", o)
	}
}

func TestLongNamesAreCut(t *testing.T) {
	p := newProc(t, testConfig())
	long := strings.Repeat("é", 300) // 600 bytes
	p.Observe(request(span{long, long, ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond},
		span{long + "x", long + "y", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	got := decode(t, p.Build())
	cut := strings.Repeat("é", 128)
	if g := got[cut+"|"+cut+"|SPAN_KIND_SERVER|STATUS_CODE_OK|-"]; g == nil || g.calls != 2 {
		t.Fatalf("%d series", len(got))
	}
}

func TestManySeriesAreSplitIntoRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeries = 1200
	p := newProc(t, cfg)
	var spans []span
	for i := range 1200 {
		spans = append(spans, span{fmt.Sprintf("svc%d", i%7), fmt.Sprint(i), ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond})
	}
	p.Observe(request(spans...))
	reqs := p.Build()
	if len(reqs) != 3 {
		t.Fatalf("%d requests", len(reqs))
	}
	if got := decode(t, reqs); len(got) != 1200 {
		t.Fatalf("%d series", len(got))
	}
}

func TestShutdownFlushesTheLastInterval(t *testing.T) {
	cfg := testConfig()
	cfg.Interval, cfg.ExpireAfter = time.Hour, time.Hour
	p := newProc(t, cfg)
	var mu sync.Mutex
	var got [][]byte
	p.SetSink(func(_ context.Context, req []byte) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, req)
		return nil
	})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.Observe(request(span{"s", "op", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil { // twice is harmless
		t.Fatal(err)
	}
	if g := decode(t, got); len(g) != 1 {
		t.Fatalf("%d series flushed", len(g))
	}
}

func TestFlushLoop(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = time.Second
	p := newProc(t, cfg)
	flushed := make(chan []byte, 10)
	p.SetSink(func(_ context.Context, req []byte) error { flushed <- req; return nil })
	_ = p.Start(context.Background())
	defer func() { _ = p.Shutdown(context.Background()) }()
	p.Observe(request(span{"s", "op", ptrace.SpanKindServer, ptrace.StatusCodeOk, time.Millisecond}))
	select {
	case req := <-flushed:
		if g := decode(t, [][]byte{req}); g["s|op|SPAN_KIND_SERVER|STATUS_CODE_OK|-"].calls != 1 {
			t.Fatal(keys(g))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no flush within 5 intervals")
	}
}

func TestValidateNamesTheKey(t *testing.T) {
	for key, mod := range map[string]func(*Config){
		"interval":     func(c *Config) { c.Interval = time.Millisecond },
		"max_series":   func(c *Config) { c.MaxSeries = 0 },
		"expire_after": func(c *Config) { c.ExpireAfter = time.Second },
		"buckets:":     func(c *Config) { c.Buckets = nil },
		"buckets[1]":   func(c *Config) { c.Buckets = []time.Duration{time.Second, time.Millisecond} },
		"buckets[0]":   func(c *Config) { c.Buckets = []time.Duration{-time.Second} },
	} {
		c := testConfig()
		mod(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), key) {
			t.Errorf("%s: %v", key, err)
		}
	}
	off := Config{}
	if err := off.Validate(); err != nil {
		t.Fatal("a disabled section is not checked:", err)
	}
	if p, err := New(off, telemetry.TestSettings()); p != nil || err != nil {
		t.Fatal("disabled: no processor")
	}
	var nilP *Processor
	nilP.Observe(request(span{"s", "op", 0, 0, 0})) // a nil processor does nothing
}

// TestObserveAllocatesNothing: spans of known series cost no allocation.
func TestObserveAllocatesNothing(t *testing.T) {
	p := newProc(t, testConfig())
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	p.Observe(raw)
	if n := testing.AllocsPerRun(50, func() { p.Observe(raw) }); n != 0 {
		t.Fatalf("%v allocations per request of 100 spans", n)
	}
}

func BenchmarkObserve_100_Spans(b *testing.B) {
	p, _ := New(testConfig(), telemetry.TestSettings())
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		p.Observe(raw)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/span")
}
