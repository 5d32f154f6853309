package receipt

// The store: receipts of records the spool took before Kafka had them.
//
// In spool mode a client is answered at the spool's fsync. If it asked for
// a receipt, the spool registers the request here (Prepare, Register)
// under its place in the spool (segment, offset) and the answer carries
// its id (below). The spool's reader sends records to Kafka in
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
// The lock: Settle runs on the Kafka client's promise goroutine (every
// tenant's acknowledgements) and Register under the spool's append lock,
// so the store's lock is only ever held for work proportional to what
// the caller brings (a chunk's records, one request) and never for a
// lookup's answer. Settle walks the chunk's positions and the entries
// together (both in spool order); Prepare does a request's allocation and
// its too_large check before either lock. A lookup finds its entry under
// the lock and copies three numbers; the ranges are built outside it,
// from columns that no longer change: they are answered only once the
// receipt is done (no record pending), and a done entry's columns are
// never written again. One answer holds at most MaxRangesPerAnswer ranges
// (Status.Next continues it), and at most maxBuilds lookups build at once,
// so lookups' memory is bounded whatever clients do.
//
// Ids are SEQUENCE-NONCE: the request's number in this store (counted
// from a random start) and 64 random bits. They name nothing of the
// spool's files or byte positions.
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

// MaxRangesPerAnswer bounds one lookup's answer; Status.Next continues it.
const MaxRangesPerAnswer = 10000

// maxBuilds bounds the lookups building an answer at once (each holds up
// to MaxRangesPerAnswer ranges while it does).
const maxBuilds = 4

type entry struct {
	seq     uint64
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
	dead    int     // records dead-lettered
	bytes   int64
}

// Store keeps receipts for lookup, bounded in bytes and age.
type Store struct {
	cfg      Config
	mu       sync.Mutex
	entries  []*entry // in spool order (Register is called in append order), so by seq too
	seq      uint64   // the last seq given
	bytes    int64
	watching atomic.Int64 // entries with records pending
	now      func() time.Time
	builds   chan struct{} // lookups building an answer

	evicted *prometheus.CounterVec
	stored  prometheus.Gauge
	mem     prometheus.Gauge
}

// NewStore builds an empty store; reg receives its metrics.
func NewStore(cfg Config, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &Store{cfg: cfg, now: time.Now, seq: uint64(binary.LittleEndian.Uint32(b[:])), builds: make(chan struct{}, maxBuilds),
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

// Prepared is a receipt ready to register: its columns allocated and its
// nonce drawn, before the spool takes its append lock.
type Prepared struct {
	e *entry // nil: too large to keep
}

// Prepare allocates the receipt of a request whose records' frames start
// at rel[i] from the request's place, readable by owner. A request larger
// than the whole store is not kept (counted too_large); it still gets an
// id. Call it before the spool's append lock; Register under it.
func (s *Store) Prepare(rel []uint32, owner uint64) Prepared {
	bytes := entryOverhead + int64(len(rel))*perRecord
	if bytes > int64(s.cfg.MaxBytes) {
		s.evicted.WithLabelValues("too_large").Inc()
		return Prepared{}
	}
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	e := &entry{nonce: binary.LittleEndian.Uint64(nb[:]), owner: owner, rel: rel,
		topic: make([]string, len(rel)), part: make([]int32, len(rel)), off: make([]int64, len(rel)), open: len(rel),
		bytes: bytes}
	for i := range e.off {
		e.off[i] = pending
	}
	return Prepared{e: e}
}

// Register keeps p for the request appended at at, its last frame ending
// at end, and returns its id. The spool calls it in append order, with
// its append lock held, before any of these records can be read back.
func (s *Store) Register(p Prepared, at Pos, end int64) string {
	e := p.e
	s.mu.Lock()
	s.seq++
	seq := s.seq
	if e != nil {
		e.seq, e.at, e.end, e.created = seq, at, end, s.now()
		s.evictLocked(e.bytes)
		s.entries = append(s.entries, e)
		s.bytes += e.bytes
		if e.open > 0 {
			s.watching.Add(1)
		}
		s.gauges()
	}
	s.mu.Unlock()
	var nonce uint64
	if e != nil {
		nonce = e.nonce
	} else {
		var nb [8]byte
		_, _ = rand.Read(nb[:])
		nonce = binary.LittleEndian.Uint64(nb[:])
	}
	return formatID(seq, nonce)
}

// Add is Prepare then Register.
func (s *Store) Add(at Pos, end int64, rel []uint32, owner uint64) string {
	return s.Register(s.Prepare(rel, owner), at, end)
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

// cursor finds the entries of positions given in spool order by walking
// with them: the next position is usually in the same entry, at the next
// record, or past every entry. Out of order (never expected), it searches
// again.
type cursor struct {
	s    *Store
	k    int // the entry at or before the last position; -1: before all
	j    int // the record of entries[k] the last match was
	last Pos
	used bool
}

func (c *cursor) find(p Pos) (*entry, int) {
	es := c.s.entries
	if !c.used || p.less(c.last) {
		c.k, c.j = sort.Search(len(es), func(k int) bool { return p.less(es[k].at) })-1, 0
	} else if c.k+1 < len(es) && !p.less(es[c.k+1].at) {
		// Past the next entry: usually just into it, else a search.
		if c.k+2 < len(es) && !p.less(es[c.k+2].at) {
			base := c.k + 2
			c.k = base + sort.Search(len(es)-base, func(k int) bool { return p.less(es[base+k].at) }) - 1
		} else {
			c.k++
		}
		c.j = 0
	}
	c.used, c.last = true, p
	if c.k < 0 {
		return nil, 0
	}
	e := es[c.k]
	if e.at.Seg != p.Seg || p.Off >= e.end {
		return nil, 0
	}
	rel := p.Off - e.at.Off
	if c.j >= len(e.rel) || int64(e.rel[c.j]) > rel {
		c.j = 0
	}
	if c.j < len(e.rel) && int64(e.rel[c.j]) != rel {
		if c.j+1 < len(e.rel) && int64(e.rel[c.j+1]) == rel {
			c.j++
		} else {
			base := c.j
			c.j = base + sort.Search(len(e.rel)-base, func(i int) bool { return int64(e.rel[base+i]) >= rel })
		}
	}
	if c.j >= len(e.rel) || int64(e.rel[c.j]) != rel {
		return nil, 0
	}
	return e, c.j
}

// Settle records where Kafka put the records framed at at[i] (in spool
// order, as the reader sends them): rc's columns, index for index;
// records rc has no offset for are left pending. The spool's reader
// calls it when Kafka has answered for a chunk (on the Kafka client's
// goroutine: memory only, a walk of the chunk and the entries together).
func (s *Store) Settle(at []Pos, rc *record.Receipt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.entries) == 0 {
		return
	}
	c := cursor{s: s}
	for i := range at {
		if i >= len(rc.Offset) || rc.Offset[i] < 0 {
			continue
		}
		if e, j := c.find(at[i]); e != nil {
			s.settleLocked(e, j, rc.Topic[i], rc.Partition[i], rc.Offset[i])
		}
	}
}

// DeadLettered records that the record framed at p will never be in
// Kafka's topic: Kafka refused it for good and it went to the dead
// letters.
func (s *Store) DeadLettered(p Pos) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := cursor{s: s}
	if e, j := c.find(p); e != nil {
		s.settleLocked(e, j, "", 0, deadLettered)
	}
}

func (s *Store) settleLocked(e *entry, i int, topic string, partition int32, offset int64) {
	if e.off[i] != pending {
		return // settled already (a replay after a resend)
	}
	e.topic[i], e.part[i], e.off[i] = topic, partition, offset
	if offset == deadLettered {
		e.dead++
	}
	if e.open--; e.open == 0 {
		s.watching.Add(-1)
	}
}

// Status is what a lookup answers.
type Status struct {
	Records      int
	Pending      int
	DeadLettered int
	// Ranges: where the records are, once none is pending (none before).
	// At most MaxRangesPerAnswer of them; a range may be cut at the end
	// of an answer and continue in the next.
	Ranges []record.Range
	// Next, when not 0, is the record to continue from (LookupFrom):
	// the answer stopped at MaxRangesPerAnswer ranges.
	Next int
}

// Lookup is LookupFrom(id, owner, 0).
func (s *Store) Lookup(id string, owner uint64) (Status, bool) {
	return s.LookupFrom(id, owner, 0)
}

// LookupFrom finds receipt id for owner, its ranges from record from on;
// false if it is unknown, evicted, or another owner's. Under the store's
// lock it only finds the entry; the ranges are built outside it.
func (s *Store) LookupFrom(id string, owner uint64, from int) (Status, bool) {
	seq, nonce, ok := parseID(id)
	if !ok || from < 0 {
		return Status{}, false
	}
	s.mu.Lock()
	s.evictLocked(0)
	s.gauges()
	k := sort.Search(len(s.entries), func(k int) bool { return s.entries[k].seq >= seq })
	if k >= len(s.entries) || s.entries[k].seq != seq || s.entries[k].nonce != nonce || s.entries[k].owner != owner {
		s.mu.Unlock()
		return Status{}, false
	}
	e := s.entries[k]
	st := Status{Records: len(e.off), Pending: e.open, DeadLettered: e.dead}
	s.mu.Unlock()
	if st.Pending > 0 || from >= len(e.off) {
		return st, true
	}
	// Done: e's columns are never written again (settleLocked skips
	// settled records), and the lock's release above ordered their last
	// writes before these reads.
	s.builds <- struct{}{}
	defer func() { <-s.builds }()
	st.Ranges, st.Next = record.AppendRangesUpTo(nil, e.topic, e.part, e.off, from, MaxRangesPerAnswer)
	return st, true
}

// formatID: SEQUENCE-NONCE, the sequence in decimal, the nonce in 16
// hex digits.
func formatID(seq, nonce uint64) string {
	var b [40]byte
	out := strconv.AppendUint(b[:0], seq, 10)
	out = append(out, '-')
	for shift := 60; shift >= 0; shift -= 4 {
		out = append(out, "0123456789abcdef"[nonce>>uint(shift)&15])
	}
	return string(out)
}

// MaxIDBytes bounds an id a lookup parses.
const MaxIDBytes = 64

func parseID(id string) (seq, nonce uint64, ok bool) {
	if len(id) > MaxIDBytes {
		return 0, 0, false
	}
	s, n, found := strings.Cut(id, "-")
	if !found || len(n) != 16 || s == "" || s[0] == '+' {
		return 0, 0, false
	}
	seq, err1 := strconv.ParseUint(s, 10, 64)
	nonce, err2 := strconv.ParseUint(n, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return seq, nonce, true
}
