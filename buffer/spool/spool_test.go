package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

func testConfig(dir string) Config {
	return Config{Dir: dir, SegmentBytes: 64 << 10, MaxBytes: 64 << 20, Fsync: "interval",
		FsyncInterval: 10 * time.Millisecond, WriteBuffer: 8 << 20, ReadAhead: 4 << 20}
}

// unstarted is the Next of a spool a test opens before it knows what the
// reader will deliver to; start replaces it.
type unstarted struct{}

func (unstarted) Consume(context.Context, *record.Batch) error {
	panic("spool test: reader started without start()")
}

// start links s (opened by open) to l and starts it, as Open and Start
// would have with l: tests append before they choose the reader's Next.
func start(t testing.TB, s *Spool, l Links) error {
	t.Helper()
	l, err := l.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	s.links, s.budget = l, l.Budget
	return s.Start(context.Background())
}

func open(t testing.TB, cfg Config) *Spool { t.Helper(); return openLimit(t, cfg, 1<<20) }

// openLimit opens with maxRecord as the exporter's record limit.
func openLimit(t testing.TB, cfg Config, maxRecord int) *Spool {
	t.Helper()
	s, err := Open(cfg, telemetry.TestSettings(), Links{Next: unstarted{}, MaxRecordBytes: maxRecord})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recs makes n records with ids from..from+n-1 as values (keys, headers and
// timestamps vary so every field goes through the frame).
func recs(from, n int) *record.Batch {
	b := &record.Batch{}
	for i := from; i < from+n; i++ {
		r := record.Record{Topic: "t", Value: []byte(fmt.Sprintf("rec-%08d-%s", i, bytes.Repeat([]byte("x"), i%50)))}
		switch i % 3 {
		case 0:
			r.Key = []byte(strconv.Itoa(i))
		case 1:
			r.Key = []byte{}
			r.Headers = []record.Header{{Key: "h", Value: []byte("v")}, {Key: "empty"}}
		}
		if i%2 == 0 {
			r.Timestamp = time.Unix(1700000000, int64(i)).UTC()
		}
		b.Records = append(b.Records, r)
	}
	return b
}

// collector records every delivered value (copied), acknowledging from
// another goroutine as Kafka's client does. fail, when set, decides a
// record's outcome.
type collector struct {
	mu   sync.Mutex
	got  []record.Record
	fail func(r *record.Record) error
	hold atomic.Bool // take batches but never answer (Kafka down)
	// answered counts the records answered, each batch's once all its
	// AckAt calls have returned.
	answered atomic.Int64
}

func (c *collector) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	if c.hold.Load() {
		return nil
	}
	var errs []error
	c.mu.Lock()
	for i := range b.Records {
		r := &b.Records[i]
		var err error
		if c.fail != nil {
			err = c.fail(r)
		}
		errs = append(errs, err)
		if err == nil {
			cp := *r
			cp.Key = bytes.Clone(r.Key)
			cp.Value = bytes.Clone(r.Value)
			cp.Headers = nil
			for _, h := range r.Headers {
				cp.Headers = append(cp.Headers, record.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
			}
			c.got = append(c.got, cp)
		}
	}
	c.mu.Unlock()
	go func() {
		for i, err := range errs {
			b.AckAt(i, err)
		}
		c.answered.Add(int64(len(errs)))
	}()
	return nil
}

// waitAnswered waits until n records have been answered, the last AckAt
// of their batches returned: whatever the spool does on Kafka's answer
// (completing a chunk, moving the watermark) is done.
func (c *collector) waitAnswered(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c.answered.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("answered %d of %d records", c.answered.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *collector) values() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.got {
		out = append(out, string(r.Value))
	}
	return out
}

func (c *collector) waitFor(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := c.values()
		if len(v) >= n {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d of %d records", len(v), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func appendOK(t *testing.T, s *Spool, b *record.Batch) {
	t.Helper()
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := s.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("append not completed")
	}
}

// deliversExactly starts s with a fresh collector and requires that exactly
// the records from..to-1 arrive, in order (a short wait catches extras).
func deliversExactly(t *testing.T, s *Spool, from, to int) {
	t.Helper()
	c := &collector{}
	if err := start(t, s, Links{Next: c}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, to-from)
	time.Sleep(100 * time.Millisecond)
	wantIDs(t, c.values(), from, to)
	_ = s.Shutdown(context.Background())
}

func wantIDs(t *testing.T, got []string, from, to int) {
	t.Helper()
	if len(got) != to-from {
		t.Fatalf("got %d records, want %d", len(got), to-from)
	}
	for i, v := range got {
		want := string(recs(from+i, 1).Records[0].Value)
		if v != want {
			t.Fatalf("record %d: got %.20q, want %.20q (order or content broken)", i, v, want)
		}
	}
}

// TestRoundTripInOrder: records come out of the spool in order with every
// field intact, across many segment rolls, and acknowledged segments are
// deleted.
func TestRoundTripInOrder(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	c := &collector{}
	if err := start(t, s, Links{Next: c}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		appendOK(t, s, recs(i*50, 50))
	}
	c.waitFor(t, 5000)
	wantIDs(t, c.values(), 0, 5000)
	c.mu.Lock()
	for i, r := range c.got {
		w := recs(i, 1).Records[0]
		if !bytes.Equal(r.Key, w.Key) || (r.Key == nil) != (w.Key == nil) || !r.Timestamp.Equal(w.Timestamp) || len(r.Headers) != len(w.Headers) || r.Topic != "t" {
			t.Fatalf("record %d: %+v differs from %+v", i, r, w)
		}
	}
	c.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for s.Backlog() != 0 || len(segments(t, dir)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d bytes, %d segments left after every record was acknowledged", s.Backlog(), len(segments(t, dir)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = s.Shutdown(context.Background())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing is replayed after a clean stop with everything acknowledged.
	s2 := open(t, testConfig(dir))
	defer s2.Close()
	if b := s2.Backlog(); b != 0 {
		t.Fatalf("backlog after reopen %d, want 0", b)
	}
}

func segments(t *testing.T, dir string) []string {
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(m)
	return m
}

// TestRestartReplaysUnacknowledged: records Kafka never acknowledged are
// delivered after a restart, in order; nothing acknowledged is lost.
func TestRestartReplaysUnacknowledged(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	c := &collector{}
	c.hold.Store(true) // Kafka down
	_ = start(t, s, Links{Next: c})
	for i := 0; i < 40; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()

	s2 := open(t, testConfig(dir))
	defer s2.Close()
	deliversExactly(t, s2, 0, 4000)
	if v := testutil.ToFloat64(s2.m.replayed); v != 4000 {
		t.Fatalf("replayed counter %v, want 4000", v)
	}
}

// TestCrashWithoutCloseReplaysFromCheckpoint: a process that dies without
// Close (the files are simply abandoned) loses nothing it acknowledged; what
// Kafka had acknowledged before the last checkpoint is not sent again.
func TestCrashWithoutCloseReplaysFromCheckpoint(t *testing.T) {
	cfg, s, c := openFsyncAlways(t)
	for i := 0; i < 20; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	c.waitFor(t, 2000)
	c.waitAnswered(t, 2000)
	checkpoint(t, s)
	c.hold.Store(true)
	for i := 20; i < 30; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	crash(s)

	s2 := open(t, cfg)
	defer s2.Close()
	// Exactly the 1000 unacknowledged records, none of the 2000 before.
	deliversExactly(t, s2, 2000, 3000)
}

// openFsyncAlways opens a spool in a new directory with fsync always and
// starts it delivering to a collector. Its checkpointer runs only when the
// test calls checkpoint.
func openFsyncAlways(t *testing.T) (Config, *Spool, *collector) {
	t.Helper()
	cfg := testConfig(t.TempDir())
	cfg.Fsync = "always"
	s := open(t, cfg)
	manualCheckpoints(s)
	c := &collector{}
	_ = start(t, s, Links{Next: c})
	return cfg, s, c
}

// manualCheckpoints makes s's checkpointer (s not started yet) run a pass
// only when the test calls checkpoint, instead of once a second.
func manualCheckpoints(s *Spool) { s.ckptTick = make(chan time.Time) }

// checkpoint runs one pass of s's checkpointer and returns when it is over:
// the checkpointer takes the second tick only after the pass the first
// one started (it writes the watermark if it moved since the last pass).
func checkpoint(t *testing.T, s *Spool) {
	t.Helper()
	for range 2 {
		select {
		case s.ckptTick <- time.Now():
		case <-time.After(10 * time.Second):
			t.Fatal("the checkpointer takes no tick")
		}
	}
}

// crash abandons s as process death would: no Shutdown, no Close; the
// reader stops and the directory's lock is released. Its goroutines end
// too, as a dead process's do, without the final checkpoint Close writes
// (the syncer's last fsync changes nothing a reopen sees: a process crash
// keeps the page cache).
func crash(s *Spool) {
	s.readStop.Store(true)
	s.lockFile.Close()
	if s.started {
		s.stopReadOnce.Do(func() { close(s.stopRead) })
		s.readWG.Wait()
		close(s.stopFin)
		s.finWG.Wait()
		close(s.stopSync)
		s.syncWG.Wait()
	}
}

// TestTornTailTruncated: a half-written frame at the end of the last
// segment (a crash mid-write) is cut off and counted; every whole record
// before it is delivered.
func TestTornTailTruncated(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	for i := 0; i < 10; i++ {
		appendOK(t, s, recs(i*10, 10))
	}
	_ = s.Close()
	segs := segments(t, dir)
	last := segs[len(segs)-1]
	full := appendFrame(nil, &recs(100, 1).Records[0], s.wfmt.Load())
	f, _ := os.OpenFile(last, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.Write(full[:len(full)-5])
	f.Close()

	s2 := open(t, testConfig(dir))
	defer s2.Close()
	if v := testutil.ToFloat64(s2.m.corruptBytes.WithLabelValues("truncated")); v != float64(len(full)-5) {
		t.Fatalf("truncated bytes counted %v, want %d", v, len(full)-5)
	}
	deliversExactly(t, s2, 0, 100)
}

// TestFlippedBytesSkipped: bytes flipped inside sealed segments lose only
// the records they hit; the reader finds the next valid frame and every
// other record is delivered, and the damage is counted.
func TestFlippedBytesSkipped(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	for i := 0; i < 100; i++ {
		appendOK(t, s, recs(i*40, 40))
	}
	_ = s.Close()
	segs := segments(t, dir)
	if len(segs) < 3 {
		t.Fatalf("want several segments, have %d", len(segs))
	}
	// Damage one record's value in the first segment and a frame header in
	// the second.
	for _, d := range []struct {
		file string
		off  int64
	}{{segs[0], 4000}, {segs[1], segHeader + 2}} {
		f, _ := os.OpenFile(d.file, os.O_RDWR, 0)
		var b [3]byte
		_, _ = f.ReadAt(b[:], d.off)
		for i := range b {
			b[i] ^= 0xA5
		}
		_, _ = f.WriteAt(b[:], d.off)
		f.Close()
	}
	s2 := open(t, testConfig(dir))
	defer s2.Close()
	c := &collector{}
	_ = start(t, s2, Links{Next: c})
	c.waitFor(t, 3990)
	time.Sleep(200 * time.Millisecond)
	got := c.values()
	if len(got) < 3990 || len(got) > 3998 {
		t.Fatalf("delivered %d of 4000 records; two damaged spots should cost only the records they hit", len(got))
	}
	seen := map[string]bool{}
	for _, v := range got {
		seen[v] = true
	}
	last := ""
	for _, v := range got {
		if v < last {
			t.Fatalf("out of order after damage: %q after %q", v, last)
		}
		last = v
	}
	if v := testutil.ToFloat64(s2.m.corruptBytes.WithLabelValues("skipped")); v == 0 {
		t.Fatal("damage not counted")
	}
	if v := testutil.ToFloat64(s2.m.corruptRegions); v < 2 {
		t.Fatalf("corrupt regions %v, want ≥ 2", v)
	}
	_ = s2.Shutdown(context.Background())
}

// TestDiskCapRefuses: at max_bytes appends are refused (429 while Kafka is
// up, 503 while it is down), the refused batch's completion never runs, and
// nothing refused was stored.
func TestDiskCapRefuses(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.MaxBytes = 256 << 10
	s := open(t, cfg)
	var up atomic.Bool
	up.Store(true)
	c := &collector{}
	c.hold.Store(true)
	_ = start(t, s, Links{Next: c, Up: up.Load})
	var stored int
	var refusal error
	for i := 0; i < 1000 && refusal == nil; i++ {
		b := recs(i*100, 100)
		completed := false
		b.OnDone(func(error) { completed = true })
		if err := s.Consume(context.Background(), b); err != nil {
			if completed {
				t.Fatal("a refused batch was completed")
			}
			refusal = err
			break
		}
		stored += 100
	}
	if refusal != consumer.ErrSpoolFull {
		t.Fatalf("refusal %v, want ErrSpoolFull (429)", refusal)
	}
	if d := s.DiskBytes(); d > int64(cfg.MaxBytes) {
		t.Fatalf("spool holds %d bytes, cap %d", d, cfg.MaxBytes)
	}
	up.Store(false)
	err := s.Consume(context.Background(), recs(0, 100))
	var re *consumer.RetryableError
	if !errors.As(err, &re) || re.Busy {
		t.Fatalf("with Kafka down: %v, want a 503-class refusal", err)
	}
	if s.ready() == nil {
		t.Fatal("readiness should report a full spool")
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	s2 := open(t, cfg)
	defer s2.Close()
	deliversExactly(t, s2, 0, stored)
}

type deadLetters struct {
	mu      sync.Mutex
	reasons []string
	values  []string
	// hold: keep the completions (a dead-letter topic Kafka has not yet
	// acknowledged) instead of calling them.
	hold bool
	held []func(error)
}

func (d *deadLetters) Write(r *record.Record, reason string, _ error, done func(error)) {
	d.mu.Lock()
	d.reasons = append(d.reasons, reason)
	d.values = append(d.values, string(r.Value))
	if d.hold {
		d.held = append(d.held, done)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	done(nil)
}

// TestDeadLetterAndRetry: a record Kafka refuses for good goes to the dead
// letter with its reason; a record that fails for a passing reason is sent
// again until it is delivered; the spool drains either way.
func TestDeadLetterAndRetry(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	var transient atomic.Int64
	c := &collector{fail: func(r *record.Record) error {
		switch {
		case bytes.HasPrefix(r.Value, []byte("rec-00000007")):
			return consumer.TooLarge("record", 10, 5, nil)
		case bytes.HasPrefix(r.Value, []byte("rec-0000001")) && transient.Add(1) <= 3:
			return consumer.ErrFull
		}
		return nil
	}}
	dl := &deadLetters{}
	_ = start(t, s, Links{Next: c, DeadLetter: dl})
	appendOK(t, s, recs(0, 100))
	got := c.waitFor(t, 99)
	if len(got) != 99 {
		t.Fatalf("delivered %d, want 99", len(got))
	}
	dl.mu.Lock()
	if len(dl.values) != 1 || dl.reasons[0] != "record_too_large" || dl.values[0][:12] != "rec-00000007" {
		t.Fatalf("dead letters %v %v", dl.reasons, dl.values)
	}
	dl.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for s.Backlog() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d", s.Backlog())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := testutil.ToFloat64(s.m.retried); v < 3 {
		t.Fatalf("retried %v, want ≥ 3", v)
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
}

// TestGroupCommit: with fsync always, concurrent appends share fsyncs, and
// every completion comes after an fsync that covers the append: one that
// began once its last byte was in the segment.
func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Fsync = "always"
	cfg.SegmentBytes = 16 << 20
	s := open(t, cfg)
	// durable is how far into the segment a finished fsync reaches: the
	// file's size when it began, every byte written before it. The
	// segment is the only one (16 MiB; no roll) and new (no spare's old
	// bytes past what was written).
	var durable atomic.Int64
	fsync := s.fsync
	s.fsync = func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := fsync(f); err != nil {
			return err
		}
		for d := durable.Load(); d < fi.Size() && !durable.CompareAndSwap(d, fi.Size()); d = durable.Load() {
		}
		return nil
	}
	c := &collector{}
	_ = start(t, s, Links{Next: c})
	var wg sync.WaitGroup
	const writers, each = 32, 20
	// seen[k] is durable when append k (records k*5..k*5+4) completed.
	var seen [writers * each]atomic.Int64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				k := w*each + i
				b := recs(k*5, 5)
				done := make(chan struct{})
				b.OnDone(func(err error) {
					if err != nil {
						t.Error(err)
					}
					seen[k].Store(durable.Load())
					close(done)
				})
				if err := s.Consume(context.Background(), b); err != nil {
					t.Error(err)
					return
				}
				<-done
			}
		}(w)
	}
	wg.Wait()
	// Where each append ends in the segment: its last record's value is
	// unique, and its frame's bytes after the value are known.
	s.mu.Lock()
	seg := s.path(segName(s.wseg))
	s.mu.Unlock()
	file, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	for k := range seen {
		last := recs(k*5+4, 1).Records[0]
		frame := appendFrame(nil, &last, s.wfmt.Load())
		tail := len(frame) - bytes.Index(frame, last.Value) - len(last.Value)
		at := bytes.Index(file, last.Value)
		if at < 0 {
			t.Fatalf("append %d is not in the segment", k)
		}
		if end := int64(at + len(last.Value) + tail); seen[k].Load() < end {
			t.Fatalf("append %d (bytes up to %d) completed when an fsync had covered %d bytes", k, end, seen[k].Load())
		}
	}
	fsyncs := testutil.ToFloat64(s.m.fsyncs)
	t.Logf("%d appends, %v fsyncs", writers*each, fsyncs)
	if fsyncs >= writers*each {
		t.Fatalf("%v fsyncs for %d appends: no group commit", fsyncs, writers*each)
	}
	c.waitFor(t, writers*each*5)
	_ = s.Shutdown(context.Background())
	_ = s.Close()
}

// TestReadAheadBounded: with Kafka holding everything, the reader never
// takes more than read_ahead of memory (and a quarter more for the appends
// it keeps) however large the backlog.
func TestReadAheadBounded(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ReadAhead = 3 << 20
	s := open(t, cfg)
	c := &collector{}
	c.hold.Store(true)
	b := budget.New(math.MaxInt64)
	_ = start(t, s, Links{Next: c, Budget: b})
	big := bytes.Repeat([]byte("y"), 10<<10)
	for i := 0; i < 1500; i++ {
		bt := &record.Batch{Records: []record.Record{{Topic: "t", Value: big}}}
		appendOK(t, s, bt)
	}
	time.Sleep(300 * time.Millisecond)
	// read_ahead, plus the appends kept in memory for it (tail.go): at
	// most a quarter of read_ahead more.
	if u, bound := b.Used(), int64(cfg.ReadAhead)*5/4; u == 0 || u > bound {
		t.Fatalf("reader holds %d bytes; bound %d", u, bound)
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
}

// TestOneProcessPerDir: a second spool on the same directory is refused.
func TestOneProcessPerDir(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	defer s.Close()
	if _, err := Open(testConfig(dir), telemetry.TestSettings(), Links{Next: unstarted{}, MaxRecordBytes: 1 << 20}); err == nil {
		t.Fatal("second Open on the same dir succeeded")
	}
}

// TestDiskFull: on a real full filesystem (a 1 MiB tmpfs) appends fail
// with a clear 503-class error, nothing refused is acknowledged, and every
// acknowledged record is delivered after a restart.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	cfg := testConfig(dir)
	cfg.MaxBytes = 64 << 20 // the cap is not what stops it: the disk is
	s := open(t, cfg)
	c := &collector{}
	c.hold.Store(true)
	_ = start(t, s, Links{Next: c})
	acked := 0
	var werr error
	for i := 0; i < 10000; i++ {
		b := recs(i*20, 20)
		var cerr error
		completed := false
		b.OnDone(func(err error) { completed, cerr = true, err })
		if werr = s.Consume(context.Background(), b); werr != nil {
			if completed {
				t.Fatal("refused batch completed")
			}
			break
		}
		if !completed || cerr != nil {
			t.Fatalf("interval-mode append not completed: %v", cerr)
		}
		acked += 20
	}
	if werr == nil {
		t.Fatal("a 1 MiB filesystem never filled")
	}
	if consumer.Reason(werr) != "spool_disk_full" {
		t.Fatalf("error %v (reason %s), want spool_disk_full", werr, consumer.Reason(werr))
	}
	t.Logf("stored %d records before: %v", acked, werr)
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	s2 := open(t, cfg)
	defer s2.Close()
	deliversExactly(t, s2, 0, acked)
}

// TestReplayThrottled: the backlog found at start is read at replay_rate
// (one second of burst), so recovery cannot take all the disk and CPU.
func TestReplayThrottled(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := open(t, cfg)
	big := bytes.Repeat([]byte("z"), 1000)
	for i := 0; i < 768; i++ { // ~768 KiB of backlog
		appendOK(t, s, &record.Batch{Records: []record.Record{{Topic: "t", Value: big}}})
	}
	_ = s.Close()
	cfg.ReplayRate = 256 << 10
	s2 := open(t, cfg)
	defer s2.Close()
	c := &collector{}
	began := time.Now()
	_ = start(t, s2, Links{Next: c})
	c.waitFor(t, 768)
	// 256 KiB come at once (the burst); the other ~512 KiB take ~2 s.
	if d := time.Since(began); d < 1500*time.Millisecond {
		t.Fatalf("768 KiB replayed in %s at 256 KiB/s", d)
	}
	_ = s2.Shutdown(context.Background())
}
