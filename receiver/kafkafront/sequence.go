package kafkafront

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/consumer"
)

// An idempotent producer numbers each partition's batches and, after an
// error or a timeout, sends the same batch again with the same numbers; a
// broker recognises a batch it already appended and answers it again with
// the original offset instead of appending it twice. ferry does the same
// for the client's leg, so a retry does not duplicate what ferry already
// delivered. Answering "already have it" for a batch ferry does not have
// loses it while the client is told it is safe, so the check is narrow:
//
//   - Producer ids are ferry's own (InitProducerId), random and so not
//     guessable, and each is remembered with the application (token) it
//     was issued to. Only a batch under an id this agent issued, sent by
//     that application, is ever taken for a retry. Any other batch (an id
//     issued to another application, or one this agent never issued or has
//     forgotten: a restart, eviction) is delivered as an ordinary batch and
//     leaves the table alone: nobody can poison another producer's state,
//     and a producer whose token changed under it (a reload that turned
//     authentication on) keeps working, without the retry check.
//   - State is per (id, partition) with the epoch, as in Kafka: a batch of
//     a newer epoch (the Java producer bumps it after an expired batch and
//     starts its sequences at 0 again) drops that partition's older
//     batches; a batch of an older epoch than the partition's is refused
//     INVALID_PRODUCER_EPOCH, as Kafka does.
//   - A retry is one of the partition's last five batches with the same
//     first and last sequence *and* the same CRC (the batch's bytes, which
//     a client's retry repeats exactly, and which cover the producer id,
//     epoch and sequences); anything else is delivered. An acknowledged
//     retry is answered with the first attempt's offset, one whose first
//     attempt is still on its way to Kafka (the client gave up waiting, or
//     ferry answered REQUEST_TIMED_OUT) is answered retriable, so the
//     client asks again once that attempt has settled.
//
// ferry does not refuse out-of-order sequences: it never answers a batch
// it did not deliver with success, so there is no gap a client could skip.
// ferry's own leg to Kafka is idempotent with its own producer id.
//
// This table is memory only: a restart forgets it. In delivery mode spool
// the batches it lets through are also checked against durable keys
// (durable.go), which a restart keeps.
type producers struct {
	mu sync.Mutex
	m  map[int64]*producer
	// maxProducers bounds the ids remembered, maxParts the partition
	// entries across all of them: both are sized by clients.
	maxProducers, maxParts int
	parts                  int
	idle                   time.Duration
	swept                  time.Time // the last sweep of idle producers
}

// producer is one issued id.
type producer struct {
	owner string // the application it was issued to ("" without a token)
	at    time.Time
	parts map[seqPart]*seqEntry
}

type seqPart struct {
	topic string
	part  int32
}

type seqBatch struct {
	first, last int32
	crc         uint32
	offset      int64
	order       uint32 // when it was claimed: the oldest is replaced first
	inflight    bool
	used        bool
}

// seqEntry is one partition of one producer: its newest epoch and the
// last batches of that epoch that are delivered or on their way. A batch
// that was not delivered frees its place, so a client retrying a failing
// batch does not push the delivered ones out.
type seqEntry struct {
	epoch  int16
	recent [5]seqBatch // Kafka keeps the last five batches too
	claims uint32
}

// seqKey names one batch's place: producer, epoch, partition.
type seqKey struct {
	pid   int64
	epoch int16
	seqPart
}

// errOldEpoch refuses a batch of an epoch the partition has moved past.
var errOldEpoch = &consumer.PermanentError{Reason: "producer_epoch_fenced", Kind: consumer.KindRefused,
	Err: kerr.InvalidProducerEpoch,
	Msg: "a newer epoch of this producer id has produced to this partition since: this batch is from a fenced producer"}

// verdict is what the table says of a batch.
type verdict int

const (
	untracked    verdict = iota // deliver; nothing to settle
	foreign                     // deliver; nothing to settle: the id was issued to another application
	claimed                     // deliver; settle when it ends
	dupAcked                    // answer with the offset, deliver nothing
	dupInflight                 // answer retriable, deliver nothing
	refusedBatch                // answer with the error
)

func newProducers(maxProducers, maxParts int) *producers {
	return &producers{m: map[int64]*producer{}, maxProducers: maxProducers, maxParts: maxParts, idle: 15 * time.Minute}
}

// issue hands out a new producer id for owner. Ids are random (63 bits,
// never negative): a client cannot name the id the next producer will get.
func (s *producers) issue(owner string, now time.Time) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	if len(s.m) >= s.maxProducers {
		s.evict(now)
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		pid := int64(binary.BigEndian.Uint64(b[:]) >> 1)
		if _, taken := s.m[pid]; taken {
			continue
		}
		if len(s.m) < s.maxProducers {
			s.m[pid] = &producer{owner: owner, at: now}
		}
		// Full of producers with batches in flight: the id is handed out
		// and its batches are delivered untracked.
		return pid
	}
}

// claim looks a batch up: k's producer, epoch and partition, sequences
// first..last, checksum crc, sent by owner. A claimed batch is marked in
// flight until settle.
func (s *producers) claim(owner string, k seqKey, first, last int32, crc uint32, now time.Time) (verdict, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	p := s.m[k.pid]
	switch {
	case p == nil:
		return untracked, 0, nil
	case p.owner != owner:
		return foreign, 0, nil
	}
	p.at = now
	e := p.parts[k.seqPart]
	if e == nil {
		if s.parts >= s.maxParts {
			s.evict(now)
			if s.m[k.pid] == nil || s.parts >= s.maxParts {
				return untracked, 0, nil
			}
		}
		if p.parts == nil {
			p.parts = map[seqPart]*seqEntry{}
		}
		e = &seqEntry{epoch: k.epoch}
		p.parts[k.seqPart] = e
		s.parts++
	}
	switch {
	case k.epoch < e.epoch:
		return refusedBatch, 0, errOldEpoch
	case k.epoch > e.epoch:
		*e = seqEntry{epoch: k.epoch}
	}
	for i := range e.recent {
		b := &e.recent[i]
		if b.used && b.first == first && b.last == last && b.crc == crc {
			if b.inflight {
				return dupInflight, 0, nil
			}
			return dupAcked, b.offset, nil
		}
	}
	slot := 0
	for i := range e.recent {
		if !e.recent[i].used {
			slot = i
			break
		}
		if e.recent[i].order < e.recent[slot].order {
			slot = i
		}
	}
	e.claims++
	e.recent[slot] = seqBatch{first: first, last: last, crc: crc, offset: -1, order: e.claims, inflight: true, used: true}
	return claimed, 0, nil
}

// settle records a claimed batch's outcome: delivered at offset, or not
// delivered (forgotten, so the client's retry is delivered). A batch whose
// epoch has been replaced meanwhile, or whose producer was forgotten, has
// nothing left to settle.
func (s *producers) settle(k seqKey, first, last int32, crc uint32, delivered bool, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.m[k.pid]
	if p == nil {
		return
	}
	e := p.parts[k.seqPart]
	if e == nil || e.epoch != k.epoch {
		return
	}
	for i := range e.recent {
		b := &e.recent[i]
		if b.used && b.inflight && b.first == first && b.last == last && b.crc == crc {
			if delivered {
				b.inflight, b.offset = false, offset
			} else {
				*b = seqBatch{}
			}
			return
		}
	}
}

// sweep forgets producers idle for s.idle (Kafka's default producer-id
// expiry is a week, but ferry's clients are local and reconnect within
// seconds), at most once a minute.
func (s *producers) sweep(now time.Time) {
	if now.Sub(s.swept) < time.Minute {
		return
	}
	s.swept = now
	for pid, p := range s.m {
		if now.Sub(p.at) > s.idle {
			s.drop(pid, p)
		}
	}
}

// evict makes room when either bound is reached: the least recently used
// producers with nothing in flight go until both counts are below nine
// tenths of their bounds. Forgetting a producer only means a later retry of
// its batches is delivered again.
func (s *producers) evict(now time.Time) {
	s.swept = time.Time{}
	s.sweep(now)
	room := func() bool { return len(s.m) < s.maxProducers*9/10 && s.parts < s.maxParts*9/10 }
	if room() {
		return
	}
	type idle struct {
		pid int64
		at  time.Time
	}
	var quiet []idle
	for pid, p := range s.m {
		if !p.busy() {
			quiet = append(quiet, idle{pid, p.at})
		}
	}
	slices.SortFunc(quiet, func(a, b idle) int { return a.at.Compare(b.at) })
	for _, q := range quiet {
		if room() {
			break
		}
		s.drop(q.pid, s.m[q.pid])
	}
}

func (s *producers) drop(pid int64, p *producer) {
	s.parts -= len(p.parts)
	delete(s.m, pid)
}

func (p *producer) busy() bool {
	for _, e := range p.parts {
		for _, b := range e.recent {
			if b.inflight {
				return true
			}
		}
	}
	return false
}
