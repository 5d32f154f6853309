package flatjson

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// The Convert benchmarks measure what ferry does per request for flat_json:
// decode the OTLP bytes and write one JSON object per item into a reused
// buffer. bk-collector's converter starts from an already decoded pdata
// model, so these include more work than theirs.

func benchTraces(b *testing.B, n int) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(n)).MarshalProto()
	var e Encoder
	var buf []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Reset()
		buf = buf[:0]
		it := wire.NewTraces(raw)
		for it.Next() {
			buf = e.Span(buf, it.Resource(), it.Scope(), it.Span())
		}
		if it.Err() != nil {
			b.Fatal(it.Err())
		}
	}
}

func BenchmarkTracesConvert_10_Span(b *testing.B)    { benchTraces(b, 10) }
func BenchmarkTracesConvert_100_Span(b *testing.B)   { benchTraces(b, 100) }
func BenchmarkTracesConvert_1000_Span(b *testing.B)  { benchTraces(b, 1000) }
func BenchmarkTracesConvert_10000_Span(b *testing.B) { benchTraces(b, 10000) }

func benchMetrics(b *testing.B, g, c, h int) {
	raw, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(g, c, h)).MarshalProto()
	var e Encoder
	var buf []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Reset()
		buf = buf[:0]
		it := wire.NewMetrics(raw)
		for it.Next() {
			buf = e.Point(buf, it.Resource(), it.Scope(), it.Metric(), it.Point())
		}
		if it.Err() != nil {
			b.Fatal(it.Err())
		}
	}
}

func BenchmarkMetricsConvert_10_Gauge_DataPoint(b *testing.B)       { benchMetrics(b, 10, 0, 0) }
func BenchmarkMetricsConvert_10_Counter_DataPoint(b *testing.B)     { benchMetrics(b, 0, 10, 0) }
func BenchmarkMetricsConvert_10_Histogram_DataPoint(b *testing.B)   { benchMetrics(b, 0, 0, 10) }
func BenchmarkMetricsConvert_100_Gauge_DataPoint(b *testing.B)      { benchMetrics(b, 100, 0, 0) }
func BenchmarkMetricsConvert_100_Counter_DataPoint(b *testing.B)    { benchMetrics(b, 0, 100, 0) }
func BenchmarkMetricsConvert_100_Histogram_DataPoint(b *testing.B)  { benchMetrics(b, 0, 0, 100) }
func BenchmarkMetricsConvert_1000_Gauge_DataPoint(b *testing.B)     { benchMetrics(b, 1000, 0, 0) }
func BenchmarkMetricsConvert_1000_Counter_DataPoint(b *testing.B)   { benchMetrics(b, 0, 1000, 0) }
func BenchmarkMetricsConvert_1000_Histogram_DataPoint(b *testing.B) { benchMetrics(b, 0, 0, 1000) }

func benchLogs(b *testing.B, n, size int) {
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(n, size)).MarshalProto()
	var e Encoder
	var buf []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Reset()
		buf = buf[:0]
		it := wire.NewLogs(raw)
		for it.Next() {
			buf = e.Log(buf, it.Resource(), it.Scope(), it.Record())
		}
		if it.Err() != nil {
			b.Fatal(it.Err())
		}
	}
}

func BenchmarkLogsConvert_10x1KB_LogRecords(b *testing.B)    { benchLogs(b, 10, 1<<10) }
func BenchmarkLogsConvert_10x10KB_LogRecords(b *testing.B)   { benchLogs(b, 10, 10<<10) }
func BenchmarkLogsConvert_10x100KB_LogRecords(b *testing.B)  { benchLogs(b, 10, 100<<10) }
func BenchmarkLogsConvert_100x1KB_LogRecords(b *testing.B)   { benchLogs(b, 100, 1<<10) }
func BenchmarkLogsConvert_100x10KB_LogRecords(b *testing.B)  { benchLogs(b, 100, 10<<10) }
func BenchmarkLogsConvert_100x100KB_LogRecords(b *testing.B) { benchLogs(b, 100, 100<<10) }
