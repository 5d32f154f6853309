package otlpreceiver

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/apache/thrift/lib/go/thrift"
	jthrift "github.com/jaegertracing/jaeger-idl/thrift-gen/jaeger"
	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer/consumertest"
)

// doorBody is a request of n items (spans, data points) to a door.
type doorBody struct {
	door, path, ctype string
	ok                int
	body              func(t *testing.T, n int) []byte
}

var doorBodies = []doorBody{
	{"zipkin", "/api/v2/spans", "application/json", http.StatusAccepted, func(_ *testing.T, n int) []byte {
		var s []string
		for i := range n {
			s = append(s, fmt.Sprintf(`{"traceId":"%016x","id":"%016x","name":"op","tags":{"a":"1"}}`, i+1, i+1))
		}
		return []byte("[" + strings.Join(s, ",") + "]")
	}},
	{"jaeger", "/api/traces", "application/x-thrift", http.StatusAccepted, func(t *testing.T, n int) []byte {
		b := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "svc"}}
		for i := range n {
			b.Spans = append(b.Spans, &jthrift.Span{TraceIdLow: int64(i + 1), SpanId: int64(i + 1), OperationName: "op"})
		}
		out, err := thrift.NewTSerializer().Write(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}},
	{"prometheus_remote_write", "/api/v1/write", "application/x-protobuf;proto=io.prometheus.write.v2.Request", http.StatusNoContent, func(t *testing.T, n int) []byte {
		st := writev2.NewSymbolTable()
		var ts []*writev2.TimeSeries
		for i := range n {
			ts = append(ts, &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "g", "i", fmt.Sprint(i)}, nil),
				Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}}})
		}
		pb, err := (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		return pb
	}},
	{"prometheus_push", "/metrics/job/j", "text/plain", http.StatusOK, func(_ *testing.T, n int) []byte {
		var b []byte
		for i := range n {
			b = fmt.Appendf(b, "g{i=\"%d\"} 1\n", i)
		}
		return b
	}},
}

// TestDoorsMaxItems: every door refuses a request of more spans or data
// points than max_items_per_request as an OTLP request is refused (413,
// too_many_items, the key named), from its own conversion; as many as the
// limit pass.
func TestDoorsMaxItems(t *testing.T) {
	cfg := testConfig()
	cfg.MaxItems = 3
	for _, d := range doorBodies {
		cfg.Doors = append(cfg.Doors, d.door)
	}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	for i, d := range doorBodies {
		url := "http://" + r.HTTPAddr() + d.path
		if code, _, body := postOTLP(t, url, d.ctype, "", d.body(t, 3)); code != d.ok {
			t.Fatalf("%s: 3 items of 3: %d %s", d.door, code, body)
		}
		code, hdr, body := postOTLP(t, url, d.ctype, "", d.body(t, 4))
		if code != http.StatusRequestEntityTooLarge || hdr.Get("X-Ferry-Reason") != "too_many_items" || !strings.Contains(string(body), "receivers.otlp.max_items_per_request") {
			t.Fatalf("%s: 4 items of 3: %d %q %s", d.door, code, hdr.Get("X-Ferry-Reason"), body)
		}
		if v := testutil.ToFloat64(r.doorSubs[i].m.Errors("too_many_items")); v != 1 {
			t.Fatalf("%s: too_many_items counted %v", d.door, v)
		}
	}
}

// droppedCounter reads ferry_door_dropped_items_total{receiver, reason}
// from the receiver's registry, as a scrape would.
func droppedCounter(t *testing.T, r *Receiver, receiver, reason string) float64 {
	t.Helper()
	mfs, err := r.set.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ferry_door_dropped_items_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			if len(ls) == 2 && ls["receiver"] == receiver && ls["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestDoorsCountDropped: what a door's mapping drops is counted in
// ferry_door_dropped_items_total{receiver, reason} and answered in
// X-Ferry-Dropped: a Jaeger span's repeated tag key, a remote write's
// gauge histogram sample, a Zipkin span's repeated tag; a request that
// drops nothing has no header.
func TestDoorsCountDropped(t *testing.T) {
	cfg := testConfig()
	cfg.Doors = []string{"zipkin", "jaeger", "prometheus_remote_write"}
	r := start(t, cfg, &consumertest.Sink{})
	base := "http://" + r.HTTPAddr()

	b := &jthrift.Batch{Process: &jthrift.Process{ServiceName: "svc"}, Spans: []*jthrift.Span{{TraceIdLow: 1, SpanId: 1, OperationName: "op",
		Tags: []*jthrift.Tag{{Key: "k", VStr: thrift.StringPtr("1")}, {Key: "k", VStr: thrift.StringPtr("2")}}}}}
	jb, err := thrift.NewTSerializer().Write(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, body := postOTLP(t, base+"/api/traces", "application/x-thrift", "", jb)
	if code != http.StatusAccepted || hdr.Get("X-Ferry-Dropped") != "1" || droppedCounter(t, r, "jaeger", "duplicate_key") != 1 {
		t.Fatalf("jaeger: %d %q %s; counted %v", code, hdr.Get("X-Ferry-Dropped"), body, droppedCounter(t, r, "jaeger", "duplicate_key"))
	}

	st := writev2.NewSymbolTable()
	ts := []*writev2.TimeSeries{
		{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "gh_bucket", "le", "1"}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}},
			Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGEHISTOGRAM}},
		{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "up"}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}}},
	}
	pb, err := (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, body = postOTLP(t, base+"/api/v1/write", "application/x-protobuf;proto=io.prometheus.write.v2.Request", "", pb)
	if code != http.StatusNoContent || hdr.Get("X-Ferry-Dropped") != "1" || droppedCounter(t, r, "prometheus_remote_write", "gauge_histogram") != 1 {
		t.Fatalf("remote write: %d %q %s", code, hdr.Get("X-Ferry-Dropped"), body)
	}

	zb := []byte(`[{"traceId":"0000000000000001","id":"0000000000000001","tags":{"a":"1","a":"2","a":"3"}}]`)
	code, hdr, _ = postOTLP(t, base+"/api/v2/spans", "application/json", "", zb)
	if code != http.StatusAccepted || hdr.Get("X-Ferry-Dropped") != "2" || droppedCounter(t, r, "zipkin", "duplicate_key") != 2 {
		t.Fatalf("zipkin: %d %q", code, hdr.Get("X-Ferry-Dropped"))
	}
	code, hdr, _ = postOTLP(t, base+"/api/v2/spans", "application/json", "", []byte(`[{"traceId":"0000000000000001","id":"0000000000000002"}]`))
	if code != http.StatusAccepted || hdr.Get("X-Ferry-Dropped") != "" || droppedCounter(t, r, "zipkin", "duplicate_key") != 2 {
		t.Fatalf("zipkin, nothing dropped: %d %q", code, hdr.Get("X-Ferry-Dropped"))
	}
}
