package pipeline

import (
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestTelemetrygen: OpenTelemetry's own load generator sends traces, metrics
// and logs over gRPC and HTTP; every item it generated is in Kafka.
func TestTelemetrygen(t *testing.T) {
	tg := kafkatest.Telemetrygen(t)
	brokers := kafkatest.Shared(t)
	spans := kafkatest.NewTopic(t, brokers, "it-tg-spans", 2)
	metrics := kafkatest.NewTopic(t, brokers, "it-tg-metrics", 2)
	logs := kafkatest.NewTopic(t, brokers, "it-tg-logs", 2)
	p := startAgent(t, brokers, "receivers.otlp.traces.topic="+spans,
		"receivers.otlp.metrics.topic="+metrics, "receivers.otlp.logs.topic="+logs)

	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(tg, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("telemetrygen %v: %v\n%s", args, err, out)
		}
	}
	const traces, children, workers, nLogs, nMetrics = 15, 2, 2, 40, 20
	for _, tr := range []struct {
		name string
		args []string
	}{
		{"grpc", []string{"--otlp-endpoint", p.Receiver("otlp").(*otlpreceiver.Receiver).GRPCAddr()}},
		{"http", []string{"--otlp-endpoint", p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr(), "--otlp-http"}},
	} {
		common := append([]string{"--otlp-insecure", "--rate", "0", "--service", "tg-" + tr.name}, tr.args...)
		run(append([]string{"traces", "--traces", "15", "--child-spans", "2", "--workers", "2"}, common...)...)
		run(append([]string{"logs", "--logs", "40"}, common...)...)
		run(append([]string{"metrics", "--metrics", "20", "--metric-type", "Sum"}, common...)...)
	}

	count := func(topic string, decode func([]byte) (map[string]int, error)) map[string]int {
		total := map[string]int{}
		// Every item was acknowledged by Kafka before telemetrygen exited,
		// so reading until the topic is idle sees all of them.
		for _, r := range kafkatest.ConsumeAll(t, brokers, topic, 3*time.Second) {
			n, err := decode(r.Value)
			if err != nil {
				t.Fatalf("%s: %v", topic, err)
			}
			for k, v := range n {
				total[k] += v
			}
		}
		return total
	}
	spanCount := count(spans, func(b []byte) (map[string]int, error) {
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(b)
		out := map[string]int{}
		for i := 0; err == nil && i < td.ResourceSpans().Len(); i++ {
			svc, _ := td.ResourceSpans().At(i).Resource().Attributes().Get("service.name")
			out[svc.Str()] += td.ResourceSpans().At(i).ScopeSpans().At(0).Spans().Len()
		}
		return out, err
	})
	logCount := count(logs, func(b []byte) (map[string]int, error) {
		ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(b)
		out := map[string]int{}
		for i := 0; err == nil && i < ld.ResourceLogs().Len(); i++ {
			rl := ld.ResourceLogs().At(i)
			svc, _ := rl.Resource().Attributes().Get("service.name")
			for j := 0; j < rl.ScopeLogs().Len(); j++ {
				lrs := rl.ScopeLogs().At(j).LogRecords()
				for k := 0; k < lrs.Len(); k++ {
					if !strings.Contains(lrs.At(k).Body().AsString(), "the message") {
						t.Fatalf("log body %q", lrs.At(k).Body().AsString())
					}
				}
				out[svc.Str()] += lrs.Len()
			}
		}
		return out, err
	})
	pointCount := count(metrics, func(b []byte) (map[string]int, error) {
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(b)
		out := map[string]int{}
		for i := 0; err == nil && i < md.ResourceMetrics().Len(); i++ {
			rm := md.ResourceMetrics().At(i)
			svc, _ := rm.Resource().Attributes().Get("service.name")
			for j := 0; j < rm.ScopeMetrics().Len(); j++ {
				out[svc.Str()] += rm.ScopeMetrics().At(j).Metrics().Len()
			}
		}
		return out, err
	})
	for _, svc := range []string{"tg-grpc", "tg-http"} {
		if spanCount[svc] != workers*traces*(1+children) || logCount[svc] != nLogs || pointCount[svc] != nMetrics {
			t.Fatalf("%s: %d spans (want %d), %d logs (want %d), %d metrics (want %d)", svc,
				spanCount[svc], workers*traces*(1+children), logCount[svc], nLogs, pointCount[svc], nMetrics)
		}
	}
}
