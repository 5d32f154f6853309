// Package zipkintest holds Zipkin spans for tests and checks the OTLP
// spans ferry's zipkin door makes of them against what was sent, per
// docs/zipkin.md: the in-process tests (otlp/zipkin) and the end-to-end
// ones (proofs/compat) check alike.
package zipkintest

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/record"
)

// Spans are what the test sends: every field of a Zipkin v2 span that
// the mapping carries, with ids, names and times of their own.
func Spans(n int) []zipkinmodel.SpanModel {
	base := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	var out []zipkinmodel.SpanModel
	for i := range n {
		parent := zipkinmodel.ID(0x1000 + uint64(i))
		s := zipkinmodel.SpanModel{
			SpanContext: zipkinmodel.SpanContext{
				TraceID:  zipkinmodel.TraceID{High: 0xabc0 + uint64(i%3), Low: 0xdef0 + uint64(i%3)},
				ID:       zipkinmodel.ID(0x2000 + uint64(i)),
				ParentID: &parent,
			},
			Name:      "get /api/" + string(rune('a'+i%26)),
			Kind:      []zipkinmodel.Kind{zipkinmodel.Server, zipkinmodel.Client, zipkinmodel.Producer, zipkinmodel.Consumer}[i%4],
			Timestamp: base.Add(time.Duration(i) * time.Millisecond),
			Duration:  time.Duration(1500+i) * time.Microsecond,
			LocalEndpoint: &zipkinmodel.Endpoint{ServiceName: []string{"frontend", "backend"}[i%2],
				IPv4: net.IPv4(10, 0, 0, byte(i)), Port: 8080},
			RemoteEndpoint: &zipkinmodel.Endpoint{ServiceName: "db", IPv4: net.IPv4(10, 0, 1, 1), Port: 5432},
			Annotations:    []zipkinmodel.Annotation{{Timestamp: base.Add(time.Duration(i)*time.Millisecond + 100*time.Microsecond), Value: "wr"}},
			Tags:           map[string]string{"http.method": "GET", "i": string(rune('0' + i%10))},
		}
		if i%5 == 0 {
			s.Tags["error"] = "timeout"
		}
		out = append(out, s)
	}
	return out
}

// Values are the records' values.
func Values(recs []record.Record) [][]byte {
	var out [][]byte
	for _, r := range recs {
		out = append(out, r.Value)
	}
	return out
}

// CheckSpans holds OTLP records (otlp_proto: a record per trace, or per partition) to the
// Zipkin spans sent, field by field, per docs/zipkin.md.
func CheckSpans(t testing.TB, want []zipkinmodel.SpanModel, values [][]byte) {
	t.Helper()
	type got struct {
		s       ptrace.Span
		service string
	}
	byID := map[pcommon.SpanID]got{}
	var traces int
	for _, v := range values {
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(v)
		if err != nil {
			t.Fatal(err)
		}
		traces++
		for _, rs := range td.ResourceSpans().All() {
			svc, _ := rs.Resource().Attributes().Get("service.name")
			for _, ss := range rs.ScopeSpans().All() {
				for _, s := range ss.Spans().All() {
					byID[s.SpanID()] = got{s, svc.Str()}
				}
			}
		}
	}
	if len(byID) != len(want) {
		t.Fatalf("%d spans in %d records, want %d", len(byID), traces, len(want))
	}
	kinds := map[zipkinmodel.Kind]ptrace.SpanKind{zipkinmodel.Server: ptrace.SpanKindServer, zipkinmodel.Client: ptrace.SpanKindClient,
		zipkinmodel.Producer: ptrace.SpanKindProducer, zipkinmodel.Consumer: ptrace.SpanKindConsumer}
	for _, w := range want {
		var sid pcommon.SpanID
		binary.BigEndian.PutUint64(sid[:], uint64(w.ID))
		g, ok := byID[sid]
		if !ok {
			t.Fatalf("span %x missing", sid)
		}
		s := g.s
		var tid pcommon.TraceID
		binary.BigEndian.PutUint64(tid[:8], w.TraceID.High)
		binary.BigEndian.PutUint64(tid[8:], w.TraceID.Low)
		var pid pcommon.SpanID
		binary.BigEndian.PutUint64(pid[:], uint64(*w.ParentID))
		if s.TraceID() != tid || s.ParentSpanID() != pid || s.Name() != w.Name || s.Kind() != kinds[w.Kind] {
			t.Fatalf("span %x: trace %s parent %s name %q kind %v", sid, s.TraceID(), s.ParentSpanID(), s.Name(), s.Kind())
		}
		if !s.StartTimestamp().AsTime().Equal(w.Timestamp) || !s.EndTimestamp().AsTime().Equal(w.Timestamp.Add(w.Duration)) {
			t.Fatalf("span %x: times %v..%v, want %v + %v", sid, s.StartTimestamp().AsTime(), s.EndTimestamp().AsTime(), w.Timestamp, w.Duration)
		}
		if g.service != w.LocalEndpoint.ServiceName {
			t.Fatalf("span %x: service.name %q", sid, g.service)
		}
		a := s.Attributes().AsRaw()
		wantAttrs := map[string]any{"network.local.address": w.LocalEndpoint.IPv4.String(), "net.host.port": int64(w.LocalEndpoint.Port),
			"service.peer.name": w.RemoteEndpoint.ServiceName, "network.peer.address": w.RemoteEndpoint.IPv4.String(),
			"net.peer.port": int64(w.RemoteEndpoint.Port)}
		for k, v := range w.Tags {
			wantAttrs[k] = v
		}
		if len(a) != len(wantAttrs) {
			t.Fatalf("span %x: attributes %v, want %v", sid, a, wantAttrs)
		}
		for k, v := range wantAttrs {
			if a[k] != v {
				t.Fatalf("span %x: attribute %s = %v, want %v (all: %v)", sid, k, a[k], v, a)
			}
		}
		wantStatus := ptrace.StatusCodeUnset
		if _, bad := w.Tags["error"]; bad {
			wantStatus = ptrace.StatusCodeError
		}
		if s.Status().Code() != wantStatus {
			t.Fatalf("span %x: status %v", sid, s.Status().Code())
		}
		if s.Events().Len() != len(w.Annotations) {
			t.Fatalf("span %x: %d events", sid, s.Events().Len())
		}
		for i, an := range w.Annotations {
			e := s.Events().At(i)
			if e.Name() != an.Value || !e.Timestamp().AsTime().Equal(an.Timestamp) {
				t.Fatalf("span %x: event %q at %v, want %q at %v", sid, e.Name(), e.Timestamp().AsTime(), an.Value, an.Timestamp)
			}
		}
	}
}
