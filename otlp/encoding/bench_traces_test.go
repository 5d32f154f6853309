package encoding

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

// The request ferry-bench otlp sends for traces (100 spans of one resource,
// each its own trace): the default split makes 100 records of it, none one.
// What the split costs in the encoder, apart from the records' cost in the
// exporter and the broker.
func benchSDKTraces(b *testing.B, partition string) { benchSDKTracesOf(b, partition, 1) }

// benchSDKTracesOf: perTrace spans a trace (an SDK batch holds a few spans
// of each request it served).
func benchSDKTracesOf(b *testing.B, partition string, perTrace int) {
	raw, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(otlpgen.New(1).TracesOf(100, perTrace))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, &Encoder{MaxRecordBytes: 1 << 20}, Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: partition}, raw, 100)
}

func BenchmarkEncodeTraces100_TraceID(b *testing.B)            { benchSDKTraces(b, "trace_id") }
func BenchmarkEncodeTraces100_None(b *testing.B)               { benchSDKTraces(b, "none") }
func BenchmarkEncodeTraces100_TraceID_10PerTrace(b *testing.B) { benchSDKTracesOf(b, "trace_id", 10) }

func BenchmarkEncodeTraces100_TracePartition(b *testing.B) {
	raw, err := (&ptrace.ProtoMarshaler{}).MarshalTraces(otlpgen.New(1).TracesOf(100, 1))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, &Encoder{MaxRecordBytes: 1 << 20, Partitions: 3}, Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}, raw, 100)
}
