package httpreceiver

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// TestRateLimitPerApp: an app over its class gets 429 with Retry-After
// before anything is queued; another app on a bigger class is unaffected.
func TestRateLimitPerApp(t *testing.T) {
	set := telemetry.TestSettings()
	lim, err := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{
		"small": {RecordsPerSec: 5, BurstRecords: 10},
		"big":   {RecordsPerSec: 1e6},
	}, Apps: map[string]string{"bulk": "big"}}, set)
	if err != nil {
		t.Fatal(err)
	}
	checker, issue := authtest.NewWithClass(t, "small")
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization"}}
	sink := &consumertest.Sink{}
	r, err := New(cfg, receiver.Env{Set: set, Next: sink, Pre: &receiver.Prechecks{Checker: checker, Limiter: lim}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(t.Context())
	url := "http://" + r.Addr() + "/v1/messages/t"
	small, bulk := issue("shop"), issue("bulk") // same class in the token; bulk is overridden to big
	five := []byte("1\n2\n3\n4\n5\n")
	for i := 0; i < 2; i++ {
		if got := post(t, url, "application/x-ndjson", "", five, "Authorization", "Bearer "+small); got.code != 200 {
			t.Fatalf("within the burst: %d %v", got.code, got.body)
		}
	}
	got := post(t, url, "application/x-ndjson", "", five, "Authorization", "Bearer "+small)
	if got.code != 429 || got.body["reason"] != "rate_limited" {
		t.Fatalf("over the limit: %d %v", got.code, got.body)
	}
	if s, _ := strconv.Atoi(got.hdr.Get("Retry-After")); s < 1 {
		t.Fatalf("Retry-After %q", got.hdr.Get("Retry-After"))
	}
	for i := 0; i < 10; i++ {
		if got := post(t, url, "application/x-ndjson", "", five, "Authorization", "Bearer "+bulk); got.code != 200 {
			t.Fatalf("bulk app throttled with shop: %d", got.code)
		}
	}
	if n := len(sink.Records()); n != 2*5+10*5 {
		t.Fatalf("%d records queued, want 60 (the refused request queued nothing)", n)
	}
	if v := testutil.ToFloat64(r.m.Errors("rate_limited")); v != 1 {
		t.Fatalf("rate_limited counter %v", v)
	}
}
