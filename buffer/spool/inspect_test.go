package spool

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// fingerprint is every file of dir with its content's hash: what a
// read-only tool must leave exactly as it was.
func fingerprint(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%d:%x", len(b), sha256.Sum256(b))
	}
	return out
}

func sameFiles(t *testing.T, before, after map[string]string) {
	t.Helper()
	if len(before) != len(after) {
		t.Fatalf("files before %v, after %v", before, after)
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s changed: %s → %s", k, v, after[k])
		}
	}
}

// twoTopics is recs with every third record in topic "u".
func twoTopics(from, n int) *record.Batch {
	b := recs(from, n)
	for i := range b.Records {
		if (from+i)%3 == 2 {
			b.Records[i].Topic = "u"
		}
	}
	return b
}

// ackedSpool writes 3000 records over several segments: the first 2000
// acknowledged by Kafka and checkpointed, the last 1000 pending; the
// first segment, acknowledged, is put back as if its deletion had been
// interrupted by a crash. It returns the directory and the config.
func ackedSpool(t *testing.T) (string, Config) {
	t.Helper()
	cfg, s, c := openFsyncAlways(t)
	appendOK(t, s, twoTopics(0, 100))
	// The first segment as it is now (its first 100 records, whole
	// frames): put back later as an acknowledged segment.
	first := segments(t, cfg.Dir)[0]
	kept, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 20; i++ {
		appendOK(t, s, twoTopics(i*100, 100))
	}
	c.waitFor(t, 2000)
	c.waitAnswered(t, 2000)
	checkpoint(t, s)
	c.hold.Store(true) // Kafka down from here
	for i := 20; i < 30; i++ {
		appendOK(t, s, twoTopics(i*100, 100))
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	if _, err := os.Stat(first); err == nil {
		t.Fatal("the first segment was not retired")
	}
	if err := os.WriteFile(first, kept, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg.Dir, cfg
}

// replays opens the spool in dir as the agent does and returns how many
// records its reader delivers, with its damage counters.
func replays(t *testing.T, cfg Config, want int) (got int, truncated, skipped float64) {
	t.Helper()
	s := open(t, cfg)
	defer s.Close()
	c := &collector{}
	if err := start(t, s, Links{Next: c}); err != nil {
		t.Fatal(err)
	}
	if want > 0 {
		c.waitFor(t, want)
	}
	time.Sleep(200 * time.Millisecond) // extras would show up by now
	_ = s.Shutdown(context.Background())
	return len(c.values()), testutil.ToFloat64(s.m.corruptBytes.WithLabelValues("truncated")),
		testutil.ToFloat64(s.m.corruptBytes.WithLabelValues("skipped"))
}

// TestInspectPredictsRestart: Inspect reads a spool with acknowledged and
// pending records without changing a byte of it, and what it says a
// restart replays is what the agent's own recovery then delivers.
func TestInspectPredictsRestart(t *testing.T) {
	dir, cfg := ackedSpool(t)
	before := fingerprint(t, dir)
	rep, err := Inspect(dir, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, before, fingerprint(t, dir))
	if rep.Live || rep.Checkpoint == nil || rep.ReplayFrom == nil || len(rep.Damage) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if rep.ReplayRecords != 1000 {
		t.Fatalf("replay %d records, want the 1000 unacknowledged", rep.ReplayRecords)
	}
	if rep.Segments[0].State != StateAcknowledged || rep.Segments[0].Pending != 0 || rep.Segments[0].Records == 0 {
		t.Fatalf("first segment %+v, want acknowledged (deleted at start)", rep.Segments[0])
	}
	total, pending := 0, 0
	for _, s := range rep.Segments {
		total += s.Records
		pending += s.Pending
		if s.Frames != s.Records || s.First != segHeader || s.Last < s.First || s.Format != segMagic {
			t.Fatalf("segment %+v", s)
		}
	}
	if pending != 1000 {
		t.Fatalf("segments hold %d pending records", pending)
	}
	var tu, tt TopicReport
	for _, tp := range rep.Topics {
		switch tp.Topic {
		case "t":
			tt = tp
		case "u":
			tu = tp
		default:
			t.Fatalf("topic %q", tp.Topic)
		}
	}
	// Records 2000..2999: the 334 with i%3 == 2 are in topic u.
	if tu.Pending != 334 || tt.Pending != 666 || tu.Records+tt.Records != total {
		t.Fatalf("topics %+v", rep.Topics)
	}
	got, _, _ := replays(t, cfg, 1000)
	if got != rep.ReplayRecords {
		t.Fatalf("a restart delivered %d records, Inspect said %d", got, rep.ReplayRecords)
	}
}

// TestScanRecords: Scan hands every record with its fields, in order, and
// PendingOnly only those a restart sends.
func TestScanRecords(t *testing.T) {
	dir, _ := ackedSpool(t)
	before := fingerprint(t, dir)
	var all, pending []string
	err := Scan(dir, ReadOptions{}, func(e *Entry) bool {
		all = append(all, string(e.Record.Value))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	err = Scan(dir, ReadOptions{PendingOnly: true}, func(e *Entry) bool {
		w := twoTopics(2000+i, 1).Records[0]
		r := e.Record
		if !e.Pending || string(r.Value) != string(w.Value) || r.Topic != w.Topic || string(r.Key) != string(w.Key) ||
			(r.Key == nil) != (w.Key == nil) || !r.Timestamp.Equal(w.Timestamp) || len(r.Headers) != len(w.Headers) {
			t.Fatalf("pending record %d: %+v, want %+v", i, r, w)
		}
		pending = append(pending, string(r.Value))
		i++
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1000 || len(all) <= 1000 || all[len(all)-1] != pending[999] {
		t.Fatalf("%d records, %d pending", len(all), len(pending))
	}
	n := 0
	_ = Scan(dir, ReadOptions{}, func(*Entry) bool { n++; return n < 5 })
	if n != 5 {
		t.Fatalf("Scan went on after fn said stop: %d", n)
	}
	sameFiles(t, before, fingerprint(t, dir))
}

// damagedSpool writes 2000 pending records and damages them: a flipped
// byte inside a record's value in the first segment, a flipped frame
// header in the second, and the newest segment cut mid-frame (a torn
// write). It returns the damage's expected offsets.
func damagedSpool(t *testing.T) (cfg Config, valueAt, headerAt, tornAt int64, segs []string) {
	t.Helper()
	cfg = testConfig(t.TempDir())
	s := open(t, cfg)
	for i := 0; i < 20; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	_ = s.Close()
	segs = segments(t, cfg.Dir)
	if len(segs) < 3 {
		t.Fatalf("want 3 segments or more, have %d", len(segs))
	}
	// Frame offsets, by segment, from Scan.
	offs := map[string][]int64{}
	if err := Scan(cfg.Dir, ReadOptions{}, func(e *Entry) bool {
		offs[e.Segment] = append(offs[e.Segment], e.Offset)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	first, second, last := filepath.Base(segs[0]), filepath.Base(segs[1]), filepath.Base(segs[len(segs)-1])
	valueAt = offs[first][5]
	flip(t, segs[0], valueAt+frameHeader+20, 1) // inside the 6th record: its checksum fails
	headerAt = offs[second][3]
	flip(t, segs[1], headerAt+5, 1) // the 4th frame's tag
	lastFrames := offs[last]
	tornAt = lastFrames[len(lastFrames)-1]
	if err := os.Truncate(segs[len(segs)-1], tornAt+20); err != nil {
		t.Fatal(err)
	}
	return cfg, valueAt, headerAt, tornAt, segs
}

// TestInspectFindsDamage: each damaged spot is reported with its segment,
// offset, kind and what recovery does with it, without the spool being
// changed; and the agent's recovery then does exactly that: it truncates
// the torn bytes, skips the damaged ones and delivers every other record.
func TestInspectFindsDamage(t *testing.T) {
	cfg, valueAt, headerAt, tornAt, segs := damagedSpool(t)
	before := fingerprint(t, cfg.Dir)
	rep, err := Inspect(cfg.Dir, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameFiles(t, before, fingerprint(t, cfg.Dir))
	if len(rep.Damage) != 3 {
		t.Fatalf("damage %+v, want 3 stretches", rep.Damage)
	}
	want := []struct {
		seg    string
		off    int64
		kind   string
		detail string
	}{
		{filepath.Base(segs[0]), valueAt, DamageFrame, "checksum mismatch"},
		{filepath.Base(segs[1]), headerAt, DamageFrame, "bad frame tag (not a frame of this segment)"},
		{filepath.Base(segs[len(segs)-1]), tornAt, DamageTornTail, "a frame cut short: "},
	}
	var skipped int64
	for i, w := range want {
		d := rep.Damage[i]
		if d.Segment != w.seg || d.Offset != w.off || d.Kind != w.kind || len(d.Detail) < len(w.detail) || d.Detail[:len(w.detail)] != w.detail || !d.Pending {
			t.Fatalf("damage %d: %+v, want %+v", i, d, w)
		}
		if i < 2 {
			skipped += d.Bytes
			if d.Frames != 1 {
				t.Fatalf("damage %d spans %d frames, want the one record it hit", i, d.Frames)
			}
		} else if d.Bytes != 20 {
			t.Fatalf("torn tail of %d bytes, want 20", d.Bytes)
		}
	}
	if b, n := rep.Lost(); n != 3 || b != skipped+20 {
		t.Fatalf("lost %d bytes in %d stretches", b, n)
	}
	if rep.ReplayRecords != 1997 {
		t.Fatalf("replay %d records, want 1997 (three records hit)", rep.ReplayRecords)
	}
	got, truncated, sk := replays(t, cfg, rep.ReplayRecords)
	if got != rep.ReplayRecords || truncated != 20 || sk != float64(skipped) {
		t.Fatalf("the restart delivered %d records, truncated %v and skipped %v bytes; Inspect said %d, 20 and %d",
			got, truncated, sk, rep.ReplayRecords, skipped)
	}
}

// TestInspectDamagedHeaders: a sealed segment whose header is damaged is
// skipped whole by the reader; the newest one is removed at start.
func TestInspectDamagedHeaders(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	for i := 0; i < 20; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	_ = s.Close()
	segs := segments(t, cfg.Dir)
	if len(segs) < 3 {
		t.Fatalf("want 3 segments or more, have %d", len(segs))
	}
	flip(t, segs[1], 20, 1)
	flip(t, segs[len(segs)-1], 0, 1)
	rep, err := Inspect(cfg.Dir, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Damage) != 2 || rep.Damage[0].Kind != DamageHeader || rep.Damage[0].Segment != filepath.Base(segs[1]) ||
		rep.Damage[0].Action != "segment skipped by the reader" || rep.Damage[1].Action != "segment removed at start" ||
		rep.Segments[len(segs)-1].State != StateRemoved {
		t.Fatalf("damage %+v", rep.Damage)
	}
	got, _, _ := replays(t, cfg, rep.ReplayRecords)
	if got != rep.ReplayRecords || got == 0 {
		t.Fatalf("the restart delivered %d records, Inspect said %d", got, rep.ReplayRecords)
	}
	if _, err := os.Stat(segs[len(segs)-1]); err == nil {
		t.Fatal("recovery kept the newest segment without a header, Inspect said it removes it")
	}
}

// TestReadOnlyToolsRespectTheLock: a spool an agent holds is refused
// unless forced; and while a tool reads, an agent cannot open it.
func TestReadOnlyToolsRespectTheLock(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	appendOK(t, s, recs(0, 10))
	if _, err := Inspect(cfg.Dir, ReadOptions{}); !errors.Is(err, ErrInUse) {
		t.Fatalf("Inspect on a held spool: %v, want ErrInUse", err)
	}
	if err := Scan(cfg.Dir, ReadOptions{}, func(*Entry) bool { return true }); !errors.Is(err, ErrInUse) {
		t.Fatalf("Scan on a held spool: %v, want ErrInUse", err)
	}
	rep, err := Inspect(cfg.Dir, ReadOptions{Force: true})
	if err != nil || !rep.Live || rep.ReplayRecords != 10 {
		t.Fatalf("forced: %v %+v", err, rep)
	}
	_ = s.Close()

	v, err := openView(cfg.Dir, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(cfg, telemetry.TestSettings(), Links{Next: unstarted{}}); err == nil {
		s2.Close()
		t.Fatal("an agent opened the spool while a tool was reading it")
	}
	v.close()
	s3 := open(t, cfg)
	_ = s3.Close()

	if _, err := Inspect(filepath.Join(cfg.Dir, "nope"), ReadOptions{}); !errors.Is(err, ErrNoSpool) {
		t.Fatalf("missing directory: %v", err)
	}
}

// TestInspectEmpty: a fresh directory and a drained spool replay nothing.
func TestInspectEmpty(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := open(t, cfg)
	_ = s.Close()
	rep, err := Inspect(cfg.Dir, ReadOptions{})
	if err != nil || rep.ReplayRecords != 0 || len(rep.Segments) != 0 || len(rep.Damage) != 0 {
		t.Fatalf("%v %+v", err, rep)
	}
	names := []string{}
	entries, _ := os.ReadDir(cfg.Dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if fmt.Sprint(names) != "[checkpoint lock]" {
		t.Fatalf("files %v", names)
	}
}

// FuzzInspectPredicts: three segments of honest frames, bytes the fuzzer
// chose flipped anywhere in them (headers included), the newest cut short
// by an amount it chose, and a checkpoint it chose (none, garbage, or a
// position). Inspect never fails or changes a byte, and what it predicts
// is what recovery and the reader then do: the records delivered, and the
// torn tail truncated.
func FuzzInspectPredicts(f *testing.F) {
	f.Add([]byte{}, uint16(0), uint8(0), uint64(0), int64(0))
	f.Add([]byte{0, 40, 1, 1, 200, 2}, uint16(5), uint8(2), uint64(4), int64(100))     // flips in two segments, a torn tail, checkpoint inside 4
	f.Add([]byte{2, 0, 0, 0xff}, uint16(0), uint8(2), uint64(3), int64(32))            // the newest's header: removed
	f.Add([]byte{1, 20, 0, 1}, uint16(0), uint8(2), uint64(3), int64(1<<20))           // a middle header: skipped; checkpoint past 3's end
	f.Add([]byte{0, 90, 0, 0x80}, uint16(300), uint8(1), uint64(0), int64(0))          // garbage checkpoint
	f.Add([]byte{1, 60, 0, 3, 2, 100, 0, 4}, uint16(1), uint8(2), uint64(9), int64(0)) // checkpoint past every segment
	f.Add([]byte{}, uint16(0), uint8(2), uint64(2), int64(-5))                         // before every segment, negative offset
	f.Fuzz(func(t *testing.T, flips []byte, cut uint16, ckMode uint8, ckSeg uint64, ckOff int64) {
		dir := t.TempDir()
		segs := map[uint64][]byte{3: fzSegment(t, 30), 4: fzSegment(t, 30), 5: fzSegment(t, 30)}
		// Each 4 bytes: segment, offset (2 bytes), xor mask.
		for i := 0; i+4 <= len(flips) && i < 64; i += 4 {
			b := segs[3+uint64(flips[i]%3)]
			off := int(flips[i+1])<<8 | int(flips[i+2])
			if mask := flips[i+3]; mask != 0 {
				b[off%len(b)] ^= mask
			}
		}
		last := segs[5]
		segs[5] = last[:len(last)-int(cut)%len(last)]
		for id, b := range segs {
			if err := os.WriteFile(filepath.Join(dir, segName(id)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		switch ckMode % 3 {
		case 1:
			_ = os.WriteFile(filepath.Join(dir, "checkpoint"), []byte("not a checkpoint"), 0o600)
		case 2:
			_ = os.WriteFile(filepath.Join(dir, "checkpoint"), fzCheckpoint(pos{ckSeg % 10, ckOff}), 0o600)
		}
		before := fingerprint(t, dir)
		rep, err := Inspect(dir, ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sameFiles(t, before, fingerprint(t, dir))
		var torn int64
		for _, d := range rep.Damage {
			if d.Kind == DamageTornTail {
				torn += d.Bytes
			}
		}
		cfg := fzConfig(dir)
		s, err := Open(cfg, telemetry.TestSettings(), Links{Next: fzNext{}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got := testutil.ToFloat64(s.m.corruptBytes.WithLabelValues("truncated")); got != float64(torn) && got != float64(torn)+float64(sizeIfRemoved(rep)) {
			t.Fatalf("recovery truncated %v bytes, Inspect said %d (damage %+v)", got, torn, rep.Damage)
		}
		if b := s.Backlog(); b != rep.ReplayBytes {
			t.Fatalf("backlog at open %d bytes, Inspect said %d", b, rep.ReplayBytes)
		}
		c := &collector{}
		if err := start(t, s, Links{Next: c}); err != nil {
			t.Fatal(err)
		}
		c.waitAnswered(t, int64(rep.ReplayRecords))
		time.Sleep(20 * time.Millisecond)
		if got := len(c.values()); got != rep.ReplayRecords {
			t.Fatalf("the restart delivered %d records, Inspect said %d (damage %+v)", got, rep.ReplayRecords, rep.Damage)
		}
		_ = s.Shutdown(context.Background())
	})
}

// sizeIfRemoved is the size of the newest segment if Open removes it
// (counted as truncated bytes, all of it), else 0.
func sizeIfRemoved(rep *Report) int64 {
	for _, s := range rep.Segments {
		if s.State == StateRemoved {
			return s.Size
		}
	}
	return 0
}

// A replay holding a spool directory no agent has opened yet (no lock
// file, or no directory) must still keep an agent from starting on it:
// otherwise the agent locks a file of its own and appends dead letters the
// replay then renames over.
func TestHoldCreatesTheLockAnAgentWaitsOn(t *testing.T) {
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "state", "spool")} {
		release, err := Hold(dir)
		if err != nil {
			t.Fatal(err)
		}
		lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("%s: no lock file while held: %v", dir, err)
		}
		if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			t.Fatalf("%s: an agent could lock the spool while a replay holds it", dir)
		}
		release()
		if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatalf("%s: still held after release: %v", dir, err)
		}
		lf.Close()
		if fi, err := os.Stat(filepath.Join(dir, "lock")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: lock file %v, %v; want mode 0600", dir, fi.Mode(), err)
		}
	}
}
