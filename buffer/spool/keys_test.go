package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

var keyCfg = idempotency.Config{Window: 10 * time.Minute, MaxBytes: 1 << 20}

// openKeys opens cfg's spool with a new idempotency store (as a restarted
// agent has: it knows only what the spool gives back).
func openKeys(t *testing.T, cfg Config, ic idempotency.Config) (*Spool, *idempotency.Store) {
	t.Helper()
	st, err := idempotency.NewStore(ic, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg, telemetry.TestSettings(), Links{Next: unstarted{}, MaxRecordBytes: 1 << 20, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func keyOf(name string) []byte { return idempotency.Scope("http", "app", name) }

func sumOf(b *record.Batch) [16]byte {
	var parts [][]byte
	for _, r := range b.Records {
		parts = append(parts, r.Value)
	}
	return idempotency.Fingerprint(parts...)
}

// keyed reserves name for b in st and returns b carrying it.
func keyed(t *testing.T, st *idempotency.Store, name string, b *record.Batch) *record.Batch {
	t.Helper()
	v, _, id := st.Begin(keyOf(name), sumOf(b), len(b.Records))
	if v != idempotency.Fresh {
		t.Fatalf("key %s: verdict %v, want fresh", name, v)
	}
	b.Idem = id
	return b
}

// verdict is what a retry of b under name is told.
func verdict(st *idempotency.Store, name string, b *record.Batch) (idempotency.Verdict, int) {
	v, n, id := st.Begin(keyOf(name), sumOf(b), len(b.Records))
	if id != nil {
		st.Abort(id)
	}
	return v, n
}

func keyFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "dedup-*.log"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKeysSurviveCrash: keys accepted before a crash are recognised after
// it (a retry answers the original count, another body is a mismatch), in
// every fsync mode; their records are delivered once; a key never sent
// stays fresh.
func TestKeysSurviveCrash(t *testing.T) {
	for _, mode := range []string{"always", "interval", "never"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Fsync = mode
			s, st := openKeys(t, cfg, keyCfg)
			c := &collector{}
			c.hold.Store(true)
			_ = start(t, s, Links{Next: c, Idem: st})
			for i := range 10 {
				appendOK(t, s, keyed(t, st, fmt.Sprint("k", i), recs(i*10, 10)))
				if v, n := verdict(st, fmt.Sprint("k", i), recs(i*10, 10)); v != idempotency.Replay || n != 10 {
					t.Fatalf("retry before the crash: %v %d", v, n)
				}
			}
			crash(s)

			s2, st2 := openKeys(t, cfg, keyCfg)
			defer s2.Close()
			for i := range 10 {
				if v, n := verdict(st2, fmt.Sprint("k", i), recs(i*10, 10)); v != idempotency.Replay || n != 10 {
					t.Fatalf("retry of k%d after the crash: %v %d, want replay 10", i, v, n)
				}
			}
			if v, _ := verdict(st2, "k3", recs(999, 10)); v != idempotency.Mismatch {
				t.Fatalf("another body under k3: %v", v)
			}
			if v, _ := verdict(st2, "never-sent", recs(0, 1)); v != idempotency.Fresh {
				t.Fatalf("unknown key: %v", v)
			}
			deliversExactly(t, s2, 0, 100)
		})
	}
}

// TestKeyWithoutRecordsDropped: the states a crash can leave — a key whose
// append was torn, a key whose records were never written, a torn key
// entry — are resolved at Open so that a key is known iff its records are
// there: the first two keys are dropped (their retries are fresh), the
// torn entry is forgotten (its records stay and are delivered: the one
// case that can duplicate, documented).
func TestKeyWithoutRecordsDropped(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "always"
	s, st := openKeys(t, cfg, keyCfg)
	held := &collector{}
	held.hold.Store(true)
	_ = start(t, s, Links{Next: held, Idem: st})
	appendOK(t, s, keyed(t, st, "whole", recs(0, 10)))
	appendOK(t, s, keyed(t, st, "torn", recs(10, 10)))
	_ = s.Close()

	// Tear the last append: its last 7 bytes never reached the disk.
	segs := segments(t, cfg.Dir)
	last := segs[len(segs)-1]
	fi, _ := os.Stat(last)
	if err := os.Truncate(last, fi.Size()-7); err != nil {
		t.Fatal(err)
	}
	// A key written for records that never were: a region past the end.
	kf := keyFiles(t, cfg.Dir)
	if len(kf) != 1 {
		t.Fatalf("key files %v", kf)
	}
	ghost := keyRec{at: time.Now().UnixNano(), seg: s.wseg, off: fi.Size(), length: 100, crc: 1, records: 3, key: keyOf("ghost")}
	// And a region inside the segment whose bytes are not the ones written
	// (a failed write's place, taken by the next append).
	moved := keyRec{at: time.Now().UnixNano(), seg: s.wseg, off: segHeader, length: 50, crc: 12345, records: 1, key: keyOf("moved")}
	f, _ := os.OpenFile(kf[0], os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.Write(appendKeyRec(appendKeyRec(nil, &ghost), &moved))
	f.Close()

	s2, st2 := openKeys(t, cfg, keyCfg)
	if v, _ := verdict(st2, "whole", recs(0, 10)); v != idempotency.Replay {
		t.Fatalf("whole append: %v", v)
	}
	for _, k := range []string{"torn", "ghost", "moved"} {
		if v, _ := verdict(st2, k, recs(10, 10)); v != idempotency.Fresh {
			t.Fatalf("%s: %v, want fresh (its records are not there)", k, v)
		}
	}
	deliversExactly(t, s2, 0, 19) // the torn append's last record is cut
	_ = s2.Close()

	// A torn key entry: the key is forgotten, its records delivered.
	cfg2 := testConfig(t.TempDir())
	s3, st3 := openKeys(t, cfg2, keyCfg)
	appendOK(t, s3, keyed(t, st3, "a", recs(0, 5)))
	appendOK(t, s3, keyed(t, st3, "b", recs(5, 5)))
	crash(s3)
	kf = keyFiles(t, cfg2.Dir)
	fi, _ = os.Stat(kf[0])
	_ = os.Truncate(kf[0], fi.Size()-3)
	s4, st4 := openKeys(t, cfg2, keyCfg)
	defer s4.Close()
	if v, _ := verdict(st4, "a", recs(0, 5)); v != idempotency.Replay {
		t.Fatalf("a: %v", v)
	}
	if v, _ := verdict(st4, "b", recs(5, 5)); v != idempotency.Fresh {
		t.Fatalf("b (torn entry): %v", v)
	}
	deliversExactly(t, s4, 0, 10)
}

// TestKeyFsyncedBeforeRecords: in every fsync round that makes a keyed
// append durable, the key log is fsynced before the segment, so no crash
// can leave the records durable and the key not; the client is answered
// only after both.
func TestKeyFsyncedBeforeRecords(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "always"
	cfg.SegmentBytes = 64 << 10 // rolls on the way: a roll's fsync must keep the order too
	s, st := openKeys(t, cfg, keyCfg)
	var mu sync.Mutex
	var order []string
	s.fsync = func(f *os.File) error {
		mu.Lock()
		order = append(order, filepath.Base(f.Name()))
		mu.Unlock()
		return f.Sync()
	}
	c := &collector{}
	_ = start(t, s, Links{Next: c, Idem: st})
	defer s.Close()
	for i := range 60 {
		b := keyed(t, st, fmt.Sprint("k", i), recs(i*20, 20))
		done := make(chan error, 1)
		b.OnDone(func(err error) { done <- err })
		if err := s.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := bytes.Join(func() (o [][]byte) {
			for _, n := range order {
				o = append(o, []byte(n))
			}
			return
		}(), []byte(" "))
		// The last two fsyncs covered this append: the key log, then the
		// segment (the roll's or the round's).
		n := len(order)
		if n < 2 || filepath.Ext(order[n-1]) != ".seg" || filepath.Ext(order[n-2]) != ".log" {
			mu.Unlock()
			t.Fatalf("append %d answered after fsyncs %s; want the key log's, then the segment's", i, got)
		}
		order = order[:0]
		mu.Unlock()
	}
	c.waitFor(t, 1200)
}

// TestKeyOfRetiredSegment: a key whose records Kafka acknowledged (their
// segment deleted) is still recognised after a restart, within the window.
func TestKeyOfRetiredSegment(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s, st := openKeys(t, cfg, keyCfg)
	manualCheckpoints(s)
	c := &collector{}
	_ = start(t, s, Links{Next: c, Idem: st})
	appendOK(t, s, keyed(t, st, "early", recs(0, 400)))
	for i := 1; i < 20; i++ {
		appendOK(t, s, recs(i*400, 400))
	}
	c.waitAnswered(t, 20*400)
	checkpoint(t, s)
	crash(s)
	s2, st2 := openKeys(t, cfg, keyCfg)
	defer s2.Close()
	if len(s2.segs) > 0 {
		low := uint64(1 << 63)
		for id := range s2.segs {
			low = min(low, id)
		}
		if low == 1 {
			t.Fatalf("the first segment was not retired (segments %v)", s2.segs)
		}
	}
	if v, n := verdict(st2, "early", recs(0, 400)); v != idempotency.Replay || n != 400 {
		t.Fatalf("key of a retired segment: %v %d", v, n)
	}
}

// TestKeyLogBounded: many distinct keys keep the key log within about
// max_bytes on disk (sealed files beyond it go, oldest first) and the
// store within max_bytes in memory; the newest keys survive a restart.
func TestKeyLogBounded(t *testing.T) {
	cfg := testConfig(t.TempDir())
	ic := idempotency.Config{Window: time.Hour, MaxBytes: 64 << 10}
	s, st := openKeys(t, cfg, ic)
	for i := range 3000 {
		appendOK(t, s, keyed(t, st, fmt.Sprintf("key-%06d", i), recs(i, 1)))
	}
	_ = s.Close()
	var disk int64
	for _, f := range keyFiles(t, cfg.Dir) {
		fi, _ := os.Stat(f)
		disk += fi.Size()
	}
	// Sealed files within max_bytes, plus the active one (a quarter).
	if limit := int64(ic.MaxBytes) + int64(ic.MaxBytes)/4 + keyMaxBody; disk > limit {
		t.Fatalf("key log holds %d bytes on disk, bound %d", disk, limit)
	}
	if st.Bytes() > int64(ic.MaxBytes) {
		t.Fatalf("store holds %d bytes", st.Bytes())
	}
	s2, st2 := openKeys(t, cfg, ic)
	defer s2.Close()
	if st2.Bytes() > int64(ic.MaxBytes) {
		t.Fatalf("restored store holds %d bytes", st2.Bytes())
	}
	if v, _ := verdict(st2, "key-002999", recs(2999, 1)); v != idempotency.Replay {
		t.Fatalf("newest key after restart: %v", v)
	}
	if v, _ := verdict(st2, "key-000000", recs(0, 1)); v != idempotency.Fresh {
		t.Fatalf("oldest key after restart: %v", v)
	}
}

// TestKeyedAppendRefusedAborts: a keyed append the spool refuses leaves
// the key fresh (the retry is appended), and a write failure leaves no
// entry behind.
func TestKeyedAppendRefusedAborts(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s, st := openKeys(t, cfg, keyCfg)
	defer s.Close()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	b := keyed(t, st, "k", recs(0, 3))
	if err := s.Consume(context.Background(), b); err == nil {
		t.Fatal("a closing spool took the append")
	}
	if v, _ := verdict(st, "k", recs(0, 3)); v != idempotency.Fresh {
		t.Fatalf("after a refusal: %v", v)
	}
	// A batch with a key and a spool without a store: refused, not stored
	// keyless.
	plain := open(t, testConfig(t.TempDir()))
	defer plain.Close()
	b2 := recs(0, 1)
	b2.Idem = &record.Idem{Key: keyOf("x")}
	if err := plain.Consume(context.Background(), b2); err == nil {
		t.Fatal("a spool without a key store took a keyed batch")
	}
}

// TestKeyWindowAcrossRestart: keys older than the window are not
// restored, and sealed key files past it are deleted.
func TestKeyWindowAcrossRestart(t *testing.T) {
	cfg := testConfig(t.TempDir())
	ic := idempotency.Config{Window: time.Second, MaxBytes: 1 << 20}
	s, st := openKeys(t, cfg, ic)
	appendOK(t, s, keyed(t, st, "old", recs(0, 1)))
	_ = s.Close()
	time.Sleep(1100 * time.Millisecond)
	s2, st2 := openKeys(t, cfg, ic)
	if v, _ := verdict(st2, "old", recs(0, 1)); v != idempotency.Fresh {
		t.Fatalf("key past the window: %v", v)
	}
	if f := keyFiles(t, cfg.Dir); len(f) != 0 {
		t.Fatalf("key files past the window kept: %v", f)
	}
	_ = s2.Close()
}

// BenchmarkKeyedAppend: what an Idempotency-Key adds to an append of one
// request (10 records of 100 B, fsync never: the CPU, not the disk): the
// store's reservation and commit, the key log's write. "plain" is the same
// append without a key. Run with -benchmem.
func BenchmarkKeyedAppend(b *testing.B) {
	val := make([]byte, 100)
	for _, keyed := range []bool{false, true} {
		name := "plain"
		if keyed {
			name = "keyed"
		}
		b.Run(name, func(b *testing.B) {
			cfg := testConfig(b.TempDir())
			cfg.Fsync, cfg.SegmentBytes, cfg.MaxBytes = "never", 64<<20, 8<<30
			st, _ := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 16 << 20}, prometheus.NewRegistry())
			s, err := Open(cfg, telemetry.TestSettings(), Links{Next: acker{}, Idem: st})
			if err != nil {
				b.Fatal(err)
			}
			_ = s.Start(context.Background())
			defer s.Close()
			bt := &record.Batch{Records: make([]record.Record, 10)}
			for i := range bt.Records {
				bt.Records[i] = record.Record{Topic: "bench", Value: val}
			}
			keys := make([][]byte, b.N)
			for i := range keys {
				keys[i] = idempotency.Scope("http", "app", fmt.Sprintf("%036d", i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				bt.Idem = nil
				if keyed {
					_, _, bt.Idem = st.Begin(keys[i], [16]byte{1}, 10)
				}
				if err := s.Consume(context.Background(), bt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestKeyOfRemovedSegment: a key naming a segment recovery removed as
// unreadable (its header cut short) is dropped, even where everything
// before the checkpoint counts as retired: its records are gone with the
// segment. The key of the retired segment before it stays.
func TestKeyOfRemovedSegment(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "never"
	s, st := openKeys(t, cfg, keyCfg)
	appendOK(t, s, keyed(t, st, "retired", recs(0, 5)))
	_ = s.Close()
	first := s.wseg
	torn := first + 1
	// The state a power loss can leave with fsync never: the first
	// segment acknowledged and deleted, the checkpoint inside the next,
	// whose header never reached the disk.
	_ = os.Remove(filepath.Join(cfg.Dir, segName(first)))
	if err := os.WriteFile(filepath.Join(cfg.Dir, segName(torn)), []byte("FRYSPL02 torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.ckptFile = nil
	if err := s.writeCheckpoint(pos{torn, segHeader + 100}); err != nil {
		t.Fatal(err)
	}
	gone := keyRec{at: time.Now().UnixNano(), seg: torn, off: segHeader, length: 40, crc: 1, records: 2, key: keyOf("gone")}
	kf := keyFiles(t, cfg.Dir)
	f, _ := os.OpenFile(kf[0], os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.Write(appendKeyRec(nil, &gone))
	f.Close()
	s2, st2 := openKeys(t, cfg, keyCfg)
	defer s2.Close()
	if s2.wseg <= torn {
		t.Fatalf("next segment %d: the test wants the removed one (%d) below it", s2.wseg, torn)
	}
	if v, _ := verdict(st2, "retired", recs(0, 5)); v != idempotency.Replay {
		t.Fatalf("key of the retired segment: %v", v)
	}
	if v, _ := verdict(st2, "gone", recs(0, 2)); v != idempotency.Fresh {
		t.Fatalf("key of a removed segment: %v, want fresh", v)
	}
}

// TestKeyFsyncFailure: when the key log's fsync fails the keyed append is
// answered with an error, not "accepted", its key is left fresh, and the
// spool refuses more (the fsync error is sticky, as a segment's is).
func TestKeyFsyncFailure(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "always"
	s, st := openKeys(t, cfg, keyCfg)
	s.fsync = func(f *os.File) error {
		if filepath.Ext(f.Name()) == ".log" {
			return errors.New("EIO")
		}
		return f.Sync()
	}
	held := &collector{}
	held.hold.Store(true)
	_ = start(t, s, Links{Next: held, Idem: st})
	defer s.Close()
	b := keyed(t, st, "k", recs(0, 3))
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := s.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("answered accepted although the key log's fsync failed")
	}
	if v, _ := verdict(st, "k", recs(0, 3)); v != idempotency.Fresh {
		t.Fatalf("after a failed fsync: %v, want fresh", v)
	}
	if err := s.Consume(context.Background(), recs(3, 1)); err == nil {
		t.Fatal("the spool took more after a failed fsync")
	}
}

// TestChainedKeysShareTheAppend: a batch with several keys (the Kafka
// front's, one per partition's producer sequence) writes them all with its
// records: each is committed once the records are stored and survives a
// crash with the record count it answers for; a refused append aborts
// every one.
func TestChainedKeysShareTheAppend(t *testing.T) {
	for _, mode := range []string{"always", "never"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Fsync = mode
			s, st := openKeys(t, cfg, keyCfg)
			c := &collector{}
			c.hold.Store(true)
			_ = start(t, s, Links{Next: c, Idem: st})
			b := recs(0, 10)
			var ids []*record.Idem
			for i, n := range []int{3, 7} {
				v, _, id := st.Begin(keyOf(fmt.Sprint("part", i)), [16]byte{byte(i)}, n)
				if v != idempotency.Fresh {
					t.Fatalf("part %d: %v", i, v)
				}
				ids = append(ids, id)
			}
			ids[0].Next = ids[1]
			b.Idem = ids[0]
			appendOK(t, s, b)
			for i, n := range []int{3, 7} {
				if v, got, _ := st.Begin(keyOf(fmt.Sprint("part", i)), [16]byte{byte(i)}, n); v != idempotency.Replay || got != n {
					t.Fatalf("part %d before the crash: %v %d", i, v, got)
				}
			}
			crash(s)

			s2, st2 := openKeys(t, cfg, keyCfg)
			defer s2.Close()
			for i, n := range []int{3, 7} {
				if v, got, _ := st2.Begin(keyOf(fmt.Sprint("part", i)), [16]byte{byte(i)}, n); v != idempotency.Replay || got != n {
					t.Fatalf("part %d after the crash: %v %d, want replay %d", i, v, got, n)
				}
			}
			// Refused (the records are over the frame bound): both aborted.
			big := recs(100, 1)
			big.Records[0].Value = make([]byte, 2<<20)
			var first, second *record.Idem
			_, _, first = st2.Begin(keyOf("big0"), [16]byte{}, 1)
			_, _, second = st2.Begin(keyOf("big1"), [16]byte{}, 1)
			first.Next = second
			big.Idem = first
			if err := s2.Consume(context.Background(), big); err == nil {
				t.Fatal("an oversized record was appended")
			}
			for _, k := range []string{"big0", "big1"} {
				if v, _, id := st2.Begin(keyOf(k), [16]byte{}, 1); v != idempotency.Fresh {
					t.Fatalf("%s after a refused append: %v, want fresh", k, v)
				} else {
					st2.Abort(id)
				}
			}
		})
	}
}
