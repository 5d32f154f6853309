package wire

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
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

func benchMetricsUnmarshal(b *testing.B, n int) {
	raw, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(n, n, n)).MarshalProto()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		it := NewMetrics(raw)
		c := 0
		for it.Next() {
			c++
		}
		if it.Err() != nil || c != 3*n {
			b.Fatal(it.Err(), c)
		}
	}
}

// As bk-collector's: n gauges, n counters and n histograms per request.
func BenchmarkMetricsUnmarshal_100_DataPoints(b *testing.B)   { benchMetricsUnmarshal(b, 100) }
func BenchmarkMetricsUnmarshal_1000_DataPoints(b *testing.B)  { benchMetricsUnmarshal(b, 1000) }
func BenchmarkMetricsUnmarshal_10000_DataPoints(b *testing.B) { benchMetricsUnmarshal(b, 10000) }

func benchLogsUnmarshal(b *testing.B, n, size int) {
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(n, size)).MarshalProto()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		it := NewLogs(raw)
		c := 0
		for it.Next() {
			c++
		}
		if it.Err() != nil || c != n {
			b.Fatal(it.Err(), c)
		}
	}
}

func BenchmarkLogsUnmarshal_10x1KB_Logs(b *testing.B)     { benchLogsUnmarshal(b, 10, 1<<10) }
func BenchmarkLogsUnmarshal_10x10KB_Logs(b *testing.B)    { benchLogsUnmarshal(b, 10, 10<<10) }
func BenchmarkLogsUnmarshal_10x100KB_Logs(b *testing.B)   { benchLogsUnmarshal(b, 10, 100<<10) }
func BenchmarkLogsUnmarshal_100x1KB_Logs(b *testing.B)    { benchLogsUnmarshal(b, 100, 1<<10) }
func BenchmarkLogsUnmarshal_100x10KB_Logs(b *testing.B)   { benchLogsUnmarshal(b, 100, 10<<10) }
func BenchmarkLogsUnmarshal_100x100KB_Logs(b *testing.B)  { benchLogsUnmarshal(b, 100, 100<<10) }
func BenchmarkLogsUnmarshal_1000x1KB_Logs(b *testing.B)   { benchLogsUnmarshal(b, 1000, 1<<10) }
func BenchmarkLogsUnmarshal_1000x10KB_Logs(b *testing.B)  { benchLogsUnmarshal(b, 1000, 10<<10) }
func BenchmarkLogsUnmarshal_1000x100KB_Logs(b *testing.B) { benchLogsUnmarshal(b, 1000, 100<<10) }
