package pipeline

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func spanMetricsConfig(t *testing.T, extra ...string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(nil, append([]string{
		"exporter.type=blackhole", "receivers.local.enabled=false", "receivers.http.listen=127.0.0.1:0",
		"telemetry.admin.listen=127.0.0.1:0", "receivers.otlp.http.listen=127.0.0.1:0", "receivers.otlp.grpc.listen=127.0.0.1:0",
		"processors.span_metrics.enabled=true", "processors.span_metrics.interval=1h", "processors.span_metrics.expire_after=1h",
		"processors.sampler.traces_percent=10",
	}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestSpanMetricsLastIntervalAtShutdown: the pipeline starts span metrics
// with the receivers, and a stop flushes the spans of the last requests
// through the OTLP receiver to the exporter; a reload that changes the
// section says it needs a restart.
func TestSpanMetricsLastIntervalAtShutdown(t *testing.T) {
	cfg := spanMetricsConfig(t)
	set := telemetry.TestSettings()
	p, err := New(cfg, set)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr()
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(2).Traces(50)).MarshalProto()
	postTraces(t, addr, raw)
	if p.SpanMetrics.Series() == 0 {
		t.Fatal("no series")
	}
	warn, err := p.Reload(spanMetricsConfig(t, "processors.span_metrics.max_series=5"))
	if err != nil || !strings.Contains(warn, "processors.span_metrics") {
		t.Fatalf("reload: %q, %v", warn, err)
	}
	if warn, _ := p.Reload(spanMetricsConfig(t)); strings.Contains(warn, "processors.span_metrics") {
		t.Fatalf("the running section reloaded unchanged: %q", warn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	flushes, err := set.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ok := 0.0
	for _, mf := range flushes {
		if mf.GetName() == "ferry_processor_span_metrics_flushes_total" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "ok" {
					ok = m.GetCounter().GetValue()
				}
			}
		}
	}
	if ok < 1 {
		t.Fatalf("%v flushes delivered at shutdown", ok)
	}
}

// postTraces sends raw (an OTLP traces request) to the agent's OTLP/HTTP
// listener addr and wants it accepted.
func postTraces(t *testing.T, addr string, raw []byte) {
	t.Helper()
	res, err := http.Post("http://"+addr+"/v1/traces", "application/x-protobuf", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
}
