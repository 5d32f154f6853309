package jaegertest

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/jaegertracing/jaeger-idl/model/v1"
	"github.com/jaegertracing/jaeger-idl/proto-gen/api_v2"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// ProtoBatch is what a Jaeger agent or the OpenTelemetry Collector's
// jaeger exporter posts to a collector's gRPC port: a batch whose process
// (service, hostname, jaeger.version and a tracer tag) holds traces × 3
// spans: a server span with tags of every type and two logs; its client
// child (CHILD_OF), which fails (error=true) and links to a span of another
// trace; and a consumer span in the same trace that FOLLOWS_FROM the child.
// 128-bit trace ids, nanosecond times.
func ProtoBatch(service string, traces int) *model.Batch {
	b := &model.Batch{Process: &model.Process{ServiceName: service, Tags: []model.KeyValue{
		model.String("hostname", "web-1"), model.String("jaeger.version", "Go-2.30.0"), model.String("deployment", "canary"),
	}}}
	base := time.Now().Add(-time.Minute).Truncate(time.Second).Add(123456789)
	for i := range traces {
		tid := model.NewTraceID(0xabc0+uint64(i), 0xdef0+uint64(i))
		t0 := base.Add(time.Duration(i) * time.Millisecond)
		id := func(k int) model.SpanID { return model.NewSpanID(uint64(i*3 + k + 1)) }
		root := &model.Span{TraceID: tid, SpanID: id(0), OperationName: fmt.Sprintf("GET /orders/%d", i), Flags: 1,
			StartTime: t0, Duration: 10*time.Millisecond + 3,
			Tags: []model.KeyValue{model.String("span.kind", "server"), model.String("http.method", "GET"),
				model.Int64("order.id", int64(1000+i)), model.Bool("cache.hit", i%2 == 0), model.Float64("ratio", 0.25+float64(i)),
				model.Binary("digest", []byte{1, 2, byte(i)})},
			Logs: []model.Log{
				{Timestamp: t0.Add(time.Millisecond + 7), Fields: []model.KeyValue{model.String("event", "retry"), model.Int64("attempt", 2)}},
				{Timestamp: t0.Add(2 * time.Millisecond), Fields: []model.KeyValue{model.String("message", "slow")}},
			}}
		child := &model.Span{TraceID: tid, SpanID: id(1), OperationName: "SELECT orders", Flags: 1,
			StartTime: t0.Add(3 * time.Millisecond), Duration: 4*time.Millisecond + 1500,
			Tags: []model.KeyValue{model.String("span.kind", "client"), model.String("db.system", "mysql"), model.Bool("error", true)},
			References: []model.SpanRef{
				{RefType: model.ChildOf, TraceID: tid, SpanID: root.SpanID},
				{RefType: model.FollowsFrom, TraceID: model.NewTraceID(1, 2), SpanID: 77},
			}}
		follow := &model.Span{TraceID: tid, SpanID: id(2), OperationName: "publish", Flags: 1,
			StartTime: t0.Add(8 * time.Millisecond), Duration: time.Millisecond,
			Tags:       []model.KeyValue{model.String("span.kind", "consumer")},
			References: []model.SpanRef{{RefType: model.FollowsFrom, TraceID: tid, SpanID: child.SpanID}}}
		b.Spans = append(b.Spans, root, child, follow)
	}
	return b
}

// PostSpans sends b's spans to addr with jaeger-idl's generated client
// (api_v2.NewCollectorServiceClient, what Jaeger agents and the
// Collector's jaeger exporter use), perRequest spans a request, each with
// md as metadata (a token): the first error.
func PostSpans(addr string, md metadata.MD, perRequest int, b *model.Batch, opts ...grpc.DialOption) error {
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		return err
	}
	defer cc.Close()
	c := api_v2.NewCollectorServiceClient(cc)
	chunks := slices.Collect(slices.Chunk(b.Spans, perRequest))
	if len(chunks) == 0 {
		chunks = [][]*model.Span{nil}
	}
	for _, s := range chunks {
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
		_, err := c.PostSpans(ctx, &api_v2.PostSpansRequest{Batch: model.Batch{Process: b.Process, Spans: s}})
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckProto says how traces (all received, in any order and any number
// of resources) differ from the spans of b: every field the translator
// maps (docs/jaeger.md).
func CheckProto(td []ptrace.Traces, b *model.Batch) error {
	got := map[pcommon.SpanID]ptrace.Span{}
	res := map[pcommon.SpanID]pcommon.Map{}
	for _, t := range td {
		for _, rs := range t.ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				if ss.Scope().Name() != "" {
					return fmt.Errorf("scope %q", ss.Scope().Name())
				}
				for _, s := range ss.Spans().All() {
					if _, dup := got[s.SpanID()]; dup {
						return fmt.Errorf("span %s received twice", s.SpanID())
					}
					got[s.SpanID()] = s
					res[s.SpanID()] = rs.Resource().Attributes()
				}
			}
		}
	}
	if len(got) != len(b.Spans) {
		return fmt.Errorf("%d spans received, %d sent", len(got), len(b.Spans))
	}
	wantRes := map[string]any{"service.name": b.Process.ServiceName}
	for _, kv := range b.Process.Tags {
		switch kv.Key {
		case "hostname":
			wantRes["host.name"] = kv.Value()
		case "jaeger.version":
			wantRes["opencensus.exporterversion"] = "Jaeger-" + kv.VStr
		default:
			wantRes[kv.Key] = kv.Value()
		}
	}
	for _, s := range b.Spans {
		o, ok := got[spanID(uint64(s.SpanID))]
		if !ok {
			return fmt.Errorf("span %s not received", s.SpanID)
		}
		if err := checkProtoSpan(o, s); err != nil {
			return fmt.Errorf("span %q %s: %w", s.OperationName, s.SpanID, err)
		}
		if err := sameMap(res[o.SpanID()], wantRes); err != nil {
			return fmt.Errorf("span %s: resource: %w", s.SpanID, err)
		}
	}
	return nil
}

func nanos(t time.Time) pcommon.Timestamp { return pcommon.Timestamp(t.UnixNano()) }

func checkProtoSpan(o ptrace.Span, s *model.Span) error {
	var tid pcommon.TraceID
	binary.BigEndian.PutUint64(tid[:8], s.TraceID.High)
	binary.BigEndian.PutUint64(tid[8:], s.TraceID.Low)
	if o.TraceID() != tid {
		return fmt.Errorf("trace id %s, sent %s", o.TraceID(), s.TraceID)
	}
	if p := s.ParentSpanID(); p != 0 && o.ParentSpanID() != spanID(uint64(p)) || p == 0 && !o.ParentSpanID().IsEmpty() {
		return fmt.Errorf("parent %s, sent %s", o.ParentSpanID(), p)
	}
	if o.Name() != s.OperationName {
		return fmt.Errorf("name %q", o.Name())
	}
	// Nanoseconds: protobuf Timestamps and Durations.
	if o.StartTimestamp() != nanos(s.StartTime) || o.EndTimestamp() != nanos(s.StartTime.Add(s.Duration)) {
		return fmt.Errorf("times %d..%d, sent %v + %v", o.StartTimestamp(), o.EndTimestamp(), s.StartTime.UnixNano(), s.Duration)
	}
	if o.Flags()&1 != uint32(s.Flags&1) {
		return fmt.Errorf("flags %x, sent %x", o.Flags(), s.Flags)
	}
	want := map[string]any{}
	kind, failed := "", false
	for _, kv := range s.Tags {
		switch kv.Key {
		case "span.kind":
			kind = kv.VStr
		case "error":
			failed = kv.VBool
		default:
			want[kv.Key] = kv.Value()
		}
	}
	kinds := map[string]ptrace.SpanKind{"server": ptrace.SpanKindServer, "client": ptrace.SpanKindClient, "consumer": ptrace.SpanKindConsumer, "producer": ptrace.SpanKindProducer}
	if o.Kind() != kinds[kind] {
		return fmt.Errorf("kind %v, span.kind tag %q", o.Kind(), kind)
	}
	if failed != (o.Status().Code() == ptrace.StatusCodeError) {
		return fmt.Errorf("status %v, error tag %v", o.Status().Code(), failed)
	}
	if err := sameMap(o.Attributes(), want); err != nil {
		return fmt.Errorf("attributes: %w", err)
	}
	if o.Events().Len() != len(s.Logs) {
		return fmt.Errorf("%d events, %d logs", o.Events().Len(), len(s.Logs))
	}
	for i, l := range s.Logs {
		e := o.Events().At(i)
		if e.Timestamp() != nanos(l.Timestamp) {
			return fmt.Errorf("event %d at %d, log at %d", i, e.Timestamp(), l.Timestamp.UnixNano())
		}
		want := map[string]any{}
		name := ""
		for _, f := range l.Fields {
			if f.Key == "event" {
				name = f.VStr
				continue
			}
			want[f.Key] = f.Value()
		}
		if e.Name() != name {
			return fmt.Errorf("event %d named %q, its event field %q", i, e.Name(), name)
		}
		if err := sameMap(e.Attributes(), want); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	// References besides the parent's CHILD_OF become links with their type.
	links := 0
	for _, r := range s.References {
		if r.RefType == model.ChildOf && r.SpanID == s.ParentSpanID() {
			continue
		}
		if links >= o.Links().Len() {
			return fmt.Errorf("%d links, more references besides the parent", o.Links().Len())
		}
		l := o.Links().At(links)
		links++
		var lt pcommon.TraceID
		binary.BigEndian.PutUint64(lt[:8], r.TraceID.High)
		binary.BigEndian.PutUint64(lt[8:], r.TraceID.Low)
		if l.TraceID() != lt || l.SpanID() != spanID(uint64(r.SpanID)) {
			return fmt.Errorf("link to %s/%s, reference to %s/%s", l.TraceID(), l.SpanID(), r.TraceID, r.SpanID)
		}
		typ := map[model.SpanRefType]string{model.ChildOf: "child_of", model.FollowsFrom: "follows_from"}[r.RefType]
		if err := sameMap(l.Attributes(), map[string]any{"opentracing.ref_type": typ}); err != nil {
			return fmt.Errorf("link %d: %w", links-1, err)
		}
	}
	if o.Links().Len() != links {
		return fmt.Errorf("%d links, %d references besides the parent", o.Links().Len(), links)
	}
	return nil
}

// sameMap: m holds exactly want, each value of its type.
func sameMap(m pcommon.Map, want map[string]any) error {
	if m.Len() != len(want) {
		return fmt.Errorf("%v, want %v", m.AsRaw(), want)
	}
	for k, v := range want {
		a, ok := m.Get(k)
		if !ok {
			return fmt.Errorf("%s missing from %v", k, m.AsRaw())
		}
		if b, isBytes := v.([]byte); isBytes {
			if a.Type() != pcommon.ValueTypeBytes || string(a.Bytes().AsRaw()) != string(b) {
				return fmt.Errorf("%s: %v, sent %v", k, a.AsRaw(), b)
			}
			continue
		}
		if err := same(a, v); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}
