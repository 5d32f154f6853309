package receivermetrics

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// The names every receiver shares, with their label names.
var families = map[string][]string{
	"ferry_receiver_requests_total":                {"code", "receiver"},
	"ferry_receiver_errors_total":                  {"reason", "receiver"},
	"ferry_receiver_received_records_total":        {"receiver", "topic"},
	"ferry_receiver_received_bytes_total":          {"receiver", "topic"},
	"ferry_receiver_received_items_total":          {"receiver", "signal"},
	"ferry_receiver_fire_and_forget_records_total": {"receiver"},
	"ferry_receiver_request_bytes":                 {"receiver"},
	"ferry_receiver_ack_latency_seconds":           {"receiver"},
}

// series returns the gathered series of the family name, keyed by their
// labels written as a=b,c=d (sorted), read from the registry (what a
// scrape would see), not from the vectors.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Metric{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			out[strings.Join(ls, ",")] = m
		}
	}
	return out
}

// counters returns the counter values of the family name by labels.
func counters(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, m := range series(t, reg, name) {
		if m.GetCounter() == nil {
			t.Fatalf("%s{%s} is not a counter", name, k)
		}
		out[k] = m.GetCounter().GetValue()
	}
	return out
}

func wantCounters(t *testing.T, reg *prometheus.Registry, name string, want map[string]float64) {
	t.Helper()
	got := counters(t, reg, name)
	if len(got) != len(want) {
		t.Errorf("%s: series %v, want %v", name, got, want)
		return
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s{%s} = %v (present %v), want %v; all: %v", name, k, g, ok, v, got)
		}
	}
}

// TestNewRegistersSharedNames: New registers every family under its shared
// name, type and label names, and the two observers exist as series of the
// receiver from the start.
func TestNewRegistersSharedNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "http")
	// Counter vectors show no series until used: touch one of each.
	m.Request(200)
	m.Error("queue_full")
	m.Received("logs", 1, 1)
	m.Items("records", 1)
	m.NoWait(1)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		labels, ok := families[mf.GetName()]
		if !ok {
			t.Errorf("unexpected family %s", mf.GetName())
			continue
		}
		seen[mf.GetName()] = true
		want := dto.MetricType_COUNTER
		if !strings.HasSuffix(mf.GetName(), "_total") {
			want = dto.MetricType_HISTOGRAM
		}
		if mf.GetType() != want {
			t.Errorf("%s: type %v, want %v", mf.GetName(), mf.GetType(), want)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help", mf.GetName())
		}
		for _, s := range mf.GetMetric() {
			var names []string
			for _, l := range s.GetLabel() {
				names = append(names, l.GetName())
				if l.GetName() == "receiver" && l.GetValue() != "http" {
					t.Errorf("%s: receiver %q", mf.GetName(), l.GetValue())
				}
			}
			if strings.Join(names, ",") != strings.Join(labels, ",") {
				t.Errorf("%s: labels %v, want %v", mf.GetName(), names, labels)
			}
		}
	}
	if len(seen) != len(families) {
		t.Errorf("registered %v, want all of %v", seen, families)
	}
	if n := testutil.CollectAndCount(reg, "ferry_receiver_request_bytes", "ferry_receiver_ack_latency_seconds"); n != 2 {
		t.Errorf("%d observer series before any observation, want 2", n)
	}
}

// TestRequest: Request counts by the numeric status, RequestCode by a named
// code, into the same family, one series per code.
func TestRequest(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "otlp_http")
	m.Request(200)
	m.Request(200)
	m.Request(429)
	m.RequestCode("ResourceExhausted")
	wantCounters(t, reg, "ferry_receiver_requests_total", map[string]float64{
		"code=200,receiver=otlp_http":               2,
		"code=429,receiver=otlp_http":               1,
		"code=ResourceExhausted,receiver=otlp_http": 1,
	})
}

// TestError: Error counts by reason, and Errors is that same series.
func TestError(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "local")
	m.Error("queue_full")
	m.Error("queue_full")
	m.Error("request_too_large")
	wantCounters(t, reg, "ferry_receiver_errors_total", map[string]float64{
		"reason=queue_full,receiver=local":        2,
		"reason=request_too_large,receiver=local": 1,
	})
	if v := testutil.ToFloat64(m.Errors("queue_full")); v != 2 {
		t.Errorf("Errors(queue_full) = %v, want 2", v)
	}
	m.Errors("origin_not_allowed").Inc()
	wantCounters(t, reg, "ferry_receiver_errors_total", map[string]float64{
		"reason=queue_full,receiver=local":         2,
		"reason=request_too_large,receiver=local":  1,
		"reason=origin_not_allowed,receiver=local": 1,
	})
}

// TestReceived: Received adds records and bytes to their own families for
// the topic; Records is the records series.
func TestReceived(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "kafka")
	m.Received("logs", 3, 300)
	m.Received("logs", 2, 50)
	m.Received("metrics", 1, 7)
	m.Received("metrics", 0, 0)
	wantCounters(t, reg, "ferry_receiver_received_records_total", map[string]float64{
		"receiver=kafka,topic=logs":    5,
		"receiver=kafka,topic=metrics": 1,
	})
	wantCounters(t, reg, "ferry_receiver_received_bytes_total", map[string]float64{
		"receiver=kafka,topic=logs":    350,
		"receiver=kafka,topic=metrics": 7,
	})
	if v := testutil.ToFloat64(m.Records("logs")); v != 5 {
		t.Errorf("Records(logs) = %v, want 5", v)
	}
}

// TestItems: Items adds n to the signal's series.
func TestItems(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "otlp_grpc")
	m.Items("traces", 10)
	m.Items("traces", 5)
	m.Items("logs", 1)
	wantCounters(t, reg, "ferry_receiver_received_items_total", map[string]float64{
		"receiver=otlp_grpc,signal=traces": 15,
		"receiver=otlp_grpc,signal=logs":   1,
	})
}

// TestNoWait: NoWait adds the fire-and-forget records; NoWaitCounter is
// that series.
func TestNoWait(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "http")
	m.NoWait(4)
	m.NoWait(3)
	wantCounters(t, reg, "ferry_receiver_fire_and_forget_records_total", map[string]float64{"receiver=http": 7})
	if v := testutil.ToFloat64(m.NoWaitCounter()); v != 7 {
		t.Errorf("NoWaitCounter = %v, want 7", v)
	}
}

// TestObservers: ReqBytes and AckLatency observe into the receiver's
// histogram series, in their own buckets.
func TestObservers(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "http")
	m.ReqBytes.Observe(100)
	m.ReqBytes.Observe(1 << 20)
	m.AckLatency.Observe(0.25)
	for name, want := range map[string]struct {
		count uint64
		sum   float64
		first float64 // the first bucket's bound
	}{
		"ferry_receiver_request_bytes":       {2, 100 + 1<<20, 64},
		"ferry_receiver_ack_latency_seconds": {1, 0.25, 0.0005},
	} {
		s := series(t, reg, name)
		h := s["receiver=http"]
		if len(s) != 1 || h == nil || h.GetHistogram() == nil {
			t.Errorf("%s: series %v", name, s)
			continue
		}
		hist := h.GetHistogram()
		if hist.GetSampleCount() != want.count || hist.GetSampleSum() != want.sum {
			t.Errorf("%s: count %d sum %v, want %d and %v", name, hist.GetSampleCount(), hist.GetSampleSum(), want.count, want.sum)
		}
		if b := hist.GetBucket(); len(b) == 0 || b[0].GetUpperBound() != want.first {
			t.Errorf("%s: buckets %v, want the first at %v", name, b, want.first)
		}
	}
	// 100 bytes is in the 256 bucket, not the 64 one.
	b := series(t, reg, "ferry_receiver_request_bytes")["receiver=http"].GetHistogram().GetBucket()
	if b[0].GetCumulativeCount() != 0 || b[1].GetUpperBound() != 256 || b[1].GetCumulativeCount() != 1 {
		t.Errorf("request_bytes buckets %v", b)
	}
}

// TestSharedAcrossReceivers: receivers on one registry share the families
// (New does not panic on the second registration) and are told apart by
// their receiver label; a second Metrics of the same name adds to the
// same series.
func TestSharedAcrossReceivers(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := New(reg, "otlp_http")
	g := New(reg, "otlp_grpc")
	again := New(reg, "otlp_http")
	h.Request(200)
	g.RequestCode("OK")
	again.Request(200)
	h.Received("t", 1, 10)
	g.Received("t", 2, 20)
	h.ReqBytes.Observe(1)
	again.ReqBytes.Observe(1)
	g.AckLatency.Observe(1)
	wantCounters(t, reg, "ferry_receiver_requests_total", map[string]float64{
		"code=200,receiver=otlp_http": 2,
		"code=OK,receiver=otlp_grpc":  1,
	})
	wantCounters(t, reg, "ferry_receiver_received_records_total", map[string]float64{
		"receiver=otlp_http,topic=t": 1,
		"receiver=otlp_grpc,topic=t": 2,
	})
	if c := series(t, reg, "ferry_receiver_request_bytes")["receiver=otlp_http"].GetHistogram().GetSampleCount(); c != 2 {
		t.Errorf("otlp_http request_bytes count %d, want 2", c)
	}
	if c := series(t, reg, "ferry_receiver_request_bytes")["receiver=otlp_grpc"].GetHistogram().GetSampleCount(); c != 0 {
		t.Errorf("otlp_grpc request_bytes count %d, want 0", c)
	}
	if c := series(t, reg, "ferry_receiver_ack_latency_seconds")["receiver=otlp_grpc"].GetHistogram().GetSampleCount(); c != 1 {
		t.Errorf("otlp_grpc ack_latency count %d, want 1", c)
	}
}

// TestExposition: what a scrape shows for a few calls, as text.
func TestExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "http")
	m.Request(413)
	m.Error("request_too_large")
	m.NoWait(2)
	want := `
# HELP ferry_receiver_errors_total Requests refused or failed, by reason.
# TYPE ferry_receiver_errors_total counter
ferry_receiver_errors_total{reason="request_too_large",receiver="http"} 1
# HELP ferry_receiver_fire_and_forget_records_total Records answered before Kafka acknowledged them (wait=false).
# TYPE ferry_receiver_fire_and_forget_records_total counter
ferry_receiver_fire_and_forget_records_total{receiver="http"} 2
# HELP ferry_receiver_requests_total Requests answered, by status code (HTTP status, or gRPC code name).
# TYPE ferry_receiver_requests_total counter
ferry_receiver_requests_total{code="413",receiver="http"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"ferry_receiver_errors_total", "ferry_receiver_fire_and_forget_records_total", "ferry_receiver_requests_total"); err != nil {
		t.Fatal(err)
	}
}
