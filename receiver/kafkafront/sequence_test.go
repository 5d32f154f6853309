package kafkafront

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// TestProducers: a batch claimed and delivered is a duplicate with its
// offset; while in flight, a duplicate in flight; not delivered, it is
// forgotten so the retry is delivered; only the last five batches are
// kept; the same sequences with another CRC are not a duplicate.
func TestProducers(t *testing.T) {
	now := time.Now()
	s := newProducers(3, 100)
	pid := s.issue("app", now)
	k := seqKey{pid: pid, seqPart: seqPart{topic: "t", part: 1}}
	claim := func(first, last int32, crc uint32) (verdict, int64) {
		t.Helper()
		v, off, err := s.claim("app", k, first, last, crc, now)
		if err != nil {
			t.Fatal(err)
		}
		return v, off
	}
	if v, _ := claim(0, 9, 1); v != claimed {
		t.Fatalf("a new batch: %v", v)
	}
	if v, _ := claim(0, 9, 1); v != dupInflight {
		t.Fatalf("a batch in flight: %v", v)
	}
	if v, _ := claim(0, 9, 2); v != claimed {
		t.Fatalf("the same sequences with other bytes: %v, want delivered", v)
	}
	s.settle(k, 0, 9, 1, true, 500)
	if v, off := claim(0, 9, 1); v != dupAcked || off != 500 {
		t.Fatalf("a delivered batch: %v offset %d", v, off)
	}
	claim(10, 19, 3)
	s.settle(k, 10, 19, 3, false, 0)
	if v, _ := claim(10, 19, 3); v != claimed {
		t.Fatalf("a batch that was not delivered: %v", v)
	}
	for i := int32(2); i < 8; i++ {
		claim(i*10, i*10+9, uint32(i))
	}
	if v, _ := claim(0, 9, 1); v != claimed {
		t.Fatalf("more than five batches were remembered: %v", v)
	}
}

// TestProducerIDsAreOwned: an id is deduplicated only for the application
// it was issued to: another application's batches under it are delivered
// and leave the owner's state alone; an id never issued is not tracked;
// ids are not sequential.
func TestProducerIDsAreOwned(t *testing.T) {
	now := time.Now()
	s := newProducers(100, 100)
	a, b := s.issue("alpha", now), s.issue("alpha", now)
	if b == a+1 || a < 0 || b < 0 {
		t.Fatalf("ids %d then %d: guessable or negative", a, b)
	}
	k := seqKey{pid: a, seqPart: seqPart{topic: "t"}}
	if v, _, _ := s.claim("alpha", k, 0, 0, 7, now); v != claimed {
		t.Fatalf("owner's batch: %v", v)
	}
	s.settle(k, 0, 0, 7, true, 1)
	if v, _, _ := s.claim("beta", k, 0, 0, 7, now); v != foreign {
		t.Fatalf("another application's batch: %v, want delivered untracked", v)
	}
	if v, _, _ := s.claim("beta", k, 1, 1, 8, now); v != foreign {
		t.Fatalf("another application's next batch: %v, want delivered untracked", v)
	}
	if v, off, _ := s.claim("alpha", k, 0, 0, 7, now); v != dupAcked || off != 1 {
		t.Fatalf("the owner's retry after another application used its id: %v %d", v, off)
	}
	if v, _, _ := s.claim("alpha", k, 1, 1, 8, now); v != claimed {
		t.Fatalf("the owner's next batch, whose sequences another application used: %v, want delivered", v)
	}
	if v, _, _ := s.claim("beta", seqKey{pid: b + a + 12345, seqPart: seqPart{topic: "t"}}, 0, 0, 7, now); v != untracked {
		t.Fatalf("an id never issued: %v, want untracked", v)
	}
}

// TestProducerEpochs: per partition, as in Kafka: a newer epoch drops the
// older one's batches (its sequences start at 0 again and are delivered);
// an older epoch is fenced; a settle for the replaced epoch changes
// nothing; another partition keeps its own epoch.
func TestProducerEpochs(t *testing.T) {
	now := time.Now()
	s := newProducers(100, 100)
	pid := s.issue("", now)
	e0 := seqKey{pid: pid, seqPart: seqPart{topic: "t"}}
	e1 := e0
	e1.epoch = 1
	s.claim("", e0, 0, 0, 1, now)
	s.claim("", e0, 1, 1, 2, now)
	if v, _, _ := s.claim("", e1, 0, 0, 1, now); v != claimed {
		t.Fatalf("epoch 1, sequence 0, same bytes as epoch 0's: %v, want delivered", v)
	}
	s.settle(e0, 1, 1, 2, true, 9) // the old epoch's late answer
	if v, _, err := s.claim("", e0, 2, 2, 3, now); v != refusedBatch || !errors.Is(err, kerr.InvalidProducerEpoch) {
		t.Fatalf("an older epoch: %v %v", v, err)
	}
	if s.parts != 1 {
		t.Fatalf("%d partition entries, want epoch 1's one", s.parts)
	}
	other := seqKey{pid: pid, seqPart: seqPart{topic: "t", part: 1}}
	if v, _, _ := s.claim("", other, 5, 5, 9, now); v != claimed {
		t.Fatalf("epoch 0 on another partition after epoch 1 on the first: %v, want delivered", v)
	}
}

// TestProducersBounded: issued ids and partition entries stay within
// their bounds; producers with a batch in flight are kept while idle ones
// go; a partition past the bound is delivered untracked.
func TestProducersBounded(t *testing.T) {
	now := time.Now()
	s := newProducers(10, 5)
	busy := s.issue("", now)
	s.claim("", seqKey{pid: busy, seqPart: seqPart{topic: "t"}}, 0, 0, 1, now)
	for i := range 100 {
		s.issue("", now.Add(time.Duration(i+1)*time.Second))
	}
	if len(s.m) > 10 {
		t.Fatalf("%d producers remembered, bound 10", len(s.m))
	}
	if s.m[busy] == nil {
		t.Fatal("a producer with a batch in flight was evicted")
	}
	for p := range int32(10) {
		v, _, _ := s.claim("", seqKey{pid: busy, seqPart: seqPart{topic: "t", part: p + 1}}, 0, 0, 1, now)
		if p+1 >= 5 && v != untracked {
			t.Fatalf("partition %d past the bound: %v", p+1, v)
		}
	}
	if s.parts > 5 {
		t.Fatalf("%d partition entries, bound 5", s.parts)
	}
	// Idle for longer than s.idle: gone at the next eviction.
	s.issue("", now.Add(time.Hour))
	for range 20 {
		s.issue("", now.Add(time.Hour))
	}
	if s.m[busy] != nil {
		t.Fatal("a producer idle past the expiry was kept")
	}
}

// TestProducersPartitionsFreed: a table whose partition entries are all
// taken makes room from the least recently used producers with nothing in
// flight, so a new producer's batches are still checked; and producers
// idle past the expiry are forgotten within a minute, full table or not.
func TestProducersPartitionsFreed(t *testing.T) {
	now := time.Now()
	s := newProducers(100, 10)
	old := s.issue("", now)
	for p := range int32(10) {
		k := seqKey{pid: old, seqPart: seqPart{topic: "t", part: p}}
		s.claim("", k, 0, 0, 1, now)
		s.settle(k, 0, 0, 1, true, int64(p))
	}
	fresh := s.issue("", now.Add(time.Second))
	if v, _, _ := s.claim("", seqKey{pid: fresh, seqPart: seqPart{topic: "t"}}, 0, 0, 1, now.Add(time.Second)); v != claimed {
		t.Fatalf("a new producer with every partition entry taken by an idle one: %v, want checked", v)
	}
	if s.m[old] != nil {
		t.Fatal("the least recently used producer was kept")
	}
	// Idle past the expiry: gone at the next look a minute on.
	if v, _, _ := s.claim("", seqKey{pid: fresh, seqPart: seqPart{topic: "u"}}, 0, 0, 1, now.Add(10*time.Minute)); v != claimed {
		t.Fatalf("a producer back after 10 minutes: %v, want still known", v)
	}
	other := s.issue("", now.Add(30*time.Minute))
	if s.m[fresh] != nil || s.m[other] == nil {
		t.Fatal("a producer idle for 20 minutes was kept")
	}
}

// TestFailedRetriesKeepTheWindow: a batch that was not delivered frees its
// place among the five, so a client retrying a failing batch again and
// again does not push the delivered batches out (their retries would then
// be delivered twice). FuzzProduceSequences found it.
func TestFailedRetriesKeepTheWindow(t *testing.T) {
	now := time.Now()
	s := newProducers(10, 10)
	pid := s.issue("", now)
	k := seqKey{pid: pid, seqPart: seqPart{topic: "t"}}
	s.claim("", k, 0, 0, 1, now)
	s.settle(k, 0, 0, 1, true, 40)
	for range 10 {
		if v, _, _ := s.claim("", k, 1, 1, 2, now); v != claimed {
			t.Fatalf("a retry of a batch that failed: %v", v)
		}
		s.settle(k, 1, 1, 2, false, 0)
	}
	if v, off, _ := s.claim("", k, 0, 0, 1, now); v != dupAcked || off != 40 {
		t.Fatalf("the delivered batch's retry after ten failed attempts of another: %v %d", v, off)
	}
}
