package wire

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// raw converts an attribute iterator to the same shape pcommon.Map.AsRaw gives.
func rawAttrs(a Attrs) map[string]any {
	out := map[string]any{}
	for {
		k, v, ok := a.Next()
		if !ok {
			return out
		}
		out[string(k)] = rawValue(v)
	}
}

func rawValue(v Value) any {
	switch v.Kind {
	case KindString:
		return string(v.Str)
	case KindBool:
		return v.Bool
	case KindInt:
		return v.Int
	case KindDouble:
		return v.Dbl
	case KindBytes:
		return append([]byte{}, v.Str...)
	case KindArray:
		out := []any{}
		it := v.Array()
		for {
			e, ok := it.Next()
			if !ok {
				return out
			}
			ev, _ := DecodeValue(e)
			out = append(out, rawValue(ev))
		}
	case KindKVList:
		return rawAttrs(Attrs{v.KVList()})
	}
	return nil
}

// richTraces has every field and attribute type, in two resources.
func richTraces() ptrace.Traces {
	td := otlpgen.New(7).Traces(5)
	rs := td.ResourceSpans().AppendEmpty()
	rs.SetSchemaUrl("https://schema/1")
	rs.Resource().Attributes().PutStr("service.name", "rich")
	rs.Resource().Attributes().PutInt("pid", 42)
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("lib")
	ss.Scope().SetVersion("1.2.3")
	ss.Scope().Attributes().PutBool("scoped", true)
	for i := 0; i < 3; i++ {
		sp := ss.Spans().AppendEmpty()
		sp.SetName(fmt.Sprintf("op-%d", i))
		sp.SetTraceID(pcommon.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, byte(i)})
		sp.SetSpanID(pcommon.SpanID{9, 9, 9, 9, 9, 9, 9, byte(i)})
		sp.SetKind(ptrace.SpanKindServer)
		sp.SetStartTimestamp(1000)
		sp.SetEndTimestamp(2000 + pcommon.Timestamp(i))
		sp.TraceState().FromRaw("a=b")
		sp.SetFlags(1)
		a := sp.Attributes()
		a.PutStr("s", "x\"y\n")
		a.PutInt("i", -7)
		a.PutDouble("d", 2.5)
		a.PutBool("b", true)
		a.PutEmptyBytes("bytes").FromRaw([]byte{0, 1, 2})
		arr := a.PutEmptySlice("arr")
		arr.AppendEmpty().SetStr("e1")
		arr.AppendEmpty().SetInt(2)
		kv := a.PutEmptyMap("kv")
		kv.PutStr("inner", "v")
		kv.PutEmptyMap("deeper").PutDouble("z", 1)
		sp.Status().SetCode(ptrace.StatusCodeError)
		sp.Status().SetMessage("boom")
		ev := sp.Events().AppendEmpty()
		ev.SetName("exception")
		ev.SetTimestamp(1500)
		ev.Attributes().PutStr("exception.message", "bad")
		ln := sp.Links().AppendEmpty()
		ln.SetTraceID(pcommon.TraceID{7})
		ln.SetSpanID(pcommon.SpanID{8})
		ln.Attributes().PutInt("n", 1)
	}
	return td
}

func TestTracesMatchPdata(t *testing.T) {
	td := richTraces()
	raw, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		res, attrs map[string]any
		sp         ptrace.Span
		scope      pcommon.InstrumentationScope
		schema     string
	}
	var wants []want
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		rs := td.ResourceSpans().At(i)
		for j := 0; j < rs.ScopeSpans().Len(); j++ {
			ss := rs.ScopeSpans().At(j)
			for k := 0; k < ss.Spans().Len(); k++ {
				sp := ss.Spans().At(k)
				wants = append(wants, want{rs.Resource().Attributes().AsRaw(), sp.Attributes().AsRaw(), sp, ss.Scope(), rs.SchemaUrl()})
			}
		}
	}
	it := NewTraces(raw)
	n := 0
	for it.Next() {
		if n >= len(wants) {
			t.Fatal("more spans than pdata sees")
		}
		w, sp := wants[n], it.Span()
		tid, sid := w.sp.TraceID(), w.sp.SpanID()
		if !bytes.Equal(sp.TraceID, tid[:]) || !bytes.Equal(sp.SpanID, sid[:]) || string(sp.Name) != w.sp.Name() ||
			sp.Kind != int32(w.sp.Kind()) || sp.Start != uint64(w.sp.StartTimestamp()) || sp.End != uint64(w.sp.EndTimestamp()) ||
			string(sp.TraceState) != w.sp.TraceState().AsRaw() || sp.Flags != w.sp.Flags() ||
			sp.StatusCode != int32(w.sp.Status().Code()) || string(sp.StatusMsg) != w.sp.Status().Message() ||
			sp.NumEvents != w.sp.Events().Len() || sp.NumLinks != w.sp.Links().Len() {
			t.Fatalf("span %d differs from pdata: %+v vs %s/%s", n, sp, hex.EncodeToString(tid[:]), w.sp.Name())
		}
		if got := rawAttrs(sp.Attributes()); !reflect.DeepEqual(got, w.attrs) {
			t.Fatalf("span %d attributes\n got %v\nwant %v", n, got, w.attrs)
		}
		if got := rawAttrs(it.Resource().Attributes()); !reflect.DeepEqual(got, w.res) {
			t.Fatalf("span %d resource\n got %v\nwant %v", n, got, w.res)
		}
		if string(it.Scope().Name) != w.scope.Name() || string(it.Scope().Version) != w.scope.Version() ||
			!reflect.DeepEqual(rawAttrs(it.Scope().Attributes()), w.scope.Attributes().AsRaw()) || string(it.Resource().SchemaURL) != w.schema {
			t.Fatalf("span %d scope/schema differ", n)
		}
		evs := sp.Events()
		for e := 0; ; e++ {
			eb, ok := evs.Next()
			if !ok {
				break
			}
			ev, err := DecodeEvent(eb)
			pe := w.sp.Events().At(e)
			if err != nil || string(ev.Name) != pe.Name() || ev.Time != uint64(pe.Timestamp()) ||
				!reflect.DeepEqual(rawAttrs(ev.Attributes()), pe.Attributes().AsRaw()) {
				t.Fatalf("event %d of span %d differs", e, n)
			}
		}
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(wants) {
		t.Fatalf("%d spans, pdata sees %d", n, len(wants))
	}
}

// TestGroupsAreRefused: an unknown field that is a group (proto2 only) is
// an error wherever it is, not skipped and forwarded in a record.
func TestGroupsAreRefused(t *testing.T) {
	for _, depth := range []int{1, 5000} {
		it := NewTraces(payloads.DeepGroup(depth))
		for it.Next() {
		}
		if it.Err() == nil {
			t.Errorf("a group nested %d deep accepted", depth)
		}
	}
	// At the request's top level too (an unknown field of the export
	// request, outside any item).
	raw, _ := ptraceotlp.NewExportRequestFromTraces(richTraces()).MarshalProto()
	raw = protowire.AppendTag(raw, 7, protowire.StartGroupType)
	raw = protowire.AppendTag(raw, 7, protowire.EndGroupType)
	it := NewTraces(raw)
	for it.Next() {
	}
	if it.Err() == nil {
		t.Error("a top-level group accepted")
	}
}

func TestMalformedIsAnErrorNotAPanic(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(richTraces()).MarshalProto()
	for cut := 1; cut < len(raw); cut += 7 {
		it := NewTraces(raw[:cut])
		for it.Next() {
		}
		_ = it.Err() // truncation must end in an error or a shorter walk, never a panic
	}
	bad := [][]byte{
		{0x0a, 0x05, 0x12, 0x03, 0x12, 0x01, 0xff}, // nested length past the end
		{0x08, 0x01}, // resource_spans as a varint
		{0x0a, 0x80}, // truncated length
		{0x0a, 0x06, 0x12, 0x04, 0x12, 0x02, 0x0a, 0x01}, // span with a 1-byte trace id... malformed framing
	}
	for i, b := range bad {
		it := NewTraces(b)
		for it.Next() {
		}
		if it.Err() == nil {
			t.Errorf("case %d: malformed input accepted", i)
		}
	}
	// A span with a trace id of the wrong length.
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("x")
	good, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	// span message is the innermost: append a trace_id field of 3 bytes to it by rebuilding.
	span := []byte{0x0a, 0x03, 1, 2, 3}
	scope := append([]byte{0x12, byte(len(span))}, span...)
	res := append([]byte{0x12, byte(len(scope))}, scope...)
	data := append([]byte{0x0a, byte(len(res))}, res...)
	it := NewTraces(data)
	for it.Next() {
	}
	if it.Err() == nil {
		t.Error("3-byte trace id accepted")
	}
	_ = good
}

// FuzzTraces: arbitrary bytes never panic; whatever pdata decodes, its
// canonical re-encoding decodes here to the same spans; and where both accept
// the raw bytes, they agree. (On raw bytes the wire decoder may be stricter:
// pdata tolerates, for example, an unterminated group in an unknown field.)
func FuzzTraces(f *testing.F) {
	for _, td := range []ptrace.Traces{richTraces(), otlpgen.New(1).Traces(3), ptrace.NewTraces()} {
		raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		it := NewTraces(raw)
		var ids [][]byte
		for it.Next() {
			ids = append(ids, append([]byte{}, it.Span().SpanID...))
			_ = rawAttrs(it.Span().Attributes())
			_ = rawAttrs(it.Resource().Attributes())
		}
		ours := it.Err()
		req := ptraceotlp.NewExportRequest()
		if err := req.UnmarshalProto(raw); err != nil {
			return // pdata refuses it; we may refuse or accept (we skip unknown fields the same way)
		}
		canon, err := req.MarshalProto()
		if err != nil {
			t.Fatal(err)
		}
		if ours != nil {
			cit := NewTraces(canon)
			ids = ids[:0]
			for cit.Next() {
				ids = append(ids, append([]byte{}, cit.Span().SpanID...))
			}
			if err := cit.Err(); err != nil {
				t.Fatalf("pdata's own encoding of the input is refused: %v", err)
			}
		}
		var want [][]byte
		rss := req.Traces().ResourceSpans()
		for i := 0; i < rss.Len(); i++ {
			for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
				sps := rss.At(i).ScopeSpans().At(j).Spans()
				for k := 0; k < sps.Len(); k++ {
					id := sps.At(k).SpanID()
					if sps.At(k).SpanID().IsEmpty() {
						want = append(want, []byte{})
					} else {
						want = append(want, append([]byte{}, id[:]...))
					}
				}
			}
		}
		if len(ids) != len(want) {
			t.Fatalf("%d spans, pdata %d", len(ids), len(want))
		}
		for i := range ids {
			if !bytes.Equal(ids[i], want[i]) {
				t.Fatalf("span %d id %x, pdata %x", i, ids[i], want[i])
			}
		}
	})
}
