package compat

import (
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/otlp/jaeger/jaegertest"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestJaegerGRPCClient: jaeger-idl's generated gRPC client
// (api_v2.CollectorServiceClient, what Jaeger agents and the OpenTelemetry
// Collector's jaeger exporter use) posts 60 traces of 3 spans, 25 spans a
// request, to the real ferry binary's Jaeger gRPC listener
// (receivers.otlp.jaeger_grpc_endpoint) and as many to its OTLP gRPC
// listener, with a bearer token; every span is read back from the real
// broker as OTLP with the ids, names, nanosecond times, kinds, status,
// attributes, events, links and resource sent, each record keyed by its
// trace id. Without the token: UNAUTHENTICATED.
func TestJaegerGRPCClient(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "jaegergrpc", 3)
	a := agenttest.Start(t, ferryBin, fmt.Sprintf(`
exporter:
  kafka:
    brokers: [%s]
    linger: 1ms
receivers:
  otlp:
    doors: [jaeger]
    auth: {mode: required, sources: [authorization]}
    traces: {topic: %s, encoding: otlp_proto, partition: trace_id}
auth:
  keys: [{id: 1, secret: "%s", issue: true}]
`, broker, topic, authtest.Key))
	tok := authtest.IssueClaims(t, token.Claims{App: "shop"})
	for _, addr := range []string{a.JaegerGRPC, a.GRPC} {
		b := jaegertest.ProtoBatch("checkout-"+addr, 60)
		if err := jaegertest.PostSpans(addr, nil, 25, b); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s without a token: %v", addr, err)
		}
		t0 := time.Now()
		if err := jaegertest.PostSpans(addr, metadata.Pairs("authorization", "Bearer "+tok), 25, b); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		t.Logf("%s: %d spans answered in %v", addr, len(b.Spans), time.Since(t0))
		var td []ptrace.Traces
		var u ptrace.ProtoUnmarshaler
		for _, r := range kafkatest.ConsumeAll(t, broker, topic, 3*time.Second) {
			d, err := u.UnmarshalTraces(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if name, _ := d.ResourceSpans().At(0).Resource().Attributes().Get("service.name"); name.Str() != b.Process.ServiceName {
				continue // the other listener's
			}
			tid := d.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).TraceID()
			if string(r.Key) != tid.String() {
				t.Fatalf("record key %q, trace %s", r.Key, tid)
			}
			td = append(td, d)
		}
		// A record per trace and request: 25-span requests split some traces.
		if len(td) < 60 {
			t.Fatalf("%s: %d records for 60 traces", addr, len(td))
		}
		if err := jaegertest.CheckProto(td, b); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
	}
}
