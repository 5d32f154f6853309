// Package idempotency recognises a client's retry of a request ferry has
// already accepted, across reconnects and agent restarts, and answers it
// with the original result instead of accepting its records twice.
//
// A receiver turns a client's key into a scoped key (Scope: the door, the
// authenticated application, the client's key), so tenants can neither
// collide nor probe each other's keys, and fingerprints the request
// (Fingerprint). Before anything is appended it asks the Store (Begin):
//
//   - Fresh: never seen (or forgotten); the store reserves the key and the
//     request goes on with Batch.Idem set. The spool writes the key
//     durably with the records, in the same append and fsync round (see
//     buffer/spool, "Idempotency keys"), and resolves the reservation
//     before the batch completes: Commit when the records are stored,
//     Abort when they were refused. A receiver whose request never reached
//     the spool aborts it itself (Abort is idempotent).
//   - Replay: accepted before with the same fingerprint: the receiver
//     answers the original result (the number of records) and appends
//     nothing.
//   - InFlight: the first copy is still being appended or fsynced: the
//     client is told to retry shortly (HTTP 409 with Retry-After), never
//     made to wait on another request's fate.
//   - Mismatch: the key was used for a different request: refused (422),
//     nothing is appended.
//   - Full: the store's bytes are taken by requests still in flight (it
//     evicts only answered keys): refused as busy (429).
//
// # Bounds and the window
//
// A key is remembered for delivery.idempotency.window after it was
// accepted; a retry later than that is accepted again (a duplicate). Keys
// cost their length plus entryOverhead bytes each, at most
// delivery.idempotency.max_bytes in all; past either bound the oldest
// answered keys go first, counted in
// ferry_idempotency_evicted_total{reason="age"|"bytes"}. The spool's
// durable log of keys is bounded by the same window and bytes, so a
// restart remembers what the running agent remembered.
//
// Cost when no client sends a key: nothing (Batch.Idem is nil, and nothing
// here is called).
package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/record"
)

// Config is the user configuration (YAML delivery.idempotency).
type Config struct {
	// Window: how long after it was accepted a key is recognised.
	Window time.Duration `yaml:"window"`
	// MaxBytes bounds the keys remembered, in memory and in the spool's
	// log of keys.
	MaxBytes bytesize.Size `yaml:"max_bytes"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.Window < time.Second || c.Window > 24*time.Hour {
		return fmt.Errorf("window: %s is outside 1s..24h", c.Window)
	}
	if c.MaxBytes < 64<<10 || c.MaxBytes > 1<<30 {
		return fmt.Errorf("max_bytes: %s is outside 64KiB..1GiB", c.MaxBytes)
	}
	return nil
}

// MaxKeyBytes bounds a client's key (the Idempotency-Key header).
const MaxKeyBytes = 128

// MaxScopedBytes bounds a scoped key (door, application and client key);
// the spool's log refuses longer ones.
const MaxScopedBytes = 256

// ValidKey reports whether k is an acceptable client key: 1 to
// MaxKeyBytes of A-Z a-z 0-9 and . _ : - + / = (UUIDs, ULIDs, base64).
func ValidKey(k string) bool {
	if len(k) == 0 || len(k) > MaxKeyBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return true
}

// Scope builds the key the store knows a request by: the door (http,
// local, kafka), the application the request authenticated as (its hash:
// fixed length, and nothing of the name is stored) and the client's key.
// With authentication off every client shares one application ("").
func Scope(door, app, key string) []byte {
	h := sha256.Sum256([]byte(app))
	out := make([]byte, 0, len(door)+1+8+1+len(key))
	out = append(out, door...)
	out = append(out, '/')
	out = append(out, h[:8]...)
	out = append(out, '/')
	return append(out, key...)
}

// Fingerprint hashes the parts that make a request's records, each
// length-prefixed so no two lists of parts hash alike.
func Fingerprint(parts ...[]byte) [16]byte {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.LittleEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var sum [32]byte
	var out [16]byte
	copy(out[:], h.Sum(sum[:0]))
	return out
}

// Verdict is Begin's answer.
type Verdict int

const (
	Fresh Verdict = iota
	Replay
	InFlight
	Mismatch
	Full
)

// entryOverhead is what a key costs beside its bytes: the map slot, the
// entry and its place in the order (in memory), the fixed fields of its
// record in the spool's log (on disk).
const entryOverhead = 96

// Cost is what a key of n bytes counts against max_bytes.
func Cost(n int) int64 { return int64(n) + entryOverhead }

type entry struct {
	key     string
	sum     [16]byte
	records int
	at      int64 // unix ns: accepted (or reserved, while in flight)
	seq     uint64
	done    bool
	dead    bool
}

// Store is the index of remembered keys, bounded in bytes and age.
type Store struct {
	cfg   Config
	mu    sync.Mutex
	m     map[string]*entry
	order []*entry // by seq (reservation order); dead ones are skipped
	head  int
	// deadInOrder counts forgotten entries still in order (compactLocked).
	deadInOrder int
	seq         uint64
	bytes       int64
	now         func() time.Time

	evicted  *prometheus.CounterVec
	replayed prometheus.Counter
	keys     prometheus.Gauge
}

// NewStore makes an empty store; reg may be nil.
func NewStore(cfg Config, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, m: map[string]*entry{}, now: time.Now,
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_idempotency_evicted_total",
			Help: "Idempotency keys forgotten before a retry could use them: reason age (older than delivery.idempotency.window) or bytes (delivery.idempotency.max_bytes)."}, []string{"reason"}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_idempotency_replayed_total",
			Help: "Retries of an accepted request answered with its original result, nothing appended."}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_idempotency_keys",
			Help: "Idempotency keys remembered (in flight or accepted)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.evicted, s.replayed, s.keys} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return s, nil
}

// Config is the store's configuration.
func (s *Store) Config() Config { return s.cfg }

// SetClock replaces time.Now (tests).
func (s *Store) SetClock(now func() time.Time) { s.now = now }

// Begin looks key up. Fresh reserves it for a request of records records
// with fingerprint sum and returns the reservation to put in Batch.Idem;
// Replay returns the original number of records.
func (s *Store) Begin(key []byte, sum [16]byte, records int) (Verdict, int, *record.Idem) {
	if len(key) > MaxScopedBytes {
		return Mismatch, 0, nil // receivers bound their keys; never reached
	}
	now := s.now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if e, ok := s.m[string(key)]; ok {
		switch {
		case e.sum != sum:
			return Mismatch, 0, nil
		case !e.done:
			return InFlight, 0, nil
		}
		s.replayed.Inc()
		return Replay, e.records, nil
	}
	cost := Cost(len(key))
	s.evictLocked(cost)
	if s.bytes+cost > int64(s.cfg.MaxBytes) {
		return Full, 0, nil
	}
	s.seq++
	e := &entry{key: string(key), sum: sum, records: records, at: now, seq: s.seq}
	s.addLocked(e)
	return Fresh, 0, &record.Idem{Key: []byte(e.key), Sum: sum, Seq: e.seq, Records: records}
}

// Commit marks a reservation accepted: its records are stored (durably,
// under the spool's fsync policy) with its key. A retry is answered
// Replay from now on, for the window.
func (s *Store) Commit(id *record.Idem) {
	now := s.now().UnixNano()
	s.mu.Lock()
	if e, ok := s.m[string(id.Key)]; ok && e.seq == id.Seq {
		e.done, e.at = true, now
	}
	s.mu.Unlock()
}

// Abort forgets a reservation whose records were not stored: a retry is
// a fresh request. A reservation already committed or forgotten is left
// alone.
func (s *Store) Abort(id *record.Idem) {
	s.mu.Lock()
	if e, ok := s.m[string(id.Key)]; ok && e.seq == id.Seq && !e.done {
		s.removeLocked(e)
		s.compactLocked()
	}
	s.mu.Unlock()
}

// Restore remembers a key the spool's log recovered at start: accepted at
// at for records records. A key older than the window is not kept.
func (s *Store) Restore(key []byte, sum [16]byte, records int, at time.Time) {
	now := s.now().UnixNano()
	if len(key) > MaxScopedBytes || now-at.UnixNano() > int64(s.cfg.Window) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[string(key)]; ok {
		s.removeLocked(old)
	}
	cost := Cost(len(key))
	s.evictLocked(cost)
	if s.bytes+cost > int64(s.cfg.MaxBytes) {
		return
	}
	s.seq++
	s.addLocked(&entry{key: string(key), sum: sum, records: records, at: at.UnixNano(), seq: s.seq, done: true})
}

// Len is the number of keys remembered.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Bytes is what the remembered keys count against max_bytes.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

func (s *Store) addLocked(e *entry) {
	s.m[e.key] = e
	s.order = append(s.order, e)
	s.bytes += Cost(len(e.key))
	s.keys.Set(float64(len(s.m)))
}

func (s *Store) removeLocked(e *entry) {
	delete(s.m, e.key)
	e.dead = true
	s.deadInOrder++
	s.bytes -= Cost(len(e.key))
	s.keys.Set(float64(len(s.m)))
}

// compactLocked drops forgotten entries from the order once they
// outnumber the live ones: an aborted reservation behind an older
// accepted key would otherwise stay there, its key held, until that key
// expired — memory max_bytes does not see (a client's refused retries,
// for a whole window).
func (s *Store) compactLocked() {
	if s.deadInOrder <= 1024 || s.deadInOrder <= len(s.m) {
		return
	}
	n := 0
	for _, e := range s.order[s.head:] {
		if !e.dead {
			s.order[n] = e
			n++
		}
	}
	clear(s.order[n:])
	s.order, s.head, s.deadInOrder = s.order[:n], 0, 0
}

// expireLocked forgets the accepted keys older than the window, oldest
// first. An entry in flight stops the walk: it is resolved within the
// request's lifetime, and what follows it is younger.
func (s *Store) expireLocked(now int64) {
	for s.head < len(s.order) {
		e := s.order[s.head]
		if !e.dead {
			if !e.done || now-e.at <= int64(s.cfg.Window) {
				break
			}
			s.removeLocked(e)
			s.evicted.WithLabelValues("age").Inc()
		}
		s.pop()
	}
}

// evictLocked makes room for cost bytes by forgetting the oldest accepted
// keys; reservations still in flight are passed over, not waited for.
func (s *Store) evictLocked(cost int64) {
	for i := s.head; s.bytes+cost > int64(s.cfg.MaxBytes) && i < len(s.order); i++ {
		if e := s.order[i]; !e.dead && e.done {
			s.removeLocked(e)
			s.evicted.WithLabelValues("bytes").Inc()
		}
	}
	for s.head < len(s.order) && s.order[s.head].dead {
		s.pop()
	}
	s.compactLocked()
}

func (s *Store) pop() {
	if s.order[s.head].dead {
		s.deadInOrder--
	}
	s.order[s.head] = nil
	s.head++
	if s.head > 1024 && s.head*2 > len(s.order) {
		n := copy(s.order, s.order[s.head:])
		clear(s.order[n:])
		s.order = s.order[:n]
		s.head = 0
	}
}

// FingerprintFrame is Fingerprint for a large body a client numbers itself
// (the local protocol's sequenced frames): xxHash64 and CRC-32C of the
// body and its length, about 5 times cheaper than SHA-256 per byte (9 GB/s
// against 1.8 on this machine: BenchmarkFingerprint256KiB), which
// made a sequenced frame cost the agent ~15 % more CPU at 200 MB/s. It
// only has to tell a client's retry (the same bytes) from its bug (other
// bytes under the same sequence): keys are scoped per application, so a
// collision could only be arranged by an application against its own
// records. Never compared with Fingerprint's sums: each door uses one.
func FingerprintFrame(body []byte) [16]byte {
	var out [16]byte
	binary.LittleEndian.PutUint64(out[0:], xxhash.Sum64(body))
	binary.LittleEndian.PutUint32(out[8:], crc32.Checksum(body, castagnoli))
	binary.LittleEndian.PutUint32(out[12:], uint32(len(body)))
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)
