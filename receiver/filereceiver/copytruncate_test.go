package filereceiver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// drive runs the receiver's loop by hand (scan, checkpoint, rounds) until
// nothing moves, the clock stepping past rotate_wait.
func drive(t *testing.T, r *Receiver, now *time.Time) {
	t.Helper()
	for i := 0; i < 8; i++ {
		*now = now.Add(r.cfg.RotateWait + time.Millisecond)
		r.scan(*now)
		if err := r.checkpoint(true); err != nil {
			t.Fatal(err)
		}
		for r.round(*now) {
		}
	}
}

func manual(t *testing.T, cfg Config, p *pipe) *Receiver {
	t.Helper()
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: p})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.CheckpointDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range r.list {
			r.closeFile(f)
		}
	})
	return r
}

// oneLog: a receiver driven by hand (drive) on one file, dir/app.log,
// its include the path and suffix ("" or "*": its copies too).
func oneLog(t *testing.T, suffix string, p *pipe) (string, *Receiver) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path + suffix}
	return path, manual(t, cfg, p)
}

// rotatedBehind: lines [0, read) of prefix are written and read; lines
// [read, unread) are written and seen by a poll, not read; then app.log is
// copied to app.log.1 and truncated, and lines [unread, after) written.
func rotatedBehind(t *testing.T, r *Receiver, path, prefix string, read, unread, after int, now *time.Time) {
	t.Helper()
	write(t, path, lines(prefix, 0, read))
	drive(t, r, now)
	write(t, path, lines(prefix, read, unread))
	r.scan(*now)
	copyTruncate(t, path, path+".1")
	write(t, path, lines(prefix, unread, after))
}

func copyTruncate(t *testing.T, path, copy string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copy, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
}

// TestCopyTruncateReadsTheCopy: lines written after ferry's last read and
// before logrotate's copy and truncation are only in the copy: ferry finds
// it (its first bytes are the truncated file's) and reads it from the
// committed offset, before the file's new lines. With the copy outside the
// globs or inside them, nothing is lost or sent twice.
func TestCopyTruncateReadsTheCopy(t *testing.T) {
	for _, inGlobs := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy in globs=%v", inGlobs), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "app.log")
			cfg := testConfig(t, dir)
			cfg.Include = []string{path}
			if inGlobs {
				cfg.Include = []string{path + "*"}
			}
			p := &pipe{}
			r := manual(t, cfg, p)
			now := time.Now()
			write(t, path, lines("line", 0, 3))
			drive(t, r, &now)
			write(t, path, lines("line", 3, 5)) // not read before the rotation
			copyTruncate(t, path, path+".1")
			write(t, path, lines("line", 5, 6))
			drive(t, r, &now)
			if got := fmt.Sprint(p.values()); got != "[line-0 line-1 line-2 line-3 line-4 line-5]" {
				t.Fatalf("got %s", got)
			}
			if n := testutil.ToFloat64(r.fm.copies); n != 1 {
				t.Fatalf("copies counted %v", n)
			}
			// The next rotation (app.log.1 -> app.log.2, a new copy): no
			// copy is read again, even one with nothing left to read.
			write(t, path, lines("line", 6, 7))
			drive(t, r, &now)
			if err := os.Rename(path+".1", path+".2"); err != nil {
				t.Fatal(err)
			}
			copyTruncate(t, path, path+".1")
			write(t, path, lines("line", 7, 8))
			drive(t, r, &now)
			checkExactlyOnce(t, p.values(), 8)
			for _, g := range p.records() {
				if g.path != path {
					t.Fatalf("a record with path %q, not the file's", g.path)
				}
			}
		})
	}
}

// TestCopyTruncateInFlight: lines handed on and not acknowledged when the
// file is truncated, then failed, come again from the copy.
func TestCopyTruncateInFlight(t *testing.T) {
	p := &pipe{hold: true}
	path, r := oneLog(t, "", p)
	now := time.Now()
	write(t, path, lines("line", 0, 3))
	drive(t, r, &now)
	if p.heldCount() != 1 {
		t.Fatalf("%d batches held", p.heldCount())
	}
	copyTruncate(t, path, path+".1")
	write(t, path, lines("line", 3, 4))
	r.scan(now.Add(time.Millisecond)) // the truncation, the copy found
	p.release(0, consumer.ErrShutdownTimeout)
	p.set(func(p *pipe) { p.hold = false })
	drive(t, r, &now)
	got := p.values()
	if fmt.Sprint(got[len(got)-4:]) != "[line-0 line-1 line-2 line-3]" {
		t.Fatalf("got %q", got)
	}
}

// TestCopyTruncateCopyEndsMidLine: a copy under the globs that ends in the
// middle of a line (the writer's buffer flushed at a block boundary, not a
// line's end) is never let go, so its unterminated rest was never read:
// the truncated file waited behind it forever. A copy does not grow; once
// quiet for rotate_wait its rest is sent, and the file's new lines follow.
func TestCopyTruncateCopyEndsMidLine(t *testing.T) {
	p := &pipe{}
	path, r := oneLog(t, "*", p)
	now := time.Now()
	write(t, path, lines("line", 0, 2))
	drive(t, r, &now)
	write(t, path, "line-2\nline-") // the writer's buffer, flushed mid-line
	copyTruncate(t, path, path+".1")
	write(t, path, "3\n") // shorter than what was read: a truncation
	drive(t, r, &now)
	write(t, path, lines("line", 4, 6))
	drive(t, r, &now)
	if got := fmt.Sprint(p.values()); got != "[line-0 line-1 line-2 line- 3 line-4 line-5]" {
		t.Fatalf("got %s", got)
	}
}

// TestTruncationBehindTheReader: ferry has read only the start of a file
// (busy elsewhere) when it is copied and truncated, and the new content
// grows past ferry's position before the next poll: still a truncation
// (the file is shorter than it was), the rest read from the copy, the new
// content from its first byte.
func TestTruncationBehindTheReader(t *testing.T) {
	p := &pipe{}
	path, r := oneLog(t, "", p)
	now := time.Now()
	write(t, path, lines("line", 0, 2))
	drive(t, r, &now)
	write(t, path, lines("line", 2, 100)) // seen by a poll, not read yet
	r.scan(now)
	copyTruncate(t, path, path+".1")
	write(t, path, lines("line", 100, 110)) // past ferry's position (2 lines)
	drive(t, r, &now)
	checkExactlyOnce(t, p.values(), 110)
	if got := p.values(); got[len(got)-1] != "line-109" || got[99] != "line-99" {
		t.Fatalf("order: %q", got)
	}
}

// TestRotatedTwiceWhileDown: while ferry is down, app.log is rotated twice
// (app.log -> app.log.1, a new app.log written and rotated to app.log.2,
// another new app.log). The checkpoint knows only the first file; the
// second was never seen. At the restart both rotated files are read, the
// older first, before the current file: nothing lost, nothing out of
// order (the one the checkpoint never knew was lost before).
func TestRotatedTwiceWhileDown(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	write(t, path, lines("line", 0, 3))
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the first lines", func() bool { return len(p.records()) == 3 })
	eventually(t, "their checkpoint", func() bool { return savedOffset(t, cfg.CheckpointDir, path) > 0 })
	write(t, path, lines("line", 3, 5)) // not read: ferry is killed first
	abandon(r)
	time.Sleep(20 * time.Millisecond) // the rotations' times are after the checkpoint's
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path, lines("line", 5, 8))
	time.Sleep(20 * time.Millisecond)
	if err := os.Rename(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	write(t, path, lines("line", 8, 10))
	p = &pipe{}
	r = start(t, cfg, p)
	eventually(t, "every line", func() bool { return len(p.records()) >= 7 })
	time.Sleep(10 * cfg.PollInterval)
	if got := fmt.Sprint(p.values()); got != "[line-3 line-4 line-5 line-6 line-7 line-8 line-9]" {
		t.Fatalf("got %s", got)
	}
	if n := testutil.ToFloat64(r.fm.rotatedSince); n != 1 {
		t.Fatalf("rotated since the checkpoint: %v", n)
	}
	for _, g := range p.records() {
		if g.path != path {
			t.Fatalf("a record of path %q", g.path)
		}
	}
}

// TestCopyTruncateTwiceBeforeRead: app.log is copied and truncated, and
// copied and truncated again before ferry read anything of its new
// content (busy with other files, or its consumer slow). The first
// truncation emptied the fingerprint, and it was refilled only by a read:
// at the second, ferry knew nothing to find the copy by, and the second
// copy's lines were lost. The fingerprint is refilled at every poll, also
// for a file closed in between (max_open_files).
func TestCopyTruncateTwiceBeforeRead(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed=%v", closed), func(t *testing.T) {
			p := &pipe{}
			path, r := oneLog(t, "", p)
			now := time.Now()
			rotatedBehind(t, r, path, "line", 3, 5, 7, &now)
			if closed {
				for _, f := range r.list {
					if f.cur == path {
						r.closeFile(f)
					}
				}
			}
			r.scan(now) // the first truncation: no read follows
			write(t, path, lines("line", 7, 9))
			r.scan(now)
			copyTruncate(t, path, path+".2")
			write(t, path, lines("line", 9, 10))
			r.scan(now) // the second
			drive(t, r, &now)
			checkExactlyOnce(t, p.values(), 10)
			if n := testutil.ToFloat64(r.fm.copies); n != 2 {
				t.Fatalf("copies counted %v", n)
			}
		})
	}
}

// TestTruncationRegrownPastLastSize: the poll stalls (checkpoint fsyncs on
// a slow disk) while app.log is copied, truncated and written past the
// size ferry last saw. Its size never shrank between two polls, so only
// its first bytes tell: they are not the fingerprint any more. Without
// that look, ferry read on from its old offset in the new content and the
// copy was never found. The same when ferry reads the file before its next
// poll (the read looks at the first bytes too): else it read new content
// at the old offsets up to the size the poll saw.
func TestTruncationRegrownPastLastSize(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("read before the poll=%v", readFirst), func(t *testing.T) {
			p := &pipe{}
			path, r := oneLog(t, "", p)
			now := time.Now()
			long := strings.Repeat("x", 60) + "-line" // the fingerprint fills its 1000 bytes
			rotatedBehind(t, r, path, long, 100, 105, 220, &now)
			if readFirst {
				for r.round(now) {
				}
			}
			drive(t, r, &now)
			checkExactlyOnce(t, p.values(), 220)
			if got := p.values(); got[104] != long+"-104" || got[105] != long+"-105" {
				t.Fatalf("order: %q %q", got[104], got[105])
			}
			if n := testutil.ToFloat64(r.fm.copies); n != 1 {
				t.Fatalf("copies counted %v", n)
			}
			if n := testutil.ToFloat64(r.fm.truncations.WithLabelValues(path)); n != 1 {
				t.Fatalf("truncations counted %v", n)
			}
		})
	}
}

// TestCopyTruncateWriterKeepsItsOffset: a writer that did not open its
// file with O_APPEND (`app > app.log`) keeps its offset when logrotate
// truncates the file: the file becomes a hole of the old size, read back
// as zero bytes, and the new lines follow it. Its first bytes are zeros
// then, not new content: taken for a truncation, the hole went to Kafka as
// NUL records and the first new line was glued to them.
func TestCopyTruncateWriterKeepsItsOffset(t *testing.T) {
	p := &pipe{}
	path, r := oneLog(t, "", p)
	now := time.Now()
	w, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString(lines("line", 0, 300)); err != nil {
		t.Fatal(err)
	}
	drive(t, r, &now)
	copyTruncate(t, path, path+".1")
	if _, err := w.WriteString(lines("line", 300, 310)); err != nil { // at its old offset
		t.Fatal(err)
	}
	drive(t, r, &now)
	for _, v := range p.values() {
		if strings.ContainsRune(v, 0) {
			t.Fatalf("a record with NUL bytes (%d bytes)", len(v))
		}
	}
	checkExactlyOnce(t, p.values(), 310)
}

// TestTruncationSeenByTheReadShorterThanBefore: the read finds the file
// copied and truncated, its new content longer than one read but shorter
// than the old size the poll saw. The size is taken again then: kept, the
// next poll took the new content for a second truncation and sent what
// was read of it twice (found by review: 292 lines).
func TestTruncationSeenByTheReadShorterThanBefore(t *testing.T) {
	p := &pipe{}
	path, r := oneLog(t, "", p)
	now := time.Now()
	long := strings.Repeat("x", 900) + "-line"
	rotatedBehind(t, r, path, long, 700, 1000, 1400, &now)
	f := r.list[0]
	for r.round(now) {
	}
	if err := r.checkpoint(true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && f.readOff == 0; i++ {
		r.round(now)
	}
	if f.readOff == 0 {
		t.Fatal("nothing of the new content read before the poll")
	}
	r.scan(now)
	drive(t, r, &now)
	checkExactlyOnce(t, p.values(), 1400)
	if n := testutil.ToFloat64(r.fm.truncations.WithLabelValues(path)); n != 1 {
		t.Fatalf("truncations counted %v", n)
	}
}
