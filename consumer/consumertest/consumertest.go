// Package consumertest owns test doubles for the next stage of a pipeline,
// so each component's tests can stand in for Kafka without a broker.
package consumertest

import (
	"context"
	"sync"

	"github.com/ferryhq/ferry/record"
)

// Holder takes every batch and leaves it unacknowledged until Release, like
// a Kafka that is slow or down.
type Holder struct {
	mu      sync.Mutex
	batches []*record.Batch
}

// Consume takes b and holds it.
func (h *Holder) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	h.mu.Lock()
	h.batches = append(h.batches, b)
	h.mu.Unlock()
	return nil
}

// Release acknowledges every held record with err (nil: delivered).
func (h *Holder) Release(err error) {
	h.mu.Lock()
	bs := h.batches
	h.batches = nil
	h.mu.Unlock()
	for _, b := range bs {
		for range b.Records {
			b.Ack(err)
		}
	}
}

// Held is the number of batches held.
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.batches)
}

// Sink keeps a copy of every record it receives and acknowledges each one
// with Err (nil: delivered), from another goroutine as Kafka's client does.
// FailFirst, when set, fails only the first record of every batch with it.
type Sink struct {
	Err       error
	FailFirst error
	mu        sync.Mutex
	recs      []record.Record
	batches   int
}

// Consume copies b's records and acknowledges them.
func (s *Sink) Consume(_ context.Context, b *record.Batch) error {
	s.mu.Lock()
	for _, r := range b.Records {
		c := r
		c.Key = append([]byte(nil), r.Key...)
		c.Value = append([]byte(nil), r.Value...)
		c.Headers = nil
		for _, h := range r.Headers {
			c.Headers = append(c.Headers, record.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)})
		}
		s.recs = append(s.recs, c)
	}
	s.batches++
	s.mu.Unlock()
	b.Arm()
	for i := range b.Records {
		err := s.Err
		if i == 0 && s.FailFirst != nil {
			err = s.FailFirst
		}
		go b.AckAt(i, err)
	}
	return nil
}

// Records returns copies of what arrived so far.
func (s *Sink) Records() []record.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]record.Record(nil), s.recs...)
}

// Reset forgets what arrived.
func (s *Sink) Reset() {
	s.mu.Lock()
	s.recs, s.batches = nil, 0
	s.mu.Unlock()
}

// Refuse is a next stage that refuses every batch with Err.
type Refuse struct{ Err error }

// Consume refuses b.
func (r Refuse) Consume(context.Context, *record.Batch) error { return r.Err }
