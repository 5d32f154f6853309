package wire

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

// skimmed is what SpanSkim and the full walk must agree on.
type skimmed struct {
	service, name string
	kind, status  int32
	start, end    uint64
}

func skimAll(raw []byte) ([]skimmed, bool) {
	var out []skimmed
	it := NewSpanSkim(raw)
	for it.Next() {
		out = append(out, skimmed{string(it.Service), string(it.Name), it.Kind, it.StatusCode, it.Start, it.End})
	}
	return out, it.Err()
}

func walkAll(raw []byte) ([]skimmed, error) {
	var out []skimmed
	it := NewTraces(raw)
	for it.Next() {
		sp := it.Span()
		svc, _ := LookupAttr(it.Resource().Raw, "service.name")
		out = append(out, skimmed{svc, string(sp.Name), sp.Kind, sp.StatusCode, sp.Start, sp.End})
	}
	return out, it.Err()
}

func TestSpanSkimMatchesWalk(t *testing.T) {
	td := otlpgen.New(7).Traces(50)
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutInt("service.name", 3) // not a string: no service
	sp := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	sp.SetName("x")
	sp.SetKind(ptrace.SpanKindConsumer)
	sp.Status().SetCode(ptrace.StatusCodeError)
	for _, d := range []ptrace.Traces{td, richTraces(), ptrace.NewTraces()} {
		raw, _ := ptraceotlp.NewExportRequestFromTraces(d).MarshalProto()
		got, bad := skimAll(raw)
		want, err := walkAll(raw)
		if bad || err != nil {
			t.Fatal(bad, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d spans, want %d", len(got), len(want))
		}
		for i := range got {
			w := want[i]
			if w.service == "3" {
				w.service = ""
			}
			if got[i] != w {
				t.Fatalf("span %d: %+v, want %+v", i, got[i], w)
			}
		}
	}
}

func TestSpanSkimNoAllocs(t *testing.T) {
	raw := tracesPayload(100)
	if n := testing.AllocsPerRun(20, func() {
		it := NewSpanSkim(raw)
		for it.Next() {
		}
	}); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

// FuzzSpanSkim: any input ends the iteration without a panic, and input
// the full walk accepts is skimmed to the same spans.
func FuzzSpanSkim(f *testing.F) {
	for _, td := range []ptrace.Traces{richTraces(), otlpgen.New(1).Traces(3), ptrace.NewTraces()} {
		raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, _ := skimAll(raw)
		want, err := walkAll(raw)
		if err != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%d spans, the walk %d", len(got), len(want))
		}
		for i := range got {
			if got[i].name != want[i].name || got[i].kind != want[i].kind || got[i].start != want[i].start ||
				got[i].end != want[i].end || got[i].status != want[i].status {
				t.Fatalf("span %d: %+v, the walk %+v", i, got[i], want[i])
			}
		}
	})
}

func BenchmarkSpanSkim_100_Spans(b *testing.B) {
	raw := tracesPayload(100)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		it := NewSpanSkim(raw)
		for it.Next() {
		}
	}
}
