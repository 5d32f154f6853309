package auth

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/telemetry"
)

var key1 = strings.Repeat("11", 32) // hex, 32 bytes

func newChecker(t testing.TB, size int, ttl time.Duration) (*Checker, *token.Keyring) {
	t.Helper()
	cfg := Config{Keys: []KeyConfig{{ID: 1, Secret: key1, Issue: true}}, CacheSize: size, CacheTTL: ttl}
	c, err := New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	ring, _ := cfg.Keyring()
	return c, ring
}

func TestCachesVerdictsIncludingRefusals(t *testing.T) {
	c, ring := newChecker(t, 100, time.Minute)
	good, _ := ring.Issue(token.Claims{App: "shop"})
	for i := 0; i < 5; i++ {
		cl, err := c.Check(good)
		if err != nil || cl.App != "shop" {
			t.Fatal(cl, err)
		}
	}
	bad := good[:len(good)-4] + "AAAA"
	for i := 0; i < 5; i++ {
		if _, err := c.Check(bad); err == nil {
			t.Fatal("forged token accepted")
		}
	}
	// One decryption per token for 10 checks.
	if m := testutil.ToFloat64(c.misses); m != 2 {
		t.Fatalf("%v decryptions for 2 distinct tokens", m)
	}
	if v := testutil.ToFloat64(c.refused.WithLabelValues(token.ReasonForged)); v != 5 {
		t.Fatalf("refused{forged} %v", v)
	}
}

func TestCacheIsBoundedAndExpires(t *testing.T) {
	c, ring := newChecker(t, 50, time.Second)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	for i := 0; i < 500; i++ {
		tok, _ := ring.Issue(token.Claims{App: fmt.Sprint("app", i)})
		if _, err := c.Check(tok); err != nil {
			t.Fatal(err)
		}
		if c.Len() > 64 { // 50 rounded up to the table's power of two
			t.Fatalf("cache holds %d verdicts, bound 64", c.Len())
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for c.Len() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if c.Len() != 0 {
		t.Fatalf("%d verdicts outlived the 1 s TTL", c.Len())
	}
}

func TestCachedTokenStillExpires(t *testing.T) {
	c, ring := newChecker(t, 16, time.Hour)
	tok, _ := ring.Issue(token.Claims{App: "a", Expires: time.Now().Add(time.Hour)})
	if _, err := c.Check(tok); err != nil {
		t.Fatal(err)
	}
	c.now.Store(time.Now().Add(2 * time.Hour).UnixNano()) // the clock moves past expiry
	var te *token.Error
	if _, err := c.Check(tok); !errors.As(err, &te) || te.Reason != token.ReasonExpired {
		t.Fatalf("cached token past its expiry: %v", err)
	}
}

func TestKeyConfig(t *testing.T) {
	f := filepath.Join(t.TempDir(), "k")
	_ = os.WriteFile(f, []byte(key1+"\n"), 0o600)
	ok := []KeyConfig{{ID: 1, Secret: key1}, {ID: 2, SecretFile: f}, {ID: 3, Secret: "ERERERERERERERERERERERERERERERERERERERERERE="}}
	for _, k := range ok {
		if _, err := k.bytes(); err != nil {
			t.Errorf("%+v: %v", k.ID, err)
		}
	}
	for _, k := range []KeyConfig{{ID: 1}, {ID: 1, Secret: "abcd"}, {ID: 1, Secret: key1, SecretFile: f}} {
		_, err := k.bytes()
		if err == nil {
			t.Errorf("%+v accepted", k)
		} else if strings.Contains(err.Error(), key1) || strings.Contains(err.Error(), "abcd") {
			t.Errorf("error echoes the secret: %v", err)
		}
	}
	two := Config{Keys: []KeyConfig{{ID: 1, Secret: key1, Issue: true}, {ID: 2, Secret: key1, Issue: true}}, CacheSize: 16, CacheTTL: time.Second}
	if err := two.Validate(); err == nil {
		t.Error("two issuing keys accepted")
	}
	_ = hex.EncodeToString
}

// BenchmarkAes256DecoderWithCached: the hot path, a token seen before
// (bk-collector: 25 ns behind one global mutex; target ≤ 15 ns, 0 allocs).
func BenchmarkAes256DecoderWithCached(b *testing.B) {
	c, ring := newChecker(b, 1000, time.Hour)
	tok, _ := ring.Issue(token.Claims{App: "app-1234", DataIDs: [4]uint64{1001, 1002, 1003}})
	_, _ = c.Check(tok)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := c.Check(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAes256DecoderWithCachedParallel: the same from every core at once;
// lock-free reads keep it flat as cores are added.
func BenchmarkAes256DecoderWithCachedParallel(b *testing.B) {
	c, ring := newChecker(b, 1000, time.Hour)
	tok, _ := ring.Issue(token.Claims{App: "app-1234"})
	_, _ = c.Check(tok)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Check(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestCachedVerdictDiesWithItsKeyring: once a reload's keyring is in
// place, no verdict from the keyring before it is answered, not even in
// the moment before SetKeys has emptied the cache (or from a check that
// verified with the old keyring and cached its verdict after the emptying):
// a revoked key never works after its replacement does.
func TestCachedVerdictDiesWithItsKeyring(t *testing.T) {
	c, ring := newChecker(t, 100, time.Minute)
	tok1, _ := ring.Issue(token.Claims{App: "shop"})
	if _, err := c.Check(tok1); err != nil {
		t.Fatal(err)
	}
	cfg2 := Config{Keys: []KeyConfig{{ID: 2, Secret: strings.Repeat("22", 32), Issue: true}}, CacheSize: 100, CacheTTL: time.Minute}
	ring2, err := cfg2.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	// The swap as SetKeys makes it, before its loop empties the slots.
	c.ring.Store(ring2)
	if _, err := c.Check(tok1); err == nil {
		t.Fatal("a token of the replaced key was accepted from the cache after the new keyring took over")
	}
	tok2, _ := ring2.Issue(token.Claims{App: "shop"})
	if _, err := c.Check(tok2); err != nil {
		t.Fatalf("new key: %v", err)
	}
}
