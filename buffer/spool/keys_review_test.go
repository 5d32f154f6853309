package spool

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/idempotency"
)

// TestKeyOfRemovedTailNotRevivedByReusedID: recovery removes a tail
// segment whose header is unreadable (power loss with fsync never, or
// damage) and drops its keys — but the key entries stay in the key log,
// and the next run writes a new segment under the same id (next is the
// last kept segment + 1). At the following restart that id is an older
// segment on disk, checked by bounds only, and the stale key comes back:
// a retry of a request whose records are gone is answered "accepted" and
// not stored — a loss.
func TestKeyOfRemovedTailNotRevivedByReusedID(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "never"
	s, st := openKeys(t, cfg, keyCfg)
	// Segment A: a keyed request (its key file then holds a valid key and
	// is kept), and plain records, enough to roll into segment B.
	appendOK(t, s, keyed(t, st, "kept", recs(0, 5)))
	for i := 1; s.wseg == 1; i++ {
		appendOK(t, s, recs(i*50, 50))
	}
	b := s.wseg
	appendOK(t, s, keyed(t, st, "lost", recs(100000, 5)))
	_ = s.Close()
	// A power loss with fsync never: B's header never reached the disk.
	if err := os.WriteFile(filepath.Join(cfg.Dir, segName(b)), []byte("FRYSPL02 torn"), 0o600); err != nil {
		t.Fatal(err)
	}

	s2, st2 := openKeys(t, cfg, keyCfg)
	if v, _ := verdict(st2, "lost", recs(100000, 5)); v != idempotency.Fresh {
		t.Fatalf("key of the removed segment after the first restart: %v, want fresh", v)
	}
	if s2.wseg != b {
		t.Logf("next segment %d, removed %d: the id is not reused here", s2.wseg, b)
	}
	// The next run writes on (plain records), past segment b.
	for i := 0; s2.wseg <= b+1; i++ {
		appendOK(t, s2, recs(200000+i*50, 50))
	}
	_ = s2.Close()

	s3, st3 := openKeys(t, cfg, keyCfg)
	defer s3.Close()
	if v, n := verdict(st3, "lost", recs(100000, 5)); v != idempotency.Fresh {
		t.Fatalf("key of records lost two restarts ago: %v %d, want fresh (a replay answers accepted for records that are gone)", v, n)
	}
	if v, _ := verdict(st3, "kept", recs(0, 5)); v != idempotency.Replay {
		t.Fatalf("kept: %v", v)
	}
	_ = fmt.Sprint()
}

// TestDroppedKeyStaysDropped: a key entry recovery drops because the bytes
// at its region are not the ones written (the place of a failed write,
// taken by the next append — undoKey's comment counts on exactly this
// check when its truncate fails) is dropped at that Open only: the entry
// stays in the key log, and once its segment is no longer the newest the
// next Open checks it by bounds alone and restores it — a replay for
// records never stored.
func TestDroppedKeyStaysDropped(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "interval"
	s, st := openKeys(t, cfg, keyCfg)
	appendOK(t, s, keyed(t, st, "whole", recs(0, 10)))
	_ = s.Close()
	kf := keyFiles(t, cfg.Dir)
	moved := keyRec{at: time.Now().UnixNano(), seg: s.wseg, off: segHeader, length: 50, crc: 12345, records: 1, sum: sumOf(recs(10, 1)), key: keyOf("moved")}
	f, _ := os.OpenFile(kf[0], os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.Write(appendKeyRec(nil, &moved))
	f.Close()

	s2, st2 := openKeys(t, cfg, keyCfg)
	if v, _ := verdict(st2, "moved", recs(10, 1)); v != idempotency.Fresh {
		t.Fatalf("moved at the first Open: %v, want fresh", v)
	}
	// This run writes on: the segment is no longer the newest.
	for i := 0; s2.wseg <= s.wseg+1; i++ {
		appendOK(t, s2, recs(1000+i*50, 50))
	}
	_ = s2.Close()

	s3, st3 := openKeys(t, cfg, keyCfg)
	defer s3.Close()
	if v, n := verdict(st3, "moved", recs(10, 1)); v != idempotency.Fresh {
		t.Fatalf("moved at the next Open: %v %d, want fresh (its records were never stored)", v, n)
	}
}
