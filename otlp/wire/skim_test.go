package wire

import (
	"math/rand/v2"
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

// TestSpanSkimMutations: 100,000 random corruptions of real requests
// (bytes changed, cut short) end the skim without a panic, and the ones the
// full walk still accepts are skimmed to the same spans. A deterministic
// companion of FuzzSpanSkim that runs in every go test.
func TestSpanSkimMutations(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(3)).MarshalProto()
	rich, _ := ptraceotlp.NewExportRequestFromTraces(richTraces()).MarshalProto()
	rng := rand.New(rand.NewPCG(1, 2))
	n := 100000
	if testing.Short() {
		n = 10000
	}
	for i := range n {
		src := raw
		if i%2 == 1 {
			src = rich
		}
		b := append([]byte{}, src...)
		for range 1 + rng.IntN(4) {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		if rng.IntN(3) == 0 {
			b = b[:rng.IntN(len(b))]
		}
		got, _ := skimAll(b)
		want, err := walkAll(b)
		if err != nil {
			continue
		}
		if len(got) != len(want) {
			t.Fatalf("%x: %d spans, the walk %d", b, len(got), len(want))
		}
		for j := range got {
			if got[j].name != want[j].name || got[j].kind != want[j].kind || got[j].status != want[j].status {
				t.Fatalf("%x: span %d: %+v, the walk %+v", b, j, got[j], want[j])
			}
		}
	}
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
