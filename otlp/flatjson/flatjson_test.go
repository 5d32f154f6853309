package flatjson

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
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

// FuzzEncode: every object the encoder writes for arbitrary bytes is valid
// JSON, and where the wire decoder and pdata both accept the bytes, the
// objects are the items pdata finds, one for one and in order: per span
// its trace and span ids, name, kind, start and end times, status code,
// number of events and scope name; per log record its times, severity,
// body (when a string) and scope name; per data point its metric's name
// and type, its time, and its value (number points) or count.
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
		var objs []map[string]any
		check := func(obj []byte) {
			if !json.Valid(obj) {
				t.Fatalf("invalid JSON: %q", obj)
			}
			d := json.NewDecoder(bytes.NewReader(obj))
			d.UseNumber()
			var m map[string]any
			if err := d.Decode(&m); err != nil {
				t.Fatalf("not a JSON object: %q: %v", obj, err)
			}
			objs = append(objs, m)
		}
		objs = objs[:0]
		ti := wire.NewTraces(raw)
		for ti.Next() {
			buf = e.Span(buf[:0], ti.Resource(), ti.Scope(), ti.Span())
			check(buf)
		}
		if treq := ptraceotlp.NewExportRequest(); ti.Err() == nil && treq.UnmarshalProto(raw) == nil {
			sameObjects(t, "span", objs, pdataSpans(treq.Traces()))
		}
		e.Reset()
		objs = objs[:0]
		li := wire.NewLogs(raw)
		for li.Next() {
			buf = e.Log(buf[:0], li.Resource(), li.Scope(), li.Record())
			check(buf)
		}
		if lreq := plogotlp.NewExportRequest(); li.Err() == nil && lreq.UnmarshalProto(raw) == nil {
			sameObjects(t, "log record", objs, pdataLogs(lreq.Logs()))
		}
		e.Reset()
		objs = objs[:0]
		mi := wire.NewMetrics(raw)
		for mi.Next() {
			buf = e.Point(buf[:0], mi.Resource(), mi.Scope(), mi.Metric(), mi.Point())
			check(buf)
		}
		if mreq := pmetricotlp.NewExportRequest(); mi.Err() == nil && mreq.UnmarshalProto(raw) == nil {
			sameObjects(t, "data point", objs, pdataPoints(mreq.Metrics()))
		}
	})
}

// want is what one object must hold: a path of keys ("status.code") to the
// value's text (a JSON string's content, or a number's literal). A value
// of anyOf is satisfied by any of its texts, "" standing for an absent key.
type want map[string]any

type anyOf []string

// sameObjects fails unless objs are as many as wants and each holds its
// want's values.
func sameObjects(t *testing.T, what string, objs []map[string]any, wants []want) {
	t.Helper()
	if len(objs) != len(wants) {
		t.Fatalf("%d %s objects, pdata has %d items", len(objs), what, len(wants))
	}
	for i, w := range wants {
		for path, v := range w {
			got := lookup(objs[i], path)
			ok := false
			switch v := v.(type) {
			case string:
				ok = got == v
			case anyOf:
				for _, alt := range v {
					ok = ok || got == alt
				}
			}
			if !ok {
				t.Fatalf("%s %d: %s = %q, pdata says %q\n%v", what, i, path, got, v, objs[i])
			}
		}
	}
}

// lookup is the text of the value at path in o ("" if absent).
func lookup(o map[string]any, path string) string {
	var v any = o
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		if v, ok = m[k]; !ok {
			return ""
		}
	}
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	case []any:
		return strconv.Itoa(len(v))
	case nil:
		return "null"
	}
	return fmt.Sprint(v)
}

// jsonText is s as it reads back from JSON: invalid UTF-8 replaced as
// encoding/json replaces it.
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// idText is an id as an object shows it: its hex, or (an id of zero bytes,
// which pdata cannot tell from none) its hex or nothing.
func idText(id []byte) any {
	if bytes.Count(id, []byte{0}) == len(id) {
		return anyOf{"", hex.EncodeToString(id)}
	}
	return hex.EncodeToString(id)
}

func enumText(names []string, v int32, prefix string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return prefix + strconv.Itoa(int(v))
}

func floatText(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

func pdataSpans(td ptrace.Traces) []want {
	var out []want
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
			ss := rss.At(i).ScopeSpans().At(j)
			for k := 0; k < ss.Spans().Len(); k++ {
				sp := ss.Spans().At(k)
				tid, sid := sp.TraceID(), sp.SpanID()
				evs := ""
				if n := sp.Events().Len(); n > 0 {
					evs = strconv.Itoa(n)
				}
				out = append(out, want{
					"trace_id":             idText(tid[:]),
					"span_id":              idText(sid[:]),
					"name":                 jsonText(sp.Name()),
					"kind":                 enumText(wire.SpanKindNames[:], int32(sp.Kind()), "SPAN_KIND_"),
					"start_time_unix_nano": u64(uint64(sp.StartTimestamp())),
					"end_time_unix_nano":   u64(uint64(sp.EndTimestamp())),
					"status.code":          enumText(wire.StatusCodeNames[:], int32(sp.Status().Code()), "STATUS_CODE_"),
					"events":               evs,
					"scope.name":           jsonText(ss.Scope().Name()),
				})
			}
		}
	}
	return out
}

func pdataLogs(ld plog.Logs) []want {
	var out []want
	rls := ld.ResourceLogs()
	for i := 0; i < rls.Len(); i++ {
		for j := 0; j < rls.At(i).ScopeLogs().Len(); j++ {
			sl := rls.At(i).ScopeLogs().At(j)
			for k := 0; k < sl.LogRecords().Len(); k++ {
				lr := sl.LogRecords().At(k)
				w := want{"time_unix_nano": u64(uint64(lr.Timestamp())), "observed_time_unix_nano": u64(uint64(lr.ObservedTimestamp())),
					"severity_number": strconv.Itoa(int(lr.SeverityNumber())), "severity_text": jsonText(lr.SeverityText()),
					"scope.name": jsonText(sl.Scope().Name())}
				if lr.Body().Type() == pcommon.ValueTypeStr {
					w["body"] = jsonText(lr.Body().Str())
				}
				out = append(out, w)
			}
		}
	}
	return out
}

func pdataPoints(md pmetric.Metrics) []want {
	var out []want
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		for j := 0; j < rms.At(i).ScopeMetrics().Len(); j++ {
			sm := rms.At(i).ScopeMetrics().At(j)
			for k := 0; k < sm.Metrics().Len(); k++ {
				m := sm.Metrics().At(k)
				base := func(t pcommon.Timestamp) want {
					return want{"name": jsonText(m.Name()), "type": wire.MetricTypeNames[m.Type()], "time_unix_nano": u64(uint64(t)),
						"scope.name": jsonText(sm.Scope().Name())}
				}
				number := func(dps pmetric.NumberDataPointSlice) {
					for p := 0; p < dps.Len(); p++ {
						dp := dps.At(p)
						w := base(dp.Timestamp())
						if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
							w["value"] = strconv.FormatInt(dp.IntValue(), 10)
						} else {
							w["value"] = floatText(dp.DoubleValue())
						}
						out = append(out, w)
					}
				}
				counted := func(t pcommon.Timestamp, n uint64) {
					w := base(t)
					w["count"] = u64(n)
					out = append(out, w)
				}
				switch m.Type() {
				case pmetric.MetricTypeGauge:
					number(m.Gauge().DataPoints())
				case pmetric.MetricTypeSum:
					number(m.Sum().DataPoints())
				case pmetric.MetricTypeHistogram:
					for p := 0; p < m.Histogram().DataPoints().Len(); p++ {
						counted(m.Histogram().DataPoints().At(p).Timestamp(), m.Histogram().DataPoints().At(p).Count())
					}
				case pmetric.MetricTypeExponentialHistogram:
					for p := 0; p < m.ExponentialHistogram().DataPoints().Len(); p++ {
						dp := m.ExponentialHistogram().DataPoints().At(p)
						counted(dp.Timestamp(), dp.Count())
					}
				case pmetric.MetricTypeSummary:
					for p := 0; p < m.Summary().DataPoints().Len(); p++ {
						counted(m.Summary().DataPoints().At(p).Timestamp(), m.Summary().DataPoints().At(p).Count())
					}
				}
			}
		}
	}
	return out
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
