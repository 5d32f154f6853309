package jaeger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/thrift/lib/go/thrift"
	"github.com/ferryhq/ferry/otlp/door"
	jthrift "github.com/jaegertracing/jaeger-idl/thrift-gen/jaeger"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

var errTooLarge = errors.New("too large")

func encode(t testing.TB, b *jthrift.Batch) []byte {
	t.Helper()
	out, err := thrift.NewTSerializer().Write(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func str(s string) *string { return &s }

// sample is a Batch with what a jaeger client sends: process tags, spans
// with tags of each type, logs, references.
func sample(spans int) *jthrift.Batch {
	b := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "checkout", Tags: []*jthrift.Tag{
		{Key: "hostname", VType: jthrift.TagType_STRING, VStr: str("web-1")},
		{Key: "jaeger.version", VType: jthrift.TagType_STRING, VStr: str("Go-2.30.0")},
	}}}
	for i := range spans {
		l, d, yes := int64(i), 2.5, true
		b.Spans = append(b.Spans, &jthrift.Span{TraceIdLow: int64(i/3 + 1), TraceIdHigh: 7, SpanId: int64(i + 1), ParentSpanId: int64(i % 3),
			OperationName: fmt.Sprintf("op-%d", i%5), Flags: 1, StartTime: 1700000000000000 + int64(i), Duration: 1500,
			Tags: []*jthrift.Tag{
				{Key: "span.kind", VType: jthrift.TagType_STRING, VStr: str("server")},
				{Key: "http.method", VType: jthrift.TagType_STRING, VStr: str("GET")},
				{Key: "n", VType: jthrift.TagType_LONG, VLong: &l},
				{Key: "ratio", VType: jthrift.TagType_DOUBLE, VDouble: &d},
				{Key: "error", VType: jthrift.TagType_BOOL, VBool: &yes},
				{Key: "blob", VType: jthrift.TagType_BINARY, VBinary: []byte{1, 2, 3}},
			},
			Logs: []*jthrift.Log{{Timestamp: 1700000000000100, Fields: []*jthrift.Tag{
				{Key: "event", VType: jthrift.TagType_STRING, VStr: str("retry")},
				{Key: "attempt", VType: jthrift.TagType_LONG, VLong: &l},
			}}},
			References: []*jthrift.SpanRef{{RefType: jthrift.SpanRefType_FOLLOWS_FROM, TraceIdLow: 9, TraceIdHigh: 9, SpanId: 99}},
		})
	}
	return b
}

// TestMapping: the Jaeger fields land where docs/jaeger.md says.
func TestMapping(t *testing.T) {
	body := encode(t, sample(3))
	pb, err := Convert(body, nil, door.Limits{MaxBytes: 1 << 20}, nil, errTooLarge)
	if err != nil {
		t.Fatal(err)
	}
	var u ptrace.ProtoUnmarshaler
	td, err := u.UnmarshalTraces(pb)
	if err != nil {
		t.Fatal(err)
	}
	rs := td.ResourceSpans().At(0)
	if got := rs.Resource().Attributes().AsRaw(); fmt.Sprint(got) != "map[host.name:web-1 opencensus.exporterversion:Jaeger-Go-2.30.0 service.name:checkout]" {
		t.Fatalf("resource %v", got)
	}
	s := rs.ScopeSpans().At(0).Spans().At(1)
	if s.TraceID().String() != "00000000000000070000000000000001" || s.SpanID().String() != "0000000000000002" || s.ParentSpanID().String() != "0000000000000001" {
		t.Fatalf("ids %s %s %s", s.TraceID(), s.SpanID(), s.ParentSpanID())
	}
	if s.Name() != "op-1" || s.Kind() != ptrace.SpanKindServer || s.Status().Code() != ptrace.StatusCodeError || s.Flags() != 1 {
		t.Fatalf("name %q kind %v status %v flags %d", s.Name(), s.Kind(), s.Status().Code(), s.Flags())
	}
	if s.StartTimestamp() != 1700000000000001000 || s.EndTimestamp() != 1700000000001501000 {
		t.Fatalf("times %d %d", s.StartTimestamp(), s.EndTimestamp())
	}
	if got := fmt.Sprint(s.Attributes().AsRaw()); got != "map[blob:[1 2 3] http.method:GET n:1 ratio:2.5]" {
		t.Fatalf("attributes %s", got)
	}
	e := s.Events().At(0)
	if e.Name() != "retry" || e.Timestamp() != 1700000000000100000 || fmt.Sprint(e.Attributes().AsRaw()) != "map[attempt:1]" {
		t.Fatalf("event %q %d %v", e.Name(), e.Timestamp(), e.Attributes().AsRaw())
	}
	l := s.Links().At(0)
	if s.Links().Len() != 1 || l.SpanID().String() != "0000000000000063" || fmt.Sprint(l.Attributes().AsRaw()) != "map[opentracing.ref_type:follows_from]" {
		t.Fatalf("links %d %s %v", s.Links().Len(), l.SpanID(), l.Attributes().AsRaw())
	}
	// a span with no parentSpanId takes its CHILD_OF reference as parent.
	root := rs.ScopeSpans().At(0).Spans().At(0)
	if !root.ParentSpanID().IsEmpty() {
		t.Fatalf("root parent %s", root.ParentSpanID())
	}
}

// TestChunksConvertAsTheWhole: converted by chunks, each span is what the
// translator makes of the whole Batch, in the same order, under the same
// resource (repeated once a chunk).
func TestChunksConvertAsTheWhole(t *testing.T) {
	cases := worstCases(t)
	cases["client-like, many chunks"] = encode(t, sample(2000))
	for name, body := range cases {
		whole, err := Decode(body)
		if err != nil {
			t.Fatal(err)
		}
		pb, err := Convert(body, nil, door.Limits{MaxBytes: 1 << 30}, nil, errTooLarge)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var u ptrace.ProtoUnmarshaler
		chunked, err := u.UnmarshalTraces(pb)
		if err != nil {
			t.Fatal(err)
		}
		// the chunks' spans gathered under one resource and scope.
		joined := ptrace.NewTraces()
		rss := chunked.ResourceSpans()
		if rss.Len() == 0 {
			t.Fatalf("%s: no resource", name)
		}
		rs := joined.ResourceSpans().AppendEmpty()
		rss.At(0).Resource().CopyTo(rs.Resource())
		var spans ptrace.SpanSlice
		for i := range rss.Len() {
			if !reflect.DeepEqual(rss.At(i).Resource().Attributes().AsRaw(), rs.Resource().Attributes().AsRaw()) {
				t.Fatalf("%s: chunk %d's resource differs", name, i)
			}
			for j := range rss.At(i).ScopeSpans().Len() {
				if spans == (ptrace.SpanSlice{}) {
					spans = rs.ScopeSpans().AppendEmpty().Spans()
				}
				rss.At(i).ScopeSpans().At(j).Spans().MoveAndAppendTo(spans)
			}
		}
		var jm ptrace.JSONMarshaler
		a, _ := jm.MarshalTraces(whole)
		b, _ := jm.MarshalTraces(joined)
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: chunked and whole differ:\n%.600s\n%.600s", name, a, b)
		}
		if name == "client-like, many chunks" && rss.Len() < 8 {
			t.Fatalf("%s: %d chunks", name, rss.Len())
		}
		t.Logf("%-26s %d chunks", name, rss.Len())
	}
}

// allocated returns the bytes f allocates (the mean of runs calls).
func allocated(runs int, f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&b)
	return (b.TotalAlloc - a.TotalAlloc) / uint64(runs)
}

// lying returns a Batch of n bytes whose spans list declares count
// elements.
func lying(count uint32, n int) []byte {
	b := []byte{12, 0, 1, 11, 0, 1, 0, 0, 0, 1, 'x', 0, 15, 0, 2, 12}
	b = binary.BigEndian.AppendUint32(b, count)
	for len(b) < n {
		b = append(b, 0)
	}
	return b
}

// TestLyingLengthRefusedBeforeAllocation: a list declaring more elements
// than the body can hold is refused from its header, allocating next to
// nothing: 2^31-1 spans in 20 bytes, and (where the thrift reader's own
// MaxMessageSize bound lets the length through and would allocate 8 bytes
// a declared element) 60,000 spans in a 64 KiB body of zeros.
func TestLyingLengthRefusedBeforeAllocation(t *testing.T) {
	for _, c := range []struct {
		count uint32
		n     int
	}{{1<<31 - 1, 20}, {1 << 31, 20}, {60000, 64 << 10}} {
		body := lying(c.count, c.n)
		var err error
		a := allocated(100, func() { _, err = Convert(body, nil, door.Limits{MaxBytes: 1 << 30}, nil, errTooLarge) })
		if err == nil || !strings.Contains(err.Error(), "elements") && !strings.Contains(err.Error(), "negative") && !strings.Contains(err.Error(), "required field") {
			t.Fatalf("%d declared in %d bytes: %v", c.count, c.n, err)
		}
		if a > 4096 {
			t.Fatalf("%d declared in %d bytes: %d bytes allocated before the refusal", c.count, c.n, a)
		}
		if allocs := testing.AllocsPerRun(20, func() { _, _ = Convert(body, nil, door.Limits{MaxBytes: 1 << 30}, nil, errTooLarge) }); allocs > 16 {
			t.Fatalf("%v allocations", allocs)
		}
	}
	// The thrift reader alone, bounded by MaxMessageSize = the body, takes
	// the 60,000 and allocates for it: why the walk comes first.
	body := lying(60000, 64<<10)
	if a := allocated(1, func() { _, _ = Decode(body) }); a < 400<<10 {
		t.Fatalf("the thrift reader alone allocated only %d bytes: is the walk still needed?", a)
	}
}

// TestWalkLimits: nesting beyond MaxDepth, more than MaxPerList tags, a
// list of the wrong element type where the schema has structs, trailing
// bytes: each refused by the walk.
func TestWalkLimits(t *testing.T) {
	// an unknown field (id 9) of nested lists, 40 deep.
	deep := []byte{12, 0, 1, 11, 0, 1, 0, 0, 0, 0, 0, 15, 0, 2, 12, 0, 0, 0, 0, 15, 0, 9}
	for range 40 {
		deep = append(deep, 15, 0, 0, 0, 1)
	}
	deep = append(deep, 15, 0, 0, 0, 0)
	if _, err := Walk(deep); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("deep: %v", err)
	}
	many := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "s"}, Spans: []*jthrift.Span{{OperationName: "x"}}}
	for i := range MaxPerList + 1 {
		many.Spans[0].Tags = append(many.Spans[0].Tags, &jthrift.Tag{Key: fmt.Sprint(i), VType: jthrift.TagType_BOOL})
	}
	_, err := Convert(encode(t, many), nil, door.Limits{MaxBytes: 1 << 30}, nil, errTooLarge)
	if !errors.Is(err, errTooLarge) || !strings.Contains(err.Error(), "Span.tags: 10001 elements") {
		t.Fatalf("too many tags: %v", err)
	}
	wrong := []byte{12, 0, 1, 11, 0, 1, 0, 0, 0, 0, 0, 15, 0, 2, 3, 0, 0, 0, 1, 0, 0}
	if _, err := Walk(wrong); err == nil || !strings.Contains(err.Error(), "Batch.spans: a list of type 3") {
		t.Fatalf("wrong element type: %v", err)
	}
	ok := encode(t, sample(2))
	if c, err := Walk(ok); err != nil || c.Spans != 2 || c.Tags != 2+12+4 || c.Logs != 2 || c.Refs != 2 {
		t.Fatalf("a real batch: %+v %v", c, err)
	}
	if _, err := Walk(append(ok, 0)); err == nil || !strings.Contains(err.Error(), "1 bytes after the batch") {
		t.Fatalf("trailing: %v", err)
	}
	// the process, or the spans, twice (ok less its stop byte, then the
	// field again).
	procTwice := append(append(ok[:len(ok)-1:len(ok)-1], 12, 0, 1, 11, 0, 1, 0, 0, 0, 0, 0), 0)
	if _, err := Walk(procTwice); err == nil || !strings.Contains(err.Error(), "Batch.process given twice") {
		t.Fatalf("process twice: %v", err)
	}
	spansTwice := append(append(ok[:len(ok)-1:len(ok)-1], 15, 0, 2, 12, 0, 0, 0, 0), 0)
	if _, err := Walk(spansTwice); err == nil || !strings.Contains(err.Error(), "Batch.spans given twice") {
		t.Fatalf("spans twice: %v", err)
	}
	if _, err := Convert(ok, nil, door.Limits{MaxBytes: 100}, nil, errTooLarge); !errors.Is(err, errTooLarge) {
		t.Fatalf("past max: %v", err)
	}
	// a span missing a required field (the serializer writes the zero
	// values of required fields, so take them out of the bytes).
	noDuration := encode(t, &jthrift.Batch{Process: &jthrift.Process{}, Spans: []*jthrift.Span{{Duration: 0x0102030405060708}}})
	i := strings.Index(string(noDuration), "\x0a\x00\x09\x01\x02")
	noDuration = append(noDuration[:i:i], noDuration[i+11:]...)
	if _, err := Walk(noDuration); err == nil || !strings.Contains(err.Error(), "Span: required field duration missing") {
		t.Fatalf("no duration: %v", err)
	}
}

// TestContentType: thrift binary's two media types; anything else refused.
func TestContentType(t *testing.T) {
	conv := Converter(errTooLarge)
	body := encode(t, sample(1))
	for ct, ok := range map[string]bool{"application/x-thrift": true, "application/vnd.apache.thrift.binary; charset=x": true,
		"application/vnd.apache.thrift.compact": false, "": false, "application/json": false} {
		q, _ := http.NewRequest(http.MethodPost, "/api/traces", nil)
		q.Header.Set("Content-Type", ct)
		if _, err := conv(q, body, nil, door.Limits{MaxBytes: 1 << 20}, nil); (err == nil) != ok {
			t.Fatalf("%q: %v", ct, err)
		}
	}
}

// worstCases are bodies made of the structure each converts with the most
// OTLP bytes per thrift byte.
func worstCases(t testing.TB) map[string][]byte {
	n := 2000
	unknown := &jthrift.Batch{Process: &jthrift.Process{}, Spans: []*jthrift.Span{{}}}
	refs := &jthrift.Batch{Process: &jthrift.Process{}, Spans: []*jthrift.Span{{}}}
	logs := &jthrift.Batch{Process: &jthrift.Process{}, Spans: []*jthrift.Span{{}}}
	status := &jthrift.Batch{Process: &jthrift.Process{}}
	empty := &jthrift.Batch{Process: &jthrift.Process{}}
	spans := &jthrift.Batch{Process: &jthrift.Process{}}
	yes := true
	for i := range n {
		unknown.Spans[0].Tags = append(unknown.Spans[0].Tags, &jthrift.Tag{Key: fmt.Sprint(i), VType: 99})
		refs.Spans[0].References = append(refs.Spans[0].References, &jthrift.SpanRef{RefType: jthrift.SpanRefType_FOLLOWS_FROM, TraceIdLow: 1, SpanId: int64(i + 1)})
		logs.Spans[0].Logs = append(logs.Spans[0].Logs, &jthrift.Log{Timestamp: int64(i)})
		spans.Spans = append(spans.Spans, &jthrift.Span{TraceIdLow: -1, TraceIdHigh: -1, SpanId: -1, ParentSpanId: -1, StartTime: -1, Duration: 1, Flags: 1})
		status.Spans = append(status.Spans, &jthrift.Span{TraceIdLow: 1, SpanId: int64(i + 1), Tags: []*jthrift.Tag{
			{Key: "error", VType: jthrift.TagType_BOOL, VBool: &yes},
			{Key: "http.status_message", VType: jthrift.TagType_STRING, VStr: str(strings.Repeat("m", 200))},
		}})
	}
	// a process of many tags and spans of few bytes: the process's
	// resource is repeated in every chunk.
	bigProc := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "s"}}
	for i := range 5000 {
		bigProc.Process.Tags = append(bigProc.Process.Tags, &jthrift.Tag{Key: fmt.Sprint("k", i), VType: jthrift.TagType_STRING, VStr: str("v")})
		bigProc.Spans = append(bigProc.Spans, &jthrift.Span{TraceIdLow: 1, SpanId: int64(i + 1)})
	}
	return map[string][]byte{"unknown tag types": encode(t, unknown), "a process of 5,000 tags": encode(t, bigProc), "references": encode(t, refs), "logs": encode(t, logs),
		"error status message": encode(t, status), "minimal spans": encode(t, spans), "empty batch": encode(t, empty), "client-like": encode(t, sample(500))}
}

// TestAmplify: the worst structures stay within Amplify OTLP bytes a body
// byte (the door's reservation).
func TestAmplify(t *testing.T) {
	for name, body := range worstCases(t) {
		pb, err := Convert(body, nil, door.Limits{MaxBytes: 1 << 30}, nil, errTooLarge)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r := float64(len(pb)) / float64(len(body))
		t.Logf("%-22s %8d thrift bytes → %8d OTLP bytes: %.2f×", name, len(body), len(pb), r)
		if len(pb) > Amplify*len(body) {
			t.Fatalf("%s: %.2f× is over Amplify (%d)", name, r, Amplify)
		}
	}
}

func BenchmarkConvert(b *testing.B) {
	for _, n := range []int{10, 500, 5000} {
		body := encode(b, sample(n))
		b.Run(fmt.Sprintf("spans=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			dst := make([]byte, 0, Amplify*len(body))
			for b.Loop() {
				var st door.Stats // as the receiver converts
				if _, err := Convert(body, dst, door.Limits{MaxBytes: cap(dst), MaxItems: 100000}, &st, errTooLarge); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "spans/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/span")
		})
	}
	body := lying(1<<31-1, 20)
	b.Run("lying-length", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Convert(body, nil, door.Limits{MaxBytes: 1 << 20}, nil, errTooLarge)
		}
	})
}

// FuzzConvert: no input panics; a converted request is at most Amplify
// times its body; no input makes the conversion allocate more than a
// bounded multiple of its size (a lying length costs nothing); and a limit
// of 3 items refuses exactly the Batches declaring more than 3 spans.
func FuzzConvert(f *testing.F) {
	f.Add(encode(f, sample(3)))
	f.Add(lying(1<<31-1, 20))
	f.Add(lying(3, 64))
	for _, b := range worstCases(f) {
		if len(b) < 4096 {
			f.Add(b)
		}
	}
	small := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "s"}, Spans: []*jthrift.Span{{OperationName: "x", References: []*jthrift.SpanRef{{}}}}}
	f.Add(encode(f, small))
	f.Fuzz(func(t *testing.T, body []byte) {
		var pb []byte
		var err error
		var st door.Stats // counting what is dropped runs too
		a := allocated(1, func() { pb, err = Convert(body, nil, door.Limits{MaxBytes: 1 << 30}, &st, errTooLarge) })
		if err == nil && len(pb) > Amplify*len(body) {
			t.Fatalf("%d bytes → %d", len(body), len(pb))
		}
		if a > uint64(64*len(body)+64<<10) {
			t.Fatalf("%d bytes allocated for a body of %d (err %v)", a, len(body), err)
		}
		if err != nil {
			return
		}
		c, _ := Walk(body)
		_, lerr := Convert(body, nil, door.Limits{MaxBytes: 1 << 30, MaxItems: 3}, nil, errTooLarge)
		if errors.Is(lerr, door.ErrTooManyItems) != (c.Spans > 3) || lerr != nil && !errors.Is(lerr, door.ErrTooManyItems) {
			t.Fatalf("%d spans, limit 3: %v", c.Spans, lerr)
		}
	})
}

// peakHeap is the most heap f holds above what was held before it, as
// sampled while it runs (the collector made eager, so the heap held is
// close to what is live).
func peakHeap(f func()) uint64 {
	old := debug.SetGCPercent(5)
	defer debug.SetGCPercent(old)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	f()
	close(done)
	<-stopped
	if p := peak.Load(); p > base {
		return p - base
	}
	return 0
}

// TestConvertMemoryBoundedByChunk: the heap a conversion holds is that of
// a chunk (chunkSpans spans or chunkBytes of body), not of the body: the
// whole Batch decoded at once and translated at once held about 5× the
// body (11 MB for 10,000 client-like spans in 4.2 MB).
func TestConvertMemoryBoundedByChunk(t *testing.T) {
	body := encode(t, sample(10000))
	dst := make([]byte, 0, Amplify*len(body))
	var err error
	peak := peakHeap(func() { _, err = Convert(body, dst, door.Limits{MaxBytes: cap(dst)}, nil, errTooLarge) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes of body: at most %d bytes of heap held while converting", len(body), peak)
	if peak > 3<<20 || peak > uint64(len(body))*3/4 {
		t.Fatalf("%d bytes of heap held converting a body of %d: not bounded by a chunk", peak, len(body))
	}
}

// manySpans is a Batch of n copies of one minimal span (81 bytes each).
func manySpans(t testing.TB, n int) []byte {
	one := encode(t, &jthrift.Batch{Process: &jthrift.Process{ServiceName: "s"}, Spans: []*jthrift.Span{{TraceIdLow: 1, SpanId: 1}}})
	head := []byte{15, 0, 2, 12, 0, 0, 0, 1}
	i := bytes.Index(one, head) + len(head)
	span := one[i : len(one)-1]
	b := append([]byte(nil), one[:i-4]...)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = append(b, bytes.Repeat(span, n)...)
	return append(b, 0)
}

// TestMaxItems: a Batch of more spans than lim.MaxItems is refused with
// door.ErrTooManyItems from its spans list's header, before a span is
// decoded: 200,000 spans (16 MB) against a limit of 10 allocate next to
// nothing. As many spans as the limit pass.
func TestMaxItems(t *testing.T) {
	lim := door.Limits{MaxBytes: 1 << 30, MaxItems: 10}
	if _, err := Convert(manySpans(t, 10), nil, lim, nil, errTooLarge); err != nil {
		t.Fatalf("10 spans of 10: %v", err)
	}
	if _, err := Convert(manySpans(t, 11), nil, lim, nil, errTooLarge); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("11 spans of 10: %v", err)
	}
	body := manySpans(t, 200000)
	var err error
	if a := allocated(1, func() { _, err = Convert(body, nil, lim, nil, errTooLarge) }); !errors.Is(err, door.ErrTooManyItems) || a > 16<<10 {
		t.Fatalf("200,000 spans of 10: %v, %d bytes allocated", err, a)
	}
	// a header declaring more spans than the body holds is the walk's 400.
	lie := lying(1000, 200)
	if _, err := Convert(lie, nil, lim, nil, errTooLarge); err == nil || errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("a lying length: %v", err)
	}
}

// TestDropped: what the translator drops or folds is counted, by reason:
// repeated keys in process tags (service.name against serviceName too),
// span tags (http.response.status_code is written as http.status_code)
// and log fields; tags of an unknown type; a span.kind of another value;
// an all-zero span. The process's count is the Batch's, not a chunk's.
func TestDropped(t *testing.T) {
	l, d := int64(1), 2.5
	b := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "checkout", Tags: []*jthrift.Tag{
		{Key: "service.name", VType: jthrift.TagType_STRING, VStr: str("other")},
		{Key: "hostname", VType: jthrift.TagType_STRING, VStr: str("a")},
		{Key: "hostname", VType: jthrift.TagType_STRING, VStr: str("b")},
	}}}
	for i := range 600 {
		b.Spans = append(b.Spans, &jthrift.Span{TraceIdLow: 1, SpanId: int64(i + 1), OperationName: "op"})
	}
	b.Spans[0].Tags = []*jthrift.Tag{
		{Key: "a", VType: jthrift.TagType_STRING, VStr: str("1")},
		{Key: "a", VType: jthrift.TagType_LONG, VLong: &l},
		{Key: "a", VType: jthrift.TagType_DOUBLE, VDouble: &d},
		{Key: "http.status_code", VType: jthrift.TagType_LONG, VLong: &l},
		{Key: "http.response.status_code", VType: jthrift.TagType_LONG, VLong: &l},
		{Key: "odd", VType: 99},
		{Key: "span.kind", VType: jthrift.TagType_STRING, VStr: str("rpc")},
	}
	b.Spans[0].Logs = []*jthrift.Log{{Timestamp: 1, Fields: []*jthrift.Tag{
		{Key: "event", VType: jthrift.TagType_STRING, VStr: str("e")},
		{Key: "k", VType: jthrift.TagType_STRING, VStr: str("1")},
		{Key: "k", VType: jthrift.TagType_STRING, VStr: str("2")},
	}}}
	b.Spans[1].Tags = []*jthrift.Tag{{Key: "span.kind", VType: jthrift.TagType_BOOL, VBool: new(bool)}} // not a string: unknown
	b.Spans[2].Tags = []*jthrift.Tag{{Key: "span.kind", VType: jthrift.TagType_STRING, VStr: str("client")}}
	b.Spans[599] = &jthrift.Span{} // every field zero
	var st door.Stats
	pb, err := Convert(encode(t, b), nil, door.Limits{MaxBytes: 1 << 30}, &st, errTooLarge)
	if err != nil {
		t.Fatal(err)
	}
	want := door.Stats{}
	want.Dropped[door.DuplicateKey] = 2 + 2 + 1 + 1
	want.Dropped[door.UnknownTagType] = 1
	want.Dropped[door.UnknownSpanKind] = 2
	want.Dropped[door.EmptySpan] = 1
	if st != want {
		t.Fatalf("dropped %v, want %v", st.Dropped, want.Dropped)
	}
	var u ptrace.ProtoUnmarshaler
	td, _ := u.UnmarshalTraces(pb)
	if td.SpanCount() != 599 || td.ResourceSpans().Len() < 3 {
		t.Fatalf("%d spans in %d chunks", td.SpanCount(), td.ResourceSpans().Len())
	}
	if a, _ := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Attributes().Get("a"); a.Double() != 2.5 {
		t.Fatalf("the last value of a repeated key is kept: %v", a.AsRaw())
	}
}
