package otlpreceiver

import (
	"bytes"
	"github.com/ferryhq/ferry/receiver"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/signal"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestSamplingKeepsTheSameTracesInEveryEncoding: at 30%, about 30% of
// traces arrive, exactly those the rule keeps, whatever the partitioning;
// the rest are counted as dropped by policy.
func TestSamplingKeepsTheSameTracesInEveryEncoding(t *testing.T) {
	td := otlpgen.New(9).Traces(2000) // 2000 spans, 2000 random trace ids
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	decision := sampler.For(30)
	want := 0
	spans := td.ResourceSpans().At(0).ScopeSpans()
	for i := 0; i < spans.Len(); i++ {
		id := spans.At(i).Spans().At(0).TraceID()
		if decision.Keep(id[:]) {
			want++
		}
	}
	if want < 540 || want > 660 {
		t.Fatalf("the rule itself keeps %d of 2000", want)
	}
	for _, part := range []string{"none", "trace_id", "resource"} {
		t.Run(part, func(t *testing.T) {
			set := telemetry.TestSettings()
			s, _ := sampler.New(sampler.Config{TracesPercent: 30, LogsPercent: 100}, set)
			cfg := testConfig()
			cfg.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: part}
			cfg.MaxRequestBytes = 4 << 20
			sink := &consumertest.Sink{}
			r := startWith(t, cfg, set, sink, &receiver.Prechecks{Sampler: s})
			res, err := http.Post("http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			got := 0
			for _, rec := range sink.Records() {
				td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(rec.Value)
				if err != nil {
					t.Fatal(err)
				}
				rss := td.ResourceSpans()
				for i := 0; i < rss.Len(); i++ {
					for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
						sps := rss.At(i).ScopeSpans().At(j).Spans()
						for k := 0; k < sps.Len(); k++ {
							id := sps.At(k).TraceID()
							if !decision.Keep(id[:]) {
								t.Fatalf("a trace the rule drops arrived")
							}
							got++
						}
					}
				}
			}
			if got != want {
				t.Fatalf("%d spans arrived, the rule keeps %d", got, want)
			}
			if v := testutil.ToFloat64(s.DroppedCounter(signal.Traces, "")); int(v) != 2000-want {
				t.Fatalf("dropped counter %v, want %d", v, 2000-want)
			}
		})
	}
}

func TestAttributeFiltersOnTheWay(t *testing.T) {
	set := telemetry.TestSettings()
	ap, err := attributes.New(attributes.Config{
		Actions: []attributes.Action{{Action: "delete", Key: "http.method1"}},
		DropIf:  []attributes.Match{{Key: "http.route", Equals: "/healthz"}},
	}, set)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Traces = encoding.Config{Topic: "spans", Encoding: "flat_json", Partition: "trace_id"}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, set, sink, &receiver.Prechecks{Attributes: ap})
	td := otlpgen.New(3).Traces(5)
	td.ResourceSpans().At(0).ScopeSpans().At(2).Spans().At(0).Attributes().PutStr("http.route", "/healthz")
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	res, err := http.Post("http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	recs := sink.Records()
	if res.StatusCode != 200 || len(recs) != 4 {
		t.Fatalf("status %d, %d records, want 4 (one health check dropped)", res.StatusCode, len(recs))
	}
	for _, rec := range recs {
		if bytes.Contains(rec.Value, []byte(`"http.method1"`)) || bytes.Contains(rec.Value, []byte("/healthz")) {
			t.Fatalf("filtered data arrived: %s", rec.Value)
		}
	}
}
