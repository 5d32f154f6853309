package encoding

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/sampling"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestRecordSpansSeesEverySpanBeforeSampling: in every encoding and
// partitioning, RecordSpans keeps the facts of every span of the request,
// those the sampler drops included, equal to the full walk's, and none
// when it is off.
func TestRecordSpansSeesEverySpanBeforeSampling(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(4).Traces(300)).MarshalProto()
	var want []wire.SpanFacts
	it := wire.NewTraces(raw)
	for it.Next() {
		sp := it.Span()
		want = append(want, wire.SpanFacts{Res: it.Resource().Raw, Name: sp.Name, Kind: sp.Kind, Status: sp.StatusCode, Start: sp.Start, End: sp.End})
	}
	for _, enc := range []string{"otlp_proto", "otlp_json", "flat_json"} {
		for _, part := range []string{"trace_id", "resource", "none"} {
			for _, pct := range []float64{100, 30} {
				e := &Encoder{RecordSpans: true, Sample: sampling.For(pct)}
				_, _, items, err := e.Encode(Traces, &Config{Topic: "t", Encoding: enc, Partition: part}, raw, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(e.Spans) != len(want) || (pct < 100 && items >= len(want)) {
					t.Fatalf("%s/%s/%v: %d spans recorded, %d kept, want %d recorded", enc, part, pct, len(e.Spans), items, len(want))
				}
				for i, f := range e.Spans {
					w := want[i]
					if string(f.Name) != string(w.Name) || string(f.Res) != string(w.Res) || f.Kind != w.Kind || f.Status != w.Status || f.Start != w.Start || f.End != w.End {
						t.Fatalf("%s/%s: span %d: %+v, want %+v", enc, part, i, f, w)
					}
				}
				e.RecordSpans = false
				if _, _, _, err := e.Encode(Traces, &Config{Topic: "t", Encoding: enc, Partition: part}, raw, nil); err != nil || len(e.Spans) != 0 {
					t.Fatalf("off: %d recorded (%v)", len(e.Spans), err)
				}
			}
		}
	}
}
