package spool

// The appender: framing batches into the active segment, rolling segments,
// and the disk bound.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/record"
)

// Consume appends b and completes it under the fsync policy. It never
// blocks on fsync: with fsync always the completion runs from the syncer.
func (s *Spool) Consume(_ context.Context, b *record.Batch) error {
	if b.Idem == nil {
		return s.consume(b)
	}
	if s.idem == nil {
		return &consumer.PermanentError{Reason: "idempotency_unavailable", Kind: consumer.KindInvalid,
			Msg: "idempotency keys need delivery.mode spool"}
	}
	err := s.consume(b)
	if err != nil {
		s.resolveKeys(b, err)
	}
	return err
}

// resolveKeys resolves every key of b (Batch.Idem and the keys chained to
// it): committed when its records are stored (err nil), else aborted.
func (s *Spool) resolveKeys(b *record.Batch, err error) {
	for id := b.Idem; id != nil; id = id.Next {
		if err == nil {
			s.idem.Commit(id)
		} else {
			s.idem.Abort(id)
		}
	}
}

func (s *Spool) consume(b *record.Batch) error {
	n := len(b.Records)
	if n == 0 {
		b.Complete(nil)
		return nil
	}
	buf := s.getBuf()
	wf := s.wfmt.Load()
	// rel: each record's frame offset in buf, for a client that asked for
	// a receipt (nil otherwise: nothing is spent).
	var rel []uint32
	if b.Receipt != nil && s.links.Receipts != nil {
		rel = make([]uint32, 0, n)
	}
	for i := range b.Records {
		r := &b.Records[i]
		before := len(buf)
		if rel != nil {
			rel = append(rel, uint32(before))
		}
		buf = appendFrame(buf, r, wf)
		if len(buf)-before-frameHeader > s.maxFrame {
			s.putBuf(buf)
			s.m.refused.WithLabelValues("record_too_large").Add(float64(n))
			return consumer.TooLarge("record", int64(r.Size()), int64(s.maxFrame), nil)
		}
	}
	size := int64(len(buf))
	if s.appending.Add(size) > int64(s.cfg.WriteBuffer) && s.appending.Load() != size {
		s.appending.Add(-size)
		s.putBuf(buf)
		s.m.refused.WithLabelValues("write_buffer_full").Add(float64(n))
		return consumer.ErrFull
	}
	// The receipt's columns and nonce are made before the append lock,
	// which every appender takes: under it the store only files them.
	var prep *receipt.Prepared
	if rel != nil {
		p := s.links.Receipts.Prepare(rel, b.Receipt.Owner)
		prep = &p
	}
	s.mu.Lock()
	kept, err := s.appendLocked(buf, wf, b, size, prep)
	s.mu.Unlock()
	if !kept {
		s.putBuf(buf)
	}
	if err != nil {
		s.appending.Add(-size)
		s.m.refused.WithLabelValues(consumer.Reason(err)).Add(float64(n))
		return err
	}
	s.m.appendedRecords.Add(float64(n))
	s.m.appendedBytes.Add(float64(size))
	kick(s.dataKick)
	if s.cfg.Fsync == "always" {
		kick(s.syncKick)
		return nil
	}
	s.appending.Add(-size)
	s.resolveKeys(b, nil)
	b.Complete(nil)
	return nil
}

// appendLocked writes buf, frames sealed for wf, at the end of the active
// segment; kept says the reader's tail took buf. Called with s.mu held.
func (s *Spool) appendLocked(buf []byte, wf *segFormat, b *record.Batch, size int64, prep *receipt.Prepared) (kept bool, _ error) {
	switch {
	case s.closing:
		return false, consumer.ErrShuttingDown
	case s.failErr != nil:
		return false, &consumer.RetryableError{Reason: "spool_failed", After: 30 * time.Second,
			Msg: "ferry's disk spool failed and accepts nothing until restarted: " + osCause(s.failErr)}
	case s.disk+size > int64(s.cfg.MaxBytes):
		if !s.links.Up() {
			return false, &consumer.RetryableError{Reason: "spool_full", After: 5 * time.Second,
				Msg: "Kafka is unreachable and ferry's disk spool is full; retry later"}
		}
		return false, consumer.ErrSpoolFull
	}
	if s.f != nil && s.woff+size > int64(s.cfg.SegmentBytes) && s.woff > segHeader {
		if err := s.roll(); err != nil {
			return false, err
		}
	}
	if s.f == nil {
		if err := s.create(); err != nil {
			s.m.writeErrors.Inc()
			s.log.Log(slog.LevelError, "create", "spool segment not created; the request is refused", "err", err)
			return false, errWrite(err)
		}
	}
	if cur := s.wfmt.Load(); cur != wf {
		reseal(buf, cur)
	}
	var undoKey func()
	if b.Idem != nil {
		// The key first: a crash can leave it without its records (recovery
		// drops it), never the records without it (see the doc).
		var err error
		if undoKey, err = s.writeKey(b, buf, keyRegionCRC(buf), pos{s.wseg, s.woff}); err != nil {
			s.m.writeErrors.Inc()
			s.log.Log(slog.LevelError, "keys", "spool key log write failed; the request is refused", "err", err)
			return false, errWrite(err)
		}
	}
	if _, err := s.f.WriteAt(buf, s.woff); err != nil {
		if undoKey != nil {
			undoKey()
		}
		// Leave no partial frame behind: the next append starts at woff.
		s.m.writeErrors.Inc()
		s.log.Log(slog.LevelError, "write", "spool write failed; the request is refused", "err", err)
		if terr := s.f.Truncate(s.woff); terr != nil {
			s.failErr = fmt.Errorf("write failed (%v) and truncating it failed: %w", err, terr)
		}
		return false, errWrite(err)
	}
	at := pos{s.wseg, s.woff}
	if prep != nil {
		// Registered under the append lock, before the reader can see
		// these frames: it learns of every receipt before its records.
		b.Receipt.SpoolID = s.links.Receipts.Register(*prep, receipt.Pos{Seg: at.seg, Off: at.off}, at.off+size)
	}
	s.woff += size
	s.written += size
	s.segs[s.wseg] = s.woff
	s.disk += size
	if s.cfg.Fsync == "always" {
		s.waitMu.Lock()
		s.waiters = append(s.waiters, waiter{end: s.written, b: b, n: size})
		s.waitMu.Unlock()
	}
	return s.keepTail(buf, at, len(b.Records)), nil
}

// roll seals the active segment (fsynced unless fsync is never) and starts
// the next. Called with s.mu held.
func (s *Spool) roll() error {
	s.syncMu.Lock()
	var err error
	if s.kdirty && s.cfg.Fsync != "never" {
		// The sealed segment counts as durable at once (s.durable): the
		// keys written with its records must be too.
		if err = s.fsync(s.kf); err == nil {
			s.kdirty = false
		}
	}
	if s.recycled && err == nil {
		// The recycled file's old bytes go before it is sealed: a sealed
		// segment ends at its size.
		err = s.f.Truncate(s.woff)
	}
	if err == nil && s.cfg.Fsync != "never" {
		err = s.fsync(s.f)
	}
	s.f.Close()
	s.f, s.recycled = nil, false
	s.syncMu.Unlock()
	// Whatever the outcome, the appends waiting for an fsync of the sealed
	// segment learn it now, not at the next append (which may never come).
	defer kick(s.syncKick)
	if err != nil {
		s.failErr = fmt.Errorf("sealing a full segment: %w", err)
		return errWrite(err)
	}
	s.durable = s.written
	s.wseg++
	s.woff = segHeader
	return nil
}

// create makes segment s.wseg's file, the active one, with a secret of its
// own: over a spare if there is one (recycle.go), else a new file. Called
// with s.mu held. A failure leaves no file behind and may be retried by the
// next append.
func (s *Spool) create() error {
	id := s.wseg
	wf, err := newSegFormat(s.maxFrame)
	if err != nil {
		return err
	}
	if f := s.recycle(id, wf); f != nil {
		s.f, s.woff, s.recycled = f, segHeader, true
		s.segs[id] = segHeader
		s.disk += segHeader
		s.wfmt.Store(wf)
		return nil
	}
	f, err := os.OpenFile(s.path(segName(id)), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(wf.header(), 0); err == nil && s.cfg.Fsync != "never" {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	if s.cfg.Fsync != "never" {
		syncDir(s.cfg.Dir)
	}
	s.f, s.woff = f, segHeader
	s.segs[id] = segHeader
	s.disk += segHeader
	s.wfmt.Store(wf)
	return nil
}

func (a *appender) getBuf() []byte {
	if p, ok := a.bufPool.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, 64<<10)
}

func (a *appender) putBuf(b []byte) {
	if cap(b) > 4<<20 {
		return
	}
	a.bufPool.Put(&b)
}

// passed forgets the segments wholly before wm (never the active one) and
// returns them, for the finisher to delete.
func (a *appender) passed(wm pos) []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var gone []uint64
	for id, size := range a.segs {
		if id < wm.seg && id != a.wseg {
			gone = append(gone, id)
			a.disk -= size
			delete(a.segs, id)
			delete(a.v1, id)
		}
	}
	return gone
}
