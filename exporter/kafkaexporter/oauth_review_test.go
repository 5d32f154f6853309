package kafkaexporter

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A provider that answers a very short expires_in (a misconfigured client,
// a clock-skew workaround) must not make ferry ask it several times a
// second forever, with no connection asking: Kafka's own client waits at
// least sasl.login.refresh.min.period.seconds (60 s) between refreshes.
func TestOAuthShortLifetimeDoesNotHammerProvider(t *testing.T) {
	p := newIDP(t, false, tokenJSON("tok", 0.01))
	ts := newTS(t, oauthCfg(p.URL))
	_, _ = ts.token(context.Background())
	time.Sleep(2 * time.Second)
	if n := p.requests.Load(); n > 3 {
		t.Fatalf("%d token requests in 2 s with no connection asking", n)
	}
}

// The too-short token is refused with a reason naming the lifetime.
func TestOAuthShortLifetimeRefused(t *testing.T) {
	p := newIDP(t, false, tokenJSON("tok", 1))
	ts := newTS(t, oauthCfg(p.URL))
	if tok, err := ts.token(context.Background()); err == nil || tok != "" || !strings.Contains(err.Error(), "lives 1s") {
		t.Fatalf("a 1 s token: %q %v", tok, err)
	}
}
