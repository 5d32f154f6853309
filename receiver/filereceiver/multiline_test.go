package filereceiver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const javaTrace = "2026-11-25 10:00:00 ERROR boom\n" +
	"java.lang.IllegalStateException: x\n" +
	"\tat a.b.C.d(C.java:10)\n" +
	"\n" + // an empty line inside the event stays in it
	"\tat a.b.C.e(C.java:20)\n"

func mlConfig(t *testing.T, dir string) Config {
	cfg := testConfig(t, dir)
	cfg.Multiline = Multiline{StartPattern: `^\d{4}-\d{2}-\d{2} `, MaxLines: 500, FlushTimeout: 100 * time.Millisecond}
	return cfg
}

// TestMultilineStartPattern: a stack trace is one record, from its first
// line to the line before the next event, with its first line's offset;
// the last event is sent once the file is quiet for flush_timeout.
func TestMultilineStartPattern(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, javaTrace+"2026-11-25 10:00:01 INFO next\n")
	p := &pipe{}
	cfg := mlConfig(t, dir)
	cfg.Multiline.FlushTimeout = time.Hour
	r := start(t, cfg, p)
	eventually(t, "the trace", func() bool { return len(p.records()) == 1 })
	g := p.records()[0]
	if g.value != strings.TrimSuffix(javaTrace, "\n") || g.off != 0 || g.cont {
		t.Fatalf("trace record: %+v", g)
	}
	// The second event waits: its next line may belong to it.
	time.Sleep(10 * cfg.PollInterval)
	if n := len(p.records()); n != 1 {
		t.Fatalf("%d records before the second event was ended", n)
	}
	write(t, path, "  continued\n2026-11-25 10:00:02 INFO third\n")
	eventually(t, "the second event", func() bool { return len(p.records()) == 2 })
	if g := p.records()[1]; g.value != "2026-11-25 10:00:01 INFO next\n  continued" || g.off != int64(len(javaTrace)) {
		t.Fatalf("second event: %+v", g)
	}
	// The committed offset is the third event's first byte: never inside
	// an event, so a restart sends it whole.
	third := int64(len(javaTrace) + len("2026-11-25 10:00:01 INFO next\n  continued\n"))
	eventually(t, "the checkpoint", func() bool { return savedOffset(t, cfg.CheckpointDir, path) == third })
	abandon(r)
	p2 := &pipe{}
	cfg.Multiline.FlushTimeout = 50 * time.Millisecond
	start(t, cfg, p2)
	eventually(t, "the flushed third event", func() bool { return len(p2.records()) == 1 })
	if g := p2.records()[0]; g.value != "2026-11-25 10:00:02 INFO third" || g.off != third {
		t.Fatalf("after restart: %+v", g)
	}
}

// TestMultilineContinuePattern: indented lines join the line before.
func TestMultilineContinuePattern(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "app.log"), "first\n  a\n  b\nsecond\nthird\n  c\n")
	cfg := testConfig(t, dir)
	cfg.Multiline = Multiline{ContinuePattern: `^\s`, MaxLines: 10, FlushTimeout: 20 * time.Millisecond}
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "three events", func() bool { return len(p.records()) == 3 })
	if got := fmt.Sprintf("%q", p.values()); got != `["first\n  a\n  b" "second" "third\n  c"]` {
		t.Fatalf("got %s", got)
	}
}

// TestMultilineCut: a group of more than max_lines (or max_line_bytes) is
// cut, the cut records marked continued and counted; nothing is lost.
func TestMultilineCut(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("2026-11-25 start\n")
	for i := 0; i < 7; i++ {
		fmt.Fprintf(&b, "  frame %d\n", i)
	}
	b.WriteString("2026-11-25 end\n")
	write(t, filepath.Join(dir, "app.log"), b.String())
	cfg := mlConfig(t, dir)
	cfg.Multiline.MaxLines = 3
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "four records", func() bool { return len(p.records()) == 4 })
	got := p.records()
	want := []struct {
		v    string
		cont bool
	}{{"2026-11-25 start\n  frame 0\n  frame 1", true}, {"  frame 2\n  frame 3\n  frame 4", true}, {"  frame 5\n  frame 6", false}, {"2026-11-25 end", false}}
	for i, w := range want {
		if got[i].value != w.v || got[i].cont != w.cont {
			t.Errorf("record %d: %+v, want %q cont=%v", i, got[i], w.v, w.cont)
		}
	}
	if n := testutil.ToFloat64(r.m.Errors("multiline_cut")); n != 2 {
		t.Fatalf("multiline_cut counted %v, want 2", n)
	}

	// By bytes: max_line_bytes 32 holds the start line and one frame.
	dir = t.TempDir()
	write(t, filepath.Join(dir, "app.log"), "2026-11-25 s\n  0123456789\n  0123456789\n2026-11-25 e\n")
	cfg = mlConfig(t, dir)
	cfg.MaxLineBytes = 32
	p = &pipe{}
	start(t, cfg, p)
	eventually(t, "three records", func() bool { return len(p.records()) == 3 })
	if got := fmt.Sprintf("%q", p.values()); got != `["2026-11-25 s\n  0123456789" "  0123456789" "2026-11-25 e"]` {
		t.Fatalf("by bytes: %s", got)
	}
}

// TestMultilineRotation: an event at the end of a file renamed away is
// sent when the file is let go, before the new file's lines.
func TestMultilineRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "2026-11-25 a\n  a1\n2026-11-25 b\n  b1\n")
	cfg := mlConfig(t, dir)
	cfg.Multiline.FlushTimeout = time.Hour
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "event a", func() bool { return len(p.records()) == 1 })
	if err := os.Rename(path, filepath.Join(dir, "app.log.1")); err != nil {
		t.Fatal(err)
	}
	write(t, path, "2026-11-25 c\n2026-11-25 d\n")
	eventually(t, "events b and c", func() bool { return len(p.records()) == 3 })
	if got := fmt.Sprintf("%q", p.values()); got != `["2026-11-25 a\n  a1" "2026-11-25 b\n  b1" "2026-11-25 c"]` {
		t.Fatalf("got %s", got)
	}
}

// TestGroup: group alone, at the edges of a read.
func TestGroup(t *testing.T) {
	m := newMultiline(Multiline{StartPattern: "^S", MaxLines: 100})
	buf := []byte("x\nS1\n c\nS2\n d\n")
	lines, consumed, _, _ := frame(buf, 64, 100, false, false, nil)
	recs, next, held, cut := m.group(buf, lines, consumed, 64, false, false, false)
	// "x" before any start line is an event of its own; S2's may grow.
	if len(recs) != 2 || string(buf[recs[1].start:recs[1].end]) != "S1\n c" || !held || next != 8 || cut != 0 {
		t.Fatalf("recs %v next %d held %v", recs, next, held)
	}
	// stuck: one group fills the read and cannot be held.
	recs, next, held, cut = m.group(buf[8:], mustFrame(buf[8:]), len(buf)-8, 64, false, false, true)
	if len(recs) != 1 || held || next != len(buf)-8 || cut != 1 || !recs[0].cont {
		t.Fatalf("stuck: %v %d %v %d", recs, next, held, cut)
	}
	// A long line's pieces are records of their own and end a group.
	buf = []byte("S1\n0123456789\nS2\n")
	lines, consumed, _, _ = frame(buf, 4, 100, false, false, nil)
	recs, _, held, _ = m.group(buf, lines, consumed, 4, false, false, false)
	var vals []string
	for _, l := range recs {
		vals = append(vals, string(buf[l.start:l.end]))
	}
	if fmt.Sprint(vals) != "[S1 0123 4567 89]" || !held {
		t.Fatalf("pieces: %q held %v", vals, held)
	}
}

func mustFrame(buf []byte) []lineRef {
	l, _, _, _ := frame(buf, 64, 100, false, false, nil)
	return l
}
