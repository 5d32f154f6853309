// Package auth owns checking application tokens on every receiver: the key
// configuration, where a token is taken from, and a cache of verdicts.
//
// The cache is built for the hot path: a fixed table of atomic pointers,
// 2-way set associative, indexed by a hash of the token. A hit is one hash,
// one or two atomic loads, a string compare and a compare against a coarse
// clock (updated every 100 ms): no lock, no allocation, no shared write, so
// it scales with cores. The table's size is the bound (cache_size verdicts);
// a verdict lives at most cache_ttl, and a newer one replaces an expired or
// the older of two colliding ones. Refusals of tokens up to maxRefusedLen
// are cached too, so a flood of one bad token costs one decryption per
// TTL, not one per request.
package auth

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/telemetry"
)

// KeyConfig is one key (YAML auth.keys[]).
type KeyConfig struct {
	ID uint16 `yaml:"id"`
	// Secret is 32 bytes as base64 or hex; usually "${FERRY_TOKEN_KEY_1}".
	Secret string `yaml:"secret"`
	// SecretFile is a file holding the secret instead (trailing space ignored).
	SecretFile string `yaml:"secret_file"`
	// Issue marks the key `ferry token issue` uses; exactly one may be set.
	Issue bool `yaml:"issue"`
}

// Config is the user configuration (YAML auth).
type Config struct {
	Keys      []KeyConfig   `yaml:"keys"`
	CacheSize int           `yaml:"cache_size"`
	CacheTTL  time.Duration `yaml:"cache_ttl"`
}

// Validate names the first invalid field; it reads secret files.
func (c *Config) Validate() error {
	if c.CacheSize < 16 {
		return fmt.Errorf("cache_size: %d is below 16", c.CacheSize)
	}
	if c.CacheTTL < time.Second {
		return fmt.Errorf("cache_ttl: %s is below 1s", c.CacheTTL)
	}
	issuers := 0
	seen := map[uint16]bool{}
	for i, k := range c.Keys {
		if seen[k.ID] {
			return fmt.Errorf("keys[%d].id: %d is used twice", i, k.ID)
		}
		seen[k.ID] = true
		if _, err := k.bytes(); err != nil {
			return fmt.Errorf("keys[%d]: %w", i, err)
		}
		if k.Issue {
			issuers++
		}
	}
	if issuers > 1 {
		return fmt.Errorf("keys: %d keys are marked issue: true; mark one", issuers)
	}
	return nil
}

// bytes decodes the key; errors never contain the secret.
func (k KeyConfig) bytes() ([]byte, error) {
	s := k.Secret
	if k.SecretFile != "" {
		if s != "" {
			return nil, fmt.Errorf("secret and secret_file are both set")
		}
		b, err := os.ReadFile(k.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("secret_file: %w", err)
		}
		s = strings.TrimSpace(string(b))
	}
	if s == "" {
		return nil, fmt.Errorf("secret: empty (set secret or secret_file)")
	}
	for _, dec := range []func(string) ([]byte, error){
		hex.DecodeString, base64.StdEncoding.DecodeString, base64.RawStdEncoding.DecodeString,
		base64.URLEncoding.DecodeString, base64.RawURLEncoding.DecodeString,
	} {
		if b, err := dec(s); err == nil && len(b) == 32 {
			return b, nil
		}
	}
	return nil, fmt.Errorf("secret: not 32 bytes of hex or base64 (generate one with `ferry token keygen`)")
}

// Keyring builds the token keyring from the configuration.
func (c *Config) Keyring() (*token.Keyring, error) {
	keys := map[uint16][]byte{}
	var issuer uint16
	for _, k := range c.Keys {
		b, err := k.bytes()
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", k.ID, err)
		}
		keys[k.ID] = b
		if k.Issue {
			issuer = k.ID
		}
	}
	return token.NewKeyring(keys, issuer)
}

// Checker verifies tokens through the cache.
type Checker struct {
	ring  atomic.Pointer[token.Keyring]
	max   int64
	ttl   int64
	now   atomic.Int64 // coarse clock, unix nanos
	slots []atomic.Pointer[verdict]
	mask  uint64
	seed  maphash.Seed
	stop  chan struct{}
	wg    sync.WaitGroup

	// Only misses (decryptions) are counted: a shared counter bumped on every
	// hit would bounce one cache line between cores and cost more than the hit.
	misses  prometheus.Counter
	refused *prometheus.CounterVec
	entries prometheus.Gauge
}

type verdict struct {
	// ring is the keyring that gave the verdict; it answers only while
	// that keyring is the current one, so a reload revokes every cached
	// verdict at the instant it swaps keyrings (emptying the cache after
	// it would leave a moment, and a check that verified with the old
	// keyring could cache its verdict after the emptying).
	ring    *token.Keyring
	tok     string
	claims  *token.Claims
	err     *token.Error
	expires int64 // cache entry expiry, unix nanos
	tokExp  int64 // token expiry, unix nanos (0: none)
}

// New builds a checker from cfg; Start runs its clock and janitor.
func New(cfg Config, set telemetry.Settings) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ring, err := cfg.Keyring()
	if err != nil {
		return nil, err
	}
	n := 2
	for n < cfg.CacheSize {
		n <<= 1
	}
	c := &Checker{max: int64(n), ttl: int64(cfg.CacheTTL), stop: make(chan struct{}),
		slots: make([]atomic.Pointer[verdict], n), mask: uint64(n - 1), seed: maphash.MakeSeed()}
	c.ring.Store(ring)
	c.now.Store(time.Now().UnixNano())
	c.misses = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_auth_decryptions_total",
		Help: "Tokens verified by decryption (cache misses)."})
	c.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_auth_refused_total",
		Help: "Requests refused for their token, by reason."}, []string{"reason"})
	c.entries = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_auth_cache_entries", Help: "Verdicts cached."})
	set.Registry.MustRegister(c.misses, c.refused, c.entries)
	return c, nil
}

// SetKeys swaps the keyring (reload), which revokes every cached verdict
// at once (each answers only for its own keyring), and empties the cache to
// free them.
func (c *Checker) SetKeys(cfg Config) error {
	ring, err := cfg.Keyring()
	if err != nil {
		return err
	}
	c.ring.Store(ring)
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
	return nil
}

// Start runs the coarse clock and the janitor.
func (c *Checker) Start(context.Context) error {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		sweep := time.Duration(c.ttl) / 2
		last := time.Now()
		for {
			select {
			case <-c.stop:
				return
			case now := <-t.C:
				c.now.Store(now.UnixNano())
				if now.Sub(last) >= sweep {
					c.evict(now.UnixNano())
					last = now
					c.entries.Set(float64(c.Len()))
				}
			}
		}
	}()
	return nil
}

// Shutdown stops the clock and janitor.
func (c *Checker) Shutdown(context.Context) error {
	close(c.stop)
	c.wg.Wait()
	return nil
}

// maxRefusedLen is the longest refused token whose verdict is cached:
// above the tokens ferry issues (about 100 bytes with a few claims).
const maxRefusedLen = 256

// Check returns the claims of a valid token, or a *token.Error. Refusals are
// counted by reason.
func (c *Checker) Check(tok string) (*token.Claims, error) {
	now, ring := c.now.Load(), c.ring.Load()
	i := maphash.String(c.seed, tok) & c.mask &^ 1
	a, b := c.slots[i].Load(), c.slots[i+1].Load()
	if a != nil && a.tok == tok && now < a.expires && a.ring == ring {
		return c.answer(a, now)
	}
	if b != nil && b.tok == tok && now < b.expires && b.ring == ring {
		return c.answer(b, now)
	}
	c.misses.Inc()
	claims, err := ring.Verify(tok, time.Unix(0, now))
	vd := &verdict{ring: ring, tok: tok, expires: now + c.ttl}
	if err != nil {
		vd.err = err.(*token.Error)
		if vd.err.Reason == token.ReasonExpired {
			vd.err = nil
			vd.claims = &claims
			vd.tokExp = claims.Expires.UnixNano()
		}
	} else {
		vd.claims = &claims
		if !claims.Expires.IsZero() {
			vd.tokExp = claims.Expires.UnixNano()
		}
	}
	// A refusal is cached for tokens of a real token's length only: anyone
	// can make up refused ones, as many and as long as they like (up to
	// token.MaxLen), and a full cache of those would hold 256 MiB; at
	// maxRefusedLen it holds 22 MiB at most, and refusing a longer one
	// again costs one decryption.
	if tok != "" && len(tok) <= token.MaxLen && (vd.claims != nil || len(tok) <= maxRefusedLen) {
		// A copy: tok may be a slice of a whole request line or header,
		// which the cache would otherwise keep alive.
		vd.tok = strings.Clone(tok)
		// Replace an empty, expired or this token's slot, else the older.
		switch {
		case a == nil || a.tok == tok || now >= a.expires || a.ring != ring:
			c.slots[i].Store(vd)
		case b == nil || b.tok == tok || now >= b.expires || b.ring != ring || b.expires < a.expires:
			c.slots[i+1].Store(vd)
		default:
			c.slots[i].Store(vd)
		}
	}
	return c.answer(vd, now)
}

func (c *Checker) answer(vd *verdict, now int64) (*token.Claims, error) {
	if vd.err != nil {
		c.refused.WithLabelValues(vd.err.Reason).Inc()
		return nil, vd.err
	}
	if vd.tokExp != 0 && now >= vd.tokExp {
		c.refused.WithLabelValues(token.ReasonExpired).Inc()
		return nil, &token.Error{Reason: token.ReasonExpired}
	}
	return vd.claims, nil
}

// RefusedCounter is the refusal counter for reason (for tests).
func (c *Checker) RefusedCounter(reason string) prometheus.Counter {
	return c.refused.WithLabelValues(reason)
}

// Refused counts a refusal the checker did not see (a missing token, a
// receiver's own reason).
func (c *Checker) Refused(reason string) { c.refused.WithLabelValues(reason).Inc() }

// evict frees expired verdicts' memory (the table bounds their number).
func (c *Checker) evict(now int64) {
	for i := range c.slots {
		if v := c.slots[i].Load(); v != nil && now >= v.expires {
			c.slots[i].CompareAndSwap(v, nil)
		}
	}
}

// Len is the number of cached verdicts (a scan; for metrics and tests).
func (c *Checker) Len() int {
	n := 0
	for i := range c.slots {
		if c.slots[i].Load() != nil {
			n++
		}
	}
	return n
}
