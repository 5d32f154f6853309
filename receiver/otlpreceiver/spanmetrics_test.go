package otlpreceiver

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"golang.org/x/sys/unix"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// smSpans is n spans over two services, three names, kinds and status
// codes, with durations of 1 ms to 3 s, each with its own trace id; want
// is calls and bucket counts per series key
// service|name|kind|status, as span metrics must count them.
func smSpans(n int) (raw []byte, want map[string][]uint64) {
	td := ptrace.NewTraces()
	want = map[string][]uint64{}
	t0 := time.Unix(1700000000, 0)
	bounds := spanmetrics.DefaultBuckets
	for _, svc := range []string{"cart", "shop"} {
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", svc)
		sps := rs.ScopeSpans().AppendEmpty().Spans()
		for i := range n / 2 {
			sp := sps.AppendEmpty()
			var id [16]byte
			binary.BigEndian.PutUint64(id[:8], uint64(i)*0x9e3779b97f4a7c15+uint64(len(svc)))
			binary.BigEndian.PutUint64(id[8:], uint64(i)*0xbf58476d1ce4e5b9^0x94d049bb133111eb)
			sp.SetTraceID(id)
			sp.SetSpanID(pcommon.SpanID{1, byte(i)})
			name := []string{"GET /", "POST /cart", "db.query"}[i%3]
			kind := []ptrace.SpanKind{ptrace.SpanKindServer, ptrace.SpanKindClient}[i%2]
			status := []ptrace.StatusCode{ptrace.StatusCodeUnset, ptrace.StatusCodeOk, ptrace.StatusCodeError, ptrace.StatusCodeUnset}[i%4]
			d := time.Duration(1+(i*37)%3000) * time.Millisecond
			sp.SetName(name)
			sp.SetKind(kind)
			sp.Status().SetCode(status)
			sp.SetStartTimestamp(pcommon.NewTimestampFromTime(t0))
			sp.SetEndTimestamp(pcommon.NewTimestampFromTime(t0.Add(d)))
			k := fmt.Sprintf("%s|%s|SPAN_KIND_%s|STATUS_CODE_%s", svc, name, strings.ToUpper(kind.String()), strings.ToUpper(status.String()))
			if want[k] == nil {
				want[k] = make([]uint64, len(bounds)+2) // calls, then buckets
			}
			want[k][0]++
			b := 0
			for b < len(bounds) && d > bounds[b] {
				b++
			}
			want[k][1+b]++
		}
	}
	raw, _ = ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	return raw, want
}

// TestSpanMetricsThroughTheReceiver: spans in over OTLP/HTTP with the
// sampler keeping 30% of traces; span metrics out as records on the metrics
// topic, in each metrics encoding, whose calls and bucket counts are those
// of every span sent, the sampled-out ones included.
func TestSpanMetricsThroughTheReceiver(t *testing.T) {
	raw, want := smSpans(600)
	for _, enc := range []string{"otlp_proto", "otlp_json", "flat_json"} {
		t.Run(enc, func(t *testing.T) {
			set := telemetry.TestSettings()
			s, _ := sampler.New(sampler.Config{TracesPercent: 30, LogsPercent: 100}, set)
			sm, err := spanmetrics.New(spanmetrics.Config{Enabled: true, Interval: time.Hour, Buckets: spanmetrics.DefaultBuckets,
				MaxSeries: 100, ExpireAfter: time.Hour}, set)
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig()
			cfg.Metrics = encoding.Config{Topic: "metrics", Encoding: enc, Partition: "resource"}
			sink := &consumertest.Sink{}
			r := startWith(t, cfg, set, sink, &receiver.Prechecks{Sampler: s, SpanMetrics: sm})
			if err := sm.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 2 { // twice: cumulative
				res, err := http.Post("http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
			}
			spans := 0
			for _, rec := range sink.Records() {
				if rec.Topic == "spans" {
					td, _ := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(rec.Value)
					spans += td.SpanCount()
				}
			}
			if spans == 0 || spans > 2*600/2 {
				t.Fatalf("%d of 1200 spans passed the sampler at 30%%", spans)
			}
			sink.Reset()
			if err := sm.Shutdown(context.Background()); err != nil { // the last interval
				t.Fatal(err)
			}
			got := map[string][]uint64{}
			for _, rec := range sink.Records() {
				if rec.Topic != "metrics" {
					t.Fatalf("a record on %q", rec.Topic)
				}
				readSpanMetrics(t, enc, rec.Value, got)
			}
			if len(got) != len(want) {
				t.Fatalf("%d series, want %d", len(got), len(want))
			}
			for k, w := range want {
				g := got[k]
				for i := range w {
					if g == nil || g[i] != 2*w[i] {
						t.Fatalf("%s: %v, want twice %v", k, g, w)
					}
				}
			}
		})
	}
}

// readSpanMetrics adds the calls and bucket counts of one record to got.
func readSpanMetrics(t *testing.T, enc string, v []byte, got map[string][]uint64) {
	t.Helper()
	var md pmetric.Metrics
	var err error
	switch enc {
	case "otlp_proto":
		md, err = (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(v)
	case "otlp_json":
		md, err = (&pmetric.JSONUnmarshaler{}).UnmarshalMetrics(v)
	case "flat_json":
		readFlatSpanMetrics(t, v, got)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		ms := rms.At(i).ScopeMetrics().At(0).Metrics()
		for j := 0; j < ms.Len(); j++ {
			m := ms.At(j)
			switch m.Name() {
			case spanmetrics.CallsMetric:
				for k := 0; k < m.Sum().DataPoints().Len(); k++ {
					dp := m.Sum().DataPoints().At(k)
					entry(got, dp.Attributes())[0] += uint64(dp.IntValue())
				}
			case spanmetrics.DurationMetric:
				for k := 0; k < m.Histogram().DataPoints().Len(); k++ {
					dp := m.Histogram().DataPoints().At(k)
					e := entry(got, dp.Attributes())
					for b, c := range dp.BucketCounts().AsRaw() {
						e[1+b] += c
					}
				}
			}
		}
	}
}

func entry(got map[string][]uint64, a pcommon.Map) []uint64 {
	var parts []string
	for _, k := range []string{"service.name", "span.name", "span.kind", "status.code"} {
		v, _ := a.Get(k)
		parts = append(parts, v.AsString())
	}
	k := strings.Join(parts, "|")
	if got[k] == nil {
		got[k] = make([]uint64, len(spanmetrics.DefaultBuckets)+2)
	}
	return got[k]
}

// readFlatSpanMetrics reads one flat_json record: one data point.
func readFlatSpanMetrics(t *testing.T, v []byte, got map[string][]uint64) {
	t.Helper()
	var p struct {
		Name         string            `json:"name"`
		Type         string            `json:"type"`
		Temporality  string            `json:"temporality"`
		Attributes   map[string]string `json:"attributes"`
		Value        uint64            `json:"value"`
		BucketCounts []uint64          `json:"bucket_counts"`
	}
	if err := json.Unmarshal(v, &p); err != nil {
		t.Fatalf("%v: %s", err, v)
	}
	if p.Temporality != "cumulative" {
		t.Fatalf("temporality %q", p.Temporality)
	}
	a := pcommon.NewMap()
	for k, s := range p.Attributes {
		a.PutStr(k, s)
	}
	e := entry(got, a)
	switch p.Name {
	case spanmetrics.CallsMetric:
		e[0] += p.Value
	case spanmetrics.DurationMetric:
		for b, c := range p.BucketCounts {
			e[1+b] += c
		}
	default:
		t.Fatalf("metric %q", p.Name)
	}
}

// ackAll acknowledges every record at once, as a Kafka that costs nothing.
type ackAll struct{}

func (ackAll) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	for i := range b.Records {
		b.AckAt(i, nil)
	}
	return nil
}

// BenchmarkSpanMetricsOverhead: the OTLP traces export path (decode,
// encode into records by trace id, submit, acknowledgement; what every
// OTLP/HTTP and OTLP/gRPC traces request costs after its body is read) of
// a request of 100 spans as otlpgen makes them, without and with span
// metrics, alternating in the same run so both see the same machine,
// each timed in CPU time of its thread.
// Reports ns/span of each and the overhead in percent (the goal: ≤ 10).
func BenchmarkSpanMetricsOverhead(b *testing.B) {
	raw, err := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	if err != nil {
		b.Fatal(err)
	}
	cfg := testConfig()
	cfg.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: "trace_id"}
	cfg.MaxRequestBytes = 4 << 20
	build := func(sm *spanmetrics.Processor) *Receiver {
		set := telemetry.TestSettings()
		r, err := New(cfg, receiver.Env{Set: set, Next: ackAll{}, Pre: &receiver.Prechecks{SpanMetrics: sm}})
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	sm, err := spanmetrics.New(spanmetrics.Config{Enabled: true, Interval: time.Hour, Buckets: spanmetrics.DefaultBuckets,
		MaxSeries: 10000, ExpireAfter: time.Hour}, telemetry.TestSettings())
	if err != nil {
		b.Fatal(err)
	}
	off, on := build(nil), build(sm)
	ctx := context.Background()
	// Each side is timed by the CPU time of this goroutine's thread
	// (locked to it), over blocks of 10 requests: on a machine shared with
	// other work, wall time mostly measures the others.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	run := func(r *Receiver, n int) time.Duration {
		t0 := threadCPU()
		for range n {
			buf := r.body.Get(len(raw))
			buf.B = append(buf.B, raw...)
			o := r.export(ctx, r.httpM, encoding.Traces, buf, nil, http.Header{})
			if o.err != nil || o.items != 100 {
				b.Fatal(o.err, o.items)
			}
		}
		return threadCPU() - t0
	}
	run(off, 10)
	run(on, 10)
	var tOff, tOn time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			tOff += run(off, 10)
			tOn += run(on, 10)
		} else {
			tOn += run(on, 10)
			tOff += run(off, 10)
		}
	}
	n := float64(b.N) * 10 * 100
	b.ReportMetric(float64(tOff.Nanoseconds())/n, "cpu-ns/span-off")
	b.ReportMetric(float64(tOn.Nanoseconds())/n, "cpu-ns/span-on")
	b.ReportMetric(100*float64(tOn-tOff)/float64(tOff), "%overhead")
}

// threadCPU is the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}
