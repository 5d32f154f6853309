package auth

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"hash/maphash"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/telemetry"
)

var key2 = strings.Repeat("22", 32)

// TestSetKeysRevokesCachedVerdicts: a token cached as valid stops passing
// the moment a reload drops its key, the cache is emptied, and a token of
// a key kept across the reload is verified again under the new keyring.
// A reload that fails leaves the keys in force.
func TestSetKeysRevokesCachedVerdicts(t *testing.T) {
	c, ring := newChecker(t, 64, time.Hour)
	tok1, _ := ring.Issue(token.Claims{App: "shop"})
	for i := 0; i < 3; i++ {
		if _, err := c.Check(tok1); err != nil {
			t.Fatal(err)
		}
	}
	if c.Len() != 1 || testutil.ToFloat64(c.misses) != 1 {
		t.Fatalf("before the reload: %d cached, %v decryptions", c.Len(), testutil.ToFloat64(c.misses))
	}
	// Key 1 revoked, key 2 in.
	if err := c.SetKeys(Config{Keys: []KeyConfig{{ID: 2, Secret: key2, Issue: true}}}); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 0 {
		t.Fatalf("%d verdicts cached after SetKeys", c.Len())
	}
	if _, err := c.Check(tok1); reason(err) != token.ReasonKey {
		t.Fatalf("token of the revoked key: %v, want unknown_key", err)
	}
	if n := testutil.ToFloat64(c.RefusedCounter(token.ReasonKey)); n != 1 {
		t.Fatalf("refused{unknown_key} = %v", n)
	}
	// Key 1 back, next to key 2: the refusal cached above is not answered
	// under the new keyring.
	if err := c.SetKeys(Config{Keys: []KeyConfig{{ID: 1, Secret: key1}, {ID: 2, Secret: key2, Issue: true}}}); err != nil {
		t.Fatal(err)
	}
	if cl, err := c.Check(tok1); err != nil || cl.App != "shop" {
		t.Fatalf("token of a key restored: %v %v", cl, err)
	}
	// A reload with a bad key changes nothing.
	if err := c.SetKeys(Config{Keys: []KeyConfig{{ID: 3, Secret: "short"}}}); err == nil {
		t.Fatal("SetKeys accepted a bad key")
	}
	if _, err := c.Check(tok1); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
}

// TestCacheEntryLivesCacheTTL: a cached verdict is answered until cache_ttl
// has passed on the coarse clock, then the token is decrypted again;
// refusals likewise.
func TestCacheEntryLivesCacheTTL(t *testing.T) {
	c, ring := newChecker(t, 64, time.Minute)
	good, _ := ring.Issue(token.Claims{App: "shop"})
	forged := good[:len(good)-4] + "AAAA"
	t0 := c.now.Load()
	for _, tok := range []string{good, forged} {
		_, _ = c.Check(tok)
	}
	c.now.Store(t0 + int64(59*time.Second))
	for _, tok := range []string{good, forged} {
		_, _ = c.Check(tok)
	}
	if m := testutil.ToFloat64(c.misses); m != 2 {
		t.Fatalf("%v decryptions within the TTL, want 2", m)
	}
	c.now.Store(t0 + int64(time.Minute))
	if _, err := c.Check(good); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(forged); reason(err) != token.ReasonForged {
		t.Fatalf("forged after the TTL: %v", err)
	}
	if m := testutil.ToFloat64(c.misses); m != 4 {
		t.Fatalf("%v decryptions after the TTL, want 4", m)
	}
	// Re-verified entries replaced the old ones in place.
	if c.Len() != 2 {
		t.Fatalf("%d cached, want 2", c.Len())
	}
}

// TestExpiredTokenRefusedAndCached: a token already past its expiry is
// refused as expired, counted each time, and not decrypted again; a token
// expiring within the cache TTL passes until its expiry, not the TTL's.
func TestExpiredTokenRefusedAndCached(t *testing.T) {
	c, ring := newChecker(t, 64, time.Hour)
	old, _ := ring.Issue(token.Claims{App: "a", Expires: time.Now().Add(-time.Minute)})
	for i := 0; i < 3; i++ {
		if _, err := c.Check(old); reason(err) != token.ReasonExpired {
			t.Fatalf("expired token: %v", err)
		}
	}
	if n := testutil.ToFloat64(c.RefusedCounter(token.ReasonExpired)); n != 3 {
		t.Fatalf("refused{expired} = %v, want 3", n)
	}
	if m := testutil.ToFloat64(c.misses); m != 1 {
		t.Fatalf("%v decryptions of one expired token, want 1", m)
	}
	exp := time.Unix(0, c.now.Load()).Add(10 * time.Second).Truncate(time.Second) // tokens carry seconds
	soon, _ := ring.Issue(token.Claims{App: "b", Expires: exp})
	if _, err := c.Check(soon); err != nil {
		t.Fatal(err)
	}
	c.now.Store(exp.UnixNano() - 1)
	if _, err := c.Check(soon); err != nil {
		t.Fatalf("a nanosecond before its expiry: %v", err)
	}
	c.now.Store(exp.UnixNano())
	if _, err := c.Check(soon); reason(err) != token.ReasonExpired {
		t.Fatalf("at its expiry (cache TTL an hour away): %v", err)
	}
	if m := testutil.ToFloat64(c.misses); m != 2 {
		t.Fatalf("%v decryptions, want 2: the expiry is the cached verdict's", m)
	}
}

// TestRefusedReasons: each way a token fails is counted under its reason,
// and a token too long to cache is still refused (and not cached).
func TestRefusedReasons(t *testing.T) {
	c, ring := newChecker(t, 64, time.Minute)
	good, _ := ring.Issue(token.Claims{App: "shop"})
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	enc := base64.RawURLEncoding.EncodeToString
	version := append([]byte{raw[0] + 1}, raw[1:]...)
	otherKey := append([]byte{raw[0], 0, 9}, raw[3:]...)
	for _, tc := range []struct{ tok, reason string }{
		{"!!not base64!!", token.ReasonMalformed},
		{"abc", token.ReasonMalformed},
		{strings.Repeat("A", token.MaxLen+1), token.ReasonMalformed},
		{enc(version), token.ReasonVersion},
		{enc(otherKey), token.ReasonKey},
		{good[:len(good)-4] + "AAAA", token.ReasonForged},
	} {
		for i := 0; i < 2; i++ {
			if _, err := c.Check(tc.tok); reason(err) != tc.reason {
				t.Fatalf("%.12q: %v, want %s", tc.tok, err, tc.reason)
			}
		}
		if n := testutil.ToFloat64(c.RefusedCounter(tc.reason)); n < 2 {
			t.Fatalf("refused{%s} = %v", tc.reason, n)
		}
	}
	if n := testutil.ToFloat64(c.RefusedCounter(token.ReasonMalformed)); n != 6 {
		t.Fatalf("refused{malformed} = %v, want 6", n)
	}
	if c.Len() != 5 { // every distinct token but the over-long one
		t.Fatalf("%d cached, want 5 (the over-long token is not cached)", c.Len())
	}
	c.Refused("conflicting_tokens")
	if n := testutil.ToFloat64(c.RefusedCounter("conflicting_tokens")); n != 1 {
		t.Fatalf("Refused: %v", n)
	}
}

// TestCheckerClockAndJanitor: once started, the coarse clock moves (a
// token's expiry is seen without any test touching the clock) and the
// janitor reports the cache's size; Shutdown stops both.
func TestCheckerClockAndJanitor(t *testing.T) {
	c, ring := newChecker(t, 64, time.Second)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	tok, _ := ring.Issue(token.Claims{App: "a", Expires: time.Now().Add(1500 * time.Millisecond)}) // whole seconds: 0.5 to 1.5 s away
	if _, err := c.Check(tok); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(c.entries) != 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := testutil.ToFloat64(c.entries); g != 1 {
		t.Fatalf("cache entries gauge %v, want 1", g)
	}
	for reason(func() error { _, err := c.Check(tok); return err }()) != token.ReasonExpired {
		if time.Now().After(deadline) {
			t.Fatal("a cached token never expired: the clock does not move")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKeySecrets: a key is 32 bytes as hex (either case) or any base64
// alphabet, with or without padding, inline or from a file (surrounding
// space ignored); anything else is refused without echoing the secret.
func TestKeySecrets(t *testing.T) {
	b := make([]byte, 32)
	for i := range b {
		b[i] = byte(i*7 + 250) // includes bytes that differ between base64 alphabets
	}
	dir := t.TempDir()
	file := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, k := range map[string]KeyConfig{
		"hex":          {Secret: hex.EncodeToString(b)},
		"HEX":          {Secret: strings.ToUpper(hex.EncodeToString(b))},
		"std":          {Secret: base64.StdEncoding.EncodeToString(b)},
		"raw std":      {Secret: base64.RawStdEncoding.EncodeToString(b)},
		"url":          {Secret: base64.URLEncoding.EncodeToString(b)},
		"raw url":      {Secret: base64.RawURLEncoding.EncodeToString(b)},
		"file":         {SecretFile: file("k1", base64.StdEncoding.EncodeToString(b))},
		"file, spaced": {SecretFile: file("k2", "  \n"+hex.EncodeToString(b)+"\r\n\n")},
	} {
		got, err := k.bytes()
		if err != nil || string(got) != string(b) {
			t.Errorf("%s: %x %v", name, got, err)
		}
	}
	short := hex.EncodeToString(b[:31])
	long := base64.StdEncoding.EncodeToString(append(b, 1))
	for name, tc := range map[string]struct {
		k    KeyConfig
		want string
	}{
		"empty":          {KeyConfig{}, "secret: empty"},
		"31 bytes":       {KeyConfig{Secret: short}, "not 32 bytes"},
		"33 bytes":       {KeyConfig{Secret: long}, "not 32 bytes"},
		"both":           {KeyConfig{Secret: short, SecretFile: file("k3", short)}, "both set"},
		"missing file":   {KeyConfig{SecretFile: filepath.Join(dir, "nope")}, "secret_file"},
		"empty file":     {KeyConfig{SecretFile: file("k4", " \n")}, "secret: empty"},
		"file, 31 bytes": {KeyConfig{SecretFile: file("k5", short)}, "not 32 bytes"},
	} {
		_, err := tc.k.bytes()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), short) || strings.Contains(err.Error(), long) {
			t.Errorf("%s: the error echoes the secret: %v", name, err)
		}
	}
}

// TestConfigValidate: the cache's bounds, unique ids, at most one issuing
// key, and the failing key named by its index; New refuses what Validate
// refuses.
func TestConfigValidate(t *testing.T) {
	ok := Config{Keys: []KeyConfig{{ID: 1, Secret: key1, Issue: true}, {ID: 2, Secret: key2}}, CacheSize: 16, CacheTTL: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	none := ok
	none.Keys = nil
	if err := none.Validate(); err != nil {
		t.Fatalf("no keys: %v", err)
	}
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"cache_size":   {func(c *Config) { c.CacheSize = 15 }, "cache_size"},
		"cache_ttl":    {func(c *Config) { c.CacheTTL = 999 * time.Millisecond }, "cache_ttl"},
		"duplicate id": {func(c *Config) { c.Keys[1].ID = 1 }, "keys[1].id"},
		"bad secret":   {func(c *Config) { c.Keys[1].Secret = "nope" }, "keys[1]"},
		"two issuers":  {func(c *Config) { c.Keys[1].Issue = true }, "2 keys are marked issue"},
	} {
		c := ok
		c.Keys = append([]KeyConfig(nil), ok.Keys...)
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		if _, err := New(c, telemetry.TestSettings()); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// TestKeyringIssuer: the keyring issues with the key marked issue, verifies
// with all, and cannot issue when none is marked.
func TestKeyringIssuer(t *testing.T) {
	both := Config{Keys: []KeyConfig{{ID: 1, Secret: key1}, {ID: 2, Secret: key2, Issue: true}}}
	ring, err := both.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ring.Issue(token.Claims{App: "a"})
	if err != nil {
		t.Fatal(err)
	}
	only2, _ := (&Config{Keys: []KeyConfig{{ID: 2, Secret: key2}}}).Keyring()
	if _, err := only2.Verify(tok, time.Now()); err != nil {
		t.Fatalf("issued with key 2? %v", err)
	}
	only1, _ := (&Config{Keys: []KeyConfig{{ID: 1, Secret: key1, Issue: true}}}).Keyring()
	if _, err := only1.Verify(tok, time.Now()); reason(err) != token.ReasonKey {
		t.Fatalf("issued with key 1? %v", err)
	}
	if _, err := only2.Issue(token.Claims{App: "a"}); err == nil {
		t.Fatal("a keyring with no issuing key issued")
	}
	if _, err := (&Config{Keys: []KeyConfig{{ID: 7, Secret: "x"}}}).Keyring(); err == nil || !strings.Contains(err.Error(), "key 7") {
		t.Fatalf("bad key: %v", err)
	}
}

// TestCacheReplacesTheOlder: a third token in a full set takes the place of
// the verdict cached first, and the newer one keeps answering.
func TestCacheReplacesTheOlder(t *testing.T) {
	c, ring := newChecker(t, 16, time.Minute)
	set := func(tok string) uint64 { return maphash.String(c.seed, tok) & c.mask &^ 1 }
	byset := map[uint64][]string{}
	var toks []string
	for i := 0; len(toks) < 3; i++ {
		tok, _ := ring.Issue(token.Claims{App: "app" + strconv.Itoa(i)})
		s := set(tok)
		if byset[s] = append(byset[s], tok); len(byset[s]) == 3 {
			toks = byset[s]
		}
	}
	t0 := c.now.Load()
	for i, tok := range toks {
		c.now.Store(t0 + int64(i)*int64(time.Second))
		if _, err := c.Check(tok); err != nil {
			t.Fatal(err)
		}
	}
	if m := testutil.ToFloat64(c.misses); m != 3 {
		t.Fatalf("%v decryptions", m)
	}
	_, _ = c.Check(toks[1]) // the newer of the first two: still cached
	_, _ = c.Check(toks[2])
	if m := testutil.ToFloat64(c.misses); m != 3 {
		t.Fatalf("%v decryptions: the third token evicted the newer verdict, not the older", m)
	}
	_, _ = c.Check(toks[0]) // the oldest: evicted
	if m := testutil.ToFloat64(c.misses); m != 4 {
		t.Fatalf("%v decryptions: the oldest verdict was kept", m)
	}
}

// TestMadeUpTokensHoldLittle: refusals of made-up tokens longer than
// maxRefusedLen are not cached (65,536 of them at token.MaxLen would hold
// 256 MiB), and a cached token is a copy, not a view of the request line
// or header it was cut from.
func TestMadeUpTokensHoldLittle(t *testing.T) {
	c, ring := newChecker(t, 1024, time.Minute)
	for i := range 2000 {
		tok := strconv.Itoa(i) + strings.Repeat("A", token.MaxLen-10)
		if _, err := c.Check(tok); err == nil {
			t.Fatal("a made-up token passed")
		}
	}
	if n := c.Len(); n != 0 {
		t.Fatalf("%d refusals of made-up %d-byte tokens cached", n, token.MaxLen-6)
	}
	good, _ := ring.Issue(token.Claims{App: "shop"})
	line := "POST /v1/messages/logs?token=" + good + " HTTP/1.1" + strings.Repeat(" ", 60000)
	i := strings.Index(line, good)
	if _, err := c.Check(line[i : i+len(good)]); err != nil {
		t.Fatal(err)
	}
	for j := range c.slots {
		if vd := c.slots[j].Load(); vd != nil && unsafe.StringData(vd.tok) == unsafe.StringData(line[i:]) {
			t.Fatal("the cached token is a view of the request line")
		}
	}
}
