package jaeger_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/jaeger/jaegertest"
	"github.com/ferryhq/ferry/proofs/harness/leaktest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

func TestMain(m *testing.M) { leaktest.Main(m) }

func receiverConfig() otlpreceiver.Config {
	var c otlpreceiver.Config
	c.Enabled = true
	c.HTTP.Enabled = true
	c.HTTP.HTTPConfig = server.HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	c.GRPC.MaxHeaderBytes = 64 << 10 // for the tests that turn gRPC on
	c.MaxRequestBytes = 1 << 20
	c.MaxItems = 100000
	c.MaxExpandedBytes = 8 << 20
	c.WaitForAck = true
	c.AckTimeout = 5 * time.Second
	c.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: "trace_id"}
	c.Metrics = encoding.Config{Topic: "metrics", Encoding: "otlp_proto", Partition: "resource"}
	c.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "resource"}
	c.Doors = []string{"jaeger"}
	return c
}

func startReceiver(t *testing.T, cfg otlpreceiver.Config, pre *receiver.Prechecks) (*otlpreceiver.Receiver, *consumertest.Sink) {
	t.Helper()
	sink := &consumertest.Sink{}
	r, err := otlpreceiver.New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Pre: pre})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r, sink
}

func received(t *testing.T, sink *consumertest.Sink) []ptrace.Traces {
	t.Helper()
	var out []ptrace.Traces
	var u ptrace.ProtoUnmarshaler
	for _, rec := range sink.Records() {
		if rec.Topic != "spans" {
			t.Fatalf("a record on topic %q", rec.Topic)
		}
		td, err := u.UnmarshalTraces(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, td)
	}
	return out
}

// TestJaegerClientThroughReceiver: jaeger-client-go's tracer makes spans
// and its HTTP transport posts them (thrift binary, /api/traces) to the
// real OTLP receiver with the jaeger door open, behind required tokens;
// every span arrives on the traces topic as OTLP with the ids, names,
// microsecond times, kinds, status, attributes, events, links and resource
// the client sent. Without a token, or with a forged one, the transport
// gets the error.
func TestJaegerClientThroughReceiver(t *testing.T) {
	checker, issue := authtest.New(t)
	cfg := receiverConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "header"}}
	r, sink := startReceiver(t, cfg, &receiver.Prechecks{Checker: checker})
	spans := jaegertest.Spans("checkout", 20)
	url := "http://" + r.HTTPAddr() + "/api/traces"

	if err := jaegertest.Send(url, nil, 100, spans); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("no token: %v", err)
	}
	tok := issue("shop")
	if err := jaegertest.Send(url, map[string]string{"Authorization": "Bearer " + authtest.Forge(tok)}, 100, spans); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("forged token: %v", err)
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records from refused requests", n)
	}
	// batches of 7 spans: requests of several traces and parts of traces.
	if err := jaegertest.Send(url, map[string]string{"Authorization": "Bearer " + tok}, 7, spans); err != nil {
		t.Fatal(err)
	}
	if err := jaegertest.Check(received(t, sink), "checkout", spans); err != nil {
		t.Fatal(err)
	}
	// bk-collector's path and the token as X-Ferry-Token.
	sink.Reset()
	if err := jaegertest.Send("http://"+r.HTTPAddr()+"/jaeger/v1/traces", map[string]string{"X-Ferry-Token": tok}, 100, spans); err != nil {
		t.Fatal(err)
	}
	if err := jaegertest.Check(received(t, sink), "checkout", spans); err != nil {
		t.Fatal(err)
	}
}

func post(t *testing.T, url, ctype string, body []byte) (int, string) {
	t.Helper()
	q, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	q.Header.Set("Content-Type", ctype)
	res, err := http.DefaultClient.Do(q)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	return res.StatusCode, res.Header.Get("X-Ferry-Reason") + ": " + b.String()
}

// TestJaegerRefusals: a body that is no thrift Batch, or declares a list
// longer than itself, is a 400 naming the problem; another content type a
// 400; more spans than max_items_per_request a 413 too_many_items (the OTLP
// request's own limit, counted from the spans list's header); none reaches
// the sink.
func TestJaegerRefusals(t *testing.T) {
	cfg := receiverConfig()
	cfg.MaxItems = 10
	r, sink := startReceiver(t, cfg, nil)
	url := "http://" + r.HTTPAddr() + "/api/traces"
	if code, msg := post(t, url, "application/x-thrift", []byte("not thrift at all")); code != 400 || !strings.Contains(msg, "jaeger: not a jaeger.thrift Batch") {
		t.Fatalf("garbage: %d %s", code, msg)
	}
	if code, msg := post(t, url, "application/x-thrift", lyingBatch()); code != 400 || !strings.Contains(msg, "declares 2147483647 elements") {
		t.Fatalf("lying length: %d %s", code, msg)
	}
	if code, msg := post(t, url, "application/json", []byte("{}")); code != 400 || !strings.Contains(msg, "Content-Type") {
		t.Fatalf("json: %d %s", code, msg)
	}
	err := jaegertest.Send(url, nil, 100, jaegertest.Spans("svc", 4)) // 12 spans
	if err == nil || !strings.Contains(err.Error(), "413") {
		t.Fatalf("12 spans, max_items_per_request 10: %v", err)
	}
	if err := jaegertest.Send(url, nil, 100, jaegertest.Spans("svc", 3)); err != nil {
		t.Fatalf("9 spans: %v", err)
	}
	if n := len(sink.Records()); n != 3 {
		t.Fatalf("%d records, want the 3 traces of the last request", n)
	}
}

// lyingBatch: a Batch whose spans list declares 2^31-1 elements in a
// 20-byte body.
func lyingBatch() []byte {
	var b []byte
	b = append(b, 12, 0, 1) // process: struct, field 1
	b = append(b, 11, 0, 1, 0, 0, 0, 1, 'x', 0)
	b = append(b, 15, 0, 2, 12)
	b = binary.BigEndian.AppendUint32(b, 1<<31-1)
	return b
}
