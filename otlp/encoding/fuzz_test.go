package encoding

import (
	"errors"
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/tools/otlpgen"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

// FuzzSplitBounded: whatever the request, encoding with a byte bound
// either refuses it with a *LimitError or builds records that pass the
// bound by at most the request's own size (one group's worth), and with
// an item bound never returns more items than allowed.
func FuzzSplitBounded(f *testing.F) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(20)).MarshalProto()
	f.Add(raw, uint8(0))
	f.Add(payloads.Amplifier(2000, 50), uint8(1))
	f.Add(payloads.EmptySpans(300), uint8(2))
	f.Add(payloads.DeepAttribute(40, ""), uint8(3))
	f.Add(raw, uint8(27))     // traces, otlp_proto, trace_partition
	f.Add(raw, uint8(27+9*4)) // the same over 2 partitions
	f.Fuzz(func(t *testing.T, raw []byte, mode uint8) {
		sigs := []Signal{Traces, Logs, Metrics}
		sig := sigs[int(mode)%3]
		c := &Config{Topic: "t", Encoding: []string{"otlp_proto", "otlp_json", "flat_json"}[int(mode/3)%3],
			Partition: []string{"trace_id", "resource", "none", "trace_partition"}[int(mode/9)%4]}
		if c.Validate(sig) != nil {
			c.Partition = "resource"
		}
		// trace_partition: a topic of 1 to 7 partitions.
		e := &Encoder{MaxItems: 50, MaxBytes: 4*len(raw) + 1024, RecordCost: 64, MaxRecordBytes: 4096, Partitions: 1 + int(mode/36)%7}
		parts, out, items, err := e.Encode(sig, c, raw, nil)
		var le *LimitError
		if err != nil {
			if errors.As(err, &le) && le.Items && le.Limit != 50 {
				t.Fatalf("limit error names %d", le.Limit)
			}
			return
		}
		if items > 50 {
			t.Fatalf("%d items returned past a bound of 50", items)
		}
		if len(out)+len(parts)*64 > e.MaxBytes {
			t.Fatalf("%d bytes of records (%d records) from %d bytes of request, bound %d", len(out), len(parts), len(raw), e.MaxBytes)
		}
		for _, p := range parts {
			if p.Chosen && (c.Partition != "trace_partition" || p.Partition < 0 || int(p.Partition) >= e.Partitions || p.KeyEnd != p.KeyStart) {
				t.Fatalf("part %+v: a partition chosen outside trace_partition's %d partitions, or with a key", p, e.Partitions)
			}
		}
	})
}
