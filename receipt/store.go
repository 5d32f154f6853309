package receipt

// The store: receipts of records the spool took before Kafka had them.
//
// In spool mode a client is answered at the spool's fsync. If it asked for
// a receipt, the spool registers the request here (Add) under its place in
// the spool (segment, offset) and the answer carries an id naming that
// place plus 64 random bits. The spool's reader sends records to Kafka in
// spool order; when Kafka has acknowledged a chunk of them the reader
// tells the store where each record went (Settle) — by its spool position,
// which is how a record read back from disk is matched to the request that
// wrote it. GET /receipts/{id} then answers pending, or the ranges.
//
// Bounds: every receipt costs 28 bytes a record (its frame's place, topic,
// partition and offset) plus 160; the store holds at most max_bytes of
// them and none older than max_age. Past either bound the oldest go first,
// counted in ferry_receipts_evicted_total{reason="bytes"|"age"}; a lookup
// of an evicted receipt answers 404 as an unknown one does. A single
// request larger than max_bytes is not stored (its answer still carries
// the id; its lookup answers 404; counted with reason "too_large").
//
// The store lives in memory only: a restart forgets every receipt (a
// lookup answers 404) while the spool still delivers the records, which
// carry their ferry.request_id header if the client gave one. Persisting
// it would cost a write per request for a convenience; the request id in
// Kafka is the durable answer.
//
// Cost when no client asks: the spool checks Watching() (an atomic load)
// once per chunk it sends and tracks nothing.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/record"
)

// Config is the user configuration (YAML delivery.receipts).
type Config struct {
	// MaxBytes bounds the memory of the receipts kept for lookup.
	MaxBytes bytesize.Size `yaml:"max_bytes"`
	// MaxAge: a receipt older than this is forgotten, answered or not.
	MaxAge time.Duration `yaml:"max_age"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.MaxBytes < 64<<10 {
		return fmt.Errorf("max_bytes: %s is below 64KiB", c.MaxBytes)
	}
	if c.MaxAge < time.Second || c.MaxAge > 24*time.Hour {
		return fmt.Errorf("max_age: %s is outside 1s..24h", c.MaxAge)
	}
	return nil
}

// Pos is a record's place in the spool: its frame's segment and offset.
type Pos struct {
	Seg uint64
	Off int64
}

func (a Pos) less(b Pos) bool { return a.Seg < b.Seg || a.Seg == b.Seg && a.Off < b.Off }

// Settle states of a record besides an offset.
const (
	pending      = -1
	deadLettered = -2
)

// entryOverhead is what an entry costs beside its per-record columns.
const entryOverhead = 160

// perRecord: the frame offset (4), topic (16), partition (4), offset (8).
const perRecord = 32

type entry struct {
	at      Pos
	end     int64 // the offset after its last frame (same segment)
	nonce   uint64
	owner   uint64
	created time.Time
	rel     []uint32 // each record's frame offset from at.Off
	topic   []string
	part    []int32
	off     []int64 // pending, deadLettered, or the Kafka offset
	open    int     // records still pending
	bytes   int64
}

// Store keeps receipts for lookup, bounded in bytes and age.
type Store struct {
	cfg      Config
	mu       sync.Mutex
	entries  []*entry // in spool order (Add is called in append order)
	bytes    int64
	watching atomic.Int64 // entries with records pending
	now      func() time.Time

	evicted *prometheus.CounterVec
	stored  prometheus.Gauge
	mem     prometheus.Gauge
}

// NewStore builds an empty store; reg receives its metrics.
func NewStore(cfg Config, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, now: time.Now,
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receipts_evicted_total",
			Help: "Spool receipts forgotten before or after they were looked up, by why (bytes, age, too_large)."}, []string{"reason"}),
		stored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_receipts_stored",
			Help: "Spool receipts kept for GET /receipts/{id}."}),
		mem: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_receipts_bytes",
			Help: "Memory the kept spool receipts take (delivery.receipts.max_bytes bounds it)."}),
	}
	reg.MustRegister(s.evicted, s.stored, s.mem)
	return s, nil
}

// Watching reports whether any receipt waits for Kafka: the spool's
// reader tracks record positions only then.
func (s *Store) Watching() bool { return s != nil && s.watching.Load() > 0 }

// Add registers the receipt of a request appended at at, whose records'
// frames start at at.Off+rel[i] and end at end, readable by owner; it
// returns the id. The spool calls it in append order, with its append
// lock held, before any of these records can be read back.
func (s *Store) Add(at Pos, end int64, rel []uint32, owner uint64) string {
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	e := &entry{at: at, end: end, nonce: binary.LittleEndian.Uint64(nb[:]), owner: owner, created: s.now(), rel: rel,
		topic: make([]string, len(rel)), part: make([]int32, len(rel)), off: make([]int64, len(rel)), open: len(rel),
		bytes: entryOverhead + int64(len(rel))*perRecord}
	for i := range e.off {
		e.off[i] = pending
	}
	id := formatID(at, e.nonce)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.bytes > int64(s.cfg.MaxBytes) {
		s.evicted.WithLabelValues("too_large").Inc()
		return id
	}
	s.evictLocked(e.bytes)
	s.entries = append(s.entries, e)
	s.bytes += e.bytes
	if e.open > 0 {
		s.watching.Add(1)
	}
	s.gauges()
	return id
}

// evictLocked drops the oldest entries until room more bytes fit and
// none is older than max_age.
func (s *Store) evictLocked(room int64) {
	cutoff := s.now().Add(-s.cfg.MaxAge)
	i := 0
	for i < len(s.entries) {
		e := s.entries[i]
		switch {
		case s.bytes+room > int64(s.cfg.MaxBytes):
			s.evicted.WithLabelValues("bytes").Inc()
		case e.created.Before(cutoff):
			s.evicted.WithLabelValues("age").Inc()
		default:
			goto done
		}
		s.bytes -= e.bytes
		if e.open > 0 {
			s.watching.Add(-1)
		}
		i++
	}
done:
	if i > 0 {
		clear(s.entries[:i])
		s.entries = append(s.entries[:0], s.entries[i:]...)
	}
}

func (s *Store) gauges() {
	s.stored.Set(float64(len(s.entries)))
	s.mem.Set(float64(s.bytes))
}

// find is the entry holding the record framed at p, and its index there.
func (s *Store) find(p Pos) (*entry, int) {
	k := sort.Search(len(s.entries), func(k int) bool { return p.less(s.entries[k].at) }) - 1
	if k < 0 {
		return nil, 0
	}
	e := s.entries[k]
	if e.at.Seg != p.Seg || p.Off >= e.end {
		return nil, 0
	}
	rel := p.Off - e.at.Off
	i := sort.Search(len(e.rel), func(i int) bool { return int64(e.rel[i]) >= rel })
	if i >= len(e.rel) || int64(e.rel[i]) != rel {
		return nil, 0
	}
	return e, i
}

// Settle records where Kafka put the records framed at at[i]: rc's
// columns, index for index; records rc has no offset for are left
// pending. The spool's reader calls it when Kafka has answered for a
// chunk (on the Kafka client's goroutine: memory only).
func (s *Store) Settle(at []Pos, rc *record.Receipt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range at {
		if i >= len(rc.Offset) || rc.Offset[i] < 0 {
			continue
		}
		s.settleLocked(at[i], rc.Topic[i], rc.Partition[i], rc.Offset[i])
	}
}

// DeadLettered records that the record framed at p will never be in
// Kafka's topic: Kafka refused it for good and it went to the dead
// letters.
func (s *Store) DeadLettered(p Pos) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked(p, "", 0, deadLettered)
}

func (s *Store) settleLocked(p Pos, topic string, partition int32, offset int64) {
	e, i := s.find(p)
	if e == nil || e.off[i] != pending {
		return // evicted, or settled already (a replay after a resend)
	}
	e.topic[i], e.part[i], e.off[i] = topic, partition, offset
	if e.open--; e.open == 0 {
		s.watching.Add(-1)
	}
}

// Status is what a lookup answers.
type Status struct {
	Records      int
	Pending      int
	DeadLettered int
	Ranges       []record.Range
}

// Lookup finds receipt id for owner; false if it is unknown, evicted, or
// another owner's.
func (s *Store) Lookup(id string, owner uint64) (Status, bool) {
	at, nonce, ok := parseID(id)
	if !ok {
		return Status{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(0)
	s.gauges()
	k := sort.Search(len(s.entries), func(k int) bool { return !s.entries[k].at.less(at) })
	if k >= len(s.entries) || s.entries[k].at != at || s.entries[k].nonce != nonce || s.entries[k].owner != owner {
		return Status{}, false
	}
	e := s.entries[k]
	st := Status{Records: len(e.off), Pending: e.open}
	for _, o := range e.off {
		if o == deadLettered {
			st.DeadLettered++
		}
	}
	st.Ranges = record.AppendRanges(nil, e.topic, e.part, e.off)
	return st, true
}

// formatID: segment-offset-nonce, the first two in decimal (the spool
// position a reader of the spool's files can find), the nonce in hex.
func formatID(at Pos, nonce uint64) string {
	var b []byte
	b = strconv.AppendUint(b, at.Seg, 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, at.Off, 10)
	b = append(b, '-')
	h := strconv.FormatUint(nonce, 16)
	b = append(b, strings.Repeat("0", 16-len(h))...)
	b = append(b, h...)
	return string(b)
}

// MaxIDBytes bounds an id a lookup parses.
const MaxIDBytes = 64

func parseID(id string) (Pos, uint64, bool) {
	if len(id) > MaxIDBytes {
		return Pos{}, 0, false
	}
	parts := strings.Split(id, "-")
	if len(parts) != 3 || len(parts[2]) != 16 {
		return Pos{}, 0, false
	}
	seg, err1 := strconv.ParseUint(parts[0], 10, 64)
	off, err2 := strconv.ParseInt(parts[1], 10, 64)
	nonce, err3 := strconv.ParseUint(parts[2], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil || off < 0 {
		return Pos{}, 0, false
	}
	return Pos{seg, off}, nonce, true
}
