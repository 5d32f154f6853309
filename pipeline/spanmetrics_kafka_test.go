package pipeline

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestSpanMetricsIntoKafka: spans in over OTLP/HTTP with the sampler at
// 10 %, span metrics read back from the real metrics topic after the
// agent stops: as many calls as spans were sent, sampled out or not.
func TestSpanMetricsIntoKafka(t *testing.T) {
	brokers := kafkatest.Shared(t)
	spansTopic, metricsTopic := "sm-spans-"+t.Name(), "sm-metrics-"+t.Name()
	kafkatest.CreateTopic(t, brokers, spansTopic, 1)
	kafkatest.CreateTopic(t, brokers, metricsTopic, 1)
	p := startAgent(t, brokers, "processors.span_metrics.enabled=true", "processors.span_metrics.interval=1h",
		"processors.span_metrics.expire_after=1h", "processors.sampler.traces_percent=10",
		"receivers.otlp.traces.topic="+spansTopic, "receivers.otlp.metrics.topic="+metricsTopic)
	addr := p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr()
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(5).Traces(200)).MarshalProto()
	for range 3 {
		postTraces(t, addr, raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil { // the last interval
		t.Fatal(err)
	}
	var calls, count int64
	for _, rec := range kafkatest.ConsumeAll(t, brokers, metricsTopic, 3*time.Second) {
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < md.ResourceMetrics().Len(); i++ {
			ms := md.ResourceMetrics().At(i).ScopeMetrics().At(0).Metrics()
			for j := 0; j < ms.Len(); j++ {
				m := ms.At(j)
				switch m.Name() {
				case spanmetrics.CallsMetric:
					for k := 0; k < m.Sum().DataPoints().Len(); k++ {
						calls += m.Sum().DataPoints().At(k).IntValue()
					}
				case spanmetrics.DurationMetric:
					for k := 0; k < m.Histogram().DataPoints().Len(); k++ {
						count += int64(m.Histogram().DataPoints().At(k).Count())
					}
				}
			}
		}
	}
	spans := len(kafkatest.ConsumeAll(t, brokers, spansTopic, 2*time.Second))
	if calls != 600 || count != 600 || spans == 0 || spans > 150 {
		t.Fatalf("calls %d, histogram count %d, want 600 each; %d trace records passed the sampler at 10%%", calls, count, spans)
	}
}
