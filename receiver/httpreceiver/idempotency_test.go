package httpreceiver

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// spoolWithKeys opens (or reopens) a real spool in dir, fsync always,
// delivering to sink, with a new idempotency store, and a receiver on it.
func spoolWithKeys(t *testing.T, dir string, sink *consumertest.Sink) (*Receiver, string, *spool.Spool) {
	t.Helper()
	st, err := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 1 << 20}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(spool.Config{Dir: dir, SegmentBytes: 1 << 20, MaxBytes: 64 << 20, Fsync: "always", WriteBuffer: 8 << 20,
		ReadAhead: 4 << 20}, telemetry.TestSettings(), spool.Links{Next: sink, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	_ = sp.Start(context.Background())
	r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: sp, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r, "http://" + r.Addr(), sp
}

func stopSpool(r *Receiver, sp *spool.Spool) {
	_ = r.Shutdown(context.Background())
	_ = sp.Shutdown(context.Background())
	_ = sp.Close()
}

// TestIdempotencyKeyOverHTTP: a request with an Idempotency-Key is stored
// once however often it is resent — before and after the agent restarts
// on the same spool — and each retry is answered as the original was,
// marked Idempotent-Replayed; the key with another body or topic is
// refused (422); a malformed key is refused before the body is read.
func TestIdempotencyKeyOverHTTP(t *testing.T) {
	dir := t.TempDir()
	sink := &consumertest.Sink{}
	r, url, sp := spoolWithKeys(t, dir, sink)
	body := []byte("{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n")
	key := "0f8fad5b-d9cb-469f-a165-70867728950e"
	res := post(t, url+"/v1/messages/t", "application/x-ndjson", "", body, "Idempotency-Key", key)
	if res.code != 200 || res.body["accepted"] != float64(3) || res.hdr.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v %v", res.code, res.body, res.hdr)
	}
	for range 3 {
		res = post(t, url+"/v1/messages/t", "application/x-ndjson", "gzip", gz(body), "Idempotency-Key", key, "X-Ferry-Request-Id", "r1")
		if res.code != 200 || res.body["accepted"] != float64(3) || res.hdr.Get("Idempotent-Replayed") != "true" ||
			res.body["request_id"] != "r1" {
			t.Fatalf("retry: %d %v %v", res.code, res.body, res.hdr)
		}
	}
	for _, tc := range []struct{ path, body string }{{"/v1/messages/t", "{\"n\":9}\n"}, {"/v1/messages/other", string(body)}} {
		res = post(t, url+tc.path, "application/x-ndjson", "", []byte(tc.body), "Idempotency-Key", key)
		if res.code != http.StatusUnprocessableEntity || res.body["reason"] != "idempotency_key_reused" {
			t.Fatalf("reused key %s: %d %v", tc.path, res.code, res.body)
		}
	}
	for _, bad := range []string{strings.Repeat("k", idempotency.MaxKeyBytes+1), "has space", "ünï"} {
		res = post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Idempotency-Key", bad)
		if res.code != 400 || res.body["reason"] != "invalid_idempotency_key" {
			t.Fatalf("key %.20q: %d %v", bad, res.code, res.body)
		}
	}
	if v := testutil.ToFloat64(r.m.Errors("invalid_idempotency_key")); v != 3 {
		t.Fatalf("invalid keys counted %v", v)
	}
	// Two keys in one request: which one would count?
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages/t", strings.NewReader("x"))
	req.Header.Add("Idempotency-Key", "a")
	req.Header.Add("Idempotency-Key", "b")
	if hr, err := http.DefaultClient.Do(req); err != nil || hr.StatusCode != 400 {
		t.Fatalf("two keys: %v %v", hr, err)
	} else {
		hr.Body.Close()
	}
	// The same request without the key is simply accepted again.
	if res = post(t, url+"/v1/messages/t", "application/x-ndjson", "", body); res.code != 200 {
		t.Fatalf("without a key: %d %v", res.code, res.body)
	}
	waitRecords(t, sink, 6)
	stopSpool(r, sp)

	// A restart on the same spool remembers the key.
	sink2 := &consumertest.Sink{}
	r2, url2, sp2 := spoolWithKeys(t, dir, sink2)
	defer stopSpool(r2, sp2)
	res = post(t, url2+"/v1/messages/t", "application/x-ndjson", "", body, "Idempotency-Key", key)
	if res.code != 200 || res.body["accepted"] != float64(3) || res.hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after restart: %d %v %v", res.code, res.body, res.hdr)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(sink2.Records()); n != 0 {
		t.Fatalf("the retry after restart stored %d records", n)
	}
	if len(sink.Records()) != 6 {
		t.Fatalf("delivered %d records in all, want 6 (3 keyed once, 3 unkeyed)", len(sink.Records()))
	}
}

func waitRecords(t *testing.T, sink *consumertest.Sink, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(sink.Records()) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if got := len(sink.Records()); got != n {
		t.Fatalf("delivered %d records, want %d", got, n)
	}
}

// TestIdempotencyKeyInFlight: a retry while the first copy is still being
// stored is told 409 with Retry-After, not stored and not made to wait.
func TestIdempotencyKeyInFlight(t *testing.T) {
	st, _ := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 1 << 20}, prometheus.NewRegistry())
	h := &consumertest.Holder{}
	r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: h, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Start(context.Background())
	defer r.Shutdown(context.Background())
	url := "http://" + r.Addr()
	if res := post(t, url+"/v1/messages/t?wait=false", "text/plain", "", []byte("x"), "Idempotency-Key", "k"); res.code != 202 {
		t.Fatalf("first: %d %v", res.code, res.body)
	}
	res := post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Idempotency-Key", "k")
	if res.code != http.StatusConflict || res.body["reason"] != "idempotency_key_in_flight" || res.hdr.Get("Retry-After") == "" {
		t.Fatalf("retry in flight: %d %v", res.code, res.body)
	}
	if h.Held() != 1 {
		t.Fatalf("%d batches held, want 1", h.Held())
	}
	h.Release(nil)
}

// TestIdempotencyKeyNeedsSpool: without a key store (delivery modes kafka
// and spill) a request with a key is refused, never silently taken as if
// its retries were safe.
func TestIdempotencyKeyNeedsSpool(t *testing.T) {
	r, url := start(t, testConfig(), &consumertest.Sink{})
	res := post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"), "Idempotency-Key", "k")
	if res.code != 400 || res.body["reason"] != "idempotency_unavailable" || !strings.Contains(res.body["error"].(string), "delivery.mode spool") {
		t.Fatalf("%d %v", res.code, res.body)
	}
	if v := testutil.ToFloat64(r.m.Errors("idempotency_unavailable")); v != 1 {
		t.Fatalf("counted %v", v)
	}
}
