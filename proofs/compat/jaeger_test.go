package compat

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/otlp/jaeger/jaegertest"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestJaegerClient: jaeger-client-go's tracer makes 60 traces of 3 spans
// and its HTTP transport (thrift binary, the sender jaeger clients use for
// a collector) posts them, 25 spans a request, to the real ferry binary's
// /api/traces with a bearer token; every span is read back from the real
// broker as OTLP with the ids, names, microsecond times, kinds, status,
// attributes, events, links and resource the client sent. Without the
// token the transport gets the 401.
func TestJaegerClient(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "jaeger", 3)
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
	url := "http://" + a.OTLP + "/api/traces"
	spans := jaegertest.Spans("checkout", 60)
	if err := jaegertest.Send(url, nil, 25, spans); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without a token: %v", err)
	}
	tok := authtest.IssueClaims(t, token.Claims{App: "shop"})
	t0 := time.Now()
	if err := jaegertest.Send(url, map[string]string{"Authorization": "Bearer " + tok}, 25, spans); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d spans answered in %v", len(spans), time.Since(t0))
	// A record per trace and request: 25-span requests split some traces.
	recs := kafkatest.ConsumeAll(t, broker, topic, 3*time.Second)
	if len(recs) < 60 {
		t.Fatalf("%d records for 60 traces", len(recs))
	}
	var td []ptrace.Traces
	var u ptrace.ProtoUnmarshaler
	for _, r := range recs {
		d, err := u.UnmarshalTraces(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		tid := d.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).TraceID()
		if string(r.Key) != tid.String() {
			t.Fatalf("record key %q, trace %s", r.Key, tid)
		}
		td = append(td, d)
	}
	if err := jaegertest.Check(td, "checkout", spans); err != nil {
		t.Fatal(err)
	}
}
