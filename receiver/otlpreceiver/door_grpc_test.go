package otlpreceiver

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/telemetry"
)

// rawBytes is a client codec that sends a message's bytes as they are.
type rawBytes struct{}

func (rawBytes) Name() string { return "proto" }
func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawBytes) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

const postSpans = "/jaeger.api_v2.CollectorService/PostSpans"

// postRaw sends req's bytes to PostSpans at addr.
func postRaw(t *testing.T, addr string, req []byte) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	return cc.Invoke(context.Background(), postSpans, req, new([]byte), grpc.ForceCodecV2(rawBytes{}))
}

func field(num protowire.Number, msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, m)
	}
	return out
}

// jaegerSpan is a span of a 16-byte trace id, an 8-byte span id and
// extra fields.
func jaegerSpan(id byte, extra ...byte) []byte {
	s := field(1, append(make([]byte, 15), 1))
	s = append(s, field(2, append(make([]byte, 7), id))...)
	return append(s, extra...)
}

// jaegerRequest is a PostSpansRequest of a batch whose process is service
// and of spans.
func jaegerRequest(service string, spans ...[]byte) []byte {
	b := field(2, field(1, []byte(service)))
	return field(1, append(b, field(1, spans...)...))
}

// emptyTags is n empty KeyValues as a span's tags (2 bytes each).
func emptyTags(n int) []byte { return []byte(strings.Repeat("\x42\x00", n)) }

func jaegerConfig() Config {
	cfg := testConfig()
	cfg.Doors = []string{"jaeger"}
	cfg.JaegerGRPCEndpoint = "127.0.0.1:0"
	return cfg
}

// TestJaegerGRPCListeners: with the jaeger door open, Jaeger's service is
// served on grpc.listen and on jaeger_grpc_endpoint, which serves nothing
// else and is listed as jaeger_grpc; requests count under
// receiver="jaeger_grpc". Without the door neither serves it (OTLP's
// listener answers UNIMPLEMENTED); without the endpoint it is on
// grpc.listen alone.
func TestJaegerGRPCListeners(t *testing.T) {
	set := telemetry.TestSettings()
	sink := &consumertest.Sink{}
	r := startWith(t, jaegerConfig(), set, sink, nil)
	req := jaegerRequest("svc", jaegerSpan(1), jaegerSpan(2))
	for _, addr := range []string{r.GRPCAddr(), r.JaegerGRPCAddr()} {
		if err := postRaw(t, addr, req); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
	}
	if n := len(sink.Records()); n != 2 {
		t.Fatalf("%d records, want a trace's from each listener", n)
	}
	if l := r.Listening(); len(l) != 6 || l[4] != "jaeger_grpc" || l[5] != r.JaegerGRPCAddr() {
		t.Fatalf("listening %v", l)
	}
	m := receivermetrics.New(set.Registry, "jaeger_grpc")
	if v := testutil.ToFloat64(m.Records("spans")); v != 2 {
		t.Fatalf("jaeger_grpc records: %v", v)
	}
	cc, _ := grpc.NewClient(r.JaegerGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	if err := cc.Invoke(context.Background(), "/opentelemetry.proto.collector.trace.v1.TraceService/Export", []byte{}, new([]byte), grpc.ForceCodecV2(rawBytes{})); status.Code(err) != codes.Unimplemented {
		t.Fatalf("OTLP on the Jaeger listener: %v", err)
	}

	off := testConfig()
	off.JaegerGRPCEndpoint = "127.0.0.1:0"
	r2 := start(t, off, &consumertest.Sink{})
	if r2.JaegerGRPCAddr() != "" || len(r2.Listening()) != 4 {
		t.Fatalf("without the door: %q %v", r2.JaegerGRPCAddr(), r2.Listening())
	}
	if err := postRaw(t, r2.GRPCAddr(), req); status.Code(err) != codes.Unimplemented {
		t.Fatalf("without the door: %v", err)
	}

	only := jaegerConfig()
	only.JaegerGRPCEndpoint = ""
	r3 := start(t, only, &consumertest.Sink{})
	if r3.JaegerGRPCAddr() != "" {
		t.Fatalf("without the endpoint: %q", r3.JaegerGRPCAddr())
	}
	if err := postRaw(t, r3.GRPCAddr(), req); err != nil {
		t.Fatal(err)
	}
}

// TestJaegerGRPCConfig: the endpoint may not be grpc.listen (the service
// is there already), and is used only with the door open.
func TestJaegerGRPCConfig(t *testing.T) {
	cfg := jaegerConfig()
	cfg.GRPC.Listen, cfg.JaegerGRPCEndpoint = "127.0.0.1:4317", "127.0.0.1:4317"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "jaeger_grpc_endpoint") {
		t.Fatalf("endpoint = grpc.listen: %v", err)
	}
	cfg.Doors = nil
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the door closed: %v", err)
	}
}

// TestJaegerGRPCAnswers: a malformed message is INVALID_ARGUMENT, a span
// past the walk's bounds or a request past max_items_per_request
// RESOURCE_EXHAUSTED without RetryInfo (not retried), each counted by
// reason under jaeger_grpc.
func TestJaegerGRPCAnswers(t *testing.T) {
	set := telemetry.TestSettings()
	cfg := jaegerConfig()
	cfg.MaxItems = 3
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, set, sink, nil)
	addr := r.JaegerGRPCAddr()
	m := receivermetrics.New(set.Registry, "jaeger_grpc")
	for _, c := range []struct {
		name, reason string
		req          []byte
		code         codes.Code
		msg          string
	}{
		{"garbage", "invalid_payload", []byte("\x0a\xff\xff\xff\xff\x07garbage"), codes.InvalidArgument, "not a jaeger.api_v2.PostSpansRequest"},
		{"a span id of 3 bytes", "invalid_payload", jaegerRequest("s", field(2, []byte{1, 2, 3})), codes.InvalidArgument, "span_id of 3 bytes"},
		{"10,001 tags", "request_too_large", jaegerRequest("s", jaegerSpan(1, emptyTags(10001)...)), codes.ResourceExhausted, "more than 10000 tags"},
		{"4 spans", "too_many_items", jaegerRequest("s", jaegerSpan(1), jaegerSpan(2), jaegerSpan(3), jaegerSpan(4)), codes.ResourceExhausted, "max_items_per_request"},
	} {
		before := testutil.ToFloat64(m.Errors(c.reason))
		err := postRaw(t, addr, c.req)
		st := status.Convert(err)
		if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) || len(st.Details()) != 0 {
			t.Errorf("%s: %v (details %v)", c.name, err, st.Details())
		}
		if v := testutil.ToFloat64(m.Errors(c.reason)) - before; v != 1 {
			t.Errorf("%s: errors{reason=%s} went up by %v", c.name, c.reason, v)
		}
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records from refused requests", n)
	}
}

// TestJaegerGRPCReservesConversion: before converting, a request reserves
// its OTLP buffer and the walk's Peak (the largest chunk of spans decoded
// and translated at once) out of its read's lease, and whatever the lease
// lacks from the budget: a request whose chunk does not fit beside the
// other requests' memory is RESOURCE_EXHAUSTED with RetryInfo (retried
// later), one that could never fit in the budget without it (not to be
// retried); every reservation is given back.
func TestJaegerGRPCReservesConversion(t *testing.T) {
	cfg := jaegerConfig()
	b := budget.New(16 << 20)
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Bodies: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	addr := r.JaegerGRPCAddr()
	// A span of 10,000 empty tags: 20 KB, whose decoding and translation
	// the walk counts at 320 bytes a tag, 3.2 MB.
	flood := jaegerRequest("s", jaegerSpan(1, emptyTags(10000)...))
	waitUsed := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for b.Used() != want {
			if time.Now().After(deadline) {
				t.Fatalf("budget holds %d bytes, want %d", b.Used(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := postRaw(t, addr, flood); err != nil {
		t.Fatalf("with room: %v", err)
	}
	waitUsed(0)
	// Room for the read (twice max_request_bytes), not for the chunk.
	taken := b.Limit() - 2*int64(cfg.MaxRequestBytes) - 1<<20
	b.Reserve(taken, b.Limit())
	st := status.Convert(postRaw(t, addr, flood))
	if st.Code() != codes.ResourceExhausted || len(st.Details()) == 0 {
		t.Fatalf("no room for the chunk: %v (details %v), want RESOURCE_EXHAUSTED with RetryInfo", st.Err(), st.Details())
	}
	// A small request fits in its read's lease.
	if err := postRaw(t, addr, jaegerRequest("s", jaegerSpan(1))); err != nil {
		t.Fatalf("a small request: %v", err)
	}
	b.Release(taken)
	waitUsed(0)

	small := jaegerConfig()
	b2 := budget.New(2 << 20)
	r2, err := New(small, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Bodies: b2})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Shutdown(context.Background()) })
	st = status.Convert(postRaw(t, r2.JaegerGRPCAddr(), flood))
	if st.Code() != codes.ResourceExhausted || len(st.Details()) != 0 || !strings.Contains(st.Message(), "more than queue.memory_limit") {
		t.Fatalf("a chunk larger than the budget: %v (details %v), want RESOURCE_EXHAUSTED without RetryInfo", st.Err(), st.Details())
	}
	if b2.Used() != 0 {
		t.Fatalf("budget holds %d bytes", b2.Used())
	}
}

// TestJaegerGRPCFloodCostsLittle: a 4 MiB message of empty tags (2 bytes
// each: gogo-protobuf's decoder would make a 120-byte struct of each, some
// 1.4 GB) is refused by the walk; the whole exchange, client included,
// allocates a few times the message (gRPC's frames, ferry's copy).
func TestJaegerGRPCFloodCostsLittle(t *testing.T) {
	cfg := jaegerConfig()
	cfg.MaxRequestBytes = 8 << 20
	cfg.MaxExpandedBytes = 8 << 20
	r := start(t, cfg, &consumertest.Sink{})
	req := jaegerRequest("s", jaegerSpan(1, emptyTags(2<<20)...))
	cc, _ := grpc.NewClient(r.JaegerGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	post := func() error {
		return cc.Invoke(context.Background(), postSpans, req, new([]byte), grpc.ForceCodecV2(rawBytes{}))
	}
	_ = post() // the connection and gRPC's pools
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	err := post()
	runtime.ReadMemStats(&b)
	alloc := b.TotalAlloc - a.TotalAlloc
	t.Logf("%d bytes of empty tags: %v; %d bytes allocated (%.1f× the message)", len(req), err, alloc, float64(alloc)/float64(len(req)))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "more than 10000 tags") {
		t.Fatal(err)
	}
	if alloc > 8*uint64(len(req)) {
		t.Fatalf("%d bytes allocated for a %d-byte message", alloc, len(req))
	}
}

// TestJaegerGRPCTapCountsJaeger: a PostSpans refused when it arrives (no
// room in memory for its stream) is counted under receiver="jaeger_grpc",
// on either listener, not as an OTLP request.
func TestJaegerGRPCTapCountsJaeger(t *testing.T) {
	set := telemetry.TestSettings()
	b := budget.New(16 << 20)
	r, err := New(jaegerConfig(), receiver.Env{Set: set, Next: &consumertest.Sink{}, Bodies: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	b.Reserve(b.Limit(), b.Limit())
	jm := receivermetrics.New(set.Registry, "jaeger_grpc")
	om := receivermetrics.New(set.Registry, "otlp_grpc")
	for _, addr := range []string{r.JaegerGRPCAddr(), r.GRPCAddr()} {
		st := status.Convert(postRaw(t, addr, jaegerRequest("s", jaegerSpan(1))))
		if st.Code() != codes.ResourceExhausted || len(st.Details()) == 0 {
			t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED with RetryInfo", addr, st.Err())
		}
	}
	if j, o := testutil.ToFloat64(jm.Errors("queue_full")), testutil.ToFloat64(om.Errors("queue_full")); j != 2 || o != 0 {
		t.Fatalf("refused at arrival: jaeger_grpc %v, otlp_grpc %v; want 2, 0", j, o)
	}
}

// TestJaegerGRPCCountsRepeatedKeys: tags repeating a key fold into one
// OTLP attribute (the last value); the gRPC door counts each folded tag in
// ferry_door_dropped_items_total{receiver="jaeger_grpc",reason="duplicate_key"},
// as the HTTP doors do, and still delivers the span.
func TestJaegerGRPCCountsRepeatedKeys(t *testing.T) {
	set := telemetry.TestSettings()
	sink := &consumertest.Sink{}
	r := startWith(t, jaegerConfig(), set, sink, nil)
	kv := func(k, v string) []byte { return append(field(1, []byte(k)), field(3, []byte(v))...) }
	span := jaegerSpan(1, field(8, kv("a", "1"), kv("b", "2"), kv("a", "3"), kv("a", "4"))...)
	if err := postRaw(t, r.JaegerGRPCAddr(), jaegerRequest("s", span)); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records, want the span's 1", n)
	}
	got := testutil.ToFloat64(droppedItems(set.Registry).WithLabelValues("jaeger_grpc", "duplicate_key"))
	if got != 2 {
		t.Fatalf("duplicate_key dropped %v, want 2 (the first two values of a)", got)
	}
}
