package spool

// The ledger: which chunks Kafka has answered for, the watermark, and the
// checkpoint that records it.

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"time"
)

// checkpointer writes the watermark once a second when it moved.
func (s *Spool) checkpointer() {
	defer s.syncWG.Done()
	var tick <-chan time.Time = s.ckptTick
	if tick == nil {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.stopSync:
			return
		case <-tick:
		}
		s.ackMu.Lock()
		wm, ck := s.wm, s.ckpt
		s.ackMu.Unlock()
		if wm != ck {
			if err := s.writeCheckpoint(wm); err != nil {
				s.log.Log(slog.LevelError, "checkpoint", "spool checkpoint not written; a restart would replay more", "err", err)
			}
		}
	}
}

const ckptMagic = "FRYCKPT1"

// writeCheckpoint overwrites the checkpoint in place: 28 bytes in one
// sector, into blocks allocated once, so it works on a full disk where a
// temp file and rename would not. A torn write fails the CRC and recovery
// replays from the first segment: duplicates, never loss.
func (s *Spool) writeCheckpoint(p pos) error {
	var b [28]byte
	copy(b[:], ckptMagic)
	binary.LittleEndian.PutUint64(b[8:], p.seg)
	binary.LittleEndian.PutUint64(b[16:], uint64(p.off))
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	if s.ckptFile == nil {
		f, err := os.OpenFile(s.path("checkpoint"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return err
		}
		s.ckptFile = f
	}
	_, err := s.ckptFile.WriteAt(b[:], 0)
	if err == nil && s.cfg.Fsync != "never" {
		err = s.ckptFile.Sync()
	}
	if err != nil {
		return err
	}
	s.ackMu.Lock()
	s.ckpt = p
	s.ackMu.Unlock()
	return nil
}

func readCheckpoint(name string) (pos, bool, error) {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return pos{}, false, nil
	}
	if err != nil {
		return pos{}, false, err
	}
	if len(b) != 28 || string(b[:8]) != ckptMagic || crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return pos{}, false, errors.New("checkpoint: bad magic, size or checksum")
	}
	return pos{binary.LittleEndian.Uint64(b[8:]), int64(binary.LittleEndian.Uint64(b[16:]))}, true, nil
}

// mark is a chunk's place in read order. It is separate from the chunk
// because a chunk's memory is reused as soon as it completes, while its
// mark waits until every earlier chunk has completed too.
type mark struct {
	end  pos
	done bool
}

func (s *Spool) push(m *mark) {
	s.ledger.push(m)
	if m.done {
		s.advance()
	}
}

func (l *ledger) push(m *mark) {
	l.ackMu.Lock()
	l.fifo = append(l.fifo, m)
	l.ackMu.Unlock()
}

// advance moves the watermark over the chunks completed in read order,
// and has the finisher retire the segments it has passed. It runs on the
// completion path (the Kafka client's promise goroutine; an exactly-once
// exporter's committer, whose next transaction waits for it), so it never
// takes the append lock: appends hold that lock through their writes and
// a segment roll's fsync, and with many clients appending, a completion
// queued behind them stalled delivery (up to a second per exactly-once
// transaction under load). Only the finisher touches the segment table.
func (s *Spool) advance() {
	wm, moved, replayed, crossed := s.ledger.settle(s.replayEnd)
	if !moved {
		return
	}
	if replayed && s.m.backlogAtOpenValue > 0 {
		took := time.Since(s.startedAt)
		s.m.replaySeconds.Set(took.Seconds())
		s.logger.Info("spool: the backlog found at start is delivered", "bytes", s.m.backlogAtOpenValue, "took", took.Round(time.Millisecond))
	}
	if crossed {
		s.hand(finTask{pass: true, passed: wm})
	}
}

// settle moves the watermark over the completed chunks at the head of the
// read order; it reports the watermark, whether it moved, whether it just
// passed replayEnd (the backlog found at Open is delivered), and whether
// it entered a later segment than the last report (earlier segments may
// be retired).
func (l *ledger) settle(replayEnd pos) (wm pos, moved, replayed, crossed bool) {
	l.ackMu.Lock()
	defer l.ackMu.Unlock()
	i := 0
	for i < len(l.fifo) && l.fifo[i].done {
		l.wm = l.fifo[i].end
		i++
	}
	if i == 0 {
		return l.wm, false, false, false
	}
	clear(l.fifo[:i])
	l.fifo = append(l.fifo[:0], l.fifo[i:]...)
	replayed = !l.replayDone && !l.wm.less(replayEnd)
	if replayed {
		l.replayDone = true
	}
	crossed = l.wm.seg > l.retiredBefore
	if crossed {
		l.retiredBefore = l.wm.seg
	}
	return l.wm, true, replayed, crossed
}
