package wire

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/internal/otlpgen"
)

func tracesPayload(n int) []byte {
	raw, err := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(n)).MarshalProto()
	if err != nil {
		panic(err)
	}
	return raw
}

func benchTracesUnmarshal(b *testing.B, n int) {
	raw := tracesPayload(n)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		count := 0
		it := NewTraces(raw)
		for it.Next() {
			count++
		}
		if err := it.Err(); err != nil || count != n {
			b.Fatal(err, count)
		}
	}
}

func BenchmarkTracesUnmarshal_10_Spans(b *testing.B)    { benchTracesUnmarshal(b, 10) }
func BenchmarkTracesUnmarshal_100_Spans(b *testing.B)   { benchTracesUnmarshal(b, 100) }
func BenchmarkTracesUnmarshal_1000_Spans(b *testing.B)  { benchTracesUnmarshal(b, 1000) }
func BenchmarkTracesUnmarshal_10000_Spans(b *testing.B) { benchTracesUnmarshal(b, 10000) }
