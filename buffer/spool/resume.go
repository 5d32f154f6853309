package spool

// Resuming where Kafka committed (delivery.guarantee exactly_once), and the
// spool directory's identity.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// resume asks Links.Resume how far Kafka committed this spool and starts
// reading there when it is past the checkpoint. The checkpoint trails
// Kafka: it is written once a second from the watermark, which moves only
// after a commit, so after a crash the records between the two are in
// Kafka already and reading them again would duplicate them. It retries
// until Resume answers (false: the reader is stopping).
func (s *Spool) resume() bool {
	if s.links.Resume == nil {
		return true
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stopRead:
			cancel()
		case <-ctx.Done():
		}
	}()
	for tries := 1; ; tries++ {
		p, ok, err := s.links.Resume(ctx)
		if err == nil {
			if ok {
				s.skipTo(pos{p.Seg, p.Off})
			}
			return true
		}
		if s.readStop.Load() {
			return false
		}
		s.log.Log(slog.LevelWarn, "resume", "exactly once: how far Kafka committed this spool could not be read; nothing is sent until it is (retrying)",
			"attempt", tries, "err", err)
		if !s.sleep(backoff(tries)) {
			return false
		}
	}
}

// skipTo moves the read position and the watermark forward to p, a
// position Kafka committed. Only forward (the checkpoint is never ahead of
// Kafka; if it is, Kafka's state was lost or reset and the checkpoint is
// the safer of the two), and only to a place this spool holds.
func (s *Spool) skipTo(p pos) {
	s.ackMu.Lock()
	wm := s.wm
	s.ackMu.Unlock()
	if !wm.less(p) {
		return
	}
	s.mu.Lock()
	size, known := s.segs[p.seg]
	s.mu.Unlock()
	if !known || p.off > size {
		s.logger.Warn("exactly once: the position Kafka committed is not in this spool; starting from the checkpoint (records after it may be sent again)",
			"committed_segment", segName(p.seg), "committed_offset", p.off, "checkpoint_segment", segName(wm.seg), "checkpoint_offset", wm.off)
		s.m.resumeMismatch.Inc()
		return
	}
	skipped := s.bytesBetween(wm, p)
	s.rpos, s.need = p, 0
	s.ackMu.Lock()
	s.wm = p
	s.retiredBefore = max(s.retiredBefore, p.seg)
	s.ackMu.Unlock()
	if gone := s.appender.passed(p); len(gone) > 0 {
		s.hand(finTask{gone: gone})
	}
	s.m.resumeSkipped.Add(float64(skipped))
	s.logger.Info("exactly once: resuming after what Kafka committed; the records between the checkpoint and there are not sent again",
		"segment", segName(p.seg), "offset", p.off, "skipped_bytes", skipped)
}

// bytesBetween is how many segment bytes lie between a and b (a before b).
func (s *Spool) bytesBetween(a, b pos) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.seg == b.seg {
		return b.off - a.off
	}
	n := s.segs[a.seg] - a.off
	for id, size := range s.segs {
		if id > a.seg && id < b.seg {
			n += size
		}
	}
	return n + b.off
}

// DirID returns the identity of the spool in dir: a random id made the
// first time and kept in dir/id, so it lives and dies with the segments.
// Kafka's exactly-once state is keyed by it: positions committed by one
// spool are never applied to another (a wiped or replaced directory gets
// a new id and starts from its own checkpoint).
func DirID(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("spool: %w", err)
	}
	name := filepath.Join(dir, "id")
	if b, err := os.ReadFile(name); err == nil {
		id := strings.TrimSpace(string(b))
		if len(id) != 32 {
			return "", fmt.Errorf("spool: %s holds %q, not a spool id (32 hex digits)", name, id)
		}
		if _, err := hex.DecodeString(id); err != nil {
			return "", fmt.Errorf("spool: %s holds %q, not a spool id (32 hex digits)", name, id)
		}
		return id, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("spool: %w", err)
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	// Written whole under a temporary name and linked into place: a crash
	// leaves no half id, and of two agents racing on a fresh directory
	// (one of them will fail on the spool's lock anyway) one id wins.
	tmp := fmt.Sprintf("%s.%d.%d.tmp", name, os.Getpid(), time.Now().UnixNano())
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("spool: %w", err)
	}
	defer os.Remove(tmp)
	if f, err := os.Open(tmp); err == nil {
		_ = f.Sync()
		f.Close()
	}
	if err := os.Link(tmp, name); err != nil {
		if errors.Is(err, os.ErrExist) {
			return DirID(dir)
		}
		return "", fmt.Errorf("spool: %w", err)
	}
	syncDir(dir)
	return id, nil
}
