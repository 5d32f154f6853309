// Package budget owns ferry's memory bound as a number: the bytes every
// stage that holds client data has reserved, and the limit they share.
//
// One Budget is built first, from queue.memory_limit, and handed to every
// stage that holds data between a client and Kafka's acknowledgement: the
// queue (batches admitted from receivers), the spool's reader (chunks read
// ahead of Kafka) and the receivers (request bodies, reserved before they
// are read). A stage reserves before it spends memory and releases when
// the memory is free again, so the sum can never pass the limit and no
// stage needs to know the others exist.
//
// A stage that must not take the room another one needs reserves under a
// ceiling lower than the limit (the spool's reader stops at read_ahead, so
// receivers always find room). In spill mode request bodies get a Budget
// of their own: a full queue is what sends spill mode to disk, so reading
// a body must not depend on room in it.
//
// Reserve and Release are one compare-and-swap each; waiting for room
// (queue.block_timeout) costs nothing unless someone waits.
package budget

import (
	"context"
	"sync/atomic"
	"time"
)

// Budget is a byte bound shared by the stages that hold data.
type Budget struct {
	limit   int64
	used    atomic.Int64
	waiters atomic.Int64
	freed   chan struct{}
}

// New returns a budget of limit bytes.
func New(limit int64) *Budget { return &Budget{limit: limit, freed: make(chan struct{}, 1)} }

// Reserve takes n bytes while the total stays at or below ceiling (and the
// limit), and reports whether it did.
func (b *Budget) Reserve(n, ceiling int64) bool {
	ceiling = min(ceiling, b.limit)
	for {
		u := b.used.Load()
		if u+n > ceiling {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// TryReserve takes n bytes if they fit under the limit.
func (b *Budget) TryReserve(n int64) bool { return b.Reserve(n, b.limit) }

// Release gives back n reserved bytes and wakes a waiter, if any.
func (b *Budget) Release(n int64) {
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		select {
		case b.freed <- struct{}{}:
		default:
		}
	}
}

// Wait blocks until some bytes are released, until (at most 10 ms at a
// time, so a waiter re-checks even if the wake-up went to another one) or
// ctx ends. The caller tries to reserve again afterwards.
func (b *Budget) Wait(ctx context.Context, until time.Time) {
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	t := time.NewTimer(min(time.Until(until), 10*time.Millisecond))
	defer t.Stop()
	select {
	case <-b.freed:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Used returns the reserved bytes.
func (b *Budget) Used() int64 { return b.used.Load() }

// Limit returns the bound.
func (b *Budget) Limit() int64 { return b.limit }
