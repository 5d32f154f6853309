// Package submit owns the part of a request every receiver shares once its
// records are built: hand the batch to the pipeline, then wait for Kafka's
// answer, the ack timeout or the client leaving — and give the request's
// pooled buffers back exactly once, when nothing points into them any more.
//
// The order matters and is easy to get wrong by hand: the batch's
// completion is attached before the batch is handed on (Kafka may answer
// before Consume returns); the body's own memory reservation is given up
// only when the queue has reserved the whole batch; a refused batch is
// detached and its buffers returned at once; a request whose client left
// or timed out leaves its buffers to the completion, which runs when Kafka
// answers, however late.
package submit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/record"
)

// Submitter hands one receiver's batches to the pipeline.
type Submitter struct {
	// Next is the pipeline's intake.
	Next consumer.Consumer
	// Bodies is the reader the request's buffers came from.
	Bodies *httpbody.Reader
	// AckTimeout bounds how long Wait waits for Kafka.
	AckTimeout time.Duration
	// Recycle, if set, takes the batch back when it is complete.
	Recycle func(*record.Batch)
	// M receives the acknowledgement latency.
	M *receivermetrics.Metrics
}

// Ticket is a batch handed on, to wait for.
type Ticket struct {
	s      *Submitter
	start  time.Time
	n      int
	done   chan error
	failed int
	// timer bounds Wait; it goes back to the pool with the ticket (a new
	// timer a request was two of its allocations). Since Go 1.23 a
	// stopped timer's channel holds no stale tick, so Reset is safe.
	timer *time.Timer
}

var ticketPool = sync.Pool{New: func() any { return &Ticket{done: make(chan error, 1)} }}

// Submit hands b on. raw and out (either may be nil) are the pooled buffers
// b's records point into; from here they belong to Submit. wait: the caller
// will call Wait (and must, to release the Ticket); otherwise the Ticket is
// nil. A refused batch returns the pipeline's error, with the buffers
// already back in the pool.
func (s *Submitter) Submit(ctx context.Context, b *record.Batch, wait bool, raw, out *httpbody.Buf) (*Ticket, error) {
	var t *Ticket
	if wait {
		t = ticketPool.Get().(*Ticket)
		t.s, t.start, t.n = s, time.Now(), len(b.Records)
	}
	b.OnDone(func(err error) {
		failed := b.Failed()
		s.Bodies.Put(raw)
		s.Bodies.Put(out)
		if s.Recycle != nil {
			s.Recycle(b)
		}
		if t != nil {
			t.failed = failed
			t.done <- err
		}
	})
	// The queue reserves the whole batch (the request and the records'
	// buffer included) from here.
	s.Bodies.Release(raw)
	s.Bodies.Release(out)
	if err := s.Next.Consume(ctx, b); err != nil {
		b.PopDone()
		s.Bodies.Put(raw)
		s.Bodies.Put(out)
		if s.Recycle != nil {
			s.Recycle(b)
		}
		if t != nil {
			t.release()
		}
		return nil, err
	}
	return t, nil
}

// Wait waits for Kafka's answer for the batch: nil when every record is
// acknowledged; the batch's error, with the number of records not
// delivered; ErrAckTimeout-kind after AckTimeout (the records stay queued);
// or ctx's error when the client left. t must not be used after.
func (t *Ticket) Wait(ctx context.Context) (failed int, err error) {
	if t.timer == nil {
		t.timer = time.NewTimer(t.s.AckTimeout)
	} else {
		t.timer.Reset(t.s.AckTimeout)
	}
	// Stopped before the ticket goes back to the pool (not deferred: the
	// next request may already have it).
	select {
	case err := <-t.done:
		t.timer.Stop()
		if t.s.M != nil {
			t.s.M.AckLatency.Observe(time.Since(t.start).Seconds())
		}
		failed = t.failed
		t.release()
		return failed, err
	case <-t.timer.C:
		// The completion still runs later and writes to done: this ticket
		// is left to the garbage collector rather than reused.
		return t.n, AckTimeout(t.s.AckTimeout, t.n)
	case <-ctx.Done():
		t.timer.Stop()
		return t.n, ctx.Err()
	}
}

func (t *Ticket) release() {
	t.s, t.failed, t.n = nil, 0, 0
	ticketPool.Put(t)
}

// AckTimeout is the error of a request Kafka did not answer for in time.
func AckTimeout(d time.Duration, records int) error {
	return &consumer.RetryableError{Reason: "ack_timeout", Kind: consumer.KindTimeout, After: time.Second,
		Msg: fmt.Sprintf("Kafka did not acknowledge within %s; the %d records stay queued and may still be delivered", d, records)}
}

// SubmitAsync is Submit for a caller that answers from the completion (a
// pipelined protocol): done runs exactly once, after the buffers are back,
// when Kafka (or the spool) has answered for every record — on the
// goroutine that completed the batch, which may be the Kafka client's, so
// done must not block. A refused batch returns the pipeline's error and
// done never runs.
func (s *Submitter) SubmitAsync(ctx context.Context, b *record.Batch, raw, out *httpbody.Buf, done func(err error)) error {
	b.OnDone(func(err error) {
		s.Bodies.Put(raw)
		s.Bodies.Put(out)
		if s.Recycle != nil {
			s.Recycle(b)
		}
		done(err)
	})
	s.Bodies.Release(raw)
	s.Bodies.Release(out)
	if err := s.Next.Consume(ctx, b); err != nil {
		b.PopDone()
		s.Bodies.Put(raw)
		s.Bodies.Put(out)
		if s.Recycle != nil {
			s.Recycle(b)
		}
		return err
	}
	return nil
}
