package auth

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
)

// ReceiverConfig is one receiver's authentication (YAML receivers.<r>.auth).
type ReceiverConfig struct {
	// Mode: none (no token checked), optional (a token, if present, must be
	// valid), required (a valid token must be present).
	Mode string `yaml:"mode"`
	// Sources, tried in order: authorization (Authorization: Bearer),
	// header (X-Ferry-Token), query (?token=), metadata (gRPC
	// "authorization: Bearer …" or "x-ferry-token"), resource (OTLP only: the
	// resource attribute ferry.token, removed before export), hello (the
	// local protocol's hello), sasl (the Kafka front: the SASL PLAIN
	// password).
	Sources []string `yaml:"sources"`
}

// Validate names the first invalid field.
func (c *ReceiverConfig) Validate() error {
	switch c.Mode {
	case "", "none", "optional", "required":
	default:
		return fmt.Errorf("mode: %q is not one of none, optional, required", c.Mode)
	}
	for _, s := range c.Sources {
		switch s {
		case "authorization", "header", "query", "metadata", "resource", "hello", "sasl":
		default:
			return fmt.Errorf("sources: %q is not one of authorization, header, query, metadata, resource, hello, sasl", s)
		}
	}
	if c.Mode != "none" && c.Mode != "" && len(c.Sources) == 0 {
		return fmt.Errorf("sources: at least one is needed when mode is %s", c.Mode)
	}
	return nil
}

// Gate applies one receiver's configuration with the shared checks. Its
// configuration can be swapped while requests run (reload).
type Gate struct {
	cfg     atomic.Pointer[ReceiverConfig]
	checker *Checker
	limiter *ratelimit.Limiter
}

// NewGate returns a gate over the shared checker and limiter (either may
// be nil); with mode none (or no checker) it lets all in.
func NewGate(c ReceiverConfig, checker *Checker, limiter *ratelimit.Limiter) *Gate {
	g := &Gate{checker: checker, limiter: limiter}
	g.cfg.Store(&c)
	return g
}

// SetConfig swaps the receiver's auth configuration (reload).
func (g *Gate) SetConfig(c ReceiverConfig) { g.cfg.Store(&c) }

// ErrRateLimited builds the refusal for an app over its limit.
func ErrRateLimited(wait time.Duration) error {
	return &consumer.RetryableError{Reason: "rate_limited", Msg: "over this application's rate limit; retry later", After: max(wait, time.Second), Busy: true}
}

// Limit admits records and bytes for the holder of claims (nil: no token),
// or returns a retryable rate_limited error saying when to retry.
func (g *Gate) Limit(claims *token.Claims, records, bytes int) error {
	if g == nil || g.limiter == nil {
		return nil
	}
	app, class := "", ""
	if claims != nil {
		app, class = claims.App, claims.RateClass
	}
	if ok, wait := g.limiter.Allow(app, class, records, bytes); !ok {
		return ErrRateLimited(wait)
	}
	return nil
}

// Enabled reports whether the gate checks anything.
func (g *Gate) Enabled() bool {
	if g == nil || g.checker == nil {
		return false
	}
	m := g.cfg.Load().Mode
	return m != "none" && m != ""
}

// HTTP checks the token of an HTTP request. It returns the claims (nil when
// no token was given and none is required) or a *token.Error.
func (g *Gate) HTTP(r *http.Request) (*token.Claims, error) {
	if !g.Enabled() {
		return nil, nil
	}
	return g.Check(g.HTTPToken(r))
}

// WantsResource reports whether the resource attribute ferry.token is a
// source (the OTLP receiver then looks there when no other source had one).
func (g *Gate) WantsResource() bool {
	return g.Enabled() && slices.Contains(g.cfg.Load().Sources, "resource")
}

// Refused counts a refusal decided outside the checker (a receiver's own
// reason, such as conflicting resource tokens).
func (g *Gate) Refused(reason string) {
	if g.Enabled() {
		g.checker.Refused(reason)
	}
}

// Check applies the mode to tok ("" = none given).
func (g *Gate) Check(tok string) (*token.Claims, error) {
	if !g.Enabled() {
		return nil, nil
	}
	return g.check(g.cfg.Load().Mode, tok)
}

// HTTPToken returns the token an HTTP request carries in its sources.
func (g *Gate) HTTPToken(r *http.Request) string {
	c := g.cfg.Load()
	var tok string
	for _, s := range c.Sources {
		switch s {
		case "authorization":
			tok = bearer(r.Header.Get("Authorization"))
		case "header":
			tok = r.Header.Get("X-Ferry-Token")
		case "query":
			if r.URL.RawQuery != "" {
				tok = r.URL.Query().Get("token")
			}
		}
		if tok != "" {
			break
		}
	}
	return tok
}

// GRPC checks the token in a gRPC call's metadata.
func (g *Gate) GRPC(ctx context.Context) (*token.Claims, error) {
	if !g.Enabled() {
		return nil, nil
	}
	return g.Check(g.GRPCToken(ctx))
}

// GRPCToken returns the token in a gRPC call's metadata.
func (g *Gate) GRPCToken(ctx context.Context) string {
	c := g.cfg.Load()
	var tok string
	for _, s := range c.Sources {
		switch s {
		case "authorization", "metadata":
			// One name at a time: FromIncomingContext would copy every
			// entry of the call's metadata on every request.
			if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
				tok = bearer(v[0])
			}
			if tok == "" {
				if v := metadata.ValueFromIncomingContext(ctx, "x-ferry-token"); len(v) > 0 {
					tok = v[0]
				}
			}
		}
		if tok != "" {
			break
		}
	}
	return tok
}

func (g *Gate) check(mode, tok string) (*token.Claims, error) {
	if tok == "" {
		if mode == "required" {
			g.checker.Refused(token.ReasonMissing)
			return nil, &token.Error{Reason: token.ReasonMissing}
		}
		return nil, nil
	}
	return g.checker.Check(tok)
}

func bearer(h string) string {
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}
