package spool

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// serialAcker answers every batch from one goroutine, in order, as the
// Kafka client's promise goroutine does: if an acknowledgement blocks,
// every later one waits behind it.
type serialAcker struct {
	acks chan func()
	fail func(r *record.Record) error
	mu   sync.Mutex
	done map[string]time.Time // first value of a batch → when it completed
}

func newSerialAcker(fail func(r *record.Record) error) *serialAcker {
	a := &serialAcker{acks: make(chan func(), 1024), fail: fail, done: map[string]time.Time{}}
	go func() {
		for f := range a.acks {
			f()
		}
	}()
	return a
}

func (a *serialAcker) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	first := string(b.Records[0].Value)
	n := len(b.Records)
	for i := range b.Records {
		err := a.fail(&b.Records[i])
		last := i == n-1
		a.acks <- func() {
			b.AckAt(i, err)
			if last {
				a.mu.Lock()
				a.done[first] = time.Now()
				a.mu.Unlock()
			}
		}
	}
	return nil
}

// slowDeadLetters takes as long as a slow disk to store a dead letter.
type slowDeadLetters struct{ delay time.Duration }

func (d slowDeadLetters) Write(_ *record.Record, _ string, _ error, done func(error)) {
	time.Sleep(d.delay)
	done(nil)
}

// TestSlowDeadLetterDoesNotStallAcks: storing a dead letter (a write and
// an fsync, or a produce to the dead-letter topic) never runs on the Kafka
// client's promise goroutine: while one record's dead letter takes a slow
// disk's time, acknowledgements for every other batch (other partitions)
// keep being processed.
func TestSlowDeadLetterDoesNotStallAcks(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.SegmentBytes = 1 << 20
	s := open(t, cfg)
	defer s.Close()
	k := newSerialAcker(func(r *record.Record) error {
		if bytes.HasPrefix(r.Value, []byte("rec-00000000")) {
			return consumer.TooLarge("record", 10, 5, nil)
		}
		return nil
	})
	defer close(k.acks) // runs after the deferred Shutdown: no more batches come
	_ = start(t, s, Links{Next: k, DeadLetter: slowDeadLetters{delay: 2 * time.Second}})
	defer s.Shutdown(context.Background())
	appendOK(t, s, recs(0, 10)) // its first record goes to the slow dead letter
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	appendOK(t, s, recs(10, 10))
	deadline := time.Now().Add(5 * time.Second)
	for {
		k.mu.Lock()
		at, ok := k.done[string(recs(10, 1).Records[0].Value)]
		k.mu.Unlock()
		if ok {
			if d := at.Sub(start); d > time.Second {
				t.Fatalf("another batch's acknowledgement waited %s behind a dead-letter write", d)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the second batch was never acknowledged")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
