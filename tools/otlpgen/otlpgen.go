// Package otlpgen owns synthetic OTLP payloads for benchmarks, tests and
// ferry-bench. Their shape follows the generator bk-collector's published
// benchmarks use, so figures compare like for like: one resource with
// service.name and three more attributes; every span, log record and metric
// in its own scope; four string attributes on each item; random ids and
// names. Values come from a seeded generator: the same call gives the same
// payload.
//
// Log bodies come in two kinds. Random letters and digits (the seeds'
// shape) are the worst case for the exporter's compression: nothing
// repeats, so lz4 searches every position and saves nothing. Text is what
// applications log: lines of an application log with timestamps, levels,
// a small vocabulary and varying numbers and ids, which compresses about
// as well as real logs do.
package otlpgen

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// Gen makes payloads; not safe for concurrent use.
type Gen struct {
	rng *rand.Rand
	Now time.Time
}

// New returns a generator seeded with seed.
func New(seed uint64) *Gen {
	return &Gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), Now: time.Unix(1_790_000_000, 0)}
}

// String returns n random letters and digits.
func (g *Gen) String(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[g.rng.IntN(len(letters))]
	}
	return string(b)
}

// lines are an application's log messages; %d is a number, %s an id.
var lines = []string{
	"GET /api/v1/orders/%d HTTP/1.1 200 %dms bytes=%d user=%s",
	"POST /api/v1/cart/%s/items HTTP/1.1 201 %dms bytes=%d",
	"order %d accepted for customer %s: %d items, total %d EUR",
	"cache miss for key session:%s, loading from database",
	"retrying request to payment-service (attempt %d of 5): connection reset by peer",
	"user %s logged in from 10.%d.%d.%d",
	"slow query took %dms: SELECT id, status, total FROM orders WHERE customer_id = %d",
	"published %d events to topic orders.v1 in %dms",
	"health check ok: db=%dms cache=%dms queue_depth=%d",
	"worker %d finished job %s in %dms, next poll in %dms",
}

var levels = []string{"INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"}

// Text returns n bytes of application log lines.
func (g *Gen) Text(n int) string {
	b := make([]byte, 0, n+160)
	for len(b) < n {
		ms := g.rng.IntN(1000)
		b = g.Now.Add(time.Duration(g.rng.IntN(3600_000))*time.Millisecond).UTC().AppendFormat(b, "2006-01-02T15:04:05")
		b = append(b, '.')
		b = append(b, byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
		b = append(b, "Z "...)
		b = append(b, levels[g.rng.IntN(len(levels))]...)
		b = append(b, " [http-nio-8080-exec-"...)
		b = strconv.AppendInt(b, int64(g.rng.IntN(64)), 10)
		b = append(b, "] com.example.shop.OrderService - "...)
		line := lines[g.rng.IntN(len(lines))]
		for i := 0; i < len(line); i++ {
			if line[i] == '%' && i+1 < len(line) {
				i++
				if line[i] == 'd' {
					b = strconv.AppendInt(b, int64(g.rng.IntN(100_000)), 10)
				} else {
					for j := 0; j < 8; j++ {
						b = append(b, "0123456789abcdef"[g.rng.IntN(16)])
					}
				}
				continue
			}
			b = append(b, line[i])
		}
		b = append(b, '\n')
	}
	return string(b[:n])
}

// TraceID returns a random non-zero trace id.
func (g *Gen) TraceID() pcommon.TraceID {
	var id pcommon.TraceID
	binary.LittleEndian.PutUint64(id[:8], g.rng.Uint64()|1)
	binary.LittleEndian.PutUint64(id[8:], g.rng.Uint64())
	return id
}

// SpanID returns a random non-zero span id.
func (g *Gen) SpanID() pcommon.SpanID {
	var id pcommon.SpanID
	binary.LittleEndian.PutUint64(id[:], g.rng.Uint64()|1)
	return id
}

func (g *Gen) resource(m pcommon.Map) {
	m.PutStr("service.name", "generator.service")
	for i := 1; i <= 3; i++ {
		m.PutStr("http.resource"+strconv.Itoa(i), g.String(8))
	}
}

func (g *Gen) attrs(m pcommon.Map) {
	for i := 1; i <= 4; i++ {
		m.PutStr("http.method"+strconv.Itoa(i), g.String(8))
	}
}

// Traces returns n spans of one resource, each its own trace.
func (g *Gen) Traces(n int) ptrace.Traces { return g.TracesOf(n, 1) }

// TracesOf returns n spans of one resource, perTrace consecutive spans
// sharing a trace id: an SDK's batch holds a few spans of each request it
// served, where Traces' one span per trace is the worst case for a split
// by trace.
func (g *Gen) TracesOf(n, perTrace int) ptrace.Traces {
	perTrace = max(perTrace, 1)
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	g.resource(rs.Resource().Attributes())
	var trace pcommon.TraceID
	for i := 0; i < n; i++ {
		ss := rs.ScopeSpans().AppendEmpty()
		ss.Scope().SetName("otlpgen")
		sp := ss.Spans().AppendEmpty()
		sp.SetName(g.String(12))
		if i%perTrace == 0 {
			trace = g.TraceID()
		}
		sp.SetTraceID(trace)
		sp.SetSpanID(g.SpanID())
		sp.SetParentSpanID(g.SpanID())
		sp.SetStartTimestamp(pcommon.NewTimestampFromTime(g.Now))
		sp.SetEndTimestamp(pcommon.NewTimestampFromTime(g.Now.Add(time.Second)))
		sp.SetKind(ptrace.SpanKind(1 + i%5))
		g.attrs(sp.Attributes())
	}
	return td
}

// Body kinds of log records.
const (
	BodyRandom = "random"
	BodyText   = "text"
)

// Bodies lists the body kinds Logs accepts.
var Bodies = []string{BodyRandom, BodyText}

// Logs returns n log records of size bytes of random body each, of one
// resource.
func (g *Gen) Logs(n, size int) plog.Logs { return g.LogsOf(n, size, BodyRandom) }

// LogsOf returns n log records of size bytes of body each, of one
// resource; body is BodyRandom or BodyText.
func (g *Gen) LogsOf(n, size int, body string) plog.Logs {
	str := g.String
	if body == BodyText {
		str = g.Text
	}
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	g.resource(rl.Resource().Attributes())
	for i := 0; i < n; i++ {
		lr := rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
		lr.SetTraceID(g.TraceID())
		lr.SetSpanID(g.SpanID())
		lr.SetTimestamp(pcommon.NewTimestampFromTime(g.Now))
		lr.SetSeverityNumber(plog.SeverityNumberInfo)
		lr.SetSeverityText("INFO")
		lr.Body().SetStr(str(size))
		g.attrs(lr.Attributes())
	}
	return ld
}

// Metrics returns gauges, counters and histograms metrics of one data point
// each, of one resource.
func (g *Gen) Metrics(gauges, counters, histograms int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	g.resource(rm.Resource().Attributes())
	ts := pcommon.NewTimestampFromTime(g.Now)
	for i := 0; i < gauges; i++ {
		m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("gauge_" + g.String(6))
		dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
		dp.SetTimestamp(ts)
		dp.SetDoubleValue(g.rng.Float64() * 100)
		g.attrs(dp.Attributes())
	}
	for i := 0; i < counters; i++ {
		m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("counter_" + g.String(6))
		s := m.SetEmptySum()
		s.SetIsMonotonic(true)
		s.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		dp := s.DataPoints().AppendEmpty()
		dp.SetStartTimestamp(ts)
		dp.SetTimestamp(ts)
		dp.SetIntValue(g.rng.Int64N(1 << 20))
		g.attrs(dp.Attributes())
	}
	for i := 0; i < histograms; i++ {
		m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
		m.SetName("histogram_" + g.String(6))
		h := m.SetEmptyHistogram()
		h.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		dp := h.DataPoints().AppendEmpty()
		dp.SetStartTimestamp(ts)
		dp.SetTimestamp(ts)
		dp.ExplicitBounds().FromRaw([]float64{1, 5, 10, 50, 100})
		dp.BucketCounts().FromRaw([]uint64{1, 2, 3, 4, 5, 6})
		dp.SetCount(21)
		dp.SetSum(321.5)
		g.attrs(dp.Attributes())
	}
	return md
}
