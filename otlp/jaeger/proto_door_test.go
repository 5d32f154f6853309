package jaeger_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jaegertracing/jaeger-idl/model/v1"
	"github.com/jaegertracing/jaeger-idl/proto-gen/api_v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/otlp/jaeger/jaegertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
)

func grpcConfig() otlpreceiver.Config {
	c := receiverConfig()
	c.GRPC.Enabled, c.GRPC.Listen = true, "127.0.0.1:0"
	c.JaegerGRPCEndpoint = "127.0.0.1:0"
	return c
}

func codeOf(err error) codes.Code { return status.Code(err) }

// TestJaegerGRPCThroughReceiver: jaeger-idl's generated gRPC client
// (api_v2.NewCollectorServiceClient, what Jaeger agents and the
// OpenTelemetry Collector's jaeger exporter use) posts batches to the real
// OTLP receiver's Jaeger service, on the OTLP gRPC listener and on its own,
// behind required tokens: without a token, or with a forged one,
// UNAUTHENTICATED and nothing in the sink; with a bearer token (or
// x-ferry-token) every span arrives on the traces topic as OTLP with the
// ids, names, nanosecond times, kinds, status, attributes, events, links and
// resource sent.
func TestJaegerGRPCThroughReceiver(t *testing.T) {
	checker, issue := authtest.New(t)
	cfg := grpcConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "metadata"}}
	r, sink := startReceiver(t, cfg, &receiver.Prechecks{Checker: checker})
	b := jaegertest.ProtoBatch("checkout", 20)
	tok := issue("shop")
	for _, addr := range []string{r.JaegerGRPCAddr(), r.GRPCAddr()} {
		sink.Reset()
		if err := jaegertest.PostSpans(addr, nil, 100, b); codeOf(err) != codes.Unauthenticated {
			t.Fatalf("%s, no token: %v", addr, err)
		}
		if err := jaegertest.PostSpans(addr, metadata.Pairs("authorization", "Bearer "+authtest.Forge(tok)), 100, b); codeOf(err) != codes.Unauthenticated {
			t.Fatalf("%s, forged token: %v", addr, err)
		}
		if n := len(sink.Records()); n != 0 {
			t.Fatalf("%d records from refused requests", n)
		}
		// 7 spans a request: requests of several traces and parts of traces.
		if err := jaegertest.PostSpans(addr, metadata.Pairs("authorization", "Bearer "+tok), 7, b); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if err := jaegertest.CheckProto(received(t, sink), b); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		sink.Reset()
		if err := jaegertest.PostSpans(addr, metadata.Pairs("x-ferry-token", tok), 100, b); err != nil {
			t.Fatal(err)
		}
		if err := jaegertest.CheckProto(received(t, sink), b); err != nil {
			t.Fatalf("%s, x-ferry-token: %v", addr, err)
		}
	}
	// The Jaeger listener serves Jaeger's service alone.
	cc, _ := grpc.NewClient(r.JaegerGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	err := cc.Invoke(context.Background(), "/opentelemetry.proto.collector.trace.v1.TraceService/Export", &api_v2.PostSpansRequest{}, &api_v2.PostSpansResponse{})
	if codeOf(err) != codes.Unimplemented {
		t.Fatalf("OTLP on the Jaeger listener: %v", err)
	}
}

// TestJaegerGRPCRefusals: a message that is not a PostSpansRequest is
// INVALID_ARGUMENT naming the problem; a span of 20,000 empty tags (the
// walk's bound is 10,000) and more spans than max_items_per_request are
// RESOURCE_EXHAUSTED without RetryInfo (not to be retried); none reaches
// the sink, and the receiver serves on.
func TestJaegerGRPCRefusals(t *testing.T) {
	cfg := grpcConfig()
	cfg.MaxItems = 10
	r, sink := startReceiver(t, cfg, nil)
	cc, _ := grpc.NewClient(r.JaegerGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	raw := func(b []byte) error {
		return cc.Invoke(context.Background(), "/jaeger.api_v2.CollectorService/PostSpans", b, new([]byte), grpc.ForceCodecV2(bytesCodec{}))
	}
	if err := raw([]byte("not a protobuf at all")); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not a jaeger.api_v2.PostSpansRequest") {
		t.Fatalf("garbage: %v", err)
	}
	flood := []byte(strings.Repeat("\x42\x00", 20000))
	span := append([]byte{0x0a}, varint(len(flood))...)
	span = append(span, flood...)
	req := append([]byte{0x0a}, varint(len(span))...)
	req = append(req, span...)
	if err := raw(req); codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than 10000 tags") || len(status.Convert(err).Details()) != 0 {
		t.Fatalf("tag flood: %v", err)
	}
	err := jaegertest.PostSpans(r.JaegerGRPCAddr(), nil, 100, jaegertest.ProtoBatch("svc", 4)) // 12 spans
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_items_per_request") || len(status.Convert(err).Details()) != 0 {
		t.Fatalf("12 spans, max_items_per_request 10: %v", err)
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records from refused requests", n)
	}
	b := jaegertest.ProtoBatch("svc", 3)
	if err := jaegertest.PostSpans(r.JaegerGRPCAddr(), nil, 100, b); err != nil {
		t.Fatalf("9 spans: %v", err)
	}
	if err := jaegertest.CheckProto(received(t, sink), b); err != nil {
		t.Fatal(err)
	}
	// An empty batch is accepted, as Jaeger's collector does.
	if err := jaegertest.PostSpans(r.JaegerGRPCAddr(), nil, 1, &model.Batch{Process: &model.Process{ServiceName: "idle"}}); err != nil {
		t.Fatalf("no spans: %v", err)
	}
}

func varint(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// bytesCodec sends a message's bytes as they are.
type bytesCodec struct{}

func (bytesCodec) Name() string { return "proto" }
func (bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (bytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
