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
