package spool

// The syncer: group-commit fsync, and the appends waiting for it.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/ferryhq/ferry/record"
)

type waiter struct {
	end int64
	b   *record.Batch
	n   int64
}

// syncer runs the fsync policy: group commit for always, a ticker for
// interval. It also makes the final fsync at shutdown in every mode.
func (s *Spool) syncLoop() {
	defer s.syncWG.Done()
	var tick <-chan time.Time
	if s.cfg.Fsync == "interval" {
		t := time.NewTicker(s.cfg.FsyncInterval)
		defer t.Stop()
		tick = t.C
	}
	var synced int64
	for {
		final := false
		select {
		case <-s.syncKick:
		case <-tick:
		case <-s.stopSync:
			final = true
		}
		s.mu.Lock()
		target, f, failed := s.written, s.f, s.failErr
		synced = max(synced, s.durable)
		run := target > synced && f != nil && failed == nil && (s.cfg.Fsync != "never" || final)
		kf, kdirty := s.kf, s.kdirty && run
		if kdirty {
			s.kdirty = false // an append after this sets it again
		}
		s.mu.Unlock()
		if run {
			start := time.Now()
			s.syncMu.Lock()
			var err, kerr error
			if kdirty {
				// The keys before the records they name (keys.go): every
				// key of an append up to target was written before target
				// was read, under the append lock.
				kerr = s.fsync(kf)
			}
			if err = kerr; kerr == nil || errors.Is(kerr, os.ErrClosed) {
				err = s.fsync(f)
			}
			s.syncMu.Unlock()
			if errors.Is(kerr, os.ErrClosed) {
				// A rotation sealed the key file; its fsync decided: durable,
				// or the spool has failed.
				s.mu.Lock()
				if s.failErr != nil && err == nil {
					err = s.failErr
				}
				s.mu.Unlock()
			}
			if errors.Is(err, os.ErrClosed) {
				// A roll closed the file; its own fsync decided for what we
				// wanted: durable, or the spool has failed.
				s.mu.Lock()
				target, failed = max(synced, s.durable), s.failErr
				s.mu.Unlock()
				err = nil
			}
			s.m.fsyncs.Inc()
			s.m.fsyncSeconds.Observe(time.Since(start).Seconds())
			if err != nil {
				s.mu.Lock()
				if s.failErr == nil {
					s.failErr = fmt.Errorf("fsync: %w", err)
				}
				failed = s.failErr
				s.mu.Unlock()
				s.logger.Error("spool fsync failed; the spool refuses new data until ferry is restarted", "err", err)
			} else {
				synced = target
			}
		}
		s.completeWaiters(synced, failed)
		if final {
			return
		}
	}
}

// completeWaiters answers every append covered by an fsync up to synced,
// or every waiting append with failed.
func (s *Spool) completeWaiters(synced int64, failed error) {
	s.waitMu.Lock()
	i := 0
	for i < len(s.waiters) && (failed != nil || s.waiters[i].end <= synced) {
		i++
	}
	done := slices.Clone(s.waiters[:i])
	s.waiters = append(s.waiters[:0], s.waiters[i:]...)
	s.waitMu.Unlock()
	for _, w := range done {
		var err error
		if w.end > synced {
			err = errWrite(failed)
		}
		s.appending.Add(-w.n)
		// Resolved before the batch completes (its receiver recycles it
		// then): a retry from now on is answered from the store.
		s.resolveKeys(w.b, err)
		w.b.Complete(err)
	}
}
