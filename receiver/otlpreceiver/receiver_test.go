package otlpreceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func testConfig() Config {
	var c Config
	c.Enabled = true
	c.HTTP.Enabled = true
	c.HTTP.HTTPConfig = server.HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	c.GRPC.Enabled, c.GRPC.Listen, c.GRPC.MaxHeaderBytes = true, "127.0.0.1:0", 64<<10
	c.MaxRequestBytes = 256 << 10
	c.MaxItems = 100000
	c.MaxExpandedBytes = 4 << 20
	c.WaitForAck = true
	c.AckTimeout = 5 * time.Second
	c.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: "trace_id"}
	c.Metrics = encoding.Config{Topic: "metrics", Encoding: "otlp_proto", Partition: "resource"}
	c.Logs = encoding.Config{Topic: "logs", Encoding: "flat_json", Partition: "resource"}
	return c
}

func start(t *testing.T, cfg Config, next consumer.Consumer) *Receiver {
	t.Helper()
	return startWith(t, cfg, telemetry.TestSettings(), next, nil)
}

// startWith starts a receiver with shared settings and pre-checks.
func startWith(t *testing.T, cfg Config, set telemetry.Settings, next consumer.Consumer, pre *receiver.Prechecks) *Receiver {
	t.Helper()
	r, err := New(cfg, receiver.Env{Set: set, Next: next, Pre: pre})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

func postOTLP(t *testing.T, url, ctype, enc string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, out
}

// statusOf decodes a google.rpc.Status protobuf body.
func statusOf(t *testing.T, b []byte) (int, string) {
	t.Helper()
	var code int
	var msg string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad Status body %x", b)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			code, b = int(v), b[m:]
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			msg, b = string(v), b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			b = b[m:]
		}
	}
	return code, msg
}

func TestHTTPAllSignals(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(), sink)
	base := "http://" + r.HTTPAddr()

	traces, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(7)).MarshalProto()
	code, hdr, body := postOTLP(t, base+"/v1/traces", "application/x-protobuf", "", traces)
	if code != 200 || len(body) != 0 || hdr.Get("Content-Type") != "application/x-protobuf" {
		t.Fatalf("traces: %d %q %x", code, hdr.Get("Content-Type"), body)
	}
	// 7 spans with 7 random trace ids: 7 records, keyed by trace id.
	recs := sink.Records()
	if len(recs) != 7 || recs[0].Topic != "spans" || len(recs[0].Key) != 32 {
		t.Fatalf("trace records: %d, first %+v", len(recs), recs[0].Topic)
	}
	hs := map[string]string{}
	for _, h := range recs[0].Headers {
		hs[h.Key] = string(h.Value)
	}
	if hs["ferry.signal"] != "traces" || hs["ferry.encoding"] != "otlp_proto" {
		t.Fatalf("headers %v", hs)
	}
	sink.Reset()

	// OTLP/JSON logs, gzip, flat_json: one record per log record.
	lj, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(2).Logs(5, 30)).MarshalJSON()
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write(lj)
	_ = zw.Close()
	code, hdr, body = postOTLP(t, base+"/v1/logs", "application/json", "gzip", zb.Bytes())
	if code != 200 || string(body) != "{}" || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("logs: %d %s", code, body)
	}
	recs = sink.Records()
	if len(recs) != 5 || recs[0].Topic != "logs" {
		t.Fatalf("log records: %d", len(recs))
	}
	var obj map[string]any
	if err := json.Unmarshal(recs[0].Value, &obj); err != nil || len(obj["body"].(string)) != 30 {
		t.Fatalf("flat_json log: %v %s", err, recs[0].Value)
	}
	sink.Reset()

	mp, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(3).Metrics(2, 2, 2)).MarshalProto()
	if code, _, body = postOTLP(t, base+"/v1/metrics", "application/x-protobuf", "", mp); code != 200 {
		t.Fatalf("metrics: %d %x", code, body)
	}
	if recs = sink.Records(); len(recs) != 1 || recs[0].Topic != "metrics" || len(recs[0].Key) != 16 {
		t.Fatalf("metric records: %d", len(recs))
	}
	if v := testutil.ToFloat64(r.httpM.Records("spans")); v != 7 {
		t.Fatalf("received records counter %v", v)
	}

	// An empty request succeeds and sends nothing.
	sink.Reset()
	empty, _ := ptraceotlp.NewExportRequestFromTraces(ptrace.NewTraces()).MarshalProto()
	if code, _, _ = postOTLP(t, base+"/v1/traces", "application/x-protobuf", "", empty); code != 200 || len(sink.Records()) != 0 {
		t.Fatalf("empty: %d, %d records", code, len(sink.Records()))
	}
}

func TestHTTPErrors(t *testing.T) {
	valid, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(2)).MarshalProto()
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write(bytes.Repeat([]byte{0}, 4<<20))
	_ = zw.Close()
	cases := []struct {
		name, path, ctype, enc string
		body                   []byte
		next                   consumer.Consumer
		code, grpcCode         int
		reason                 string
		retry                  bool
	}{
		{"malformed", "/v1/traces", "application/x-protobuf", "", []byte{0x0a, 0x09, 0x01}, &consumertest.Sink{}, 400, 3, "invalid_payload", false},
		{"bad json", "/v1/logs", "application/json", "", []byte(`{"resourceLogs":[`), &consumertest.Sink{}, 400, 3, "invalid_payload", false},
		{"gzip bomb", "/v1/traces", "application/x-protobuf", "gzip", bomb.Bytes(), &consumertest.Sink{}, 413, 8, "request_too_large", false},
		{"content type", "/v1/traces", "text/plain", "", valid, &consumertest.Sink{}, 415, 3, "unsupported_content_type", false},
		{"unknown path", "/v1/profiles", "application/x-protobuf", "", valid, &consumertest.Sink{}, 404, 5, "not_found", false},
		{"full", "/v1/traces", "application/x-protobuf", "", valid, consumertest.Refuse{Err: consumer.ErrFull}, 429, 8, "queue_full", true},
		{"kafka down", "/v1/traces", "application/x-protobuf", "", valid, consumertest.Refuse{Err: consumer.ErrUnavailable}, 503, 14, "kafka_unavailable", true},
		{"unknown topic", "/v1/traces", "application/x-protobuf", "", valid, &consumertest.Sink{Err: consumer.UnknownTopic("spans", nil)}, 500, 13, "unknown_topic", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, testConfig(), c.next)
			code, hdr, body := postOTLP(t, "http://"+r.HTTPAddr()+c.path, c.ctype, c.enc, c.body)
			if code != c.code {
				t.Fatalf("status %d, want %d (%s)", code, c.code, body)
			}
			var gc int
			var msg string
			if strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				var st struct {
					Code    int
					Message string
				}
				_ = json.Unmarshal(body, &st)
				gc, msg = st.Code, st.Message
			} else {
				gc, msg = statusOf(t, body)
			}
			if gc != c.grpcCode || msg == "" {
				t.Fatalf("Status body code %d msg %q, want code %d", gc, msg, c.grpcCode)
			}
			if c.retry != (hdr.Get("Retry-After") != "") {
				t.Fatalf("Retry-After %q", hdr.Get("Retry-After"))
			}
			if v := testutil.ToFloat64(r.httpM.Errors(c.reason)); v < 1 {
				t.Fatalf("errors_total{reason=%s} = %v", c.reason, v)
			}
		})
	}
}

func TestPartialSuccessWithFlatJSON(t *testing.T) {
	cfg := testConfig()
	cfg.Traces = encoding.Config{Topic: "spans", Encoding: "flat_json", Partition: "trace_id"}
	sink := &consumertest.Sink{FailFirst: consumer.TooLarge("record", 2_000_000, 1_000_000, nil)}
	r := start(t, cfg, sink)
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(4)).MarshalProto()
	code, _, body := postOTLP(t, "http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", "", raw)
	if code != 200 {
		t.Fatalf("%d %x", code, body)
	}
	resp := ptraceotlp.NewExportResponse()
	if err := resp.UnmarshalProto(body); err != nil {
		t.Fatal(err)
	}
	if ps := resp.PartialSuccess(); ps.RejectedSpans() != 1 || !strings.Contains(ps.ErrorMessage(), "exceeds") {
		t.Fatalf("partial success %d %q", ps.RejectedSpans(), ps.ErrorMessage())
	}
}

func TestGRPC(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(), sink)
	cc, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	if _, err := ptraceotlp.NewGRPCClient(cc).Export(ctx, ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(3)), grpc.UseCompressor("gzip")); err != nil {
		t.Fatal(err)
	}
	if _, err := pmetricotlp.NewGRPCClient(cc).Export(ctx, pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := plogotlp.NewGRPCClient(cc).Export(ctx, plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 10))); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Records()); n != 3+1+2 {
		t.Fatalf("%d records, want 6", n)
	}
	if v := testutil.ToFloat64(r.grpcM.Records("spans")); v != 3 {
		t.Fatalf("grpc records counter %v", v)
	}
}

func TestGRPCErrors(t *testing.T) {
	for _, c := range []struct {
		next  consumer.Consumer
		code  codes.Code
		retry bool
	}{
		{consumertest.Refuse{Err: consumer.ErrFull}, codes.ResourceExhausted, true},
		{consumertest.Refuse{Err: consumer.ErrUnavailable}, codes.Unavailable, true},
		{&consumertest.Sink{Err: consumer.UnknownTopic("logs", nil)}, codes.Internal, false},
	} {
		r := start(t, testConfig(), c.next)
		cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		_, err := plogotlp.NewGRPCClient(cc).Export(context.Background(), plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(1, 10)))
		cc.Close()
		st := status.Convert(err)
		if st.Code() != c.code {
			t.Fatalf("code %v, want %v (%v)", st.Code(), c.code, err)
		}
		var hasRetry bool
		for _, d := range st.Details() {
			if _, ok := d.(*errdetails.RetryInfo); ok {
				hasRetry = true
			}
		}
		if hasRetry != c.retry {
			t.Fatalf("%v: RetryInfo %v, want %v", c.code, hasRetry, c.retry)
		}
	}
	// Malformed bytes over gRPC: send raw garbage with the raw codec's client side.
	r := start(t, testConfig(), &consumertest.Sink{})
	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	err := cc.Invoke(context.Background(), "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
		&rawMsg{out: []byte{0x0a, 0x09, 0x01}}, &rawMsg{reader: r.body}, grpc.ForceCodecV2(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed over gRPC: %v", err)
	}
	_ = plog.NewLogs
}

func TestHTTPMethodNotAllowed(t *testing.T) {
	r := start(t, testConfig(), &consumertest.Sink{})
	res, err := http.Get("http://" + r.HTTPAddr() + "/v1/logs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if code, msg := statusOf(t, body); res.StatusCode != 405 || res.Header.Get("Allow") != "POST" || code != 12 || msg == "" {
		t.Fatalf("GET /v1/logs: %d Allow=%q status %d %q", res.StatusCode, res.Header.Get("Allow"), code, msg)
	}
	if v := testutil.ToFloat64(r.httpM.Errors("method_not_allowed")); v != 1 {
		t.Fatalf("counter %v", v)
	}
}

// completer completes each batch inside Consume, before it returns, as the
// spool does with fsync interval: the receiver may reuse the batch for the
// next request before its own Submit call has returned.
type completer struct{ n atomic.Int64 }

func (c *completer) Consume(_ context.Context, b *record.Batch) error {
	c.n.Add(int64(len(b.Records)))
	b.Complete(nil)
	return nil
}

// TestBatchReusedOnlyAfterItsMetrics: the per-topic metrics of a request
// routed per resource are read from its records before they are handed
// on, so a batch completed (and taken back for the next request) before
// Submit returns still counts under the right topics.
func TestBatchReusedOnlyAfterItsMetrics(t *testing.T) {
	cfg := testConfig()
	cfg.Logs = encoding.Config{Topic: "logs-{resource.service.name}", Encoding: "otlp_proto", Partition: "resource"}
	next := &completer{}
	r := startWith(t, cfg, telemetry.TestSettings(), next, nil)
	ld := plog.NewLogs()
	for _, svc := range []string{"cart", "pay"} {
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("service.name", svc)
		rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr("x")
	}
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	const requests = 20
	for range requests {
		if code, _, body := postOTLP(t, "http://"+r.HTTPAddr()+"/v1/logs", "application/x-protobuf", "", raw); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	if got := next.n.Load(); got != 2*requests {
		t.Fatalf("%d records handed on, want %d", got, 2*requests)
	}
	for topic, want := range map[string]float64{"logs-cart": requests, "logs-pay": requests, "": 0} {
		if v := testutil.ToFloat64(r.httpM.Records(topic)); v != want {
			t.Fatalf("records counted for topic %q: %v, want %v", topic, v, want)
		}
	}
}

// holder keeps every batch without completing it (for requests not
// waiting for Kafka's ack), copying what the test checks only at the end.
type holder struct {
	mu      sync.Mutex
	batches []*record.Batch
}

func (h *holder) Consume(_ context.Context, b *record.Batch) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches = append(h.batches, b)
	return nil
}

// TestOneRecordRequestHoldsOnlyItself: a request forwarded as its record's
// value holds (and counts against the queue) its own buffer, not also the
// output buffer a rebuilt record would have needed, and its key survives
// that buffer's reuse by the next requests.
func TestOneRecordRequestHoldsOnlyItself(t *testing.T) {
	cfg := testConfig()
	cfg.WaitForAck = false
	cfg.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "resource"}
	next := &holder{}
	r := start(t, cfg, next)
	// On one P the pool hands the released output buffer to the next
	// request, which writes its own key where the last one's was.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	keys := map[string]bool{}
	services := []string{"cart", "pay", "ship", "search", "auth", "mail", "ads", "feed"}
	for _, svc := range services {
		ld := plog.NewLogs()
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("service.name", svc)
		for range 64 {
			rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr(strings.Repeat("x", 1024))
		}
		raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
		if code, _, body := postOTLP(t, "http://"+r.HTTPAddr()+"/v1/logs", "application/x-protobuf", "", raw); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	next.mu.Lock()
	defer next.mu.Unlock()
	if len(next.batches) != len(services) {
		t.Fatalf("%d batches", len(next.batches))
	}
	for _, b := range next.batches {
		rec := &b.Records[0]
		if len(b.Records) != 1 || len(rec.Value) < 64<<10 || len(rec.Key) != 16 {
			t.Fatalf("%d records, value %d bytes, key %q", len(b.Records), len(rec.Value), rec.Key)
		}
		if held := b.MemBytes - int64(cap(rec.Value)); held > record.Overhead+1024 {
			t.Fatalf("a request of %d bytes counts %d bytes besides its own buffer", len(rec.Value), held)
		}
		keys[string(rec.Key)] = true
	}
	if len(keys) != len(services) {
		t.Fatalf("%d keys for %d resources: a key was overwritten by a later request", len(keys), len(services))
	}
}
