package encoding

import (
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/sampling"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// interleaved has 3 traces spread over 2 resources and 3 scopes.
func interleaved() ptrace.Traces {
	td := ptrace.NewTraces()
	for r := 0; r < 2; r++ {
		rs := td.ResourceSpans().AppendEmpty()
		rs.SetSchemaUrl("s")
		rs.Resource().Attributes().PutInt("r", int64(r))
		for s := 0; s < 2-r; s++ {
			ss := rs.ScopeSpans().AppendEmpty()
			ss.Scope().SetName("scope")
			ss.Scope().SetVersion(string(rune('a' + s)))
			for i := 0; i < 6; i++ {
				sp := ss.Spans().AppendEmpty()
				sp.SetTraceID(pcommon.TraceID{byte(1 + i%3)})
				sp.SetSpanID(pcommon.SpanID{byte(r), byte(s), byte(i), 1})
				sp.SetName("op")
			}
		}
	}
	return td
}

func parts(t *testing.T, sig Signal, c Config, raw []byte) ([]Part, []byte, int) {
	t.Helper()
	if err := c.Validate(sig); err != nil {
		t.Fatal(err)
	}
	var e Encoder
	ps, out, n, err := e.Encode(sig, &c, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ps, out, n
}

// value is part p's value: the request itself, or its range of out.
func value(p Part, raw, out []byte) []byte {
	if p.Whole {
		return raw
	}
	return out[p.ValStart:p.ValEnd]
}

func TestProtoWholeRequestIsForwardedUntouched(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(interleaved()).MarshalProto()
	ps, out, n := parts(t, Traces, Config{Topic: "t", Encoding: "otlp_proto", Partition: "none"}, raw)
	if len(ps) != 1 || !ps[0].Whole || n != 18 || len(out) != 0 {
		t.Fatalf("parts %+v out %d n %d", ps, len(out), n)
	}
}

// TestOneRecordRequestIsForwardedUntouched: a request that makes a single
// record (one resource, as an SDK sends) is that record as it came, with
// the key it would have had, and only then.
func TestOneRecordRequestIsForwardedUntouched(t *testing.T) {
	logs := func(resources int) plog.Logs {
		ld := plog.NewLogs()
		for r := range resources {
			rl := ld.ResourceLogs().AppendEmpty()
			rl.Resource().Attributes().PutStr("service.name", "svc")
			rl.Resource().Attributes().PutInt("r", int64(r))
			for i := range 3 { // a scope per record, as some SDKs send
				lr := rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
				lr.Body().SetStr("a line of text")
				lr.SetTraceID(pcommon.TraceID{8: byte(i+1) << 6, 9: byte(r + 1)}) // the sampler reads bytes 8-15
			}
		}
		return ld
	}
	c := Config{Topic: "l", Encoding: "otlp_proto", Partition: "resource"}
	raw, _ := plogotlp.NewExportRequestFromLogs(logs(1)).MarshalProto()
	ps, out, n := parts(t, Logs, c, raw)
	if len(ps) != 1 || !ps[0].Whole || n != 3 || ps[0].Items != 3 {
		t.Fatalf("one resource: parts %+v, %d items", ps, n)
	}
	key := string(out[ps[0].KeyStart:ps[0].KeyEnd])
	// The same resource among others, so rebuilt: the same key.
	two, _ := plogotlp.NewExportRequestFromLogs(logs(2)).MarshalProto()
	ps2, out2, _ := parts(t, Logs, c, two)
	if len(ps2) != 2 || ps2[0].Whole || string(out2[ps2[0].KeyStart:ps2[0].KeyEnd]) != key {
		t.Fatalf("two resources: parts %+v; key %q, want %q", ps2, out2[ps2[0].KeyStart:ps2[0].KeyEnd], key)
	}
	// Rebuilt or not, the record holds the same items.
	a, errA := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(value(ps[0], raw, out))
	b, errB := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(value(ps2[0], two, out2))
	if errA != nil || errB != nil || a.LogRecordCount() != 3 || b.LogRecordCount() != 3 {
		t.Fatalf("%v %v %d %d", errA, errB, a.LogRecordCount(), b.LogRecordCount())
	}
	for i := range 3 {
		x := a.ResourceLogs().At(0).ScopeLogs().At(i).LogRecords().At(0)
		y := b.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(i)
		if x.Body().Str() != y.Body().Str() || x.TraceID() != y.TraceID() {
			t.Fatalf("record %d differs", i)
		}
	}
	// Not forwarded as it came: records sampled out, a request over the
	// record limit, a JSON record.
	var e Encoder
	kept := func(d sampling.Decision) int {
		k := 0
		for i := range 3 {
			tid := a.ResourceLogs().At(0).ScopeLogs().At(i).LogRecords().At(0).TraceID()
			if d.Keep(tid[:]) {
				k++
			}
		}
		return k
	}
	for pct := 1.0; pct < 100 && (kept(e.Sample) == 0 || kept(e.Sample) == 3); pct++ {
		e.Sample = sampling.For(pct)
	}
	if k := kept(e.Sample); k == 0 || k == 3 {
		t.Fatal("no sampling percent keeps some of the records")
	}
	if ps, _, _, err := e.Encode(Logs, &c, raw, nil); err != nil || len(ps) != 1 || ps[0].Whole || e.Dropped == 0 {
		t.Fatalf("some sampled out: %+v %v dropped %d", ps, err, e.Dropped)
	}
	// An unknown field of 1,000 bytes: the items fit one record under the
	// limit, the request as sent does not.
	junk := protowire.AppendBytes(protowire.AppendTag(slices.Clone(raw), 99, protowire.BytesType), make([]byte, 1000))
	e = Encoder{MaxRecordBytes: len(junk) - 1}
	if ps, _, _, err := e.Encode(Logs, &c, junk, nil); err != nil || len(ps) != 1 || ps[0].Whole {
		t.Fatalf("over the record limit: %+v %v", ps, err)
	}
	e = Encoder{MaxRecordBytes: len(junk)}
	if ps, _, _, err := e.Encode(Logs, &c, junk, nil); err != nil || len(ps) != 1 || !ps[0].Whole {
		t.Fatalf("at the record limit: %+v %v", ps, err)
	}
	j := Config{Topic: "l", Encoding: "otlp_json", Partition: "resource"}
	if ps, _, _ := parts(t, Logs, j, raw); len(ps) != 1 || ps[0].Whole {
		t.Fatalf("otlp_json: %+v", ps)
	}
	// MaxBytes counts the forwarded value.
	e = Encoder{MaxBytes: len(raw)}
	if _, _, _, err := e.Encode(Logs, &c, raw, nil); err == nil {
		t.Fatal("a request whose record takes more than MaxBytes accepted")
	}
}

// TestResourceKeyIsFNV1a: the key keeps its definition (keys written
// before a release must still match): FNV-1a 64 of the sorted key, 0,
// value, 0 pairs, in hex.
func TestResourceKeyIsFNV1a(t *testing.T) {
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	rl.Resource().Attributes().PutStr("zone", "eu")
	rl.Resource().Attributes().PutStr("app", "shop")
	rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	ps, out, _ := parts(t, Logs, Config{Topic: "l", Encoding: "otlp_proto", Partition: "resource"}, raw)
	h := fnv.New64a()
	for _, kv := range [][2]string{{"app", "shop"}, {"zone", "eu"}} {
		v := protowire.AppendTag(nil, 1, protowire.BytesType) // AnyValue.string_value
		v = protowire.AppendString(v, kv[1])
		h.Write([]byte(kv[0]))
		h.Write([]byte{0})
		h.Write(v)
		h.Write([]byte{0})
	}
	if got, want := string(out[ps[0].KeyStart:ps[0].KeyEnd]), hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("key %s, want %s", got, want)
	}
}

func TestSplitByTraceID(t *testing.T) {
	td := interleaved()
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	for _, enc := range []string{"otlp_proto", "otlp_json"} {
		ps, out, n := parts(t, Traces, Config{Topic: "t", Encoding: enc, Partition: "trace_id"}, raw)
		if len(ps) != 3 || n != 18 {
			t.Fatalf("%s: %d parts, %d items", enc, len(ps), n)
		}
		seen := map[pcommon.SpanID]bool{}
		for _, p := range ps {
			val := value(p, raw, out)
			var got ptrace.Traces
			var err error
			if enc == "otlp_proto" {
				got, err = (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(val)
			} else {
				got, err = (&ptrace.JSONUnmarshaler{}).UnmarshalTraces(val)
			}
			if err != nil {
				t.Fatalf("%s part does not decode: %v", enc, err)
			}
			key := string(out[p.KeyStart:p.KeyEnd])
			if got.SpanCount() != p.Items || p.Items != 6 {
				t.Fatalf("%s part has %d spans, says %d", enc, got.SpanCount(), p.Items)
			}
			for i := 0; i < got.ResourceSpans().Len(); i++ {
				rs := got.ResourceSpans().At(i)
				if rs.SchemaUrl() != "s" || rs.Resource().Attributes().Len() != 1 {
					t.Fatalf("resource lost: %v", rs.Resource().Attributes().AsRaw())
				}
				for j := 0; j < rs.ScopeSpans().Len(); j++ {
					ss := rs.ScopeSpans().At(j)
					if ss.Scope().Name() != "scope" {
						t.Fatal("scope lost")
					}
					for k := 0; k < ss.Spans().Len(); k++ {
						sp := ss.Spans().At(k)
						tid := sp.TraceID()
						if hex.EncodeToString(tid[:]) != key {
							t.Fatalf("span of trace %x in the record keyed %s", tid, key)
						}
						seen[sp.SpanID()] = true
					}
				}
			}
		}
		if len(seen) != 18 {
			t.Fatalf("%s: %d distinct spans across parts, want 18", enc, len(seen))
		}
	}
}

func TestSplitByResourceWithStableKeys(t *testing.T) {
	ld := plog.NewLogs()
	for r := 0; r < 2; r++ {
		rl := ld.ResourceLogs().AppendEmpty()
		if r == 0 {
			rl.Resource().Attributes().PutStr("a", "1")
			rl.Resource().Attributes().PutStr("b", "2")
		} else { // same attributes, other order
			rl.Resource().Attributes().PutStr("b", "2")
			rl.Resource().Attributes().PutStr("a", "1")
		}
		lr := rl.ScopeLogs().AppendEmpty().LogRecords()
		for i := 0; i < 3; i++ {
			lr.AppendEmpty().Body().SetStr("x")
		}
	}
	other := ld.ResourceLogs().AppendEmpty()
	other.Resource().Attributes().PutStr("a", "other")
	other.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	ps, out, n := parts(t, Logs, Config{Topic: "l", Encoding: "otlp_proto", Partition: "resource"}, raw)
	if len(ps) != 3 || n != 7 {
		t.Fatalf("%d parts %d items", len(ps), n)
	}
	k0, k1, k2 := string(out[ps[0].KeyStart:ps[0].KeyEnd]), string(out[ps[1].KeyStart:ps[1].KeyEnd]), string(out[ps[2].KeyStart:ps[2].KeyEnd])
	if k0 != k1 || k0 == k2 || len(k0) != 16 {
		t.Fatalf("keys %q %q %q: same attributes in any order must share a key", k0, k1, k2)
	}
	for _, p := range ps {
		got, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(value(p, raw, out))
		if err != nil || got.LogRecordCount() != p.Items || got.ResourceLogs().Len() != 1 {
			t.Fatalf("part: %v, %d records, says %d", err, got.LogRecordCount(), p.Items)
		}
	}
}

func TestMetricsSplitCountsDataPoints(t *testing.T) {
	md := otlpgen.New(1).Metrics(2, 2, 2)
	md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge().DataPoints().AppendEmpty().SetIntValue(1)
	raw, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	ps, out, n := parts(t, Metrics, Config{Topic: "m", Encoding: "otlp_proto", Partition: "resource"}, raw)
	if len(ps) != 1 || n != 7 || ps[0].Items != 7 {
		t.Fatalf("parts %+v n %d", ps, n)
	}
	got, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(value(ps[0], raw, out))
	if err != nil || got.DataPointCount() != 7 {
		t.Fatalf("%v %d", err, got.DataPointCount())
	}
}

func TestFlatJSONOneRecordPerItem(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(interleaved()).MarshalProto()
	ps, out, n := parts(t, Traces, Config{Topic: "t", Encoding: "flat_json", Partition: "trace_id"}, raw)
	if len(ps) != 18 || n != 18 {
		t.Fatalf("%d parts", len(ps))
	}
	for _, p := range ps {
		var m map[string]any
		if err := json.Unmarshal(value(p, raw, out), &m); err != nil {
			t.Fatal(err)
		}
		if m["trace_id"] != string(out[p.KeyStart:p.KeyEnd]) {
			t.Fatalf("key %s, trace_id %v", out[p.KeyStart:p.KeyEnd], m["trace_id"])
		}
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []struct {
		s Signal
		c Config
	}{
		{Traces, Config{Topic: "", Encoding: "otlp_proto", Partition: "none"}},
		{Traces, Config{Topic: "t", Encoding: "avro", Partition: "none"}},
		{Logs, Config{Topic: "t", Encoding: "flat_json", Partition: "trace_id"}},
		{Metrics, Config{Topic: "t", Encoding: "flat_json", Partition: "span"}},
	}
	for _, b := range bad {
		if err := b.c.Validate(b.s); err == nil {
			t.Errorf("%+v accepted", b.c)
		}
	}
}

func TestMalformedRequestIsAnError(t *testing.T) {
	var e Encoder
	for _, c := range []Config{{Topic: "t", Encoding: "otlp_proto", Partition: "none"}, {Topic: "t", Encoding: "otlp_proto", Partition: "trace_id"}, {Topic: "t", Encoding: "flat_json", Partition: "none"}, {Topic: "t", Encoding: "otlp_json", Partition: "resource"}} {
		if _, _, _, err := e.Encode(Traces, &c, []byte{0x0a, 0x05, 0x01}, nil); err == nil {
			t.Errorf("%+v: malformed accepted", c)
		}
	}
}

func TestLargeGroupsAreSplitUnderTheRecordLimit(t *testing.T) {
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(10, 100<<10)).MarshalProto() // ~1 MB, one resource
	e := Encoder{MaxRecordBytes: 300_000}
	c := Config{Topic: "l", Encoding: "otlp_proto", Partition: "resource"}
	ps, out, n, err := e.Encode(Logs, &c, raw, nil)
	if err != nil || n != 10 {
		t.Fatal(err, n)
	}
	if len(ps) < 4 {
		t.Fatalf("%d parts: a 1 MB resource must be split under 300 kB", len(ps))
	}
	total := 0
	key := string(out[ps[0].KeyStart:ps[0].KeyEnd])
	for _, p := range ps {
		if v := value(p, raw, out); len(v) > 300_000 {
			t.Fatalf("part of %d bytes over the limit", len(v))
		}
		if string(out[p.KeyStart:p.KeyEnd]) != key {
			t.Fatal("chunks of one resource must share its key")
		}
		ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(value(p, raw, out))
		if err != nil || ld.LogRecordCount() != p.Items {
			t.Fatalf("chunk: %v, %d records, says %d", err, ld.LogRecordCount(), p.Items)
		}
		total += p.Items
	}
	if total != 10 {
		t.Fatalf("%d records across chunks", total)
	}
	// Metrics: chunks count data points.
	md := otlpgen.New(1).Metrics(200, 200, 200)
	mraw, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	e.MaxRecordBytes = 20_000
	ps, out, n, err = e.Encode(Metrics, &Config{Topic: "m", Encoding: "otlp_proto", Partition: "resource"}, mraw, nil)
	if err != nil || n != 600 {
		t.Fatal(err, n)
	}
	total = 0
	for _, p := range ps {
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(value(p, mraw, out))
		if err != nil || md.DataPointCount() != p.Items {
			t.Fatalf("%v %d %d", err, md.DataPointCount(), p.Items)
		}
		total += p.Items
	}
	if total != 600 || len(ps) < 2 {
		t.Fatalf("%d points in %d parts", total, len(ps))
	}
}

// TestSplitCountsSchemaURLs: the schema URLs of a resource and a scope are
// copied into every record of them, so a split under the record limit
// counts them (it once did not: 19 small log records and a 6000-byte
// resource schema URL made records of 11 kB under an 8 kB limit, found by
// FuzzOTLPHTTP's record bound).
func TestSplitCountsSchemaURLs(t *testing.T) {
	for _, scope := range []bool{false, true} {
		ld := otlpgen.New(3).Logs(100, 100)
		if scope {
			ld.ResourceLogs().At(0).ScopeLogs().At(0).SetSchemaUrl(strings.Repeat("s", 6000))
		} else {
			ld.ResourceLogs().At(0).SetSchemaUrl(strings.Repeat("s", 6000))
		}
		raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
		e := Encoder{MaxRecordBytes: 8 << 10}
		ps, out, n, err := e.Encode(Logs, &Config{Topic: "l", Encoding: "otlp_proto", Partition: "resource"}, raw, nil)
		if err != nil || n != 100 || len(ps) < 2 {
			t.Fatalf("scope %v: %v, %d items in %d parts", scope, err, n, len(ps))
		}
		for _, p := range ps {
			if v := value(p, raw, out); len(v) > 8<<10 {
				t.Fatalf("scope %v: a part of %d items and %d bytes, over the 8 KiB limit", scope, p.Items, len(v))
			}
		}
	}
}

// TestSplitAllocatesNothing: an Encoder reused for requests of the same
// shape (the receivers pool them) allocates nothing per request, so the
// agent's garbage is the request's own buffers, not the split's scratch.
func TestSplitAllocatesNothing(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	c := &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_id"}
	e := Encoder{MaxRecordBytes: 1 << 20} // as the receivers run it: records split under the exporter's limit
	var out []byte
	encode := func() {
		_, o, n, err := e.Encode(Traces, c, raw, out[:0])
		if err != nil || n != 100 {
			t.Fatal(n, err)
		}
		out = o
	}
	encode()
	if a := testing.AllocsPerRun(100, encode); a != 0 {
		t.Fatalf("%.1f allocations per request of 100 spans", a)
	}
}

// TestSplitByTracePartition: partition trace_partition puts every span on
// the partition Kafka's murmur2 partitioner gives a record keyed by its
// hex trace id (kgo.StickyKeyPartitioner, the exporter's default, is the
// reference), one record per partition a request reaches, no key; without
// a partition count it writes what trace_id writes.
func TestSplitByTracePartition(t *testing.T) {
	td := otlpgen.New(7).TracesOf(300, 3) // 100 traces of 3 spans, one resource
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	want := func(tid pcommon.TraceID, n int) int32 {
		key := []byte(hex.EncodeToString(tid[:]))
		return int32(kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: key}, n))
	}
	for _, n := range []int{1, 3, 7, 64} {
		for _, enc := range []string{"otlp_proto", "otlp_json"} {
			c := Config{Topic: "t", Encoding: enc, Partition: "trace_partition"}
			if err := c.Validate(Traces); err != nil {
				t.Fatal(err)
			}
			e := Encoder{Partitions: n}
			ps, out, items, err := e.Encode(Traces, &c, raw, nil)
			if err != nil || items != 300 {
				t.Fatal(err, items)
			}
			seen, partsSeen := 0, map[int32]bool{}
			for _, p := range ps {
				if !p.Chosen || p.KeyEnd != p.KeyStart || p.Partition < 0 || int(p.Partition) >= n {
					t.Fatalf("n %d %s: part %+v: want a chosen partition below n and no key", n, enc, p)
				}
				if partsSeen[p.Partition] {
					t.Fatalf("n %d %s: two records for partition %d", n, enc, p.Partition)
				}
				partsSeen[p.Partition] = true
				var got ptrace.Traces
				if enc == "otlp_proto" {
					got, err = (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(value(p, raw, out))
				} else {
					got, err = (&ptrace.JSONUnmarshaler{}).UnmarshalTraces(value(p, raw, out))
				}
				if err != nil || got.SpanCount() != p.Items {
					t.Fatalf("n %d %s: %v, %d spans, part says %d", n, enc, err, got.SpanCount(), p.Items)
				}
				rs := got.ResourceSpans().At(0)
				if v, _ := rs.Resource().Attributes().Get("service.name"); v.Str() == "" {
					t.Fatalf("n %d %s: resource lost", n, enc)
				}
				for i := 0; i < rs.ScopeSpans().Len(); i++ {
					for j, sps := 0, rs.ScopeSpans().At(i).Spans(); j < sps.Len(); j++ {
						if w := want(sps.At(j).TraceID(), n); w != p.Partition {
							t.Fatalf("n %d %s: span of trace %s in partition %d's record, its key goes to %d", n, enc, sps.At(j).TraceID(), p.Partition, w)
						}
						seen++
					}
				}
			}
			if seen != 300 || (n > 1 && len(ps) < 2) || len(ps) > n {
				t.Fatalf("n %d %s: %d spans in %d records", n, enc, seen, len(ps))
			}
		}
	}
	// Unknown partition count: a record per trace keyed by its id.
	c := Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}
	ps, out, _ := parts(t, Traces, c, raw)
	if len(ps) != 100 || ps[0].Chosen || ps[0].KeyEnd-ps[0].KeyStart != 32 {
		t.Fatalf("without partitions: %d parts, first %+v (key %q)", len(ps), ps[0], out[ps[0].KeyStart:ps[0].KeyEnd])
	}
	// flat_json: an object per span, keyed by its trace id, whatever the count.
	e := Encoder{Partitions: 3}
	ps, _, _, err := e.Encode(Traces, &Config{Topic: "t", Encoding: "flat_json", Partition: "trace_partition"}, raw, nil)
	if err != nil || len(ps) != 300 || ps[0].Chosen || ps[0].KeyEnd-ps[0].KeyStart != 32 {
		t.Fatalf("flat_json: %v, %d parts", err, len(ps))
	}
	// Logs and metrics have no trace to follow.
	if err := (&Config{Topic: "l", Encoding: "otlp_proto", Partition: "trace_partition"}).Validate(Logs); err == nil {
		t.Fatal("trace_partition accepted for logs")
	}
}

// TestTracePartitionIsWholeWhenOnePartition: a request whose traces all
// map to one partition is forwarded as it came, on that partition.
func TestTracePartitionIsWholeWhenOnePartition(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	e := Encoder{Partitions: 1}
	ps, out, n, err := e.Encode(Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}, raw, nil)
	if err != nil || n != 100 || len(ps) != 1 || !ps[0].Whole || !ps[0].Chosen || ps[0].Partition != 0 || len(out) != 0 {
		t.Fatalf("%v: %d items, parts %+v, %d bytes built", err, n, ps, len(out))
	}
}

// TestTracePartitionSplitsUnderTheRecordLimit: a partition's group over
// the record limit is cut into several records, all on its partition.
func TestTracePartitionSplitsUnderTheRecordLimit(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(2000)).MarshalProto()
	e := Encoder{Partitions: 2, MaxRecordBytes: 64 << 10}
	ps, out, n, err := e.Encode(Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}, raw, nil)
	if err != nil || n != 2000 {
		t.Fatal(err, n)
	}
	per := map[int32]int{}
	for _, p := range ps {
		if v := value(p, raw, out); len(v) > 64<<10 || !p.Chosen {
			t.Fatalf("part %+v of %d bytes", p, len(v))
		}
		per[p.Partition] += p.Items
	}
	if len(per) != 2 || per[0]+per[1] != 2000 || len(ps) < 4 {
		t.Fatalf("%d parts, items per partition %v", len(ps), per)
	}
}

// TestTracePartitionAllocatesNothing: as TestSplitAllocatesNothing, for
// the default split.
func TestTracePartitionAllocatesNothing(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	c := &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}
	e := Encoder{MaxRecordBytes: 1 << 20, Partitions: 12}
	var out []byte
	encode := func() {
		ps, o, n, err := e.Encode(Traces, c, raw, out[:0])
		if err != nil || n != 100 || len(ps) != 12 {
			t.Fatal(n, err, len(ps))
		}
		out = o
	}
	encode()
	if a := testing.AllocsPerRun(100, encode); a != 0 {
		t.Fatalf("%.1f allocations per request of 100 spans", a)
	}
}

// TestMissingTraceIDsShareTheZeroID: spans with no trace id or an empty
// one go, in both trace splits, where the zero id goes: one record keyed by
// 32 zeros (trace_id), or that key's partition (trace_partition).
func TestMissingTraceIDsShareTheZeroID(t *testing.T) {
	td := ptrace.NewTraces()
	ss := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty()
	for i := 0; i < 4; i++ {
		sp := ss.Spans().AppendEmpty()
		sp.SetSpanID(pcommon.SpanID{byte(i + 1)})
		sp.SetName("no trace")
	}
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	// pdata leaves an empty trace id out: withEmptyTraceID writes one span's
	// as present and empty.
	zero := strings.Repeat("0", 32)
	for _, empty := range []bool{false, true} {
		in := raw
		if empty {
			in = withEmptyTraceID(t, raw)
		}
		ps, out, n := parts(t, Traces, Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_id"}, in)
		if n != 4 || len(ps) != 1 || string(out[ps[0].KeyStart:ps[0].KeyEnd]) != zero {
			t.Fatalf("empty %v, trace_id: %d items in %d parts, key %q", empty, n, len(ps), out[ps[0].KeyStart:ps[0].KeyEnd])
		}
		want := int32(kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: []byte(zero)}, 7))
		e := Encoder{Partitions: 7}
		ps, _, n, err := e.Encode(Traces, &Config{Topic: "t", Encoding: "otlp_proto", Partition: "trace_partition"}, in, nil)
		if err != nil || n != 4 || len(ps) != 1 || !ps[0].Chosen || ps[0].Partition != want {
			t.Fatalf("empty %v, trace_partition: %v, %d items, parts %+v, want partition %d", empty, err, n, ps, want)
		}
	}
}

// withEmptyTraceID adds an empty trace_id field (1) to the first span of a
// traces request of one resource and one scope.
func withEmptyTraceID(t *testing.T, raw []byte) []byte {
	t.Helper()
	// ExportTraceServiceRequest{1: ResourceSpans{2: ScopeSpans{2: Span}}}:
	// rebuild it with the span's bytes prefixed by an empty field 1.
	rs, _ := field(t, raw, 1)
	ss, rsRest := field(t, rs, 2)
	sp, ssRest := field(t, ss, 2)
	sp = append(protowire.AppendTag(nil, 1, protowire.BytesType), append([]byte{0}, sp...)...)
	ss = append(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), sp), ssRest...)
	rs = append(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), ss), rsRest...)
	return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), rs)
}

// field returns the first length-delimited field num of msg and every other
// field of msg, re-encoded after it.
func field(t *testing.T, msg []byte, num protowire.Number) (val, rest []byte) {
	t.Helper()
	for len(msg) > 0 {
		n, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			t.Fatal("bad protobuf")
		}
		m := protowire.ConsumeFieldValue(n, typ, msg[l:])
		if m < 0 {
			t.Fatal("bad protobuf")
		}
		if n == num && typ == protowire.BytesType && val == nil {
			val, _ = protowire.ConsumeBytes(msg[l:])
		} else {
			rest = append(rest, msg[:l+m]...)
		}
		msg = msg[l+m:]
	}
	return val, rest
}

// tracePartition's table path for 16-byte ids and its general path agree
// with Kafka's murmur2 partitioner on the hex key, for random ids and ids
// of other lengths.
func TestTracePartitionIsKafkasMurmur2(t *testing.T) {
	part := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		tid := make([]byte, []int{16, 16, 16, 8, 15, 1}[i%6])
		for j := range tid {
			tid[j] = byte(rng.Uint32())
		}
		n := 1 + int(rng.Uint32()%1000)
		want := int32(part.Partition(&kgo.Record{Key: []byte(hex.EncodeToString(tid))}, n))
		if got := tracePartition(tid, n); got != want {
			t.Fatalf("id %x, %d partitions: %d, Kafka's partitioner %d", tid, n, got, want)
		}
	}
}
