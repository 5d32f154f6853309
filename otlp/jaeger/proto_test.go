package jaeger

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jaegertracing/jaeger-idl/model/v1"
	"github.com/jaegertracing/jaeger-idl/proto-gen/api_v2"
	translator "github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/jaeger"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"
)

// protoReq is a PostSpansRequest of b, marshalled by the generated code.
func protoReq(t testing.TB, b *model.Batch) []byte {
	t.Helper()
	out, err := (&api_v2.PostSpansRequest{Batch: *b}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var protoT0 = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)

// protoSample: what an agent or the Collector's jaeger exporter sends:
// a batch process with tags, spans with tags of each type, logs,
// references in and out of the trace; every fifth span carries its own
// process.
func protoSample(spans int) *model.Batch {
	b := &model.Batch{Process: &model.Process{ServiceName: "checkout", Tags: []model.KeyValue{
		model.String("hostname", "web-1"), model.String("jaeger.version", "Go-2.30.0"), model.Int64("pid", 42)}}}
	for i := range spans {
		tid := model.NewTraceID(7, uint64(i/3+1))
		s := &model.Span{TraceID: tid, SpanID: model.NewSpanID(uint64(i + 1)), OperationName: fmt.Sprintf("op-%d", i%5),
			Flags: 1, StartTime: protoT0.Add(time.Duration(i) * time.Microsecond), Duration: 1500*time.Microsecond + 7,
			Tags: []model.KeyValue{
				model.String("span.kind", []string{"server", "client", "producer", "consumer", "internal"}[i%5]),
				model.String("http.method", "GET"), model.Int64("n", int64(i)), model.Float64("ratio", 2.5),
				model.Bool("error", i%2 == 0), model.Binary("blob", []byte{1, 2, 3}),
			},
			Logs: []model.Log{{Timestamp: protoT0.Add(100 * time.Microsecond), Fields: []model.KeyValue{
				model.String("event", "retry"), model.Int64("attempt", int64(i))}}},
			References: []model.SpanRef{
				{RefType: model.FollowsFrom, TraceID: model.NewTraceID(9, 9), SpanID: 99},
			},
		}
		if i%3 != 0 {
			s.References = append(s.References, model.SpanRef{RefType: model.ChildOf, TraceID: tid, SpanID: model.NewSpanID(uint64(i))})
		}
		if i%5 == 4 {
			s.Process = &model.Process{ServiceName: fmt.Sprintf("sidecar-%d", i%2), Tags: []model.KeyValue{model.String("zone", "b")}}
		}
		if i%7 == 6 {
			s.Tags = append(s.Tags, model.String("otel.scope.name", "lib"), model.String("otel.scope.version", "1.2"),
				model.String("w3c.tracestate", "a=b"))
		}
		b.Spans = append(b.Spans, s)
	}
	return b
}

func protoUnmarshal(t testing.TB, pb []byte) ptrace.Traces {
	t.Helper()
	var u ptrace.ProtoUnmarshaler
	td, err := u.UnmarshalTraces(pb)
	if err != nil {
		t.Fatal(err)
	}
	return td
}

// protoCanon is each span of td with its resource and scope, as JSON, sorted:
// two conversions hold the same spans the same way whatever their
// grouping into resource and scope spans.
func protoCanon(t testing.TB, td ptrace.Traces) []string {
	t.Helper()
	var out []string
	var m ptrace.JSONMarshaler
	for _, rs := range td.ResourceSpans().All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, s := range ss.Spans().All() {
				one := ptrace.NewTraces()
				r := one.ResourceSpans().AppendEmpty()
				rs.Resource().CopyTo(r.Resource())
				o := r.ScopeSpans().AppendEmpty()
				ss.Scope().CopyTo(o.Scope())
				s.CopyTo(o.Spans().AppendEmpty())
				j, err := m.MarshalTraces(one)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, string(j))
			}
		}
	}
	slices.Sort(out)
	return out
}

// protoDirect is the translator's conversion of the whole request, decoded at
// once by the generated code: what the Collector's jaeger receiver makes.
func protoDirect(t testing.TB, req []byte) (ptrace.Traces, error) {
	t.Helper()
	var r api_v2.PostSpansRequest
	if err := r.Unmarshal(req); err != nil {
		return ptrace.Traces{}, err
	}
	return translator.ProtoToTraces([]*model.Batch{&r.Batch})
}

// TestProtoMapping: the Jaeger proto fields land where docs/jaeger.md
// says, and the chunked conversion holds exactly the spans, resources and
// scopes the translator makes of the whole request at once.
func TestProtoMapping(t *testing.T) {
	req := protoReq(t, protoSample(600)) // 3 chunks of spans without a process of their own, 1 with
	pb, err := ConvertProto(req, nil, 1<<30, errTooLarge)
	if err != nil {
		t.Fatal(err)
	}
	td := protoUnmarshal(t, pb)
	want, err := protoDirect(t, req)
	if err != nil {
		t.Fatal(err)
	}
	got, wantC := protoCanon(t, td), protoCanon(t, want)
	if len(got) != 600 || !slices.Equal(got, wantC) {
		t.Fatalf("%d spans; differ from the translator's:\n%s\n%s", len(got), got[0], wantC[0])
	}
	// The batch's spans are in one resource_spans, first.
	rs := td.ResourceSpans().At(0)
	if got := fmt.Sprint(rs.Resource().Attributes().AsRaw()); got != "map[host.name:web-1 opencensus.exporterversion:Jaeger-Go-2.30.0 pid:42 service.name:checkout]" {
		t.Fatalf("resource %s", got)
	}
	n := 0
	for _, ss := range rs.ScopeSpans().All() {
		n += ss.Spans().Len()
	}
	if n != 480 || td.ResourceSpans().Len() < 3 {
		t.Fatalf("the batch's resource: %d spans, want the 480 without a process of their own; %d resources", n, td.ResourceSpans().Len())
	}
	byID := map[string]ptrace.Span{}
	resOf := map[string]string{}
	scopeOf := map[string]string{}
	for _, rs := range td.ResourceSpans().All() {
		for _, ss := range rs.ScopeSpans().All() {
			for _, s := range ss.Spans().All() {
				byID[s.SpanID().String()] = s
				resOf[s.SpanID().String()] = fmt.Sprint(rs.Resource().Attributes().AsRaw())
				scopeOf[s.SpanID().String()] = ss.Scope().Name() + "@" + ss.Scope().Version()
			}
		}
	}
	s := byID["0000000000000002"] // i = 1
	if s.TraceID().String() != "00000000000000070000000000000001" || s.ParentSpanID().String() != "0000000000000001" {
		t.Fatalf("ids %s %s", s.TraceID(), s.ParentSpanID())
	}
	if s.Name() != "op-1" || s.Kind() != ptrace.SpanKindClient || s.Status().Code() != ptrace.StatusCodeUnset || s.Flags() != 1 {
		t.Fatalf("name %q kind %v status %v flags %d", s.Name(), s.Kind(), s.Status().Code(), s.Flags())
	}
	// nanoseconds, not microseconds as in thrift
	start := uint64(protoT0.Add(time.Microsecond).UnixNano())
	if uint64(s.StartTimestamp()) != start || uint64(s.EndTimestamp()) != start+uint64(1500*time.Microsecond+7) {
		t.Fatalf("times %d %d", s.StartTimestamp(), s.EndTimestamp())
	}
	if got := fmt.Sprint(s.Attributes().AsRaw()); got != "map[blob:[1 2 3] error:false http.method:GET n:1 ratio:2.5]" {
		t.Fatalf("attributes %s", got)
	}
	e := s.Events().At(0)
	if e.Name() != "retry" || uint64(e.Timestamp()) != uint64(protoT0.Add(100*time.Microsecond).UnixNano()) || fmt.Sprint(e.Attributes().AsRaw()) != "map[attempt:1]" {
		t.Fatalf("event %q %d %v", e.Name(), e.Timestamp(), e.Attributes().AsRaw())
	}
	l := s.Links().At(0)
	if s.Links().Len() != 1 || l.TraceID().String() != "00000000000000090000000000000009" || l.SpanID().String() != "0000000000000063" ||
		fmt.Sprint(l.Attributes().AsRaw()) != "map[opentracing.ref_type:follows_from]" {
		t.Fatalf("links %d %s %v", s.Links().Len(), l.SpanID(), l.Attributes().AsRaw())
	}
	// error=true: status ERROR; a span without a CHILD_OF reference in
	// its trace takes none as parent (the FOLLOWS_FROM one is in another
	// trace).
	root := byID["0000000000000001"]
	if root.Status().Code() != ptrace.StatusCodeError || !root.ParentSpanID().IsEmpty() || root.Kind() != ptrace.SpanKindServer {
		t.Fatalf("root: status %v parent %s kind %v", root.Status().Code(), root.ParentSpanID(), root.Kind())
	}
	// otel.scope.* tags make the scope; w3c.tracestate the trace state.
	s7 := byID["0000000000000007"] // i = 6
	if scopeOf["0000000000000007"] != "lib@1.2" || s7.TraceState().AsRaw() != "a=b" {
		t.Fatalf("scope %s, trace state %q", scopeOf["0000000000000007"], s7.TraceState().AsRaw())
	}
	if _, ok := s7.Attributes().Get("otel.scope.name"); ok {
		t.Fatal("otel.scope.name left as an attribute")
	}
	// a span's own process is its resource.
	if got := resOf["0000000000000005"]; got != "map[service.name:sidecar-0 zone:b]" { // i = 4
		t.Fatalf("own process: resource %s", got)
	}
}

// TestProtoEdges: requests the translator makes something particular of
// convert as it does on the whole request.
func TestProtoEdges(t *testing.T) {
	tid := model.NewTraceID(1, 2)
	for name, b := range map[string]*model.Batch{
		"no batch":                  {},
		"a process, no spans":       {Process: &model.Process{ServiceName: "s"}},
		"spans, no process":         {Spans: []*model.Span{{TraceID: tid, SpanID: 1, OperationName: "x"}}},
		"only own processes":        {Spans: []*model.Span{{TraceID: tid, SpanID: 1, Process: &model.Process{ServiceName: "a"}}, {TraceID: tid, SpanID: 2, Process: &model.Process{ServiceName: "b"}}}},
		"a blank span":              {Process: &model.Process{ServiceName: "s"}, Spans: []*model.Span{{}, {TraceID: tid, SpanID: 1}}},
		"no service name":           {Process: &model.Process{ServiceName: "OTLPResourceNoServiceName", Tags: []model.KeyValue{model.String("k", "v")}}, Spans: []*model.Span{{TraceID: tid, SpanID: 1}}},
		"unknown tag type":          {Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: []model.KeyValue{{Key: "k", VType: 9}}}}},
		"64-bit trace id":           {Spans: []*model.Span{{TraceID: model.NewTraceID(0, 5), SpanID: 1}}},
		"http status":               {Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: []model.KeyValue{model.Int64("http.status_code", 503), model.String("span.kind", "server")}}}},
		"otel status":               {Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: []model.KeyValue{model.String("otel.status_code", "ERROR"), model.String("otel.status_description", "boom")}}}},
		"parent by follows_from":    {Spans: []*model.Span{{TraceID: tid, SpanID: 2, References: []model.SpanRef{{TraceID: tid, SpanID: 1, RefType: model.FollowsFrom}}}}},
		"an empty own process":      {Process: &model.Process{ServiceName: "s"}, Spans: []*model.Span{{TraceID: tid, SpanID: 1, Process: &model.Process{}}}},
		"own process = the batch's": {Process: &model.Process{ServiceName: "s"}, Spans: []*model.Span{{TraceID: tid, SpanID: 1, Process: &model.Process{ServiceName: "s"}}}},
	} {
		req := protoReq(t, b)
		pb, err := ConvertProto(req, nil, 1<<20, errTooLarge)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := protoDirect(t, req)
		if err != nil {
			t.Fatal(err)
		}
		td := protoUnmarshal(t, pb)
		if got, w := protoCanon(t, td), protoCanon(t, want); !slices.Equal(got, w) {
			t.Fatalf("%s:\n got %v\nwant %v", name, got, w)
		}
		if td.ResourceSpans().Len() != want.ResourceSpans().Len() && name != "own process = the batch's" {
			t.Fatalf("%s: %d resource spans, the translator makes %d", name, td.ResourceSpans().Len(), want.ResourceSpans().Len())
		}
	}
}

// pbWrap is msgs as fields num, each length-delimited.
func pbWrap(num protowire.Number, msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, m)
	}
	return out
}

// protoReqOfSpans: a PostSpansRequest whose batch holds these spans.
func protoReqOfSpans(spans ...[]byte) []byte { return pbWrap(1, pbWrap(1, spans...)) }

// pbRepeated: n copies of field num holding v.
func pbRepeated(num protowire.Number, v []byte, n int) []byte {
	one := pbWrap(num, v)
	return []byte(strings.Repeat(string(one), n))
}

// TestProtoRefusals: what the decoder would refuse, the walk refuses,
// naming it; limits are too large (wrapping tooLarge), not malformed.
func TestProtoRefusals(t *testing.T) {
	id8 := make([]byte, 8)
	ts := func(s, ns uint64) []byte {
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, s)
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		return protowire.AppendVarint(b, ns)
	}
	for _, c := range []struct {
		name string
		req  []byte
		msg  string
		big  bool
	}{
		{"garbage", []byte("not a protobuf at all"), "not a jaeger.api_v2.PostSpansRequest", false},
		{"a length past the end", []byte{0x0a, 0xff, 0xff, 0xff, 0x7f, 1}, "unexpected EOF", false},
		{"batch as a varint", []byte{0x08, 1}, "field 1 has wire type 0, not 2", false},
		{"two batches", append(pbWrap(1, nil), pbWrap(1, nil)...), "more than one batch", false},
		{"a group", []byte{0x0b, 0x0c}, "group", false},
		{"a span id of 7 bytes", protoReqOfSpans(pbWrap(2, id8[:7])), "span 0: span_id of 7 bytes", false},
		{"a trace id of 12 bytes", protoReqOfSpans(pbWrap(1, make([]byte, 12))), "trace_id of 12 bytes", false},
		{"a timestamp in year 10000", protoReqOfSpans(pbWrap(6, ts(253402300800, 0))), "not a valid timestamp", false},
		{"negative nanos", protoReqOfSpans(pbWrap(6, ts(1, math.MaxUint64))), "not a valid timestamp", false},
		{"a duration past time.Duration", protoReqOfSpans(pbWrap(7, ts(1e11, 0))), "not a valid duration", false},
		{"a bad tag in the second span", protoReqOfSpans(nil, pbWrap(8, []byte{0x10, 0xff})), "span 1: tag", false},
		{"10,001 tags", protoReqOfSpans(pbRepeated(8, nil, 10001)), "more than 10000 tags", true},
		{"10,001 logs", protoReqOfSpans(pbRepeated(9, nil, 10001)), "more than 10000 logs", true},
		{"10,001 references", protoReqOfSpans(pbRepeated(4, nil, 10001)), "more than 10000 references", true},
		{"10,001 fields in a log", protoReqOfSpans(pbWrap(9, pbRepeated(2, nil, 10001))), "more than 10000 fields in a log", true},
		{"10,001 process tags", pbWrap(1, pbWrap(2, pbRepeated(2, nil, 10001))), "more than 10000 process tags", true},
		{"20,001 items in a span", protoReqOfSpans(append(pbRepeated(8, nil, 10000), append(pbRepeated(4, nil, 10000), pbWrap(9, nil)...)...)), "more than 20000 tags, logs", true},
	} {
		pb, err := ConvertProto(c.req, nil, 1<<20, errTooLarge)
		if err == nil || !strings.Contains(err.Error(), c.msg) || errors.Is(err, errTooLarge) != c.big {
			t.Errorf("%s: %v (%d bytes)", c.name, err, len(pb))
		}
	}
}

// TestProtoWalkAllocatesNothing: the walk of a whole request of 500
// spans allocates nothing.
func TestProtoWalkAllocatesNothing(t *testing.T) {
	req := protoReq(t, protoSample(500))
	if a := testing.AllocsPerRun(10, func() {
		if _, err := WalkProto(req); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

// protoEmptyTagFlood: a request of one span with n empty tags (2 bytes each).
func protoEmptyTagFlood(n int) []byte { return protoReqOfSpans(pbRepeated(8, nil, n)) }

// TestProtoEmptyTagsCostNothing: a request of 256 KiB of empty tags, 2
// bytes each, makes gogo-protobuf's decoder allocate a Go struct for each
// (about 120 times the request); the walk refuses it, a span holding more
// than 10,000 tags, before anything is decoded. Without the walk this
// fails.
func TestProtoEmptyTagsCostNothing(t *testing.T) {
	req := protoEmptyTagFlood(128 << 10)
	var err error
	a := allocated(3, func() { _, err = ConvertProto(req, nil, 1<<30, errTooLarge) })
	if !errors.Is(err, errTooLarge) || !strings.Contains(err.Error(), "more than 10000 tags") {
		t.Fatal(err)
	}
	var r api_v2.PostSpansRequest
	gogo := allocated(1, func() { _ = r.Unmarshal(req) })
	t.Logf("%d bytes of empty tags: the walk refuses them having allocated %d bytes; gogo-protobuf's decoder alone allocates %d (%.0f×)",
		len(req), a, gogo, float64(gogo)/float64(len(req)))
	if a > 4<<10 {
		t.Fatalf("%d bytes allocated to refuse %d bytes of empty tags", a, len(req))
	}
	if gogo < 50*uint64(len(req)) {
		t.Fatalf("the decoder allocated only %d for %d bytes: the attack this guards against is gone?", gogo, len(req))
	}
}

// protoShapes are requests of one chunk each, of the shapes that cost the
// most a byte: empty elements, and the ordinary.
func protoShapes(t testing.TB) map[string][]byte {
	tid := model.NewTraceID(1, 2)
	var minimal, strs []*model.Span
	for i := range 256 {
		minimal = append(minimal, &model.Span{TraceID: tid, SpanID: model.SpanID(i + 1)})
	}
	for i := range 8 {
		strs = append(strs, &model.Span{TraceID: tid, SpanID: model.SpanID(i + 1), OperationName: strings.Repeat("n", 4000),
			Tags: []model.KeyValue{model.String(strings.Repeat("k", 2000), strings.Repeat("v", 2000))}})
	}
	return map[string][]byte{
		"4,000 empty tags":              protoReqOfSpans(pbRepeated(8, nil, 4000)),
		"4,000 distinct tags":           protoReq(t, &model.Batch{Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: protoDistinctTags(4000, 0)}}}),
		"4,000 empty logs":              protoReqOfSpans(pbRepeated(9, nil, 4000)),
		"4,000 empty fields":            protoReqOfSpans(pbWrap(9, pbRepeated(2, nil, 4000))),
		"4,000 empty references":        protoReqOfSpans(pbRepeated(4, nil, 4000)),
		"4,000 empty warnings":          protoReqOfSpans(pbRepeated(12, nil, 4000)),
		"4,000 own process tags":        protoReqOfSpans(pbWrap(10, pbRepeated(2, nil, 4000))),
		"a batch process of 4,000 tags": pbWrap(1, pbWrap(2, pbRepeated(2, nil, 4000))),
		"256 minimal spans":             protoReq(t, &model.Batch{Spans: minimal}),
		"256 empty spans":               protoReqOfSpans(slices.Repeat([][]byte{nil}, 256)...),
		"8 spans of long strings":       protoReq(t, &model.Batch{Spans: strs}),
		"a span of a 1 MB tag":          protoReq(t, &model.Batch{Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: []model.KeyValue{model.String("k", strings.Repeat("v", 1<<20))}}}}),
		"100 client-like spans":         protoReq(t, protoSample(100)),
	}
}

func protoDistinctTags(n int, vtype model.ValueType) []model.KeyValue {
	var out []model.KeyValue
	for i := range n {
		out = append(out, model.KeyValue{Key: fmt.Sprint(i), VType: vtype})
	}
	return out
}

// TestProtoPeakCoversAllocation: the walk's Peak, what the receiver
// reserves for a conversion's transient memory, is at least what
// converting a chunk allocates (all of it, garbage included) for the
// shapes that cost the most a byte.
func TestProtoPeakCoversAllocation(t *testing.T) {
	for name, req := range protoShapes(t) {
		c, err := WalkProto(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		dst := make([]byte, 0, 2<<20)
		a := allocated(3, func() {
			if _, err := ConvertProto(req, dst, cap(dst), errTooLarge); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		})
		t.Logf("%-30s %7d bytes: peak %8d, allocated %8d (%.2f)", name, len(req), c.Peak, a, float64(a)/float64(c.Peak))
		if int64(a) > c.Peak {
			t.Errorf("%s: %d bytes allocated, peak %d", name, a, c.Peak)
		}
	}
}

// TestProtoAmplify: the worst structures a real sender makes stay within
// ProtoAmplify OTLP bytes a request byte; degenerate ones beyond are
// refused by the bound.
func TestProtoAmplify(t *testing.T) {
	tid := model.NewTraceID(1, 2)
	n := 2000
	refs := &model.Batch{Spans: []*model.Span{{TraceID: tid, SpanID: 1}}}
	unknown := &model.Batch{Spans: []*model.Span{{TraceID: tid, SpanID: 1, Tags: protoDistinctTags(n, 9)}}}
	logs := &model.Batch{Spans: []*model.Span{{TraceID: tid, SpanID: 1}}}
	var minimal, status []*model.Span
	for i := range n {
		refs.Spans[0].References = append(refs.Spans[0].References, model.SpanRef{RefType: model.FollowsFrom, TraceID: tid, SpanID: model.SpanID(i + 2)})
		logs.Spans[0].Logs = append(logs.Spans[0].Logs, model.Log{Timestamp: protoT0})
		minimal = append(minimal, &model.Span{TraceID: model.NewTraceID(math.MaxUint64, math.MaxUint64), SpanID: math.MaxUint64, StartTime: protoT0, Duration: 1, Flags: 1})
		status = append(status, &model.Span{TraceID: tid, SpanID: model.SpanID(i + 1), Tags: []model.KeyValue{
			model.Bool("error", true), model.String("http.status_message", strings.Repeat("m", 200))}})
	}
	for _, c := range []struct {
		name string
		req  []byte
		ok   bool
	}{
		{"references (ids, follows_from)", protoReq(t, refs), true},
		{"tags of an unknown value type", protoReq(t, unknown), true},
		{"logs of a timestamp", protoReq(t, logs), true},
		{"minimal spans", protoReq(t, &model.Batch{Process: &model.Process{ServiceName: "s"}, Spans: minimal}), true},
		{"error status message", protoReq(t, &model.Batch{Spans: status}), true},
		{"client-like", protoReq(t, protoSample(500)), true},
		{"references without ids", protoReqOfSpans(append(pbWrap(1, make([]byte, 16)), pbRepeated(4, []byte{0x18, 1}, n)...)), false},
		{"spans of a flag only", protoReqOfSpans(slices.Repeat([][]byte{{0x28, 1}}, n)...), false},
	} {
		unbounded, err := ConvertProto(c.req, nil, 1<<30, errTooLarge)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		r := float64(len(unbounded)) / float64(len(c.req))
		t.Logf("%-32s %8d protobuf bytes → %8d OTLP bytes: %.2f×", c.name, len(c.req), len(unbounded), r)
		_, err = ConvertProto(c.req, nil, ProtoAmplify*len(c.req), errTooLarge)
		if c.ok != (err == nil) || err != nil && !errors.Is(err, errTooLarge) {
			t.Fatalf("%s: %.2f×, ProtoAmplify %d: %v", c.name, r, ProtoAmplify, err)
		}
	}
}

// TestProtoOutputBound: a conversion past max is refused wrapping
// tooLarge, whichever chunk passes it.
func TestProtoOutputBound(t *testing.T) {
	req := protoReq(t, protoSample(600))
	full, err := ConvertProto(req, nil, 1<<30, errTooLarge)
	if err != nil {
		t.Fatal(err)
	}
	for _, max := range []int{0, 5, 100, len(full) / 2, len(full) - 1} {
		if _, err := ConvertProto(req, nil, max, errTooLarge); !errors.Is(err, errTooLarge) {
			t.Fatalf("max %d of %d: %v", max, len(full), err)
		}
	}
	if pb, err := ConvertProto(req, nil, len(full), errTooLarge); err != nil || len(pb) != len(full) {
		t.Fatalf("max = its size: %d bytes, %v", len(pb), err)
	}
}

// FuzzConvertProto: no input panics; whatever the walk takes the decoder
// takes too, and converts to the spans the translator makes of the whole
// request; a conversion stays within its max (the receiver's, ProtoAmplify
// times the request); and none allocates more than the walk's per-item
// costs say.
func FuzzConvertProto(f *testing.F) {
	f.Add(protoReq(f, protoSample(7)))
	f.Add(protoReq(f, &model.Batch{Spans: []*model.Span{{Process: &model.Process{ServiceName: "x"}}}}))
	f.Add(protoEmptyTagFlood(100))
	f.Add(protoReqOfSpans(pbRepeated(4, []byte{0x18, 1}, 50)))
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0x7f, 1})
	f.Fuzz(func(t *testing.T, req []byte) {
		c, werr := WalkProto(req)
		var r api_v2.PostSpansRequest
		if werr == nil {
			if err := r.Unmarshal(req); err != nil {
				t.Fatalf("the walk took what the decoder refuses: %v", err)
			}
			protoSameShapes(t, c.batch)
		}
		max := ProtoAmplify*len(req) + 4096
		var pb []byte
		var err error
		a := allocated(1, func() { pb, err = ConvertProto(req, nil, max, errTooLarge) })
		if werr != nil && err == nil || werr == nil && err != nil && !errors.Is(err, errTooLarge) {
			t.Fatalf("walk: %v; convert: %v", werr, err)
		}
		if len(pb) > max {
			t.Fatalf("%d bytes → %d, max %d", len(req), len(pb), max)
		}
		items := c.Tags + c.Logs + c.Fields + c.Refs
		if limit := uint64(protoCost(len(req), items, c.Fields) + protoSpanCost*int64(c.Spans) + int64(max) + 64<<10); a > limit {
			t.Fatalf("%d bytes allocated for a request of %d (%d spans, %d items; err %v), limit %d", a, len(req), c.Spans, items, err, limit)
		}
		if err != nil {
			return
		}
		want, derr := translator.ProtoToTraces([]*model.Batch{&r.Batch})
		if derr != nil {
			t.Fatal(derr)
		}
		if got, w := protoCanon(t, protoUnmarshal(t, pb)), protoCanon(t, want); !slices.Equal(got, w) {
			t.Fatalf("differs from the translator:\n got %v\nwant %v", got, w)
		}
	})
}

// protoSameShapes: the conversion's shape of each span of a walked batch counts
// its items as the walk does (the chunks, and Peak, depend on it).
func protoSameShapes(t *testing.T, batch []byte) {
	var w pbWalker
	for len(batch) > 0 {
		num, typ, n := protowire.ConsumeTag(batch)
		m := protowire.ConsumeFieldValue(num, typ, batch[n:])
		v, _ := protowire.ConsumeBytes(batch[n:])
		batch = batch[n+m:]
		if num != 1 || typ != protowire.BytesType {
			continue
		}
		s, err := w.walkSpan(v)
		if err != nil {
			t.Fatal(err)
		}
		if sh := pbShape(v); sh.items != s.items || sh.fields != s.fields || sh.process != s.process {
			t.Fatalf("shape %+v, walk %+v", sh, s)
		}
	}
}

func BenchmarkConvertProto(b *testing.B) {
	for _, n := range []int{10, 500} {
		req := protoReq(b, protoSample(n))
		b.Run(fmt.Sprintf("spans=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(req)))
			dst := make([]byte, 0, ProtoAmplify*len(req))
			for b.Loop() {
				if _, err := ConvertProto(req, dst, cap(dst), errTooLarge); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "spans/s")
		})
	}
	within := protoReqOfSpans(slices.Repeat([][]byte{pbRepeated(8, nil, 4000)}, 128)...) // 1 MB: 512,000 empty tags
	b.Run("empty-tags-within-limits", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(within)))
		for b.Loop() {
			if _, err := ConvertProto(within, nil, 1<<20, errTooLarge); err != nil {
				b.Fatal(err)
			}
		}
	})
	req := protoEmptyTagFlood(1 << 20)
	b.Run("empty-tag-flood", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = ConvertProto(req, nil, 1<<20, errTooLarge)
		}
	})
}
