package kafkafront

import (
	"sync"
	"time"
)

// An idempotent producer numbers each partition's batches and, after an
// error or a timeout, sends the same batch again with the same numbers; a
// broker recognises a batch it already appended and answers it again with
// the original offset instead of appending it twice. ferry does the same
// for the client's leg, so a retry does not duplicate what ferry already
// delivered:
//
//   - a batch matching one of the last five acknowledged for its producer
//     and partition is answered with that batch's offset, not delivered
//     again;
//   - a batch matching one still on its way to Kafka (the client gave up
//     waiting, or ferry answered REQUEST_TIMED_OUT) is answered retriable,
//     so the client asks again once the first attempt has settled;
//   - anything else is delivered. ferry does not refuse out-of-order
//     sequences: it never answers a batch it did not deliver with success,
//     so there is no gap a client could skip.
//
// ferry's own leg to Kafka is idempotent with its own producer id.
type seqTable struct {
	mu  sync.Mutex
	m   map[seqKey]*seqEntry
	max int
}

type seqKey struct {
	pid   int64
	topic string
	part  int32
}

type seqBatch struct {
	first, last int32
	offset      int64
	inflight    bool
	used        bool
}

type seqEntry struct {
	recent [5]seqBatch // Kafka keeps the last five batches too
	next   int
	at     time.Time
}

func newSeqTable(max int) *seqTable { return &seqTable{m: map[seqKey]*seqEntry{}, max: max} }

// claim marks a batch in flight, or says it is a duplicate: of an
// acknowledged batch (with its offset) or of one still in flight.
func (s *seqTable) claim(k seqKey, first, last int32, now time.Time) (dup, inflight bool, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		if len(s.m) >= s.max {
			s.evict(now)
		}
		if len(s.m) >= s.max {
			// Every producer kept has a batch in flight: this batch is
			// delivered untracked rather than the table growing.
			return false, false, 0
		}
		e = &seqEntry{}
		s.m[k] = e
	}
	e.at = now
	for i := range e.recent {
		b := &e.recent[i]
		if b.used && b.first == first && b.last == last {
			return true, b.inflight, b.offset
		}
	}
	e.recent[e.next] = seqBatch{first: first, last: last, offset: -1, inflight: true, used: true}
	e.next = (e.next + 1) % len(e.recent)
	return false, false, 0
}

// settle records a claimed batch's outcome: delivered at offset, or not
// delivered (forgotten, so the client's retry is delivered).
func (s *seqTable) settle(k seqKey, first, last int32, delivered bool, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		return
	}
	for i := range e.recent {
		b := &e.recent[i]
		if b.used && b.inflight && b.first == first && b.last == last {
			if delivered {
				b.inflight, b.offset = false, offset
			} else {
				*b = seqBatch{}
			}
			return
		}
	}
}

// evict drops producers idle for 15 minutes (Kafka's default
// producer-id expiry is a week, but ferry's clients are local and
// reconnect within seconds), then everything but in-flight if still full.
func (s *seqTable) evict(now time.Time) {
	for k, e := range s.m {
		if now.Sub(e.at) > 15*time.Minute {
			delete(s.m, k)
		}
	}
	if len(s.m) < s.max {
		return
	}
	for k, e := range s.m {
		busy := false
		for _, b := range e.recent {
			busy = busy || b.inflight
		}
		if !busy {
			delete(s.m, k)
		}
	}
}
