package httpreceiver

import (
	"context"
	"github.com/ferryhq/ferry/receiver"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// memSink records each batch's MemBytes and records.
type memSink struct {
	consumertest.Sink
	mu  sync.Mutex
	mem []int64
}

func (s *memSink) Consume(ctx context.Context, b *record.Batch) error {
	s.mu.Lock()
	s.mem = append(s.mem, b.MemBytes)
	s.mu.Unlock()
	return s.Sink.Consume(ctx, b)
}

// TestLineBombRefused: a few KB of gzip holding millions of one-byte lines
// are refused with 413 naming max_records_per_request, before any record
// is built.
func TestLineBombRefused(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 8 << 20
	cfg.MaxRecords = 1000
	sink := &memSink{}
	_, url := start(t, cfg, sink)
	body := payloads.Gzip(payloads.Lines(4 << 20))
	res := post(t, url+"/v1/messages/t", "application/x-ndjson", "gzip", body)
	if res.code != 413 || res.body["reason"] != "too_many_records" || !strings.Contains(res.body["error"].(string), "max_records_per_request") {
		t.Fatalf("line bomb: %d %v", res.code, res.body)
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records passed on", n)
	}
	// At the limit it is accepted.
	res = post(t, url+"/v1/messages/t", "application/x-ndjson", "", payloads.Lines(1000))
	if res.code != 200 || len(sink.Records()) != 1000 {
		t.Fatalf("1000 lines: %d %v, %d records", res.code, res.body, len(sink.Records()))
	}
}

// TestHeadersChargedPerRecord: a request's key and headers are shared by
// all its records in memory, but the Kafka client holds (and counts) a copy
// per record: the batch must reserve them per record, or the queue admits
// far more than its bound and the Kafka client's buffer overflows mid-request.
func TestHeadersChargedPerRecord(t *testing.T) {
	cfg := testConfig()
	cfg.MaxHeaderBytes = 64 << 10
	sink := &memSink{}
	_, url := start(t, cfg, sink)
	big := strings.Repeat("h", 8000)
	res := post(t, url+"/v1/messages/t", "application/x-ndjson", "", payloads.Lines(500),
		"X-Ferry-Header-Big", big, "X-Ferry-Key", "k")
	if res.code != 200 {
		t.Fatalf("%d %v", res.code, res.body)
	}
	want := int64(500 * (len(big) + len("big") + len("k")))
	if got := sink.mem[0]; got < want {
		t.Fatalf("MemBytes %d; the records' headers and keys alone are %d", got, want)
	}
}

// TestReservedHeadersDropped: a client cannot set headers in ferry's own
// namespace (ferry.tenant, ferry.app, ...), which consumers trust to say
// who sent a record.
func TestReservedHeadersDropped(t *testing.T) {
	sink := &memSink{}
	_, url := start(t, testConfig(), sink)
	res := post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"),
		"X-Ferry-Header-Ferry.tenant", "acme", "X-Ferry-Header-FERRY.App", "billing", "X-Ferry-Header-Source", "web")
	if res.code != 200 {
		t.Fatalf("%d %v", res.code, res.body)
	}
	recs := sink.Records()
	for _, h := range recs[0].Headers {
		if strings.HasPrefix(h.Key, "ferry.") {
			t.Fatalf("client header %q=%q reached Kafka", h.Key, h.Value)
		}
	}
	if len(recs[0].Headers) != 1 || recs[0].Headers[0].Key != "source" {
		t.Fatalf("headers %v, want only source", recs[0].Headers)
	}
}

// TestTopicScope: a token's topic pattern confines its holder to matching
// topics (another tenant's OTLP topic is refused), and the receiver's
// topics patterns confine everyone; both answer 403 topic_not_allowed.
func TestTopicScope(t *testing.T) {
	checker, _ := authtest.New(t)
	acme := authtest.IssueClaims(t, token.Claims{App: "acme", TopicPattern: "acme-*"})
	cfg := testConfig()
	cfg.Topics = []string{"acme-*", "shared-logs", "otel-*"}
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"authorization"}}
	sink := &memSink{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Pre: &receiver.Prechecks{Checker: checker}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(t.Context())
	base := "http://" + r.Addr() + "/v1/messages/"
	for _, c := range []struct {
		topic, tok string
		code       int
	}{
		{"acme-orders", acme, 200},
		{"otel-logs-globex", acme, 403}, // another tenant's topic
		{"shared-logs", acme, 403},      // allowed by the receiver, not by the token
		{"shared-logs", "", 200},
		{"billing", "", 403}, // allowed by nothing
	} {
		var hdr []string
		if c.tok != "" {
			hdr = []string{"Authorization", "Bearer " + c.tok}
		}
		res := post(t, base+c.topic, "text/plain", "", []byte("x"), hdr...)
		if res.code != c.code || c.code == 403 && res.body["reason"] != "topic_not_allowed" {
			t.Errorf("%s with token %v: %d %v, want %d", c.topic, c.tok != "", res.code, res.body, c.code)
		}
	}
	if n := len(sink.Records()); n != 2 {
		t.Fatalf("%d records passed on, want 2", n)
	}
}

// TestBrowserOriginsRefused: a request carrying an Origin header (what a
// browser adds when a web page posts to 127.0.0.1) is refused 403 unless
// its origin is configured, in which case CORS is answered.
func TestBrowserOriginsRefused(t *testing.T) {
	cfg := testConfig()
	cfg.AllowedOrigins = []string{"https://app.example.com"}
	sink := &memSink{}
	_, url := start(t, cfg, sink)
	res := post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Origin", "https://evil.example")
	if res.code != 403 || res.body["reason"] != "origin_not_allowed" {
		t.Fatalf("foreign origin: %d %v", res.code, res.body)
	}
	res = post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Origin", "null")
	if res.code != 403 {
		t.Fatalf("opaque origin: %d", res.code)
	}
	res = post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Origin", "https://app.example.com")
	if res.code != 200 || res.hdr.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Fatalf("allowed origin: %d %v", res.code, res.hdr)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}
