package spool

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/bytesize"
)

func spareFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.spare"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dirBytes is the size of every segment and spare in dir.
func dirBytes(dir string) int64 {
	var n int64
	for _, pat := range []string{"*.seg", "*.spare"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, f := range m {
			if fi, err := os.Stat(f); err == nil {
				n += fi.Size()
			}
		}
	}
	return n
}

// TestSegmentsRecycled: segments the watermark passed are overwritten by
// the next ones instead of deleted: across many rolls every record arrives
// once, in order, no byte counts as damage, at most maxSpares files wait,
// and a graceful stop leaves the recycled active segment ending at its last
// frame (the next start trims nothing).
func TestSegmentsRecycled(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := open(t, cfg)
	c := &collector{}
	_ = start(t, s, Links{Next: c})
	for i := 0; i < 300; i++ {
		appendOK(t, s, recs(i*20, 20))
		if i%50 == 0 {
			c.waitFor(t, i*20) // let the watermark pass segments as it goes
		}
	}
	wantIDs(t, c.waitFor(t, 6000), 0, 6000)
	if n := testutil.ToFloat64(s.m.recycled); n < 5 {
		t.Fatalf("%v segments recycled over ~%d rolls; spares are not being reused", n, 6000*60/int(cfg.SegmentBytes))
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(spareFiles(t, dir)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(spareFiles(t, dir)); n == 0 || n > maxSpares {
		t.Fatalf("%d spare files, want 1..%d", n, maxSpares)
	}
	if v := s.spareBytes(); v <= 0 {
		t.Fatalf("ferry_spool_spare_bytes %d with spares on disk", v)
	}
	s.mu.Lock()
	recycled := s.recycled
	s.mu.Unlock()
	if !recycled {
		t.Fatal("the active segment is a new file; the test needs a recycled one")
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	for _, k := range []string{"truncated", "skipped"} {
		if v := testutil.ToFloat64(s.m.corruptBytes.WithLabelValues(k)); v != 0 {
			t.Fatalf("%v bytes counted as damage (%s)", v, k)
		}
	}

	s2 := open(t, cfg)
	defer s2.Close()
	if v := testutil.ToFloat64(s2.m.corruptBytes.WithLabelValues("truncated")); v != 0 {
		t.Fatalf("restart after a graceful stop trimmed %v bytes", v)
	}
	if got := len(s2.spares); got == 0 {
		t.Fatal("the spares left by the first run were not adopted")
	}
	deliversExactly(t, s2, 0, 0)
}

// TestRecycledSegmentCrash: the case recycling must get right. A segment
// file this same process wrote, emptied and reused still holds its old
// frames after the new ones; after a crash, recovery must deliver exactly
// the new unacknowledged records and none of the old ones (which a shared
// secret would make valid again), and not call the old bytes damage.
func TestRecycledSegmentCrash(t *testing.T) {
	cfg, s, c := openFsyncAlways(t)
	n := 0
	for ; n < 4000; n += 20 {
		appendOK(t, s, recs(n, 20))
		if n%1000 == 0 {
			c.waitFor(t, n)
		}
	}
	c.waitFor(t, n)
	// A roll onto a spare, then one checkpoint with everything so far
	// acknowledged.
	for !s.activeRecycled() {
		appendOK(t, s, recs(n, 20))
		n += 20
		c.waitFor(t, n)
	}
	c.waitAnswered(t, int64(n))
	checkpoint(t, s)
	c.hold.Store(true)
	from := n
	appendOK(t, s, recs(n, 20))
	n += 20
	s.mu.Lock()
	active, woff := s.path(segName(s.wseg)), s.woff
	s.mu.Unlock()
	fi, err := os.Stat(active)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() <= woff+int64(frameHeader) {
		t.Fatalf("the recycled segment is %d bytes with %d written: no old frames after the new ones to test", fi.Size(), woff)
	}
	crash(s)

	s2 := open(t, cfg)
	defer s2.Close()
	for _, k := range []string{"truncated", "skipped"} {
		if v := testutil.ToFloat64(s2.m.corruptBytes.WithLabelValues(k)); v != 0 {
			t.Fatalf("a recycled segment's old bytes counted as damage: %v (%s)", v, k)
		}
	}
	if fi, _ := os.Stat(active); fi.Size() != woff {
		t.Fatalf("recovered segment is %d bytes, want %d (cut at its last frame)", fi.Size(), woff)
	}
	deliversExactly(t, s2, from, n)
}

func (s *Spool) activeRecycled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recycled
}

// TestSparesWithinMaxBytes: spares never take the directory past max_bytes
// (one is kept only while the segments, the spares and one more segment
// fit), and fsync never keeps none.
func TestSparesWithinMaxBytes(t *testing.T) {
	for _, tc := range []struct {
		fsync     string
		maxBytes  int64
		wantSpare bool
	}{{"interval", 512 << 10, true}, {"interval", 128 << 10, false}, {"never", 64 << 20, false}} {
		t.Run(tc.fsync, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir)
			cfg.Fsync = tc.fsync
			cfg.MaxBytes = bytesize.Size(tc.maxBytes)
			s := open(t, cfg)
			defer s.Close()
			c := &collector{}
			_ = start(t, s, Links{Next: c})
			var peak atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					peak.Store(max(peak.Load(), dirBytes(dir)))
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			spared := false
			for i := 0; i < 200; i++ {
				appendOK(t, s, recs(i*20, 20))
				c.waitFor(t, (i+1)*20)
				spared = spared || len(spareFiles(t, dir)) > 0
			}
			close(stop)
			wg.Wait()
			if p := peak.Load(); p > tc.maxBytes {
				t.Fatalf("segments and spares reached %d bytes, over max_bytes %d", p, tc.maxBytes)
			}
			if spared != tc.wantSpare {
				t.Fatalf("spares kept: %v, want %v", spared, tc.wantSpare)
			}
		})
	}
}

// TestReseal: frames sealed for one segment and sealed again for another
// check only under the second (what an append does when a roll came
// between its encoding and its write).
func TestReseal(t *testing.T) {
	a, _ := newSegFormat(1 << 20)
	b, _ := newSegFormat(1 << 20)
	var buf []byte
	for i := range recs(0, 30).Records {
		buf = appendFrame(buf, &recs(0, 30).Records[i], a)
	}
	count := func(f *segFormat) (n int) {
		scan(buf, true, f, func(int, []byte) bool { n++; return true })
		return n
	}
	if count(a) != 30 || count(b) != 0 {
		t.Fatalf("before: %d frames check under a, %d under b", count(a), count(b))
	}
	reseal(buf, b)
	if count(a) != 0 || count(b) != 30 {
		t.Fatalf("after: %d frames check under a, %d under b", count(a), count(b))
	}
}

// BenchmarkSegmentWrite is the cost recycling removes, outside the spool:
// 64 MiB segment files filled by 110 KB writes (an OTLP request of 100
// 1 KB logs), each new file deleted when the next is full, against the
// same writes over a file that already exists. cpu-ms/GiB is the process's
// user+system time per GiB written; the ratio is taken between the two.
func BenchmarkSegmentWrite(b *testing.B) {
	buf := make([]byte, 110<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	const seg = 64 << 20
	for _, mode := range []string{"new file", "recycled"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			var prev string
			c0 := cpuTime()
			b.SetBytes(int64(len(buf)))
			var f *os.File
			off := int64(seg)
			for i := 0; i < b.N; i++ {
				if off+int64(len(buf)) > seg {
					name := filepath.Join(dir, segName(uint64(i)))
					if f != nil {
						f.Close()
					}
					var err error
					if mode == "recycled" && prev != "" {
						err = os.Rename(prev, name)
						if err == nil {
							f, err = os.OpenFile(name, os.O_RDWR, 0)
						}
					} else {
						f, err = os.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
						if prev != "" {
							_ = os.Remove(prev)
						}
					}
					if err != nil {
						b.Fatal(err)
					}
					prev, off = name, 0
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				off += int64(len(buf))
			}
			f.Close()
			b.ReportMetric(float64(cpuTime()-c0)/1e6/(float64(b.N)*float64(len(buf))/(1<<30)), "cpu-ms/GiB")
		})
	}
}

func cpuTime() time.Duration {
	var r syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}
