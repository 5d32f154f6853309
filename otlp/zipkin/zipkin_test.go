package zipkin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"github.com/openzipkin/zipkin-go/proto/zipkin_proto3"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

func req(path, ctype string) *http.Request {
	q := httptest.NewRequest(http.MethodPost, path, nil)
	q.Header.Set("Content-Type", ctype)
	return q
}

func conv(t testing.TB, path, ctype string, body []byte) (ptrace.Traces, []byte, error) {
	t.Helper()
	pb, err := Convert(req(path, ctype), body, nil, door.Limits{MaxBytes: 1 << 30}, nil)
	if err != nil {
		return ptrace.Traces{}, nil, err
	}
	td, uerr := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(pb)
	if uerr != nil {
		t.Fatalf("Convert wrote what is not an OTLP request: %v", uerr)
	}
	return td, pb, nil
}

func protoSpans(t testing.TB, spans []zipkinmodel.SpanModel) []byte {
	t.Helper()
	b, err := zipkin_proto3.SpanSerializer{}.Serialize(ptrs(spans))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ptrs(s []zipkinmodel.SpanModel) []*zipkinmodel.SpanModel {
	out := make([]*zipkinmodel.SpanModel, len(s))
	for i := range s {
		out[i] = &s[i]
	}
	return out
}

// worstCases are the bodies that convert to the most OTLP bytes per byte
// sent, found by reading the mapping (and the fuzzer's best, below).
func worstCases(t testing.TB) map[string][2]any {
	const n = 2000
	min := make([]zipkinmodel.SpanModel, n)
	ends := make([]zipkinmodel.SpanModel, n)
	annos := make([]zipkinmodel.SpanModel, 1)
	for i := range n {
		min[i] = zipkinmodel.SpanModel{SpanContext: zipkinmodel.SpanContext{TraceID: zipkinmodel.TraceID{Low: 1}, ID: zipkinmodel.ID(i + 1)}}
		ends[i] = min[i]
		ip := net.ParseIP("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")
		ends[i].LocalEndpoint = &zipkinmodel.Endpoint{IPv6: ip, Port: 1}
		ends[i].RemoteEndpoint = &zipkinmodel.Endpoint{IPv6: ip, Port: 1}
	}
	annos[0] = min[0]
	for range 4000 {
		annos[0].Annotations = append(annos[0].Annotations, zipkinmodel.Annotation{Timestamp: time.Unix(1, 0)})
	}
	tags := min[0]
	tags.Tags = map[string]string{}
	for i := range 4000 {
		tags.Tags[fmt.Sprint(i)] = ""
	}
	services := make([]zipkinmodel.SpanModel, n)
	for i := range n {
		services[i] = min[i]
		services[i].LocalEndpoint = &zipkinmodel.Endpoint{ServiceName: fmt.Sprint(i)}
	}
	jsonMin := []byte("[" + strings.TrimSuffix(strings.Repeat(`{"traceId":"1","id":"1"},`, n), ",") + "]")
	jsonPorts := []byte("[" + strings.TrimSuffix(strings.Repeat(`{"traceId":"1","id":"1","localEndpoint":{"port":1},"remoteEndpoint":{"port":1}},`, n), ",") + "]")
	jsonV1 := []byte("[" + strings.TrimSuffix(strings.Repeat(`{"traceId":"0000000000000001","id":"0000000000000001"},`, n), ",") + "]")
	// By hand, proto3 at its smallest: a 16-byte trace id, an 8-byte id,
	// and endpoints of a port only, or a one-letter service of its own.
	var handPorts, handServices []byte
	for i := range n {
		var sp []byte
		sp = protowire.AppendTag(sp, 1, protowire.BytesType)
		sp = protowire.AppendBytes(sp, append(make([]byte, 15), 1))
		sp = protowire.AppendTag(sp, 3, protowire.BytesType)
		sp = protowire.AppendBytes(sp, []byte{0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i) + 1})
		ports := append(sp, 0x42, 2, 0x20, 1, 0x4a, 2, 0x20, 1) // local_endpoint{port:1}, remote_endpoint{port:1}
		svc := append(sp, 0x42, 4, 0x0a, 2, byte('a'+i%26), byte('a'+i/26%26))
		handPorts = protowire.AppendBytes(protowire.AppendTag(handPorts, 1, protowire.BytesType), ports)
		handServices = protowire.AppendBytes(protowire.AppendTag(handServices, 1, protowire.BytesType), svc)
	}
	return map[string][2]any{
		"proto by hand: ports":    {"application/x-protobuf", handPorts},
		"proto by hand: services": {"application/x-protobuf", handServices},
		"proto ids only":          {"application/x-protobuf", protoSpans(t, min)},
		"proto ipv6 and ports":    {"application/x-protobuf", protoSpans(t, ends)},
		"proto annotations":       {"application/x-protobuf", protoSpans(t, annos)},
		"proto empty tags":        {"application/x-protobuf", protoSpans(t, []zipkinmodel.SpanModel{tags})},
		"proto services":          {"application/x-protobuf", protoSpans(t, services)},
		"json ids only":           {"application/json", jsonMin},
		"json ports":              {"application/json", jsonPorts},
		"v1 json ids only":        {"v1", jsonV1},
	}
}

// TestAmplification measures the OTLP bytes each worst case converts to
// per body byte, which Amplify must bound.
func TestAmplification(t *testing.T) {
	worst := 0.0
	for name, c := range worstCases(t) {
		path, ct := "/api/v2/spans", c[0].(string)
		if ct == "v1" {
			path, ct = "/api/v1/spans", "application/json"
		}
		body := c[1].([]byte)
		_, pb, err := conv(t, path, ct, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r := float64(len(pb)) / float64(len(body))
		t.Logf("%-22s %8d bytes → %8d OTLP bytes: %.2f×", name, len(body), len(pb), r)
		worst = max(worst, r)
	}
	if worst > Amplify {
		t.Fatalf("a worst case converts to %.2f× its size, over Amplify (%d)", worst, Amplify)
	}
	t.Logf("worst %.2f×, Amplify %d", worst, Amplify)
}

// TestBounds: each bound refuses a body before decoding, and a body just
// within it is taken; errors past a bound are the door's ErrDoorTooLarge.
func TestBounds(t *testing.T) {
	span := `{"traceId":"1","id":"1"}`
	many := func(n int) []byte { return []byte("[" + strings.TrimSuffix(strings.Repeat(span+",", n), ",") + "]") }
	if td, _, err := conv(t, "/api/v2/spans", "application/json", many(MaxSpans)); err != nil || td.SpanCount() != MaxSpans {
		t.Fatalf("MaxSpans spans: %v", err)
	}
	if _, _, err := conv(t, "/api/v2/spans", "application/json", many(MaxSpans+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MaxSpans+1 spans: %v", err)
	}
	tags := func(n int) []byte {
		var b strings.Builder
		b.WriteString(`[{"traceId":"1","id":"1","tags":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"t%d":""`, i)
		}
		b.WriteString("}}]")
		return []byte(b.String())
	}
	if td, _, err := conv(t, "/api/v2/spans", "application/json", tags(MaxEntriesPerSpan)); err != nil || td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Attributes().Len() != MaxEntriesPerSpan+1 {
		t.Fatalf("MaxEntriesPerSpan tags: %v", err)
	}
	if _, _, err := conv(t, "/api/v2/spans", "application/json", tags(MaxEntriesPerSpan+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MaxEntriesPerSpan+1 tags: %v", err)
	}
	ptags := func(n int) []byte {
		s := zipkinmodel.SpanModel{SpanContext: zipkinmodel.SpanContext{TraceID: zipkinmodel.TraceID{Low: 1}, ID: 1}, Tags: map[string]string{}}
		for i := range n {
			s.Tags[fmt.Sprint(i)] = ""
		}
		return protoSpans(t, []zipkinmodel.SpanModel{s})
	}
	if _, _, err := conv(t, "/api/v2/spans", "application/x-protobuf", ptags(MaxEntriesPerSpan)); err != nil {
		t.Fatalf("proto: MaxEntriesPerSpan tags: %v", err)
	}
	if _, _, err := conv(t, "/api/v2/spans", "application/x-protobuf", ptags(MaxEntriesPerSpan+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("proto: MaxEntriesPerSpan+1 tags: %v", err)
	}
	deep := []byte(`[{"traceId":"1","id":"1","x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}]`)
	if _, _, err := conv(t, "/api/v2/spans", "application/json", deep); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("deep: %v", err)
	}
	// An annotation whose value the translator parses as attributes.
	attrs := func(n int) string {
		var b strings.Builder
		b.WriteString(`ev|{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `\"a%d\":1`, i)
		}
		b.WriteString(`}|0`)
		return b.String()
	}
	ok := []byte(`[{"traceId":"1","id":"1","annotations":[{"timestamp":1,"value":"` + attrs(maxAttrTokens-1) + `"}]}]`)
	if td, _, err := conv(t, "/api/v2/spans", "application/json", ok); err != nil || td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Events().At(0).Attributes().Len() != maxAttrTokens-1 {
		t.Fatalf("event attributes within the bound: %v", err)
	}
	bad := []byte(`[{"traceId":"1","id":"1","annotations":[{"timestamp":1,"value":"` + strings.ReplaceAll(attrs(maxAttrTokens+1), ",", `\u002c`) + `"}]}]`)
	if _, _, err := conv(t, "/api/v2/spans", "application/json", bad); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("event attributes past the bound (escaped commas): %v", err)
	}
	// A conversion past max.
	if _, err := Convert(req("/api/v2/spans", "application/json"), many(100), nil, door.Limits{MaxBytes: 1000}, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("past max: %v", err)
	}
}

// TestInputs: the content types and paths, bad input as an error naming
// it, and an empty list as an empty request.
func TestInputs(t *testing.T) {
	for _, c := range []struct{ path, ct, body, err string }{
		{"/api/v2/spans", "application/json", `[]`, ""},
		{"/api/v2/spans", "", ` [ {"traceId":"1","id":"1"} ] `, ""},
		{"/api/v2/spans", "application/json; charset=utf-8", `[{"traceId":"1","id":"1"}]`, ""},
		{"/api/v2/spans", "application/json", `{"traceId":"1","id":"1"}`, "array of spans"},
		{"/api/v2/spans", "application/json", `[{"traceId":"1","id":"1"}`, "unterminated"},
		{"/api/v2/spans", "application/json", `[{"traceId":"1","id":"1"}] x`, "after the JSON array"},
		{"/api/v2/spans", "application/json", `[{"traceId":"1","id":"1"},,{"traceId":"1","id":"2"}]`, "empty element"},
		{"/api/v2/spans", "application/json", `[{"traceId":"1"}]`, "valid span id required"},
		{"/api/v2/spans", "application/json", `[{"traceId":"xyz","id":"1"}]`, "invalid"},
		{"/api/v2/spans", "application/x-protobuf", "\x0a\x02\x0a\x00", "TraceID"},
		{"/api/v2/spans", "application/x-protobuf", "\x0a\xff", "invalid protobuf"},
		{"/api/v2/spans", "application/x-thrift", "x", "thrift is not served"},
		{"/api/v2/spans", "text/xml", "x", "unsupported Content-Type"},
		{"/api/v1/spans", "application/x-protobuf", "x", "takes JSON"},
		{"/api/v1/spans", "application/json", `[{"traceId":"0000000000000001","id":"0000000000000001","name":"v1","timestamp":1000,"duration":5,"annotations":[{"timestamp":1000,"value":"sr","endpoint":{"serviceName":"svc","ipv4":"1.2.3.4","port":80}}],"binaryAnnotations":[{"key":"k","value":"v","endpoint":{"serviceName":"svc"}}]}]`, ""},
	} {
		_, _, err := conv(t, c.path, c.ct, []byte(c.body))
		if c.err == "" {
			if err != nil {
				t.Fatalf("%s %q: %v", c.ct, c.body, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Fatalf("%s %q: %v, want %q", c.ct, c.body, err, c.err)
		}
	}
	td, _, err := conv(t, "/api/v1/spans", "application/json", []byte(`[{"traceId":"0000000000000001","id":"0000000000000001","name":"v1","timestamp":1000,"duration":5,"annotations":[{"timestamp":1000,"value":"sr","endpoint":{"serviceName":"svc","ipv4":"1.2.3.4","port":80}}],"binaryAnnotations":[{"key":"k","value":"v","endpoint":{"serviceName":"svc"}}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	rs := td.ResourceSpans().At(0)
	s := rs.ScopeSpans().At(0).Spans().At(0)
	if sn, _ := rs.Resource().Attributes().Get("service.name"); sn.Str() != "svc" || s.Name() != "v1" || s.Kind() != ptrace.SpanKindServer ||
		s.StartTimestamp() != 1000_000 || s.EndTimestamp() != 1005_000 {
		t.Fatalf("v1: %s %q %v %d %d", sn.Str(), s.Name(), s.Kind(), s.StartTimestamp(), s.EndTimestamp())
	}
	if v, _ := s.Attributes().Get("k"); v.Str() != "v" {
		t.Fatalf("v1 binary annotation: %v", s.Attributes().AsRaw())
	}
}

// TestChunksAreOneRequest: a body of many chunks converts to the spans one
// translation of the whole body makes (resources may repeat, one per
// chunk: OTLP allows it).
func TestChunksAreOneRequest(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("[")
	for i := range 3*chunkSpans + 7 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"traceId":"%x","id":"%x","name":"s%d","timestamp":%d,"duration":3,"localEndpoint":{"serviceName":"svc%d"},"tags":{"n":"%d"}}`, i%7+1, i+1, i, 1_000_000_000_000_000+i, i%3, i)
	}
	b.WriteString("]")
	td, _, err := conv(t, "/api/v2/spans", "application/json", b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if td.SpanCount() != 3*chunkSpans+7 {
		t.Fatalf("%d spans", td.SpanCount())
	}
	seen := map[string]bool{}
	for _, rs := range td.ResourceSpans().All() {
		svc, _ := rs.Resource().Attributes().Get("service.name")
		for _, s := range rs.ScopeSpans().At(0).Spans().All() {
			n, _ := s.Attributes().Get("n")
			var i int
			fmt.Sscan(n.Str(), &i)
			if s.Name() != "s"+n.Str() || svc.Str() != fmt.Sprintf("svc%d", i%3) {
				t.Fatalf("span %q n=%s", s.Name(), n.Str())
			}
			seen[s.Name()] = true
		}
	}
	if len(seen) != 3*chunkSpans+7 {
		t.Fatalf("%d distinct spans", len(seen))
	}
}

// FuzzConvert: no input panics, and what Convert writes is an OTLP
// request of at most Amplify times the input (plus the door's 4096), or
// an error.
func FuzzConvert(f *testing.F) {
	for _, c := range worstCases(f) {
		if b := c[1].([]byte); len(b) < 4096 {
			f.Add(c[0].(string) == "application/x-protobuf", false, b)
		}
	}
	f.Add(false, false, []byte(`[{"traceId":"1","id":"1","annotations":[{"timestamp":1,"value":"e|{\"a\":1}|0"}],"tags":{"otlp.link.0":"00000000000000000000000000000001|0000000000000001||{\"k\":\"v\"}|0","error":"true","otel.status_code":"ERROR"}}]`))
	f.Add(false, true, []byte(`[{"traceId":"1","id":"1","annotations":[{"timestamp":1,"value":"sr","endpoint":{"serviceName":"a"}}]}]`))
	s := []zipkinmodel.SpanModel{{SpanContext: zipkinmodel.SpanContext{TraceID: zipkinmodel.TraceID{High: 1, Low: 2}, ID: 3}, Name: "n", Kind: zipkinmodel.Client,
		Timestamp: time.Unix(5, 0), Duration: time.Second, Shared: true, LocalEndpoint: &zipkinmodel.Endpoint{ServiceName: "a", IPv4: net.IPv4(1, 2, 3, 4), Port: 9},
		Annotations: []zipkinmodel.Annotation{{Timestamp: time.Unix(5, 1), Value: "x"}}, Tags: map[string]string{"a": "b"}}}
	f.Add(true, false, protoSpans(f, s))
	f.Fuzz(func(t *testing.T, proto, v1 bool, body []byte) {
		path, ct := "/api/v2/spans", "application/json"
		if v1 {
			path = "/api/v1/spans"
		}
		if proto {
			ct = "application/x-protobuf"
		}
		max := min(1<<20, Amplify*len(body)+4096)
		var st door.Stats // counting what is dropped runs too
		pb, err := Convert(req(path, ct), body, make([]byte, 0, max), door.Limits{MaxBytes: max}, &st)
		if err != nil {
			return
		}
		if len(pb) > Amplify*len(body)+4096 {
			t.Fatalf("%d bytes became %d", len(body), len(pb))
		}
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(pb)
		if err != nil {
			t.Fatalf("not an OTLP request: %v", err)
		}
		// a limit of 3 items refuses exactly the requests of more spans.
		_, lerr := Convert(req(path, ct), body, make([]byte, 0, max), door.Limits{MaxBytes: max, MaxItems: 3}, nil)
		if errors.Is(lerr, door.ErrTooManyItems) != (td.SpanCount() > 3) || lerr != nil && !errors.Is(lerr, door.ErrTooManyItems) {
			t.Fatalf("%d spans, limit 3: %v", td.SpanCount(), lerr)
		}
	})
}

// BenchmarkConvert: spans/s and allocations of a 100-span request as
// zipkin-go's reporter writes it, per encoding.
func BenchmarkConvert(b *testing.B) {
	spans := make([]zipkinmodel.SpanModel, 100)
	for i := range spans {
		p := zipkinmodel.ID(i + 1)
		spans[i] = zipkinmodel.SpanModel{SpanContext: zipkinmodel.SpanContext{TraceID: zipkinmodel.TraceID{High: 7, Low: uint64(i/10 + 1)}, ID: zipkinmodel.ID(i + 100), ParentID: &p},
			Name: "get /api/orders", Kind: zipkinmodel.Server, Timestamp: time.Unix(1700000000, int64(i)*1000), Duration: 1234 * time.Microsecond,
			LocalEndpoint:  &zipkinmodel.Endpoint{ServiceName: "orders", IPv4: net.IPv4(10, 0, 0, 1), Port: 8080},
			RemoteEndpoint: &zipkinmodel.Endpoint{ServiceName: "mysql", IPv4: net.IPv4(10, 0, 0, 2), Port: 3306},
			Annotations:    []zipkinmodel.Annotation{{Timestamp: time.Unix(1700000000, int64(i)*1000+500), Value: "wire send"}},
			Tags:           map[string]string{"http.method": "GET", "http.path": "/api/orders/123", "http.status_code": "200", "component": "net/http"}}
	}
	jb, _ := json.Marshal(spans)
	pb := protoSpans(b, spans)
	for _, c := range []struct {
		name, ct string
		body     []byte
	}{{"json", "application/json", jb}, {"proto", "application/x-protobuf", pb}} {
		b.Run(c.name, func(b *testing.B) {
			q := req("/api/v2/spans", c.ct)
			dst := make([]byte, 0, Amplify*len(c.body))
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Convert(q, c.body, dst, door.Limits{MaxBytes: cap(dst)}, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(spans))/b.Elapsed().Seconds(), "spans/s")
		})
	}
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestMaxItems: more spans than lim.MaxItems (v2 JSON, v1 JSON, proto3)
// are refused with door.ErrTooManyItems as the scan counts them, before
// any is decoded: 1,000,000 spans against a limit of 10 allocate next to
// nothing. As many spans as the limit pass.
func TestMaxItems(t *testing.T) {
	lim := door.Limits{MaxBytes: 1 << 30, MaxItems: 10}
	span := `{"traceId":"0000000000000001","id":"0000000000000001"}`
	many := func(n int) []byte { return []byte("[" + strings.TrimSuffix(strings.Repeat(span+",", n), ",") + "]") }
	pspans := func(n int) []byte {
		s := make([]zipkinmodel.SpanModel, n)
		for i := range s {
			s[i].TraceID, s[i].ID = zipkinmodel.TraceID{Low: 1}, zipkinmodel.ID(i+1)
		}
		return protoSpans(t, s)
	}
	for _, c := range []struct {
		path, ct string
		body     func(int) []byte
	}{{"/api/v2/spans", "application/json", many}, {"/api/v1/spans", "application/json", many}, {"/api/v2/spans", "application/x-protobuf", pspans}} {
		if _, err := Convert(req(c.path, c.ct), c.body(10), nil, lim, nil); err != nil {
			t.Fatalf("%s %s: 10 spans of 10: %v", c.path, c.ct, err)
		}
		if _, err := Convert(req(c.path, c.ct), c.body(11), nil, lim, nil); !errors.Is(err, door.ErrTooManyItems) {
			t.Fatalf("%s %s: 11 spans of 10: %v", c.path, c.ct, err)
		}
	}
	for _, c := range []struct {
		ct   string
		body []byte
	}{{"application/json", []byte("[" + strings.TrimSuffix(strings.Repeat("{},", 1000000), ",") + "]")}, {"application/x-protobuf", bytes.Repeat([]byte{0x0a, 0x00}, 1000000)}} {
		var err error
		if a := allocated(func() { _, err = Convert(req("/api/v2/spans", c.ct), c.body, nil, lim, nil) }); !errors.Is(err, door.ErrTooManyItems) || a > 16<<10 {
			t.Fatalf("%s: 1,000,000 spans of 10: %v, %d bytes allocated", c.ct, err, a)
		}
	}
}

// TestDropped: repeated keys are counted (door.DuplicateKey): a tags
// object's repeated members (an escaped key too, and a second tags
// object's), a span's or endpoint's field given twice, a proto3 span's
// repeated tags entries, v1 binary annotations of one key (lc is
// component).
func TestDropped(t *testing.T) {
	tag := func(k, v string) []byte {
		e := protowire.AppendTag(nil, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		return protowire.AppendBytes(protowire.AppendTag(nil, 11, protowire.BytesType), e)
	}
	span := protowire.AppendTag(nil, 1, protowire.BytesType)
	span = protowire.AppendBytes(span, []byte{15: 1})
	span = protowire.AppendTag(span, 3, protowire.BytesType)
	span = protowire.AppendBytes(span, []byte{7: 1})
	span = append(append(append(span, tag("a", "1")...), tag("a", "2")...), tag("b", "3")...)
	pb := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), span)
	const id = `"traceId":"0000000000000001","id":"0000000000000001"`
	for _, c := range []struct {
		path, ct, body string
		want           int
	}{
		{"/api/v2/spans", "application/json", `[{` + id + `,"tags":{"a":"1","a":"2","b":"x","\u0061":"3"}}]`, 2},
		{"/api/v2/spans", "application/json", `[{` + id + `,"tags":{"a":"1"},"Name":"x","tags":{"a":"2","b":"3"},"name":"y"}]`, 2},
		{"/api/v2/spans", "application/json", `[{` + id + `,"localEndpoint":{"serviceName":"a","serviceName":"b"},"annotations":[{"timestamp":1,"value":"a","value":"b"}]}, {` + id + `}]`, 2},
		{"/api/v2/spans", "application/json", `[{` + id + `,"tags":{"a":"1","b":"2"}}]`, 0},
		{"/api/v2/spans", "application/x-protobuf", string(pb), 1},
		{"/api/v1/spans", "application/json", `[{` + id + `,"binaryAnnotations":[{"key":"a","value":"1"},{"key":"a","value":"2"},{"key":"lc","value":"x"},{"key":"component","value":"y"}]}]`, 2},
	} {
		var st door.Stats
		if _, err := Convert(req(c.path, c.ct), []byte(c.body), nil, door.Limits{MaxBytes: 1 << 20}, &st); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if st.Dropped[door.DuplicateKey] != c.want || st.Total() != c.want {
			t.Fatalf("%q: %v dropped, want %d repeated keys", c.body, st.Dropped, c.want)
		}
	}
}
