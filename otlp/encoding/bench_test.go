package encoding

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// BenchmarkSplit_20000Traces: a request of 20,000 one-span traces split by
// trace id. Writing each trace's record walks only that trace's spans, so
// the cost grows with the items, not items × traces (which made such a
// request cost seconds of CPU).
func BenchmarkSplit_20000Traces(b *testing.B) {
	benchEncode(b, &Encoder{}, Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_id"},
		payloads.Amplifier(64, 20000), 20000)
}

// BenchmarkEncodeLogs: a request as an SDK sends it (one resource, 100
// logs of 1 KB text) into records keyed by resource, the default.
func BenchmarkEncodeLogs(b *testing.B) {
	raw, err := (&plog.ProtoMarshaler{}).MarshalLogs(otlpgen.New(1).LogsOf(100, 1024, otlpgen.BodyText))
	if err != nil {
		b.Fatal(err)
	}
	benchEncode(b, &Encoder{MaxRecordBytes: 1 << 20}, Logs, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "resource"}, raw, 100)
}

// benchEncode encodes raw (items items of sig) with e and c over and over,
// reusing the output buffer as the receiver does.
func benchEncode(b *testing.B, e *Encoder, sig Signal, c *Config, raw []byte, items int) {
	var out []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		_, o, n, err := e.Encode(sig, c, raw, out[:0])
		if err != nil || n != items {
			b.Fatal(n, err)
		}
		out = o
	}
}
