package encoding

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/ferryhq/ferry/internal/hostile"
	"github.com/ferryhq/ferry/internal/otlpgen"
)

// BenchmarkSplit_20000Traces: a request of 20,000 one-span traces split by
// trace id. Writing each trace's record walks only that trace's spans, so
// the cost grows with the items, not items × traces (which made such a
// request cost seconds of CPU).
func BenchmarkSplit_20000Traces(b *testing.B) {
	raw := hostile.Amplifier(64, 20000)
	c := &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_id"}
	var e Encoder
	var out []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		_, o, n, err := e.Encode(Traces, c, raw, out[:0])
		if err != nil || n != 20000 {
			b.Fatal(n, err)
		}
		out = o
	}
}

// BenchmarkEncodeLogs: a request as an SDK sends it (one resource, 100
// logs of 1 KB text) into records keyed by resource, the default.
func BenchmarkEncodeLogs(b *testing.B) {
	raw, err := (&plog.ProtoMarshaler{}).MarshalLogs(otlpgen.New(1).LogsOf(100, 1024, otlpgen.BodyText))
	if err != nil {
		b.Fatal(err)
	}
	c := &Config{Topic: "t", Encoding: "otlp_proto", Partition: "resource"}
	e := Encoder{MaxRecordBytes: 1 << 20}
	var out []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		_, o, n, err := e.Encode(Logs, c, raw, out[:0])
		if err != nil || n != 100 {
			b.Fatal(n, err)
		}
		out = o
	}
}
