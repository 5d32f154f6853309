package flatjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func encodeTraces(t testing.TB, raw []byte) []map[string]any {
	var e Encoder
	var out []map[string]any
	it := wire.NewTraces(raw)
	for it.Next() {
		obj := e.Span(nil, it.Resource(), it.Scope(), it.Span())
		var m map[string]any
		if err := json.Unmarshal(obj, &m); err != nil {
			t.Fatalf("invalid JSON %s: %v", obj, err)
		}
		out = append(out, m)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSpanObject(t *testing.T) {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "checkout")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("lib")
	sp := ss.Spans().AppendEmpty()
	sp.SetTraceID(pcommon.TraceID{0xab, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	sp.SetSpanID(pcommon.SpanID{1, 2, 3, 4, 5, 6, 7, 8})
	sp.SetName("GET /cart \"quoted\"\n\x01\u2028")
	sp.SetKind(ptrace.SpanKindClient)
	sp.SetStartTimestamp(1_700_000_000_000_000_000)
	sp.SetEndTimestamp(1_700_000_000_000_500_000)
	sp.Attributes().PutInt("http.status_code", 503)
	sp.Attributes().PutDouble("ratio", 0.25)
	sp.Attributes().PutEmptySlice("list").AppendEmpty().SetBool(true)
	sp.Attributes().PutEmptyBytes("raw").FromRaw([]byte("hi"))
	sp.Attributes().PutStr("bad_utf8", string([]byte{0xff, 'a'}))
	sp.Status().SetCode(ptrace.StatusCodeError)
	sp.Status().SetMessage("upstream failed")
	ev := sp.Events().AppendEmpty()
	ev.SetName("retry")
	ev.Attributes().PutInt("attempt", 2)
	sp.Links().AppendEmpty().SetTraceID(pcommon.TraceID{1})
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()

	objs := encodeTraces(t, raw)
	if len(objs) != 1 {
		t.Fatalf("%d objects", len(objs))
	}
	o := objs[0]
	checks := map[string]any{
		"trace_id": "ab0102030405060708090a0b0c0d0e0f", "span_id": "0102030405060708",
		"name": "GET /cart \"quoted\"\n\x01\u2028", "kind": "SPAN_KIND_CLIENT",
		"start_time_unix_nano": 1.7e18, "duration_nano": 500000.0,
	}
	for k, want := range checks {
		if o[k] != want {
			t.Errorf("%s = %#v, want %#v", k, o[k], want)
		}
	}
	attrs := o["attributes"].(map[string]any)
	if attrs["http.status_code"] != 503.0 || attrs["ratio"] != 0.25 || attrs["raw"] != "aGk=" ||
		fmt.Sprint(attrs["list"]) != "[true]" || attrs["bad_utf8"] != "\ufffda" {
		t.Errorf("attributes %v", attrs)
	}
	if o["resource"].(map[string]any)["service.name"] != "checkout" || o["scope"].(map[string]any)["name"] != "lib" {
		t.Errorf("resource/scope %v %v", o["resource"], o["scope"])
	}
	st := o["status"].(map[string]any)
	if st["code"] != "STATUS_CODE_ERROR" || st["message"] != "upstream failed" {
		t.Errorf("status %v", st)
	}
	evs := o["events"].([]any)
	if len(evs) != 1 || evs[0].(map[string]any)["name"] != "retry" {
		t.Errorf("events %v", evs)
	}
	if links := o["links"].([]any); len(links) != 1 || links[0].(map[string]any)["trace_id"] != "01000000000000000000000000000000" {
		t.Errorf("links %v", links)
	}
	if _, ok := o["parent_span_id"]; ok {
		t.Error("empty parent_span_id must be omitted")
	}
}

func TestEveryItemBecomesOneObject(t *testing.T) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(50)).MarshalProto()
	if n := len(encodeTraces(t, raw)); n != 50 {
		t.Fatalf("%d span objects, want 50", n)
	}
	lraw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(2).Logs(20, 64)).MarshalProto()
	var e Encoder
	n := 0
	li := wire.NewLogs(lraw)
	for li.Next() {
		var m map[string]any
		obj := e.Log(nil, li.Resource(), li.Scope(), li.Record())
		if err := json.Unmarshal(obj, &m); err != nil || len(m["body"].(string)) != 64 || m["severity_text"] != "INFO" {
			t.Fatalf("log object %s: %v", obj, err)
		}
		n++
	}
	if n != 20 {
		t.Fatalf("%d log objects", n)
	}
	md := otlpgen.New(3).Metrics(3, 3, 3)
	mraw, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	mi := wire.NewMetrics(mraw)
	types := map[string]int{}
	for mi.Next() {
		var m map[string]any
		obj := e.Point(nil, mi.Resource(), mi.Scope(), mi.Metric(), mi.Point())
		if err := json.Unmarshal(obj, &m); err != nil {
			t.Fatalf("point %s: %v", obj, err)
		}
		types[m["type"].(string)]++
		if m["type"] == "histogram" && (fmt.Sprint(m["bucket_counts"]) != "[1 2 3 4 5 6]" || fmt.Sprint(m["explicit_bounds"]) != "[1 5 10 50 100]") {
			t.Fatalf("histogram %s", obj)
		}
		if m["type"] == "sum" && (m["monotonic"] != true || m["temporality"] != "cumulative") {
			t.Fatalf("sum %s", obj)
		}
	}
	if types["gauge"] != 3 || types["sum"] != 3 || types["histogram"] != 3 {
		t.Fatalf("types %v", types)
	}
}

func TestCacheDoesNotLeakAcrossResources(t *testing.T) {
	td := otlpgen.New(1).Traces(2)
	rs2 := td.ResourceSpans().AppendEmpty()
	rs2.Resource().Attributes().PutStr("service.name", "second")
	rs2.ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("s")
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	objs := encodeTraces(t, raw)
	if objs[0]["resource"].(map[string]any)["service.name"] != "generator.service" ||
		objs[2]["resource"].(map[string]any)["service.name"] != "second" {
		t.Fatalf("resources %v / %v", objs[0]["resource"], objs[2]["resource"])
	}
}

func FuzzEncode(f *testing.F) {
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(3)).MarshalProto()
	f.Add(raw)
	lraw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 8)).MarshalProto()
	f.Add(lraw)
	mraw, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalProto()
	f.Add(mraw)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var e Encoder
		var buf []byte
		check := func(obj []byte) {
			if !json.Valid(obj) {
				t.Fatalf("invalid JSON: %q", obj)
			}
		}
		ti := wire.NewTraces(raw)
		for ti.Next() {
			buf = e.Span(buf[:0], ti.Resource(), ti.Scope(), ti.Span())
			check(buf)
		}
		e.Reset()
		li := wire.NewLogs(raw)
		for li.Next() {
			buf = e.Log(buf[:0], li.Resource(), li.Scope(), li.Record())
			check(buf)
		}
		e.Reset()
		mi := wire.NewMetrics(raw)
		for mi.Next() {
			buf = e.Point(buf[:0], mi.Resource(), mi.Scope(), mi.Metric(), mi.Point())
			check(buf)
		}
		_ = bytes.MinRead
	})
}

func TestNeedsEscape8(t *testing.T) {
	for c := 0; c < 256; c++ {
		want := c < 0x20 || c == '"' || c == '\\' || c >= 0x80
		for pos := 0; pos < 8; pos++ {
			b := []byte("abcdefgh")
			b[pos] = byte(c)
			var w uint64
			for i := 7; i >= 0; i-- {
				w = w<<8 | uint64(b[i])
			}
			if got := needsEscape8(w); got != want {
				t.Fatalf("byte %#x at %d: got %v", c, pos, got)
			}
		}
	}
	for _, s := range []string{"plain ascii text!", "tab\there", "quote\"x", "back\\slash", "ünïcode", "\x7f del", "12345678\n"} {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(s)
		var back, want2 string
		_ = json.Unmarshal(appendString(nil, []byte(s)), &back)
		_ = json.Unmarshal(want.Bytes(), &want2)
		if back != want2 {
			t.Errorf("%q round-trips to %q", s, back)
		}
	}
}
