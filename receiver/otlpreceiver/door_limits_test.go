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
