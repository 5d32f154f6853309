package spool

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/record"
)

// keeper takes the reader's batches and answers none of them: the test
// answers, as the exactly-once committer does after a commit.
type keeper struct{ got chan *record.Batch }

func (k *keeper) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	k.got <- b
	return nil
}

// TestAnswerDoesNotWaitForAppends: Kafka's answer moves the watermark
// without the append lock, which an append holds through its write and a
// segment roll through its fsync. An exactly-once exporter answers a
// committed transaction's batches on the goroutine that then begins the
// next transaction: waiting there behind 32 clients' appends stalled
// delivery for up to a second per transaction. The segments the watermark
// passed are still retired (by the finisher, once the lock is free).
func TestAnswerDoesNotWaitForAppends(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	for i := 0; i < 60; i++ {
		appendOK(t, s, recs(i*100, 100)) // 64 KiB segments: several
	}
	before := len(segments(t, dir))
	if before < 4 {
		t.Fatalf("%d segments; the test needs the watermark to pass some", before)
	}
	k := &keeper{got: make(chan *record.Batch, 1<<10)}
	if err := start(t, s, Links{Next: k}); err != nil {
		t.Fatal(err)
	}
	var bs []*record.Batch
	for n := 0; n < 6000; {
		select {
		case b := <-k.got:
			bs = append(bs, b)
			n += len(b.Records)
		case <-time.After(10 * time.Second):
			t.Fatalf("the reader delivered %d of 6000 records", n)
		}
	}
	// An append in the middle of a long write or fsync.
	s.mu.Lock()
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		for _, b := range bs {
			for range b.Records {
				b.Ack(nil)
			}
		}
	}()
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		s.mu.Unlock()
		<-answered
		t.Fatal("answering the batches waited for the append lock")
	}
	s.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for s.Backlog() != 0 || len(segments(t, dir)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d bytes, %d of %d segments left after every record was answered", s.Backlog(), len(segments(t, dir)), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.Shutdown(context.Background())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
