package compat

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/exp/api/remote"
	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/push"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// promAgent runs ferry with both Prometheus doors, metrics to topic (a
// template may name the request's headers).
func promAgent(t *testing.T, broker, topic string, sets ...string) *agenttest.Agent {
	t.Helper()
	return agenttest.Start(t, ferryBin, "", append([]string{"exporter.kafka.brokers=[" + broker + "]", "exporter.kafka.linger=1ms",
		"receivers.otlp.doors=[prometheus_remote_write,prometheus_push]", "receivers.otlp.metrics.topic=" + topic}, sets...)...)
}

// point is one OTLP data point as read back from Kafka, flattened.
type point struct {
	resource, attrs string
	typ             pmetric.MetricType
	monotonic       bool
	value           float64
	count           uint64
	sum             float64
	bounds          []float64
	buckets         []uint64
	quantiles       string
	ts              time.Time
	noValue         bool
	ptype           string
}

func kv(m pcommon.Map) string {
	var out []string
	m.Range(func(k string, v pcommon.Value) bool { out = append(out, k+"="+v.AsString()); return true })
	sort.Strings(out)
	return strings.Join(out, ",")
}

// points reads OTLP metrics records into name → points.
func points(t *testing.T, recs []*kgo.Record) map[string][]point {
	t.Helper()
	out := map[string][]point{}
	for _, r := range recs {
		req := pmetricotlp.NewExportRequest()
		if err := req.UnmarshalProto(r.Value); err != nil {
			t.Fatalf("a record that is not OTLP metrics: %v", err)
		}
		rms := req.Metrics().ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			res := kv(rms.At(i).Resource().Attributes())
			sms := rms.At(i).ScopeMetrics()
			for j := 0; j < sms.Len(); j++ {
				ms := sms.At(j).Metrics()
				for k := 0; k < ms.Len(); k++ {
					m := ms.At(k)
					pt, _ := m.Metadata().Get("prometheus.type")
					base := point{resource: res, typ: m.Type(), ptype: pt.Str()}
					switch m.Type() {
					case pmetric.MetricTypeGauge, pmetric.MetricTypeSum:
						var dps pmetric.NumberDataPointSlice
						if m.Type() == pmetric.MetricTypeSum {
							dps = m.Sum().DataPoints()
							base.monotonic = m.Sum().IsMonotonic()
						} else {
							dps = m.Gauge().DataPoints()
						}
						for x := 0; x < dps.Len(); x++ {
							p := base
							p.attrs, p.value, p.ts, p.noValue = kv(dps.At(x).Attributes()), dps.At(x).DoubleValue(), dps.At(x).Timestamp().AsTime(), dps.At(x).Flags().NoRecordedValue()
							out[m.Name()] = append(out[m.Name()], p)
						}
					case pmetric.MetricTypeHistogram:
						dps := m.Histogram().DataPoints()
						for x := 0; x < dps.Len(); x++ {
							d := dps.At(x)
							p := base
							p.attrs, p.count, p.sum, p.bounds, p.buckets, p.ts = kv(d.Attributes()), d.Count(), d.Sum(), d.ExplicitBounds().AsRaw(), d.BucketCounts().AsRaw(), d.Timestamp().AsTime()
							out[m.Name()] = append(out[m.Name()], p)
						}
					case pmetric.MetricTypeSummary:
						dps := m.Summary().DataPoints()
						for x := 0; x < dps.Len(); x++ {
							d := dps.At(x)
							p := base
							p.attrs, p.count, p.sum, p.ts = kv(d.Attributes()), d.Count(), d.Sum(), d.Timestamp().AsTime()
							for q := 0; q < d.QuantileValues().Len(); q++ {
								p.quantiles += fmt.Sprintf("%v:%v ", d.QuantileValues().At(q).Quantile(), d.QuantileValues().At(q).Value())
							}
							out[m.Name()] = append(out[m.Name()], p)
						}
					case pmetric.MetricTypeExponentialHistogram:
						dps := m.ExponentialHistogram().DataPoints()
						for x := 0; x < dps.Len(); x++ {
							d := dps.At(x)
							p := base
							p.attrs, p.count, p.sum, p.buckets, p.ts = kv(d.Attributes()), d.Count(), d.Sum(), d.Positive().BucketCounts().AsRaw(), d.Timestamp().AsTime()
							out[m.Name()] = append(out[m.Name()], p)
						}
					}
				}
			}
		}
	}
	return out
}

// testRegistry holds one of each type with known values.
func testRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_requests_total", Help: "Requests."}, []string{"path"})
	c.WithLabelValues("/x").Add(7)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_temperature", Help: "Temperature."})
	g.Set(21.5)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "test_latency_seconds", Help: "Latency.", Buckets: []float64{0.1, 1}})
	for _, v := range []float64{0.05, 0.5, 0.7, 3} {
		h.Observe(v)
	}
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "test_size_bytes", Help: "Sizes.", Objectives: map[float64]float64{0.5: 0.01}})
	for _, v := range []float64{100, 200, 300} {
		s.Observe(v)
	}
	reg.MustRegister(c, g, h, s)
	return reg
}

// checkTyped: the registry's values as typed OTLP (the push format and
// remote write 2.0 carry types).
func checkTyped(t *testing.T, got map[string][]point, resource string, from time.Time) {
	t.Helper()
	last := func(name string) point {
		ps := got[name]
		if len(ps) == 0 {
			t.Fatalf("no %s in Kafka (have %d names)", name, len(got))
		}
		return ps[len(ps)-1]
	}
	c := last("test_requests_total")
	if c.typ != pmetric.MetricTypeSum || !c.monotonic || c.value != 7 || c.attrs != "path=/x" || c.resource != resource || c.ptype != "counter" {
		t.Fatalf("counter: %+v", c)
	}
	if c.ts.Before(from.Add(-time.Second)) || c.ts.After(time.Now().Add(time.Second)) {
		t.Fatalf("counter timestamp %v outside the test's [%v, now]", c.ts, from)
	}
	if g := last("test_temperature"); g.typ != pmetric.MetricTypeGauge || g.value != 21.5 || g.resource != resource {
		t.Fatalf("gauge: %+v", g)
	}
	h := last("test_latency_seconds")
	if h.typ != pmetric.MetricTypeHistogram || h.count != 4 || h.sum != 4.25 || fmt.Sprint(h.bounds) != "[0.1 1]" || fmt.Sprint(h.buckets) != "[1 2 1]" {
		t.Fatalf("histogram: %+v", h)
	}
	if s := last("test_size_bytes"); s.typ != pmetric.MetricTypeSummary || s.count != 3 || s.sum != 600 || s.quantiles != "0.5:200 " {
		t.Fatalf("summary: %+v", s)
	}
}

// TestPushgatewayClientThroughKafka: client_golang's push package (PUT of
// its default delimited protobuf, POST of text) to the real binary; the
// records read back from Kafka carry every type with its values, the
// grouping as the resource.
func TestPushgatewayClientThroughKafka(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "compat-prom-push", 1)
	a := promAgent(t, broker, topic)
	from := time.Now()
	p := push.New("http://"+a.OTLP, "batch/nightly").Grouping("instance", "host-1").Grouping("dir", "/var/lib").Gatherer(testRegistry())
	if err := p.Push(); err != nil {
		t.Fatalf("PUT: %v", err)
	}
	recs := kafkatest.Consume(t, broker, topic, 1, time.Minute)
	checkTyped(t, points(t, recs), "dir=/var/lib,service.instance.id=host-1,service.name=nightly,service.namespace=batch", from)
	if err := p.Format("text/plain; version=0.0.4; charset=utf-8").Add(); err != nil {
		t.Fatalf("POST text: %v", err)
	}
	recs = kafkatest.Consume(t, broker, topic, 2, time.Minute)
	checkTyped(t, points(t, recs[1:]), "dir=/var/lib,service.instance.id=host-1,service.name=nightly,service.namespace=batch", from)
}

// TestRemoteWriteClientThroughKafka: client_golang's remote write client
// (2.0, snappy) to the real binary: values, timestamps, types and the
// resource read back from Kafka equal what was sent.
func TestRemoteWriteClientThroughKafka(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "compat-prom-rw", 1)
	a := promAgent(t, broker, topic)
	api, err := remote.NewAPI("http://"+a.OTLP, remote.WithAPIPath("/api/v1/write"))
	if err != nil {
		t.Fatal(err)
	}
	st := writev2.NewSymbolTable()
	ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	series := []*writev2.TimeSeries{
		{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "rw_jobs_total", "instance", "w:1", "job", "worker", "queue", "q1"}, nil),
			Samples:  []*writev2.Sample{{Value: 11, Timestamp: ts.UnixMilli()}, {Value: 12, Timestamp: ts.UnixMilli() + 1000}},
			Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER, HelpRef: st.Symbolize("Jobs.")}},
		{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "rw_queue_depth", "instance", "w:1", "job", "worker"}, nil),
			Samples: []*writev2.Sample{{Value: 3.25, Timestamp: ts.UnixMilli()}}, Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE}},
		{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "rw_native_seconds", "instance", "w:1", "job", "worker"}, nil),
			Histograms: []*writev2.Histogram{{Count: &writev2.Histogram_CountInt{CountInt: 3}, Sum: 1.5, Schema: 1,
				PositiveSpans: []*writev2.BucketSpan{{Offset: 0, Length: 2}}, PositiveDeltas: []int64{1, 1}, Timestamp: ts.UnixMilli()}},
			Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM}},
	}
	stats, err := api.Write(context.Background(), remote.WriteV2MessageType, &writev2.Request{Symbols: st.Symbols(), Timeseries: series})
	if err != nil || stats.Samples != 3 || stats.Histograms != 1 {
		t.Fatalf("write: %v %+v", err, stats)
	}
	got := points(t, kafkatest.Consume(t, broker, topic, 1, time.Minute))
	c := got["rw_jobs_total"]
	if len(c) != 2 || c[0].typ != pmetric.MetricTypeSum || !c[0].monotonic || c[0].value != 11 || c[1].value != 12 ||
		!c[0].ts.Equal(ts) || !c[1].ts.Equal(ts.Add(time.Second)) || c[0].attrs != "queue=q1" || c[0].resource != "service.instance.id=w:1,service.name=worker" {
		t.Fatalf("counter: %+v", c)
	}
	if g := got["rw_queue_depth"]; len(g) != 1 || g[0].typ != pmetric.MetricTypeGauge || g[0].value != 3.25 || !g[0].ts.Equal(ts) {
		t.Fatalf("gauge: %+v", g)
	}
	// Prometheus bucket indexes 0,1 (counts 1,2) at schema 1 → OTLP offset -1.
	if n := got["rw_native_seconds"]; len(n) != 1 || n[0].typ != pmetric.MetricTypeExponentialHistogram || n[0].count != 3 || n[0].sum != 1.5 || fmt.Sprint(n[0].buckets) != "[1 2]" {
		t.Fatalf("native histogram: %+v", n)
	}
}

// TestPrometheusServerRemoteWrite: a real Prometheus server (agent mode,
// built by scripts/prometheus-local) scrapes a target of known values and
// remote-writes to the real binary, once in 1.0 and once in 2.0 (a topic
// each, by the header each remote_write sends); the records read back from
// Kafka carry the values, the job and instance as the resource, scrape
// timestamps, and (2.0) the types. 1.0 carries no types: gauges.
func TestPrometheusServerRemoteWrite(t *testing.T) {
	if os.Getenv("FERRY_PROMETHEUS_SERVER") == "" {
		// Building Prometheus takes minutes on a fresh machine (after
		// promtool, which make test builds for packaging/, 1.3 min
		// more): make test sets FERRY_PROMETHEUS_SERVER=1 once
		// scripts/prometheus-local has built it, as do make
		// prometheus-compat and make bench; a bare go test skips it.
		t.Skip("the real Prometheus server runs in make test, make prometheus-compat and make bench (FERRY_PROMETHEUS_SERVER=1)")
	}
	broker := kafkatest.Shared(t)
	root, err := agenttest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "prometheus-local"), "build").Output()
	if err != nil {
		t.Fatalf("scripts/prometheus-local build: %v", err)
	}
	promBin := strings.TrimSpace(string(out))
	suffix := fmt.Sprint(time.Now().UnixNano())
	for _, v := range []string{"v1", "v2"} {
		kafkatest.CreateTopic(t, broker, "compat-prom-"+v+"-"+suffix, 1)
	}
	a := promAgent(t, broker, "compat-prom-{header.x-proto}-"+suffix)

	target := httptest(t, promhttp.HandlerFor(testRegistry(), promhttp.HandlerOpts{}))
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s}
scrape_configs:
  - job_name: app
    static_configs: [{targets: [%q]}]
remote_write:
  - url: http://%s/api/v1/write
    headers: {X-Proto: v1}
    queue_config: {batch_send_deadline: 1s}
  - url: http://%s/api/v1/write
    protobuf_message: io.prometheus.write.v2.Request
    headers: {X-Proto: v2}
    queue_config: {batch_send_deadline: 1s}
`, target, a.OTLP, a.OTLP)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	// 2.0 carries each series' type only with metadata-wal-records (the
	// server says so at start).
	cmd := exec.Command(promBin, "--agent", "--enable-feature=metadata-wal-records", "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.agent.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+agenttest.FreeAddr(t))
	logs := &agenttest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", agenttest.Tail(logs.String(), 4000))
		}
	})
	resource := "service.instance.id=" + target + ",service.name=app"
	for _, v := range []string{"v1", "v2"} {
		t.Run(v, func(t *testing.T) {
			topic := "compat-prom-" + v + "-" + suffix
			deadline := time.Now().Add(90 * time.Second)
			for {
				// UpTo, not ConsumeAll: Prometheus writes every second, so
				// the topic is never idle.
				got := points(t, kafkatest.UpTo(t, broker, topic, 30*time.Second))
				ok := len(got["test_requests_total"]) > 0 && len(got["up"]) > 0
				if v == "v2" {
					ok = ok && len(got["test_latency_seconds"]) > 0 && len(got["test_size_bytes"]) > 0
				} else {
					ok = ok && len(got["test_latency_seconds_bucket"]) > 0
				}
				if ok {
					if v == "v2" {
						checkTyped(t, got, resource, from)
					} else {
						c := got["test_requests_total"][0]
						if c.typ != pmetric.MetricTypeGauge || c.value != 7 || c.attrs != "path=/x" || c.resource != resource || c.ts.Before(from.Add(-time.Second)) {
							t.Fatalf("1.0 counter (a gauge: no types): %+v", c)
						}
						var les []string
						for _, p := range got["test_latency_seconds_bucket"] {
							les = append(les, fmt.Sprintf("%s=%v", p.attrs, p.value))
						}
						if s := strings.Join(les[:3], " "); s != "le=+Inf=4 le=0.1=1 le=1=3" && !strings.Contains(strings.Join(les, " "), "le=0.1=1") {
							t.Fatalf("1.0 buckets: %s", s)
						}
					}
					if u := got["up"][0]; u.value != 1 || u.resource != resource {
						t.Fatalf("up: %+v", u)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: after 90 s Kafka has %d names; agent metrics: %s", v, len(got), agenttest.Tail(a.Logs.String(), 2000))
				}
				time.Sleep(2 * time.Second)
			}
		})
	}
}

// httptest serves h on a loopback port; its host:port.
func httptest(t *testing.T, h http.Handler) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}
