package zipkin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"github.com/openzipkin/zipkin-go/proto/zipkin_proto3"
	"github.com/openzipkin/zipkin-go/reporter"
	zipkinhttp "github.com/openzipkin/zipkin-go/reporter/http"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/zipkin"
	"github.com/ferryhq/ferry/otlp/zipkin/zipkintest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// startReceiver runs the real OTLP receiver with the zipkin door and
// required tokens, its spans (otlp_proto, a record per trace) into sink.
func startReceiver(t *testing.T, sink *consumertest.Sink) (addr, token string) {
	t.Helper()
	checker, issue := authtest.New(t)
	var c otlpreceiver.Config
	c.Enabled = true
	c.HTTP.Enabled = true
	c.HTTP.HTTPConfig = server.HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	c.MaxRequestBytes = 1 << 20
	c.MaxItems = 100000
	c.MaxExpandedBytes = 8 << 20
	c.WaitForAck = true
	c.AckTimeout = 5 * time.Second
	c.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: "trace_id"}
	c.Metrics = encoding.Config{Topic: "metrics", Encoding: "otlp_proto", Partition: "resource"}
	c.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "resource"}
	c.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "header"}}
	c.Doors = []string{"zipkin"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := otlpreceiver.New(c, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Pre: &receiver.Prechecks{Checker: checker}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r.HTTPAddr(), issue("zipkin-app")
}

// report sends spans with zipkin-go's HTTP reporter, the serializer given,
// and returns what its logger said (the reporter logs a refusal).
func report(t *testing.T, url, tok string, ser reporter.SpanSerializer, spans []zipkinmodel.SpanModel) string {
	t.Helper()
	var logs bytes.Buffer
	opts := []zipkinhttp.ReporterOption{zipkinhttp.BatchSize(len(spans)), zipkinhttp.BatchInterval(time.Hour),
		zipkinhttp.Logger(log.New(&logs, "", 0)), zipkinhttp.Serializer(ser)}
	if tok != "" {
		opts = append(opts, zipkinhttp.RequestCallback(func(q *http.Request) { q.Header.Set("Authorization", "Bearer "+tok) }))
	}
	rep := zipkinhttp.NewReporter(url, opts...)
	for _, s := range spans {
		rep.Send(s)
	}
	if err := rep.Close(); err != nil { // sends what is batched, synchronously
		t.Fatal(err)
	}
	return logs.String()
}

// TestZipkinGoReporter: zipkin-go's HTTP reporter, with JSON and proto3,
// sends to the real OTLP receiver; every span arrives as an OTLP span
// whose ids, name, kind, times, endpoints, tags, annotations and status
// are what was sent; without the token nothing is taken.
func TestZipkinGoReporter(t *testing.T) {
	sink := &consumertest.Sink{}
	addr, tok := startReceiver(t, sink)
	url := "http://" + addr + "/api/v2/spans"
	for _, ser := range []reporter.SpanSerializer{reporter.JSONSerializer{}, zipkin_proto3.SpanSerializer{}} {
		t.Run(ser.ContentType(), func(t *testing.T) {
			sink.Reset()
			if logs := report(t, url, "", ser, zipkintest.Spans(3)); !strings.Contains(logs, "401") || len(sink.Records()) != 0 {
				t.Fatalf("without a token: %q, %d records", logs, len(sink.Records()))
			}
			want := zipkintest.Spans(40)
			if logs := report(t, url, tok, ser, want); logs != "" {
				t.Fatalf("the reporter logged %q", logs)
			}
			zipkintest.CheckSpans(t, want, zipkintest.Values(sink.Records()))
		})
	}
}

// TestTooLargeIsTheDoors: the package's ErrTooLarge is the door's
// ErrDoorTooLarge (which it cannot import), so the door answers 413.
func TestTooLargeIsTheDoors(t *testing.T) {
	if !errors.Is(fmt.Errorf("x: %w", zipkin.ErrTooLarge), otlpreceiver.ErrDoorTooLarge) {
		t.Fatal("zipkin.ErrTooLarge is not the door's ErrDoorTooLarge")
	}
	if errors.Is(errors.New("other"), zipkin.ErrTooLarge) {
		t.Fatal("any error is ErrTooLarge")
	}
}

// TestDoorAnswers: through the real receiver, the answers a Zipkin sender
// gets: 202, 400 naming the problem, 413 past a bound, 415-like refusals
// of other content types as 400, and the configured
// max_items_per_request applied to the converted request.
func TestDoorAnswers(t *testing.T) {
	sink := &consumertest.Sink{}
	addr, tok := startReceiver(t, sink)
	post := func(path, ct string, body []byte) (int, string, string) {
		q, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
		q.Header.Set("Content-Type", ct)
		q.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(q)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("X-Ferry-Reason"), string(b)
	}
	if code, _, _ := post("/api/v2/spans", "application/json", []byte(`[{"traceId":"1","id":"1","name":"a"}]`)); code != 202 || len(sink.Records()) != 1 {
		t.Fatalf("one span: %d, %d records", code, len(sink.Records()))
	}
	if code, _, _ := post("/api/v1/spans", "application/json", []byte(`[{"traceId":"0000000000000001","id":"0000000000000002","name":"a"}]`)); code != 202 || len(sink.Records()) != 2 {
		t.Fatalf("v1: %d, %d records", code, len(sink.Records()))
	}
	if code, reason, msg := post("/api/v2/spans", "application/json", []byte(`[{"id":"1"}]`)); code != 400 || reason != "invalid_payload" || !strings.Contains(msg, "zipkin: ") {
		t.Fatalf("bad span: %d %s %q", code, reason, msg)
	}
	flood := []byte(`[{"traceId":"1","id":"1","tags":{` + strings.Repeat(`"a":"",`, zipkin.MaxEntriesPerSpan) + `"b":""}}]`)
	if code, reason, msg := post("/api/v2/spans", "application/json", flood); code != 413 || reason != "request_too_large" {
		t.Fatalf("tag flood: %d %s %q", code, reason, msg)
	}
}
