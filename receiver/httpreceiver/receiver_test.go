package httpreceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/receiver"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/buffer/memqueue"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

func testConfig() Config {
	return Config{Enabled: true, MaxRequestBytes: 64 << 10, MaxRecords: 100000, WaitForAck: true, AckTimeout: 5 * time.Second,
		HTTPConfig: server.HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}}
}

func start(t *testing.T, cfg Config, next consumer.Consumer) (*Receiver, string) {
	t.Helper()
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: next})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r, "http://" + r.Addr()
}

type resp struct {
	code int
	body map[string]any
	hdr  http.Header
}

func post(t *testing.T, url, ctype, enc string, body []byte, hdr ...string) resp {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := resp{code: res.StatusCode, hdr: res.Header}
	if err := json.Unmarshal(raw, &out.body); err != nil {
		t.Fatalf("response is not JSON: %q", raw)
	}
	return out
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

func zst(b []byte) []byte {
	enc, _ := zstd.NewWriter(nil)
	return enc.EncodeAll(b, nil)
}

func TestAcceptsSingleAndNDJSON(t *testing.T) {
	s := &consumertest.Sink{}
	r, base := start(t, testConfig(), s)

	got := post(t, base+"/v1/messages/t1?key=qk", "text/plain", "", []byte("hello"), "X-Ferry-Header-Trace-ID", "abc")
	if got.code != 200 || got.body["accepted"] != 1.0 {
		t.Fatalf("single: %d %v", got.code, got.body)
	}
	got = post(t, base+"/v1/messages/t1", "application/x-ndjson", "gzip", gz([]byte("{\"a\":1}\r\n\n{\"a\":2}\n{\"a\":3}")), "X-Ferry-Key", "hk")
	if got.code != 200 || got.body["accepted"] != 3.0 {
		t.Fatalf("ndjson: %d %v", got.code, got.body)
	}
	got = post(t, base+"/v1/messages/t1", "application/x-ndjson", "zstd", zst([]byte("x\ny\n")))
	if got.code != 200 || got.body["accepted"] != 2.0 {
		t.Fatalf("zstd: %d %v", got.code, got.body)
	}
	want := []struct{ key, val string }{{"qk", "hello"}, {"hk", `{"a":1}`}, {"hk", `{"a":2}`}, {"hk", `{"a":3}`}, {"", "x"}, {"", "y"}}
	recs := s.Records()
	if len(recs) != len(want) {
		t.Fatalf("got %d records, want %d", len(recs), len(want))
	}
	for i, w := range want {
		if string(recs[i].Key) != w.key || string(recs[i].Value) != w.val || recs[i].Topic != "t1" {
			t.Errorf("record %d = %q/%q/%s, want %q/%q/t1", i, recs[i].Key, recs[i].Value, recs[i].Topic, w.key, w.val)
		}
	}
	if h := recs[0].Headers; len(h) != 1 || h[0].Key != "trace-id" || string(h[0].Value) != "abc" {
		t.Errorf("headers = %+v, want trace-id=abc", h)
	}
	if v := testutil.ToFloat64(r.m.Records("t1")); v != 6 {
		t.Errorf("received records counter = %v, want 6", v)
	}
}

func TestFireAndForget(t *testing.T) {
	s := &consumertest.Sink{}
	r, base := start(t, testConfig(), s)
	got := post(t, base+"/v1/messages/t1?wait=false", "application/x-ndjson", "", []byte("a\nb\n"))
	if got.code != http.StatusAccepted || got.body["accepted"] != 2.0 {
		t.Fatalf("got %d %v, want 202 accepted 2", got.code, got.body)
	}
	if v := testutil.ToFloat64(r.m.NoWaitCounter()); v != 2 {
		t.Errorf("fire-and-forget counter = %v, want 2", v)
	}
}

// errorConsumer refuses every batch with err.
type errorConsumer struct{ err error }

func (e errorConsumer) Consume(context.Context, *record.Batch) error { return e.err }

func TestErrorPaths(t *testing.T) {
	big := bytes.Repeat([]byte("a"), 70<<10) // over the 64 KiB test limit
	bomb := gz(bytes.Repeat([]byte("z"), 1<<20))
	cases := []struct {
		name, path, ctype, enc string
		body                   []byte
		next                   consumer.Consumer
		code                   int
		reason                 string
		retryAfter             bool
	}{
		{"invalid topic", "/v1/messages/bad%20topic", "text/plain", "", []byte("x"), &consumertest.Sink{}, 400, "invalid_topic", false},
		{"topic too long", "/v1/messages/" + strings.Repeat("t", 250), "text/plain", "", []byte("x"), &consumertest.Sink{}, 400, "invalid_topic", false},
		{"unknown path", "/v2/other", "text/plain", "", []byte("x"), &consumertest.Sink{}, 404, "not_found", false},
		{"body too large", "/v1/messages/t", "text/plain", "", big, &consumertest.Sink{}, 413, "request_too_large", false},
		{"gzip bomb", "/v1/messages/t", "text/plain", "gzip", bomb, &consumertest.Sink{}, 413, "request_too_large", false},
		{"zstd bomb", "/v1/messages/t", "text/plain", "zstd", zst(bytes.Repeat([]byte("z"), 1<<20)), &consumertest.Sink{}, 413, "request_too_large", false},
		{"content type", "/v1/messages/t", "application/x-www-form-urlencoded", "", []byte("x"), &consumertest.Sink{}, 415, "unsupported_content_type", false},
		{"content encoding", "/v1/messages/t", "text/plain", "br", []byte("x"), &consumertest.Sink{}, 415, "unsupported_content_encoding", false},
		{"corrupt gzip", "/v1/messages/t", "text/plain", "gzip", []byte("not gzip at all"), &consumertest.Sink{}, 400, "corrupt_body", false},
		{"corrupt zstd", "/v1/messages/t", "text/plain", "zstd", []byte("not zstd at all"), &consumertest.Sink{}, 400, "corrupt_body", false},
		{"truncated gzip", "/v1/messages/t", "text/plain", "gzip", gz([]byte("hello world"))[:15], &consumertest.Sink{}, 400, "corrupt_body", false},
		{"empty body", "/v1/messages/t", "text/plain", "", nil, &consumertest.Sink{}, 400, "empty_body", false},
		{"only blank lines", "/v1/messages/t", "application/x-ndjson", "", []byte("\n\r\n\n"), &consumertest.Sink{}, 400, "empty_body", false},
		{"bad wait", "/v1/messages/t?wait=maybe", "text/plain", "", []byte("x"), &consumertest.Sink{}, 400, "invalid_parameter", false},
		{"queue full", "/v1/messages/t", "text/plain", "", []byte("x"), errorConsumer{consumer.ErrFull}, 429, "queue_full", true},
		{"kafka down", "/v1/messages/t", "text/plain", "", []byte("x"), errorConsumer{consumer.ErrUnavailable}, 503, "kafka_unavailable", true},
		{"record too large", "/v1/messages/t", "text/plain", "", []byte("x"), &consumertest.Sink{Err: consumer.TooLarge("record", 2000000, 1000000, nil)}, 413, "record_too_large", false},
		{"unknown topic", "/v1/messages/t", "text/plain", "", []byte("x"), &consumertest.Sink{Err: consumer.UnknownTopic("t", nil)}, 404, "unknown_topic", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, base := start(t, testConfig(), c.next)
			got := post(t, base+c.path, c.ctype, c.enc, c.body)
			if got.code != c.code || got.body["reason"] != c.reason {
				t.Fatalf("got %d %v, want %d reason %s", got.code, got.body, c.code, c.reason)
			}
			if msg, _ := got.body["error"].(string); msg == "" {
				t.Errorf("no error message in %v", got.body)
			}
			if c.retryAfter && got.hdr.Get("Retry-After") == "" {
				t.Errorf("no Retry-After header")
			}
			if v := testutil.ToFloat64(r.m.Errors(c.reason)); v != 1 {
				t.Errorf("errors_total{reason=%s} = %v, want 1", c.reason, v)
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	r, base := start(t, testConfig(), &consumertest.Sink{})
	res, err := http.Get(base + "/v1/messages/t")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 405 || res.Header.Get("Allow") != "POST" {
		t.Fatalf("GET = %d (Allow %q), want 405 Allow POST", res.StatusCode, res.Header.Get("Allow"))
	}
	if v := testutil.ToFloat64(r.m.Errors("method_not_allowed")); v != 1 {
		t.Errorf("counter = %v", v)
	}
}

func TestValidateJSON(t *testing.T) {
	cfg := testConfig()
	cfg.ValidateJSON = true
	_, base := start(t, cfg, &consumertest.Sink{})
	got := post(t, base+"/v1/messages/t", "application/x-ndjson", "", []byte("{\"ok\":1}\n{broken\n"))
	if got.code != 400 || got.body["reason"] != "invalid_ndjson" || !strings.Contains(got.body["error"].(string), "line 2") {
		t.Fatalf("got %d %v, want 400 invalid_ndjson naming line 2", got.code, got.body)
	}
}

func TestAckTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.AckTimeout = 200 * time.Millisecond
	h := &consumertest.Holder{}
	r, base := start(t, cfg, h)
	got := post(t, base+"/v1/messages/t", "text/plain", "", []byte("x"))
	if got.code != http.StatusGatewayTimeout || got.body["reason"] != "ack_timeout" {
		t.Fatalf("got %d %v, want 504 ack_timeout", got.code, got.body)
	}
	h.Release(nil) // a late acknowledgement must not panic or block
	if v := testutil.ToFloat64(r.m.Errors("ack_timeout")); v != 1 {
		t.Errorf("counter = %v", v)
	}
}

// TestQueueFull: with Kafka holding everything, the memory queue refuses
// with 429 once full, its gauge never passes the limit, and requests are
// accepted again once Kafka acknowledges.
func TestQueueFull(t *testing.T) {
	set := telemetry.TestSettings()
	h := &consumertest.Holder{}
	q, err := memqueue.New(memqueue.Config{MemoryLimit: 1 << 20, ReadyBelow: 0.95}, set, budget.New(1<<20), h, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, base := start(t, testConfig(), q)
	body := bytes.Repeat([]byte("v"), 60<<10)
	var accepted, refused int
	for i := 0; i < 40; i++ {
		got := post(t, base+"/v1/messages/t?wait=false", "text/plain", "", body)
		switch got.code {
		case 202:
			accepted++
		case 429:
			refused++
			if got.hdr.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("unexpected %d %v", got.code, got.body)
		}
		if q.Used() > q.Limit() {
			t.Fatalf("queue holds %d bytes, over its limit %d", q.Used(), q.Limit())
		}
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("accepted %d refused %d: want both", accepted, refused)
	}
	if ready, _ := set.Health.Ready(); ready {
		t.Error("readyz says ready while the queue is full")
	}
	h.Release(nil)
	if q.Used() != 0 {
		t.Fatalf("queue holds %d bytes after every batch was acknowledged", q.Used())
	}
	if got := post(t, base+"/v1/messages/t?wait=false", "text/plain", "", body); got.code != 202 {
		t.Fatalf("after release: %d %v", got.code, got.body)
	}
}
