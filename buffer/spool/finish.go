package spool

// The finisher: the I/O that completions hand off the Kafka client's
// promise goroutine.

import (
	"errors"

	"github.com/ferryhq/ferry/consumer"
)

// finTask is work handed from the Kafka client's promise path to the
// finisher: store record i of chunk c's dead letter, or (c nil) retire
// the segments gone, or when pass, those wholly before the watermark
// passed.
type finTask struct {
	c      *chunk
	i      int
	err    error
	gone   []uint64
	pass   bool
	passed pos
}

// hand queues t for the finisher. It never blocks: the promise goroutine
// calls it. The queue is a slice, not a channel, so that it cannot fill:
// it holds at most one task per record the reader has in flight plus one
// per chunk, and those are bounded by the reader's memory budget.
func (f *finisher) hand(t finTask) {
	f.finMu.Lock()
	f.finQ = append(f.finQ, t)
	f.finMu.Unlock()
	kick(f.finKick)
}

// finisher does what must not run on the Kafka client's promise goroutine
// (franz-go runs every promise of the client on one goroutine: a slow step
// there would hold up every acknowledgement, including live traffic's):
// writing dead letters (a write and an fsync, or a produce) and retiring
// the segments the watermark passed (which takes the append lock, held
// through appends' writes and a roll's fsync). Giving a chunk back and
// moving the watermark are a few atomic and in-memory steps and stay
// inline, so a chunk's buffer is reused at once. It drains its queue
// before it stops.
func (s *Spool) finishLoop() {
	defer s.finWG.Done()
	var work []finTask
	for {
		s.finMu.Lock()
		work, s.finQ = s.finQ, work[:0]
		s.finMu.Unlock()
		for _, t := range work {
			if t.c == nil {
				if t.pass {
					t.gone = s.appender.passed(t.passed)
				}
				s.removed(t.gone)
				continue
			}
			var pe *consumer.PermanentError
			errors.As(t.err, &pe)
			c, i := t.c, t.i
			s.links.DeadLetter.Write(&c.batch.Records[i], pe.Reason, t.err, func(werr error) { c.deadLettered(i, werr) })
		}
		clear(work)
		if len(work) > 0 {
			continue
		}
		select {
		case <-s.finKick:
		case <-s.stopFin:
			s.finMu.Lock()
			left := len(s.finQ)
			s.finMu.Unlock()
			if left == 0 {
				return
			}
		}
	}
}

// removed retires the segments the watermark has passed (the finisher's
// side of advance): kept as spares or deleted.
func (s *Spool) removed(gone []uint64) {
	for _, id := range gone {
		s.retire(id)
	}
}
