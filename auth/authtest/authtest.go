// Package authtest owns a ready keyring and checker for receivers' tests.
package authtest

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/telemetry"
)

// Key is a fixed test key (hex).
var Key = strings.Repeat("2a", 32)

// New returns a checker with Key as key 1 and a function issuing tokens.
func New(t testing.TB) (*auth.Checker, func(app string) string) {
	t.Helper()
	cfg := auth.Config{Keys: []auth.KeyConfig{{ID: 1, Secret: Key, Issue: true}}, CacheSize: 64, CacheTTL: time.Minute}
	c, err := auth.New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	ring, _ := cfg.Keyring()
	return c, func(app string) string {
		tok, err := ring.Issue(token.Claims{App: app})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
}

// NewWithClass is New whose tokens name a rate-limit class.
func NewWithClass(t testing.TB, class string) (*auth.Checker, func(app string) string) {
	t.Helper()
	c, _ := New(t)
	cfg := auth.Config{Keys: []auth.KeyConfig{{ID: 1, Secret: Key, Issue: true}}, CacheSize: 64, CacheTTL: time.Minute}
	ring, _ := cfg.Keyring()
	return c, func(app string) string {
		tok, err := ring.Issue(token.Claims{App: app, RateClass: class})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
}

// IssueClaims issues a token with any claims under the test key.
func IssueClaims(t testing.TB, c token.Claims) string {
	t.Helper()
	return IssueWith(t, Key, 1, c)
}

// IssueWith issues a token with any claims under key (hex or base64) as
// key id.
func IssueWith(t testing.TB, key string, id uint16, c token.Claims) string {
	t.Helper()
	cfg := auth.Config{Keys: []auth.KeyConfig{{ID: id, Secret: key, Issue: true}}}
	ring, err := cfg.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ring.Issue(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Forge returns tok with one character in its middle changed: a token of
// the same shape that never verifies (a rewritten tail can spell the same
// bytes, see token.TestOneSpelling).
func Forge(tok string) string {
	b := []byte(tok)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
