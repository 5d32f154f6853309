package auth

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/metadata"

	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/telemetry"
)

func reason(err error) string {
	var te *token.Error
	if errors.As(err, &te) {
		return te.Reason
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

// TestGateModes: none lets every request in unchecked (a forged token
// included); optional lets a request without a token in and checks one
// that has one; required refuses a request without one (counted as
// missing) and checks the others. Each mode is applied to every HTTP
// source and to gRPC metadata.
func TestGateModes(t *testing.T) {
	c, ring := newChecker(t, 64, time.Minute)
	good, _ := ring.Issue(token.Claims{App: "shop"})
	forged := good[:len(good)-4] + "AAAA"
	type want struct{ none, good, forged string } // "" = let in; else the reason
	modes := map[string]want{
		"":         {"", "", ""},
		"none":     {"", "", ""},
		"optional": {"", "", token.ReasonForged},
		"required": {token.ReasonMissing, "", token.ReasonForged},
	}
	for mode, w := range modes {
		for _, src := range []string{"authorization", "header", "query", "metadata"} {
			g := NewGate(ReceiverConfig{Mode: mode, Sources: []string{src}}, c, nil)
			try := func(tok string) (*token.Claims, error) {
				if src == "metadata" {
					ctx := context.Background()
					if tok != "" {
						ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-ferry-token", tok))
					}
					return g.GRPC(ctx)
				}
				r := httptest.NewRequest("POST", "/v1/x", nil)
				if tok != "" {
					switch src {
					case "authorization":
						r.Header.Set("Authorization", "Bearer "+tok)
					case "header":
						r.Header.Set("X-Ferry-Token", tok)
					case "query":
						r = httptest.NewRequest("POST", "/v1/x?token="+tok, nil)
					}
				}
				return g.HTTP(r)
			}
			for _, tc := range []struct {
				tok, want string
			}{{"", w.none}, {good, w.good}, {forged, w.forged}} {
				cl, err := try(tc.tok)
				if got := reason(err); got != tc.want {
					t.Errorf("mode %q source %s token %.8q: refused %q, want %q", mode, src, tc.tok, got, tc.want)
					continue
				}
				checked := mode == "optional" || mode == "required"
				if err == nil && tc.tok == good && checked && (cl == nil || cl.App != "shop") {
					t.Errorf("mode %q source %s: a valid token gave claims %v", mode, src, cl)
				}
				if err == nil && (!checked || tc.tok == "") && cl != nil {
					t.Errorf("mode %q source %s token %.8q: claims %v without a check", mode, src, tc.tok, cl)
				}
			}
		}
	}
	// 4 sources × one request without a token under required.
	if n := testutil.ToFloat64(c.RefusedCounter(token.ReasonMissing)); n != 4 {
		t.Fatalf("refused{missing} = %v, want 4", n)
	}
	// 2 modes × 4 sources × one forged token.
	if n := testutil.ToFloat64(c.RefusedCounter(token.ReasonForged)); n != 8 {
		t.Fatalf("refused{forged} = %v, want 8", n)
	}
}

// TestGateWithoutChecker: a receiver whose agent has no checker (or a nil
// gate) lets everything in and counts nothing, whatever its mode says.
func TestGateWithoutChecker(t *testing.T) {
	g := NewGate(ReceiverConfig{Mode: "required", Sources: []string{"header"}}, nil, nil)
	if g.Enabled() || g.WantsResource() {
		t.Fatal("a gate without a checker says it checks")
	}
	if cl, err := g.HTTP(httptest.NewRequest("GET", "/", nil)); cl != nil || err != nil {
		t.Fatalf("%v %v", cl, err)
	}
	if cl, err := g.GRPC(context.Background()); cl != nil || err != nil {
		t.Fatalf("%v %v", cl, err)
	}
	g.Refused("whatever") // must not panic on the nil checker
	var nilGate *Gate
	if nilGate.Enabled() || nilGate.Limit(nil, 1, 1) != nil {
		t.Fatal("a nil gate checks or limits")
	}
}

// TestGateSetConfig: a reload's configuration applies to the next request
// (required → none lets a tokenless request in; → optional with the
// resource source is seen by WantsResource), and Refused counts only while
// the gate checks.
func TestGateSetConfig(t *testing.T) {
	c, _ := newChecker(t, 64, time.Minute)
	g := NewGate(ReceiverConfig{Mode: "required", Sources: []string{"header"}}, c, nil)
	if _, err := g.Check(""); reason(err) != token.ReasonMissing {
		t.Fatalf("required, no token: %v", err)
	}
	if g.WantsResource() {
		t.Fatal("resource wanted though not a source")
	}
	g.SetConfig(ReceiverConfig{Mode: "none"})
	if _, err := g.Check(""); err != nil {
		t.Fatalf("after reload to none: %v", err)
	}
	g.Refused("conflict")
	if n := testutil.ToFloat64(c.RefusedCounter("conflict")); n != 0 {
		t.Fatalf("a gate in mode none counted a refusal: %v", n)
	}
	g.SetConfig(ReceiverConfig{Mode: "optional", Sources: []string{"header", "resource"}})
	if !g.WantsResource() {
		t.Fatal("resource is a source after the reload, WantsResource says no")
	}
	g.Refused("conflict")
	if n := testutil.ToFloat64(c.RefusedCounter("conflict")); n != 1 {
		t.Fatalf("refused{conflict} = %v, want 1", n)
	}
}

// TestHTTPToken: where an HTTP request's token is taken from, sources in
// their configured order, with Authorization's scheme matched in any case.
func TestHTTPToken(t *testing.T) {
	all := []string{"authorization", "header", "query"}
	cases := []struct {
		name    string
		sources []string
		url     string
		headers [][2]string
		want    string
	}{
		{"bearer", all, "/", [][2]string{{"Authorization", "Bearer abc"}}, "abc"},
		{"lower-case scheme", all, "/", [][2]string{{"Authorization", "bearer abc"}}, "abc"},
		{"upper-case scheme", all, "/", [][2]string{{"Authorization", "BEARER abc"}}, "abc"},
		{"spaces around", all, "/", [][2]string{{"Authorization", "Bearer   abc  "}}, "abc"},
		{"empty bearer", []string{"authorization"}, "/", [][2]string{{"Authorization", "Bearer "}}, ""},
		{"blank bearer", []string{"authorization"}, "/", [][2]string{{"Authorization", "Bearer    "}}, ""},
		{"no space after scheme", []string{"authorization"}, "/", [][2]string{{"Authorization", "Bearerabc"}}, ""},
		{"other scheme", []string{"authorization"}, "/", [][2]string{{"Authorization", "Basic dXNlcjpwdw=="}}, ""},
		{"other scheme, then header", all, "/", [][2]string{{"Authorization", "Basic x"}, {"X-Ferry-Token", "hdr"}}, "hdr"},
		{"empty bearer, then header", all, "/", [][2]string{{"Authorization", "Bearer "}, {"X-Ferry-Token", "hdr"}}, "hdr"},
		{"first source wins", all, "/?token=q", [][2]string{{"Authorization", "Bearer a"}, {"X-Ferry-Token", "hdr"}}, "a"},
		{"order is the configuration's", []string{"query", "header", "authorization"}, "/?token=q",
			[][2]string{{"Authorization", "Bearer a"}, {"X-Ferry-Token", "hdr"}}, "q"},
		{"several authorization values: the first", all, "/",
			[][2]string{{"Authorization", "Bearer one"}, {"Authorization", "Bearer two"}}, "one"},
		{"several header values: the first", []string{"header"}, "/",
			[][2]string{{"X-Ferry-Token", "one"}, {"X-Ferry-Token", "two"}}, "one"},
		{"query", all, "/p?a=1&token=q", nil, "q"},
		{"empty query value", []string{"query"}, "/p?token=", nil, ""},
		{"query not a source", []string{"authorization", "header"}, "/p?token=q", nil, ""},
		{"header not a source", []string{"authorization"}, "/", [][2]string{{"X-Ferry-Token", "hdr"}}, ""},
		{"no sources", nil, "/?token=q", [][2]string{{"Authorization", "Bearer a"}}, ""},
		{"gRPC-only sources ignored", []string{"metadata", "resource", "hello", "sasl"}, "/?token=q",
			[][2]string{{"Authorization", "Bearer a"}, {"X-Ferry-Token", "hdr"}}, ""},
	}
	for _, tc := range cases {
		g := NewGate(ReceiverConfig{Mode: "required", Sources: tc.sources}, nil, nil)
		r := httptest.NewRequest("GET", tc.url, nil)
		for _, h := range tc.headers {
			r.Header.Add(h[0], h[1])
		}
		if got := g.HTTPToken(r); got != tc.want {
			t.Errorf("%s: token %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestGRPCToken: a gRPC call's token is "authorization: Bearer …" or else
// x-ferry-token, the first of several values, under either source name.
func TestGRPCToken(t *testing.T) {
	cases := []struct {
		name    string
		sources []string
		md      metadata.MD
		want    string
	}{
		{"bearer", []string{"metadata"}, metadata.Pairs("authorization", "Bearer abc"), "abc"},
		{"scheme in any case", []string{"metadata"}, metadata.Pairs("authorization", "bEaReR abc"), "abc"},
		{"x-ferry-token", []string{"metadata"}, metadata.Pairs("x-ferry-token", "xt"), "xt"},
		{"key in any case", []string{"metadata"}, metadata.Pairs("X-Ferry-Token", "xt"), "xt"},
		{"authorization source reads metadata", []string{"authorization"}, metadata.Pairs("x-ferry-token", "xt"), "xt"},
		{"bearer before x-ferry-token", []string{"metadata"},
			metadata.Pairs("x-ferry-token", "xt", "authorization", "Bearer abc"), "abc"},
		{"other scheme falls back", []string{"metadata"},
			metadata.Pairs("authorization", "Basic x", "x-ferry-token", "xt"), "xt"},
		{"empty bearer falls back", []string{"metadata"},
			metadata.Pairs("authorization", "Bearer ", "x-ferry-token", "xt"), "xt"},
		{"several values: the first", []string{"metadata"},
			metadata.Pairs("authorization", "Bearer one", "authorization", "Bearer two"), "one"},
		{"several x-ferry-token: the first", []string{"metadata"},
			metadata.Pairs("x-ferry-token", "one", "x-ferry-token", "two"), "one"},
		{"other scheme only", []string{"metadata"}, metadata.Pairs("authorization", "Basic x"), ""},
		{"HTTP-only sources", []string{"header", "query"}, metadata.Pairs("x-ferry-token", "xt"), ""},
		{"no metadata", []string{"metadata"}, nil, ""},
	}
	for _, tc := range cases {
		g := NewGate(ReceiverConfig{Mode: "required", Sources: tc.sources}, nil, nil)
		ctx := context.Background()
		if tc.md != nil {
			ctx = metadata.NewIncomingContext(ctx, tc.md)
		}
		if got := g.GRPCToken(ctx); got != tc.want {
			t.Errorf("%s: token %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestReceiverConfigValidate(t *testing.T) {
	for _, c := range []ReceiverConfig{
		{}, {Mode: "none"}, {Mode: "optional", Sources: []string{"header"}},
		{Mode: "required", Sources: []string{"authorization", "header", "query", "metadata", "resource", "hello", "sasl"}},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, c := range []ReceiverConfig{
		{Mode: "Required", Sources: []string{"header"}},
		{Mode: "required"},
		{Mode: "optional"},
		{Mode: "required", Sources: []string{"cookie"}},
		{Mode: "none", Sources: []string{"bearer"}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestGateLimit: the gate admits through the limiter by the token's app
// and class, and refuses past the burst with a retryable rate_limited
// error that says to wait at least a second.
func TestGateLimit(t *testing.T) {
	l, err := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{
		"small": {RecordsPerSec: 1, BurstRecords: 2},
	}}, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(ReceiverConfig{Mode: "required", Sources: []string{"header"}}, nil, l)
	small := &token.Claims{App: "shop", RateClass: "small"}
	if err := g.Limit(small, 2, 10); err != nil {
		t.Fatalf("within the burst: %v", err)
	}
	err = g.Limit(small, 1, 10)
	var re *consumer.RetryableError
	if !errors.As(err, &re) || re.Reason != "rate_limited" || !re.Busy || re.After < time.Second {
		t.Fatalf("over the burst: %#v", err)
	}
	// No class for requests without a token (no default_class): unlimited.
	for i := 0; i < 10; i++ {
		if err := g.Limit(nil, 100, 100); err != nil {
			t.Fatalf("no token, no default class: %v", err)
		}
	}
	// Another app has its own bucket.
	if err := g.Limit(&token.Claims{App: "other", RateClass: "small"}, 2, 10); err != nil {
		t.Fatalf("another app: %v", err)
	}
}
