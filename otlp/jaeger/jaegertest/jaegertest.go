// Package jaegertest makes spans with a real Jaeger client
// (github.com/uber/jaeger-client-go: its tracer, and its HTTP transport
// as the sender), and checks the OTLP traces ferry made of them against
// what the client holds; and (proto.go) sends Jaeger proto batches with
// jaeger-idl's generated gRPC client, and checks them the same way. For
// tests only.
package jaegertest

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/opentracing/opentracing-go"
	"github.com/opentracing/opentracing-go/ext"
	otlog "github.com/opentracing/opentracing-go/log"
	jaeger "github.com/uber/jaeger-client-go"
	"github.com/uber/jaeger-client-go/transport"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// collector is a jaeger.Reporter that keeps the finished spans.
type collector struct {
	mu    sync.Mutex
	spans []*jaeger.Span
}

func (c *collector) Report(s *jaeger.Span) {
	c.mu.Lock()
	c.spans = append(c.spans, s.Retain())
	c.mu.Unlock()
}
func (c *collector) Close() {}

// Spans has the jaeger client's tracer (128-bit trace ids, every span
// sampled) make traces × 3 spans for service: a server span with tags of
// every type and two logs; its client child (CHILD_OF), which fails
// (error=true); and a consumer span in the same trace that FOLLOWS_FROM
// the child.
func Spans(service string, traces int) []*jaeger.Span {
	c := &collector{}
	tr, closer := jaeger.NewTracer(service, jaeger.NewConstSampler(true), c, jaeger.TracerOptions.Gen128Bit(true),
		jaeger.TracerOptions.Tag("deployment", "canary"))
	defer closer.Close()
	base := time.Now().Add(-time.Minute)
	for i := range traces {
		t0 := base.Add(time.Duration(i) * time.Millisecond)
		root := tr.StartSpan(fmt.Sprintf("GET /orders/%d", i), opentracing.StartTime(t0), ext.SpanKindRPCServer,
			opentracing.Tag{Key: "http.method", Value: "GET"}, opentracing.Tag{Key: "order.id", Value: int64(1000 + i)},
			opentracing.Tag{Key: "cache.hit", Value: i%2 == 0}, opentracing.Tag{Key: "ratio", Value: 0.25 + float64(i)})
		root.LogFields(otlog.String("event", "retry"), otlog.Int("attempt", 2))
		root.LogFields(otlog.String("message", "slow"))
		child := tr.StartSpan("SELECT orders", opentracing.ChildOf(root.Context()), opentracing.StartTime(t0.Add(3*time.Millisecond)), ext.SpanKindRPCClient,
			opentracing.Tag{Key: "db.system", Value: "mysql"})
		ext.Error.Set(child, true)
		child.FinishWithOptions(opentracing.FinishOptions{FinishTime: t0.Add(7*time.Millisecond + 1500*time.Nanosecond)})
		follow := tr.StartSpan("publish", opentracing.FollowsFrom(child.Context()), opentracing.StartTime(t0.Add(8*time.Millisecond)),
			ext.SpanKindConsumer)
		follow.FinishWithOptions(opentracing.FinishOptions{FinishTime: t0.Add(9 * time.Millisecond)})
		root.FinishWithOptions(opentracing.FinishOptions{FinishTime: t0.Add(10 * time.Millisecond)})
	}
	return c.spans
}

// Send sends spans to url (ferry's /api/traces) with the jaeger client's
// HTTP transport, batchSize spans a request, with headers on each request
// (a token): the transport's error, which says "error from collector: N"
// for a status >= 400.
func Send(url string, headers map[string]string, batchSize int, spans []*jaeger.Span) error {
	t := transport.NewHTTPTransport(url, transport.HTTPHeaders(headers), transport.HTTPBatchSize(batchSize), transport.HTTPTimeout(10*time.Second))
	defer t.Close()
	for _, s := range spans {
		if _, err := t.Append(s); err != nil {
			return err
		}
	}
	_, err := t.Flush()
	return err
}

// Check says how traces (all received, in any order and any number of
// resources) differ from the spans the client sent.
func Check(td []ptrace.Traces, service string, spans []*jaeger.Span) error {
	got := map[pcommon.SpanID]ptrace.Span{}
	res := map[pcommon.SpanID]pcommon.Map{}
	for _, t := range td {
		for i := 0; i < t.ResourceSpans().Len(); i++ {
			rs := t.ResourceSpans().At(i)
			for j := 0; j < rs.ScopeSpans().Len(); j++ {
				ss := rs.ScopeSpans().At(j).Spans()
				for k := 0; k < ss.Len(); k++ {
					got[ss.At(k).SpanID()] = ss.At(k)
					res[ss.At(k).SpanID()] = rs.Resource().Attributes()
				}
			}
		}
	}
	if len(got) != len(spans) {
		return fmt.Errorf("%d spans received, %d sent", len(got), len(spans))
	}
	for _, s := range spans {
		sc := s.SpanContext()
		id := spanID(uint64(sc.SpanID()))
		o, ok := got[id]
		if !ok {
			return fmt.Errorf("span %s not received", sc)
		}
		if err := checkSpan(o, s); err != nil {
			return fmt.Errorf("span %q %s: %w", s.OperationName(), sc, err)
		}
		r := res[id]
		if v, _ := r.Get("service.name"); v.Str() != service {
			return fmt.Errorf("resource service.name %q", v.Str())
		}
		if v, _ := r.Get("deployment"); v.Str() != "canary" {
			return fmt.Errorf("resource deployment (a tracer tag) %q", v.Str())
		}
		if v, ok := r.Get("host.name"); !ok || v.Str() == "" {
			return fmt.Errorf("resource host.name (the client's hostname tag) missing: %v", r.AsRaw())
		}
		if v, _ := r.Get("opencensus.exporterversion"); !strings.HasPrefix(v.Str(), "Jaeger-Go-") {
			return fmt.Errorf("resource opencensus.exporterversion (jaeger.version) %q", v.Str())
		}
	}
	return nil
}

func spanID(v uint64) pcommon.SpanID {
	var b pcommon.SpanID
	binary.BigEndian.PutUint64(b[:], v)
	return b
}

func micros(t time.Time) pcommon.Timestamp { return pcommon.Timestamp(t.UnixMicro() * 1000) }

func checkSpan(o ptrace.Span, s *jaeger.Span) error {
	sc := s.SpanContext()
	var tid pcommon.TraceID
	binary.BigEndian.PutUint64(tid[:8], sc.TraceID().High)
	binary.BigEndian.PutUint64(tid[8:], sc.TraceID().Low)
	if o.TraceID() != tid || sc.TraceID().High == 0 {
		return fmt.Errorf("trace id %s, sent %s", o.TraceID(), sc.TraceID())
	}
	if sc.ParentID() != 0 && o.ParentSpanID() != spanID(uint64(sc.ParentID())) {
		return fmt.Errorf("parent %s, sent %x", o.ParentSpanID(), uint64(sc.ParentID()))
	}
	if sc.ParentID() == 0 && !o.ParentSpanID().IsEmpty() {
		return fmt.Errorf("a root with parent %s", o.ParentSpanID())
	}
	if o.Name() != s.OperationName() {
		return fmt.Errorf("name %q", o.Name())
	}
	// Jaeger carries microseconds: start and duration.
	if o.StartTimestamp() != micros(s.StartTime()) || o.EndTimestamp() != micros(s.StartTime())+pcommon.Timestamp(s.Duration().Microseconds()*1000) {
		return fmt.Errorf("times %d..%d, sent %v + %v", o.StartTimestamp(), o.EndTimestamp(), s.StartTime().UnixMicro(), s.Duration())
	}
	if o.Flags()&1 != 1 {
		return fmt.Errorf("flags %x: not sampled", o.Flags())
	}
	tags := s.Tags()
	kinds := map[any]ptrace.SpanKind{ext.SpanKindRPCServerEnum: ptrace.SpanKindServer, ext.SpanKindRPCClientEnum: ptrace.SpanKindClient, ext.SpanKindConsumerEnum: ptrace.SpanKindConsumer}
	if want := kinds[tags["span.kind"]]; o.Kind() != want {
		return fmt.Errorf("kind %v, span.kind tag %v", o.Kind(), tags["span.kind"])
	}
	if _, ok := o.Attributes().Get("span.kind"); ok {
		return fmt.Errorf("span.kind left as an attribute")
	}
	if e, _ := tags["error"].(bool); e != (o.Status().Code() == ptrace.StatusCodeError) {
		return fmt.Errorf("status %v, error tag %v", o.Status().Code(), tags["error"])
	}
	for k, v := range tags {
		if k == "span.kind" || k == "error" {
			continue
		}
		a, ok := o.Attributes().Get(k)
		if !ok {
			return fmt.Errorf("tag %s missing", k)
		}
		if err := same(a, v); err != nil {
			return fmt.Errorf("tag %s: %w", k, err)
		}
	}
	logs := s.Logs()
	if o.Events().Len() != len(logs) {
		return fmt.Errorf("%d events, %d logs", o.Events().Len(), len(logs))
	}
	for i, l := range logs {
		e := o.Events().At(i)
		if e.Timestamp() != micros(l.Timestamp) {
			return fmt.Errorf("event %d at %d, log at %d µs", i, e.Timestamp(), l.Timestamp.UnixMicro())
		}
		for _, f := range l.Fields {
			if f.Key() == "event" {
				if e.Name() != f.Value() {
					return fmt.Errorf("event %d named %q, its event field %v", i, e.Name(), f.Value())
				}
				continue
			}
			a, ok := e.Attributes().Get(f.Key())
			if !ok {
				return fmt.Errorf("event %d: field %s missing", i, f.Key())
			}
			if err := same(a, f.Value()); err != nil {
				return fmt.Errorf("event %d field %s: %w", i, f.Key(), err)
			}
		}
	}
	// References beyond the parent become links with their type.
	links := 0
	for _, r := range s.References() {
		rc := r.ReferencedContext.(jaeger.SpanContext)
		if r.Type == opentracing.ChildOfRef && rc.SpanID() == sc.ParentID() {
			continue
		}
		l := o.Links().At(links)
		links++
		want := map[opentracing.SpanReferenceType]string{opentracing.ChildOfRef: "child_of", opentracing.FollowsFromRef: "follows_from"}[r.Type]
		if l.SpanID() != spanID(uint64(rc.SpanID())) {
			return fmt.Errorf("link to %s, reference to %x", l.SpanID(), uint64(rc.SpanID()))
		}
		if v, _ := l.Attributes().Get("opentracing.ref_type"); v.Str() != want {
			return fmt.Errorf("link type %q, reference %v", v.Str(), want)
		}
	}
	if o.Links().Len() != links {
		return fmt.Errorf("%d links, %d references besides the parent", o.Links().Len(), links)
	}
	return nil
}

// same: the attribute holds the tag's value, of its type.
func same(a pcommon.Value, v any) error {
	ok := false
	switch v := v.(type) {
	case string:
		ok = a.Type() == pcommon.ValueTypeStr && a.Str() == v
	case bool:
		ok = a.Type() == pcommon.ValueTypeBool && a.Bool() == v
	case int64:
		ok = a.Type() == pcommon.ValueTypeInt && a.Int() == v
	case int:
		ok = a.Type() == pcommon.ValueTypeInt && a.Int() == int64(v)
	case float64:
		ok = a.Type() == pcommon.ValueTypeDouble && a.Double() == v
	default:
		ok = a.AsString() == fmt.Sprint(v)
	}
	if !ok {
		return fmt.Errorf("%v (%v), sent %#v", a.AsRaw(), a.Type(), v)
	}
	return nil
}
