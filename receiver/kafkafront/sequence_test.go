package kafkafront

import (
	"testing"
	"time"
)

// TestSeqTable: a batch claimed and delivered is a duplicate with its
// offset; while in flight, a duplicate in flight; not delivered, it is
// forgotten so the retry is delivered; only the last five batches are
// kept; idle producers are evicted when the table is full.
func TestSeqTable(t *testing.T) {
	now := time.Now()
	s := newSeqTable(3)
	k := seqKey{pid: 7, topic: "t", part: 1}
	if dup, _, _ := s.claim(k, 0, 9, now); dup {
		t.Fatal("a new batch was a duplicate")
	}
	if dup, inflight, _ := s.claim(k, 0, 9, now); !dup || !inflight {
		t.Fatal("a batch in flight was not recognised")
	}
	s.settle(k, 0, 9, true, 500)
	if dup, inflight, off := s.claim(k, 0, 9, now); !dup || inflight || off != 500 {
		t.Fatalf("a delivered batch: dup %v inflight %v offset %d", dup, inflight, off)
	}
	s.claim(k, 10, 19, now)
	s.settle(k, 10, 19, false, 0)
	if dup, _, _ := s.claim(k, 10, 19, now); dup {
		t.Fatal("a batch that was not delivered was taken for a duplicate")
	}
	for i := int32(2); i < 8; i++ {
		s.claim(k, i*10, i*10+9, now)
	}
	if dup, _, _ := s.claim(k, 0, 9, now); dup {
		t.Fatal("more than five batches were remembered")
	}
	for i := range 10 {
		s.claim(seqKey{pid: int64(100 + i), topic: "t"}, 0, 0, now.Add(time.Hour))
	}
	if len(s.m) > 3 {
		t.Fatalf("table grew to %d producers, bound 3", len(s.m))
	}
}
