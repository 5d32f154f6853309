package encoding

import (
	"bytes"
	"runtime"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestDecodeCost: what DecodeCost says pdata takes decoding a request (and
// writing it back, as the attribute processor does) is at least what it
// allocates, garbage included, for the shapes that amplify most (empty
// attributes, events, exemplars, packed buckets) and within a few times
// it for ordinary requests.
func TestDecodeCost(t *testing.T) {
	// A message of fields, each num: an empty message (or bytes) repeated.
	rep := func(num protowire.Number, inner []byte, n int) []byte {
		one := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), inner)
		return bytes.Repeat(one, n)
	}
	msg := func(num protowire.Number, inner []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), inner)
	}
	// traces: resource spans { resource { 100k empty attributes } }
	emptyAttrs := msg(1, msg(1, rep(1, nil, 100_000)))
	// traces: one span with 50k empty events
	span := rep(11, nil, 50_000)
	emptyEvents := msg(1, msg(2, msg(2, span)))
	// traces: one span with one link of 100k empty attributes (field 4)
	emptyLinkAttrs := msg(1, msg(2, msg(2, msg(13, rep(4, nil, 100_000)))))
	// traces: 100k empty attributes on a span in the deprecated scope
	// field 1000, which ferry's item walk does not read and pdata does
	deprecated := msg(1, msg(1000, msg(2, rep(9, nil, 100_000))))
	// traces: a resource with 100k empty entity references, and one real
	// one (its keys are strings, not messages)
	ref := append(msg(1, []byte("service")), msg(3, []byte("service.name"))...)
	ref = append(ref, msg(4, []byte("service.version"))...)
	entities := msg(1, msg(1, append(rep(3, nil, 100_000), msg(3, ref)...)))
	// metrics: a histogram point with 1M packed bucket counts and bounds
	packed := bytes.Repeat([]byte{1, 0, 0, 0, 0, 0, 0, 0}, 1<<20)
	point := append(msg(6, packed), msg(7, packed)...)
	histogram := msg(1, msg(2, msg(2, msg(9, msg(1, point)))))
	// metrics: an exponential histogram point whose positive buckets are
	// 1M varints sent unpacked (2 bytes each)
	unpacked := bytes.Repeat(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1), 1<<20)
	expPoint := msg(8, unpacked)
	expHistogram := msg(1, msg(2, msg(2, msg(10, msg(1, expPoint)))))
	packedVarints := msg(1, msg(2, msg(2, msg(10, msg(1, msg(8, msg(2, bytes.Repeat([]byte{1}, 1<<20))))))))

	ordinary := func(sig Signal) []byte {
		g := otlpgen.New(1)
		var b []byte
		switch sig {
		case Traces:
			b, _ = (&ptrace.ProtoMarshaler{}).MarshalTraces(g.Traces(200))
		case Logs:
			b, _ = (&plog.ProtoMarshaler{}).MarshalLogs(g.Logs(200, 10))
		default:
			b, _ = (&pmetric.ProtoMarshaler{}).MarshalMetrics(g.Metrics(100, 100, 100))
		}
		return b
	}
	for _, c := range []struct {
		name   string
		sig    Signal
		raw    []byte
		within float64 // the estimate at most this many times the allocation
	}{
		{"empty attributes", Traces, emptyAttrs, 0},
		{"empty events", Traces, emptyEvents, 0},
		{"empty link attributes", Traces, emptyLinkAttrs, 0},
		{"deprecated scope field", Traces, deprecated, 0},
		{"empty entity references", Traces, entities, 0},
		{"packed buckets", Metrics, histogram, 0},
		{"unpacked buckets", Metrics, expHistogram, 0},
		{"packed varint buckets", Metrics, packedVarints, 0},
		{"traces", Traces, ordinary(Traces), 5},
		{"logs", Logs, ordinary(Logs), 5},
		{"metrics", Metrics, ordinary(Metrics), 5},
	} {
		cost, err := DecodeCost(c.sig, c.raw)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var a, b runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&a)
		var rerr error
		switch c.sig {
		case Traces:
			td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(c.raw)
			if rerr = err; err == nil {
				_, rerr = (&ptrace.ProtoMarshaler{}).MarshalTraces(td)
			}
		case Logs:
			ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(c.raw)
			if rerr = err; err == nil {
				_, rerr = (&plog.ProtoMarshaler{}).MarshalLogs(ld)
			}
		default:
			md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(c.raw)
			if rerr = err; err == nil {
				_, rerr = (&pmetric.ProtoMarshaler{}).MarshalMetrics(md)
			}
		}
		runtime.ReadMemStats(&b)
		if rerr != nil {
			t.Fatalf("%s: pdata: %v", c.name, rerr)
		}
		alloc := int64(b.TotalAlloc - a.TotalAlloc)
		t.Logf("%s: %d bytes, pdata allocated %d, estimated %d", c.name, len(c.raw), alloc, cost)
		if cost < alloc {
			t.Errorf("%s: estimated %d bytes, pdata allocated %d", c.name, cost, alloc)
		}
		if c.within > 0 && float64(cost) > c.within*float64(alloc) {
			t.Errorf("%s: estimated %.1f times what pdata allocated", c.name, float64(cost)/float64(alloc))
		}
	}
}

// FuzzDecodeCost: any bytes are walked without a panic or unbounded
// recursion, and what pdata can decode is estimated at least at twice its
// size (the strings and the protobuf written back).
func FuzzDecodeCost(f *testing.F) {
	g := otlpgen.New(1)
	tb, _ := (&ptrace.ProtoMarshaler{}).MarshalTraces(g.Traces(3))
	lb, _ := (&plog.ProtoMarshaler{}).MarshalLogs(g.Logs(3, 10))
	mb, _ := (&pmetric.ProtoMarshaler{}).MarshalMetrics(g.Metrics(1, 1, 1))
	for _, b := range [][]byte{tb, lb, mb, {0x0a, 0x02, 0x0a, 0x00}, nil} {
		f.Add(byte(0), b)
		f.Add(byte(1), b)
		f.Add(byte(2), b)
	}
	f.Fuzz(func(t *testing.T, s byte, raw []byte) {
		sig := []Signal{Traces, Logs, Metrics}[int(s)%3]
		cost, err := DecodeCost(sig, raw)
		if err == nil && cost < 2*int64(len(raw)) {
			t.Fatalf("%d bytes estimated at %d", len(raw), cost)
		}
	})
}
