package otlpreceiver

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/exp/api/remote"
	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
)

// TestPrometheusDoors: the pushgateway client (PUT and POST) and the
// remote write client (v2, snappy) against the real receiver with both
// doors open: records on the metrics topic, answered as the clients
// expect (their calls return no error); other methods are 405 with Allow.
func TestPrometheusDoors(t *testing.T) {
	cfg := testConfig()
	cfg.Doors = []string{"prometheus_remote_write", "prometheus_push"}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	base := "http://" + r.HTTPAddr()

	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "batch_items_total"})
	c.Add(5)
	reg.MustRegister(c)
	p := push.New(base, "nightly").Grouping("instance", "h1").Gatherer(reg)
	if err := p.Push(); err != nil { // PUT
		t.Fatal(err)
	}
	if err := p.Add(); err != nil { // POST
		t.Fatal(err)
	}
	recs := sink.Records()
	if len(recs) != 2 || recs[0].Topic != "metrics" {
		t.Fatalf("records %d", len(recs))
	}
	names := metricNames(t, recs[0].Value)
	if names != "batch_items_total" {
		t.Fatalf("metrics %q", names)
	}
	req, _ := http.NewRequest(http.MethodDelete, base+"/metrics/job/nightly", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "PUT, POST" {
		t.Fatalf("DELETE: %d %q", res.StatusCode, res.Header.Get("Allow"))
	}

	sink.Reset()
	api, err := remote.NewAPI(base, remote.WithAPIPath("/api/v1/write"))
	if err != nil {
		t.Fatal(err)
	}
	st := writev2.NewSymbolTable()
	ts := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "up", "instance", "a:1", "job", "node"}, nil),
		Samples: []*writev2.Sample{{Value: 1, Timestamp: 1700000000000}}, Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE}}
	stats, err := api.Write(context.Background(), remote.WriteV2MessageType, &writev2.Request{Symbols: st.Symbols(), Timeseries: []*writev2.TimeSeries{ts}})
	if err != nil || stats.Samples != 1 {
		t.Fatalf("remote write: %v %+v", err, stats)
	}
	if recs := sink.Records(); len(recs) != 1 || metricNames(t, recs[0].Value) != "up" {
		t.Fatalf("remote write records %d", len(recs))
	}
}

func metricNames(t *testing.T, v []byte) string {
	t.Helper()
	req := pmetricotlp.NewExportRequest()
	if err := req.UnmarshalProto(v); err != nil {
		t.Fatal(err)
	}
	var out []string
	rms := req.Metrics().ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		sms := rms.At(i).ScopeMetrics()
		for j := 0; j < sms.Len(); j++ {
			for k := 0; k < sms.At(j).Metrics().Len(); k++ {
				out = append(out, sms.At(j).Metrics().At(k).Name())
			}
		}
	}
	return strings.Join(out, ",")
}

// TestRemoteWriteBusyIs503: Prometheus retries a 5xx but drops a 429
// (unless retry_on_http_429), so a full queue is a 503 on the remote
// write door, with Retry-After; the push door keeps ferry's 429.
func TestRemoteWriteBusyIs503(t *testing.T) {
	cfg := testConfig()
	cfg.Doors = []string{"prometheus_remote_write", "prometheus_push"}
	r := start(t, cfg, consumer.Func(func(context.Context, *record.Batch) error { return consumer.ErrFull }))
	st := writev2.NewSymbolTable()
	body := (&writev2.Request{Symbols: append(st.Symbols(), "__name__", "x"), Timeseries: []*writev2.TimeSeries{{LabelsRefs: []uint32{1, 2}, Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}}}}})
	pb, err := body.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, _ := postOTLP(t, "http://"+r.HTTPAddr()+"/api/v1/write", "application/x-protobuf;proto=io.prometheus.write.v2.Request", "", pb)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("remote write, queue full: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	code, _, _ = postOTLP(t, "http://"+r.HTTPAddr()+"/metrics/job/x", "text/plain", "", []byte("a 1\n"))
	if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable {
		t.Fatalf("push, queue full: %d", code)
	}
}
