package httpreceiver

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

func TestTokens(t *testing.T) {
	checker, issue := authtest.New(t)
	good := issue("shop")
	forged := authtest.Forge(good)
	for _, mode := range []string{"required", "optional"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig()
			cfg.Auth = auth.ReceiverConfig{Mode: mode, Sources: []string{"authorization", "header", "query"}}
			sink := &consumertest.Sink{}
			r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Pre: &receiver.Prechecks{Checker: checker}})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer r.Shutdown(t.Context())
			base := "http://" + r.Addr() + "/v1/messages/t"
			cases := []struct {
				url  string
				hdr  []string
				code int
			}{
				{base, []string{"Authorization", "Bearer " + good}, 200},
				{base, []string{"X-Ferry-Token", good}, 200},
				{base + "?token=" + good, nil, 200},
				{base, []string{"Authorization", "Bearer " + forged}, 401},
				{base, []string{"X-Ferry-Token", "garbage"}, 401},
			}
			if mode == "required" {
				cases = append(cases, struct {
					url  string
					hdr  []string
					code int
				}{base, nil, 401})
			} else {
				cases = append(cases, struct {
					url  string
					hdr  []string
					code int
				}{base, nil, 200})
			}
			for i, c := range cases {
				got := post(t, c.url, "text/plain", "", []byte("m"), c.hdr...)
				if got.code != c.code {
					t.Fatalf("case %d: %d %v, want %d", i, got.code, got.body, c.code)
				}
				if c.code == 401 {
					msg := got.body["error"].(string)
					if got.body["reason"] != "unauthenticated" || !strings.HasPrefix(msg, "invalid token: ") ||
						strings.Contains(msg, forged[:20]) || got.hdr.Get("WWW-Authenticate") == "" {
						t.Fatalf("case %d: 401 body %v", i, got.body)
					}
				}
			}
			recs := sink.Records()
			withApp := 0
			for _, rec := range recs {
				for _, h := range rec.Headers {
					if h.Key == "ferry.tenant" && string(h.Value) == "shop" {
						withApp++
					}
				}
			}
			if withApp != 3 {
				t.Fatalf("%d records carry ferry.tenant=shop, want 3 (one per valid token)", withApp)
			}
			want := 2.0
			if mode == "required" {
				want = 3
			}
			if v := testutil.ToFloat64(r.m.Errors("unauthenticated")); v != want {
				t.Fatalf("unauthenticated counter %v, want %v", v, want)
			}
		})
	}
}

func TestTokenTopicRestriction(t *testing.T) {
	checker, _ := authtest.New(t)
	ring, _ := (&auth.Config{Keys: []auth.KeyConfig{{ID: 1, Secret: authtest.Key, Issue: true}}}).Keyring()
	tok, _ := ring.Issue(token.Claims{App: "shop", Topics: [4]string{token.Messages: "shop-events"}})
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"header"}}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Pre: &receiver.Prechecks{Checker: checker}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(t.Context())
	base := "http://" + r.Addr() + "/v1/messages/"
	if got := post(t, base+"shop-events", "text/plain", "", []byte("x"), "X-Ferry-Token", tok); got.code != 200 {
		t.Fatalf("own topic: %d", got.code)
	}
	got := post(t, base+"billing", "text/plain", "", []byte("x"), "X-Ferry-Token", tok)
	if got.code != 403 || got.body["reason"] != "topic_not_allowed" {
		t.Fatalf("other topic: %d %v", got.code, got.body)
	}
}
