// Package otelsdk tests ferry against the OpenTelemetry Go SDK's own OTLP
// exporters. It is a module of its own so that the SDK (and its
// dependencies) stay out of the agent's go.mod: the agent's requirements
// list only what it runs.
package otelsdk

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/credentials"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/pipeline"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/testcerts"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/telemetry"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }

// startAgent runs the whole agent in this process on free ports.
func startAgent(t *testing.T, brokers string, sets ...string) *pipeline.Pipeline {
	t.Helper()
	all := append([]string{
		"receivers.http.listen=127.0.0.1:0", "telemetry.admin.listen=127.0.0.1:0",
		"receivers.otlp.http.listen=127.0.0.1:0", "receivers.otlp.grpc.listen=127.0.0.1:0",
		"receivers.local.enabled=false",
		"exporter.kafka.brokers=[" + brokers + "]", "exporter.kafka.health_check_interval=200ms",
		"exporter.kafka.dial_timeout=1s", "shutdown_timeout=20s",
	}, sets...)
	cfg, err := config.Parse(nil, all)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pipeline.New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	return p
}

// TestOpenTelemetrySDKExporters: the OpenTelemetry Go SDK's own OTLP
// exporters (HTTP and gRPC, traces, metrics and logs) send to ferry; what
// lands in Kafka is decoded and compared item by item with what was sent.
func TestOpenTelemetrySDKExporters(t *testing.T) {
	brokers := kafkatest.Shared(t)
	spans := kafkatest.NewTopic(t, brokers, "it-otlp-spans", 3)
	metrics := kafkatest.NewTopic(t, brokers, "it-otlp-metrics", 3)
	logs := kafkatest.NewTopic(t, brokers, "it-otlp-logs", 3)
	p := startAgent(t, brokers,
		"receivers.otlp.traces.topic="+spans, "receivers.otlp.metrics.topic="+metrics,
		"receivers.otlp.logs.topic="+logs, "receivers.otlp.logs.encoding=flat_json")
	httpAddr, grpcAddr := p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr(), p.Receiver("otlp").(*otlpreceiver.Receiver).GRPCAddr()
	ctx := context.Background()
	const nSpans, nLogs = 40, 25

	for _, transport := range []string{"http", "grpc"} {
		res := resource.NewSchemaless(attribute.String("service.name", "svc-"+transport))

		// Traces: nSpans spans in nSpans/4 traces of 4 spans.
		var texp sdktrace.SpanExporter
		var err error
		if transport == "http" {
			texp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(httpAddr), otlptracehttp.WithInsecure())
		} else {
			texp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(grpcAddr), otlptracegrpc.WithInsecure(), otlptracegrpc.WithCompressor("gzip"))
		}
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(texp, sdktrace.WithMaxExportBatchSize(16)), sdktrace.WithResource(res))
		tr := tp.Tracer("it")
		for i := 0; i < nSpans/4; i++ {
			rctx, root := tr.Start(ctx, fmt.Sprintf("%s-root-%d", transport, i))
			for j := 0; j < 3; j++ {
				_, child := tr.Start(rctx, fmt.Sprintf("%s-child-%d-%d", transport, i, j))
				child.SetAttributes(attribute.Int("i", i), attribute.Int("j", j))
				child.End()
			}
			root.End()
		}
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatalf("%s traces: %v", transport, err)
		}

		// Metrics: a counter and a histogram.
		var mexp sdkmetric.Exporter
		if transport == "http" {
			mexp, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint(httpAddr), otlpmetrichttp.WithInsecure())
		} else {
			mexp, err = otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpoint(grpcAddr), otlpmetricgrpc.WithInsecure())
		}
		if err != nil {
			t.Fatal(err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)), sdkmetric.WithResource(res))
		meter := mp.Meter("it")
		cnt, _ := meter.Int64Counter("it.requests")
		cnt.Add(ctx, 5)
		cnt.Add(ctx, 7)
		hist, _ := meter.Float64Histogram("it.latency")
		for _, v := range []float64{1, 2, 3} {
			hist.Record(ctx, v)
		}
		if err := mp.Shutdown(ctx); err != nil {
			t.Fatalf("%s metrics: %v", transport, err)
		}

		// Logs.
		var lexp sdklog.Exporter
		if transport == "http" {
			lexp, err = otlploghttp.New(ctx, otlploghttp.WithEndpoint(httpAddr), otlploghttp.WithInsecure())
		} else {
			lexp, err = otlploggrpc.New(ctx, otlploggrpc.WithEndpoint(grpcAddr), otlploggrpc.WithInsecure())
		}
		if err != nil {
			t.Fatal(err)
		}
		lp := sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(lexp)), sdklog.WithResource(res))
		lg := lp.Logger("it")
		for i := 0; i < nLogs; i++ {
			var r otellog.Record
			r.SetBody(attribute.StringValue(fmt.Sprintf("%s-log-%d", transport, i)))
			r.SetSeverity(otellog.SeverityWarn)
			r.AddAttributes(attribute.Int("n", i))
			lg.Emit(ctx, r)
		}
		if err := lp.Shutdown(ctx); err != nil {
			t.Fatalf("%s logs: %v", transport, err)
		}
	}

	// Spans: every span exactly once, on the partition a record keyed by
	// its trace id goes to (the default, trace_partition: a record per
	// partition a request reaches, without a key; a record per trace keyed
	// by its id until the agent knows the topic's partitions). Every
	// request was answered after Kafka's ack, so all of them are there.
	recs := kafkatest.ConsumeUntil(t, brokers, spans, func(rs []*kgo.Record) bool {
		n := 0
		for _, r := range rs {
			if td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(r.Value); err == nil {
				n += td.SpanCount()
			}
		}
		return n >= 2*nSpans
	}, 30*time.Second)
	seen := map[string]bool{}
	perService := map[string]int{}
	for _, r := range recs {
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(r.Value)
		if err != nil {
			t.Fatalf("span record is not TracesData: %v", err)
		}
		for i := 0; i < td.ResourceSpans().Len(); i++ {
			rs := td.ResourceSpans().At(i)
			svc, _ := rs.Resource().Attributes().Get("service.name")
			for j := 0; j < rs.ScopeSpans().Len(); j++ {
				sps := rs.ScopeSpans().At(j).Spans()
				for k := 0; k < sps.Len(); k++ {
					sp := sps.At(k)
					tid := sp.TraceID()
					key := []byte(hex.EncodeToString(tid[:]))
					if r.Key != nil && string(r.Key) != string(key) {
						t.Fatalf("span of trace %x in a record keyed %s", tid, r.Key)
					}
					if want := kgo.StickyKeyPartitioner(nil).ForTopic(spans).Partition(&kgo.Record{Key: key}, 3); int32(want) != r.Partition {
						t.Fatalf("span of trace %x on partition %d, its trace id's key goes to %d", tid, r.Partition, want)
					}
					id := sp.SpanID()
					sid := hex.EncodeToString(id[:])
					if seen[sid] {
						t.Fatalf("span %s twice", sid)
					}
					seen[sid] = true
					perService[svc.Str()]++
					if sp.ParentSpanID().IsEmpty() == false {
						if v, ok := sp.Attributes().Get("j"); !ok || v.Int() > 2 {
							t.Fatalf("child span attributes %v", sp.Attributes().AsRaw())
						}
					}
				}
			}
		}
	}
	if perService["svc-http"] != nSpans || perService["svc-grpc"] != nSpans {
		t.Fatalf("spans per service %v, want %d each", perService, nSpans)
	}

	// Metrics: the counter's sum and the histogram's count and sum, per transport.
	mrecs := kafkatest.Consume(t, brokers, metrics, 2, 30*time.Second)
	found := map[string]string{}
	for _, r := range mrecs {
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < md.ResourceMetrics().Len(); i++ {
			rm := md.ResourceMetrics().At(i)
			svc, _ := rm.Resource().Attributes().Get("service.name")
			for j := 0; j < rm.ScopeMetrics().Len(); j++ {
				ms := rm.ScopeMetrics().At(j).Metrics()
				for k := 0; k < ms.Len(); k++ {
					m := ms.At(k)
					switch m.Name() {
					case "it.requests":
						found[svc.Str()+"/requests"] = fmt.Sprint(m.Sum().DataPoints().At(0).IntValue())
					case "it.latency":
						dp := m.Histogram().DataPoints().At(0)
						found[svc.Str()+"/latency"] = fmt.Sprintf("%d/%g", dp.Count(), dp.Sum())
					}
				}
			}
		}
	}
	for _, svc := range []string{"svc-http", "svc-grpc"} {
		if found[svc+"/requests"] != "12" || found[svc+"/latency"] != "3/6" {
			t.Fatalf("metrics %v", found)
		}
	}

	// Logs (flat_json): every body once, with its attribute and severity.
	lrecs := kafkatest.Consume(t, brokers, logs, 2*nLogs, 30*time.Second)
	bodies := map[string]bool{}
	for _, r := range lrecs {
		var o struct {
			Body           string
			SeverityNumber int `json:"severity_number"`
			Attributes     map[string]any
			Resource       map[string]any
		}
		if err := json.Unmarshal(r.Value, &o); err != nil {
			t.Fatal(err)
		}
		if bodies[o.Body] || o.SeverityNumber != int(otellog.SeverityWarn) || o.Attributes["n"] == nil || o.Resource["service.name"] == nil {
			t.Fatalf("log %s", r.Value)
		}
		bodies[o.Body] = true
	}
	if len(bodies) != 2*nLogs {
		t.Fatalf("%d distinct log bodies, want %d", len(bodies), 2*nLogs)
	}
}

// TestOpenTelemetrySDKOverTLS: the SDK's trace exporters reach ferry's
// OTLP/HTTP and OTLP/gRPC listeners over TLS (gRPC with a client
// certificate, which that listener requires); every span lands in Kafka.
func TestOpenTelemetrySDKOverTLS(t *testing.T) {
	brokers := kafkatest.Shared(t)
	spans := kafkatest.NewTopic(t, brokers, "it-otlp-tls", 1)
	certs := testcerts.New(t)
	p := startAgent(t, brokers, "receivers.otlp.traces.topic="+spans, "receivers.otlp.traces.encoding=flat_json",
		"receivers.otlp.http.tls.cert_file="+certs.ServerCert, "receivers.otlp.http.tls.key_file="+certs.ServerKey,
		"receivers.otlp.grpc.tls.cert_file="+certs.ServerCert, "receivers.otlp.grpc.tls.key_file="+certs.ServerKey,
		"receivers.otlp.grpc.tls.client_ca_file="+certs.CA)
	ctx := context.Background()
	const n = 12
	for _, transport := range []string{"http", "grpc"} {
		var exp sdktrace.SpanExporter
		var err error
		if transport == "http" {
			exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr()), otlptracehttp.WithTLSClientConfig(certs.Client(false)))
		} else {
			exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(p.Receiver("otlp").(*otlpreceiver.Receiver).GRPCAddr()), otlptracegrpc.WithTLSCredentials(credentials.NewTLS(certs.Client(true))))
		}
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		for i := 0; i < n; i++ {
			_, sp := tp.Tracer("tls").Start(ctx, fmt.Sprintf("%s-%d", transport, i))
			sp.End()
		}
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatalf("%s over TLS: %v", transport, err)
		}
	}
	got := map[string]int{}
	for _, r := range kafkatest.Consume(t, brokers, spans, 2*n, 30*time.Second) {
		var m map[string]any
		if err := json.Unmarshal(r.Value, &m); err != nil {
			t.Fatal(err)
		}
		name, _ := m["name"].(string)
		tr, _, _ := strings.Cut(name, "-")
		got[tr]++
	}
	if got["http"] != n || got["grpc"] != n {
		t.Fatalf("spans in Kafka by transport: %v, want %d each", got, n)
	}
}
