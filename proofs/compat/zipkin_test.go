package compat

import (
	"bytes"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"github.com/openzipkin/zipkin-go/proto/zipkin_proto3"
	"github.com/openzipkin/zipkin-go/reporter"
	zipkinhttp "github.com/openzipkin/zipkin-go/reporter/http"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/otlp/zipkin/zipkintest"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestZipkinGoReporter: zipkin-go's HTTP reporter, unmodified, sends spans
// in JSON and in proto3 to the real ferry binary's zipkin door
// (/api/v2/spans on the OTLP/HTTP listener, tokens required); the OTLP
// records read back from the real broker hold every span with its ids,
// name, kind, times, endpoints, tags, annotations and status; a reporter
// without the token is refused and nothing of it reaches Kafka.
func TestZipkinGoReporter(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "zipkin", 3)
	a := agenttest.Start(t, ferryBin, `
auth:
  keys: [{id: 1, secret: "`+authtest.Key+`", issue: true}]
`, "exporter.kafka.brokers=["+broker+"]", "exporter.kafka.linger=1ms",
		"receivers.otlp.doors=[zipkin]", "receivers.otlp.traces.topic="+topic,
		"receivers.otlp.auth.mode=required", "receivers.otlp.auth.sources=[authorization]")
	tok := authtest.IssueClaims(t, token.Claims{App: "zipkin-app"})
	url := "http://" + a.OTLP + "/api/v2/spans"
	send := func(ser reporter.SpanSerializer, tok string, spans []zipkinmodel.SpanModel) string {
		var logs bytes.Buffer
		opts := []zipkinhttp.ReporterOption{zipkinhttp.BatchSize(len(spans)), zipkinhttp.BatchInterval(time.Hour),
			zipkinhttp.Logger(log.New(&logs, "", 0)), zipkinhttp.Serializer(ser), zipkinhttp.Timeout(20 * time.Second)}
		if tok != "" {
			opts = append(opts, zipkinhttp.RequestCallback(func(q *http.Request) { q.Header.Set("Authorization", "Bearer "+tok) }))
		}
		rep := zipkinhttp.NewReporter(url, opts...)
		for _, s := range spans {
			rep.Send(s)
		}
		if err := rep.Close(); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	if logs := send(reporter.JSONSerializer{}, "", zipkintest.Spans(5)); !strings.Contains(logs, "401") {
		t.Fatalf("without a token the reporter logged %q", logs)
	}
	want := zipkintest.Spans(60)
	if logs := send(reporter.JSONSerializer{}, tok, want[:30]); logs != "" {
		t.Fatalf("JSON: the reporter logged %q", logs)
	}
	if logs := send(zipkin_proto3.SpanSerializer{}, tok, want[30:]); logs != "" {
		t.Fatalf("proto3: the reporter logged %q", logs)
	}
	// Both requests were answered after Kafka's ack: every span is there
	// once (the default split: a record per partition a request reaches,
	// or per trace until the agent knows the topic's partitions), and none
	// of the refused request's.
	count := func(recs []*kgo.Record) int {
		n := 0
		for _, r := range recs {
			td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			n += td.SpanCount()
		}
		return n
	}
	recs := kafkatest.ConsumeUntil(t, broker, topic, func(rs []*kgo.Record) bool { return count(rs) >= len(want) }, 30*time.Second)
	// The refused request's spans would be there by now too.
	if all := kafkatest.ConsumeAll(t, broker, topic, 2*time.Second); len(all) > len(recs) {
		recs = all
	}
	var values [][]byte
	for _, r := range recs {
		values = append(values, r.Value)
	}
	spans := count(recs)
	if spans != len(want) {
		t.Fatalf("%d spans in %d records in the topic, %d sent with the token (the refused request's spans?)", spans, len(recs), len(want))
	}
	zipkintest.CheckSpans(t, want, values)
	if v := a.Metric(`ferry_receiver_errors_total{reason="unauthenticated",receiver="zipkin"}`); v != 1 {
		t.Fatalf("unauthenticated counted %v", v)
	}
}
