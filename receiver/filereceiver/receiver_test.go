package filereceiver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// got is one record as the pipeline received it.
type got struct {
	topic, key, path, value string
	off                     int64
	cont                    bool
}

// pipe stands in for the pipeline: it keeps a copy of every record, and
// acknowledges each batch at once (in Consume, as the spool without fsync
// does), or holds it until release, or refuses every batch with refuse.
type pipe struct {
	mu      sync.Mutex
	got     []got
	held    []*record.Batch
	hold    bool
	refuse  error
	refused int
	fail    error // acknowledge every record with it
	// Called for every record, under mu.
	onRecord  func(key []byte, ts time.Time)
	onHeaders func(map[string]string)
}

func (p *pipe) Consume(_ context.Context, b *record.Batch) error {
	p.mu.Lock()
	if p.refuse != nil {
		p.refused++
		p.mu.Unlock()
		return p.refuse
	}
	for _, r := range b.Records {
		g := got{topic: r.Topic, key: string(r.Key), value: string(r.Value)}
		for _, h := range r.Headers {
			switch h.Key {
			case HeaderPath:
				g.path = string(h.Value)
			case HeaderOffset:
				g.off, _ = strconv.ParseInt(string(h.Value), 10, 64)
			case HeaderContinued:
				g.cont = string(h.Value) == "true"
			}
		}
		p.got = append(p.got, g)
		if p.onRecord != nil {
			p.onRecord(r.Key, r.Timestamp)
		}
		if p.onHeaders != nil {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			p.onHeaders(h)
		}
	}
	b.Arm()
	if p.hold {
		p.held = append(p.held, b)
		p.mu.Unlock()
		return nil
	}
	fail := p.fail
	p.mu.Unlock()
	for i := range b.Records {
		b.AckAt(i, fail)
	}
	return nil
}

// release acknowledges held batch i (in arrival order) with err.
func (p *pipe) release(i int, err error) {
	p.mu.Lock()
	b := p.held[i]
	p.held[i] = nil
	p.mu.Unlock()
	for j := range b.Records {
		b.AckAt(j, err)
	}
}

// releaseAll stops holding and acknowledges every batch still held.
func (p *pipe) releaseAll() {
	p.mu.Lock()
	p.hold = false
	held := p.held
	p.mu.Unlock()
	for i, b := range held {
		if b != nil {
			p.release(i, nil)
		}
	}
}

func (p *pipe) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

func (p *pipe) records() []got {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]got(nil), p.got...)
}

func (p *pipe) values() []string {
	var out []string
	for _, g := range p.records() {
		out = append(out, g.value)
	}
	return out
}

func (p *pipe) set(fn func(p *pipe)) {
	p.mu.Lock()
	fn(p)
	p.mu.Unlock()
}

func testConfig(t *testing.T, dir string) Config {
	return Config{Enabled: true, Include: []string{filepath.Join(dir, "*.log")}, PollInterval: 10 * time.Millisecond,
		StartAt: "beginning", MaxOpenFiles: 16, MaxLineBytes: 1024, Topic: "logs", Key: "{file.path}", Encoding: "utf-8", Compression: "none",
		FingerprintBytes: 1000, CheckpointDir: filepath.Join(t.TempDir(), "ckpt"), RotateWait: 50 * time.Millisecond,
		MaxInflightBytes: 32 << 20, MaxFileInflightBytes: 4 << 20}
}

func start(t *testing.T, cfg Config, next consumer.Consumer) *Receiver {
	t.Helper()
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: next})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Batches a test left held are never acknowledged: stop anyway.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = r.Shutdown(ctx)
	})
	return r
}

// abandon stops r as a kill -9 would: no wait, no last checkpoint.
func abandon(r *Receiver) {
	r.abandoned = true
	_ = r.Shutdown(context.Background())
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func write(t *testing.T, path string, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// savedOffset is the checkpoint's committed offset for path (-1: none).
func savedOffset(t *testing.T, dir, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil {
		return -1
	}
	var doc checkpointDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	for _, e := range doc.Files {
		if e.Path == path {
			return e.Offset
		}
	}
	return -1
}

// TestLinesWithHeaders: one record per line, with its path and offset;
// "\r\n" ends a line too, empty lines are not sent, a partial last line
// waits for its end.
func TestLinesWithHeaders(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "a\nb\r\n\nccc\ndd")
	p := &pipe{}
	cfg := testConfig(t, dir)
	r := start(t, cfg, p)
	eventually(t, "three lines", func() bool { return len(p.records()) == 3 })
	want := []got{
		{topic: "logs", key: strings.TrimLeft(path, "/"), path: path, value: "a", off: 0},
		{topic: "logs", key: strings.TrimLeft(path, "/"), path: path, value: "b", off: 2},
		{topic: "logs", key: strings.TrimLeft(path, "/"), path: path, value: "ccc", off: 6},
	}
	if got := p.records(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	write(t, path, "d\n")
	eventually(t, "the completed line", func() bool { return len(p.records()) == 4 })
	if g := p.records()[3]; g.value != "ddd" || g.off != 10 {
		t.Fatalf("completed line: %+v", g)
	}
	eventually(t, "no lag", func() bool { return testutil.ToFloat64(r.fm.lag.WithLabelValues(cfg.Include[0])) == 0 })
	if n, b := testutil.ToFloat64(r.fm.lines.WithLabelValues(cfg.Include[0])), testutil.ToFloat64(r.fm.bytes.WithLabelValues(cfg.Include[0])); n != 4 || b != float64(4*len(strings.TrimLeft(path, "/"))+1+1+3+3) {
		t.Fatalf("lines %v bytes %v by group", n, b)
	}
}

// TestTopicTemplate: {file.name} makes a valid topic of the file's name.
func TestTopicTemplate(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "my app.log"), "x\n")
	cfg := testConfig(t, dir)
	cfg.Topic, cfg.Key = "files-{file.name}", ""
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "the line", func() bool { return len(p.records()) == 1 })
	if g := p.records()[0]; g.topic != "files-my_app.log" || g.key != "" {
		t.Fatalf("%+v", g)
	}
}

// TestStartAtEnd: at the first start, a file already there is read from
// its end; a file that appears later from its start.
func TestStartAtEnd(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.log")
	write(t, old, "before-1\nbefore-2\n")
	cfg := testConfig(t, dir)
	cfg.StartAt = "end"
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the first poll", func() bool { return testutil.ToFloat64(r.fm.checkpoints) > 0 })
	write(t, old, "after-1\n")
	write(t, filepath.Join(dir, "new.log"), "new-1\n")
	eventually(t, "two lines", func() bool { return len(p.records()) == 2 })
	got := p.values()
	if !(got[0] == "after-1" && got[1] == "new-1" || got[0] == "new-1" && got[1] == "after-1") {
		t.Fatalf("got %q", got)
	}
}

// TestLongLineSplit: a line longer than max_line_bytes arrives as pieces
// of that size, all but the last marked continued, counted once.
func TestLongLineSplit(t *testing.T) {
	dir := t.TempDir()
	line := strings.Repeat("0123456789", 4) // 40 bytes
	write(t, filepath.Join(dir, "a.log"), "short\n"+line+"\r\nafter\n")
	cfg := testConfig(t, dir)
	cfg.MaxLineBytes = 16
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "five records", func() bool { return len(p.records()) == 5 })
	want := []struct {
		v    string
		off  int64
		cont bool
	}{{"short", 0, false}, {line[:16], 6, true}, {line[16:32], 22, true}, {line[32:], 38, false}, {"after", 48, false}}
	for i, g := range p.records() {
		if g.value != want[i].v || g.off != want[i].off || g.cont != want[i].cont {
			t.Errorf("record %d: %+v, want %+v", i, g, want[i])
		}
	}
	if n := testutil.ToFloat64(r.m.Errors("line_too_long")); n != 1 {
		t.Fatalf("line_too_long counted %v times", n)
	}
}

// TestFrameSplitsAcrossReads: frame alone, a long line over two reads.
func TestFrameSplitsAcrossReads(t *testing.T) {
	lines, consumed, long, split := frame([]byte("abcdefghij"), 4, 100, false, false, nil)
	if len(lines) != 2 || consumed != 8 || !long || split != 1 || !lines[0].cont || !lines[1].cont {
		t.Fatalf("first read: %v %d %v %d", lines, consumed, long, split)
	}
	// The next read starts where the pieces ended; the line's last piece
	// is not continued.
	lines, consumed, long, split = frame([]byte("ij\nk\n"), 4, 100, false, true, nil)
	if len(lines) != 2 || consumed != 5 || long || split != 0 || lines[0].cont || lines[0].end != 2 {
		t.Fatalf("second read: %v %d %v %d", lines, consumed, long, split)
	}
	// A line of exactly max_line_bytes is not split.
	lines, _, long, split = frame([]byte("abcd\r\n"), 4, 100, false, false, nil)
	if len(lines) != 1 || lines[0].end != 4 || long || split != 0 {
		t.Fatalf("exact line: %v", lines)
	}
	// final: the unterminated rest is a line.
	lines, consumed, _, _ = frame([]byte("ab\ncd"), 4, 100, true, false, nil)
	if len(lines) != 2 || consumed != 5 {
		t.Fatalf("final: %v %d", lines, consumed)
	}
}

// TestLatin1: latin-1 lines arrive as UTF-8.
func TestLatin1(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.log"), "caf\xe9\nna\xefve\n")
	cfg := testConfig(t, dir)
	cfg.Encoding = "latin-1"
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "two lines", func() bool { return len(p.records()) == 2 })
	if got := p.values(); got[0] != "café" || got[1] != "naïve" {
		t.Fatalf("got %q", got)
	}
}

// seqs parses "<prefix>-<n>" values and reports duplicates and gaps.
func checkExactlyOnce(t *testing.T, values []string, n int) {
	t.Helper()
	seen := make([]int, n)
	for _, v := range values {
		i, err := strconv.Atoi(v[strings.LastIndexByte(v, '-')+1:])
		if err != nil || i < 0 || i >= n {
			t.Fatalf("unexpected value %q", v)
		}
		seen[i]++
	}
	var bad []string
	for i, c := range seen {
		if c != 1 {
			bad = append(bad, fmt.Sprintf("%d×%d", i, c))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d lines not exactly once: %v", len(bad), bad[:min(len(bad), 20)])
	}
}

// TestRotationRenameCreate: a writer renames its file away and creates a
// new one under the same name, again and again while writing; every line
// arrives exactly once, in order within the path.
func TestRotationRenameCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	const n, perFile = 3000, 500
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	firstLine := 0 // the current file's
	for i := 0; i < n; i++ {
		if i > 0 && i%perFile == 0 {
			// The file must be seen by a poll before it leaves the glob (a
			// documented limit): wait until a line of it was read rather
			// than for a few poll intervals, which a loaded machine (a
			// fsync'd checkpoint per new file) can outlast.
			want := fmt.Sprintf("line-%d", firstLine)
			eventually(t, want, func() bool {
				for _, rec := range sink.Records() {
					if string(rec.Value) == want {
						return true
					}
				}
				return false
			})
			if err := os.Rename(path, fmt.Sprintf("%s.%d", path, i/perFile)); err != nil {
				t.Fatal(err)
			}
			// The old writer still has a line to write after the rename.
			fmt.Fprintf(f, "line-%d\n", i)
			f.Close()
			i++
			if f, err = os.Create(path); err != nil {
				t.Fatal(err)
			}
			firstLine = i
		}
		fmt.Fprintf(f, "line-%d\n", i)
		if i%50 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	f.Close()
	eventually(t, "every line", func() bool { return len(sink.Records()) >= n })
	var values []string
	last := map[string]int{}
	for _, rec := range sink.Records() {
		values = append(values, string(rec.Value))
		i, _ := strconv.Atoi(strings.TrimPrefix(string(rec.Value), "line-"))
		if prev, ok := last[string(rec.Key)]; ok && i < prev {
			t.Errorf("line %d after line %d under one key", i, prev)
		}
		last[string(rec.Key)] = i
	}
	checkExactlyOnce(t, values, n)
	if got := testutil.ToFloat64(r.fm.rotations.WithLabelValues(path)); got != n/perFile-1 {
		t.Errorf("rotations counted: %v, want %d", got, n/perFile-1)
	}
	eventually(t, "the rotated files let go", func() bool { return testutil.ToFloat64(r.fm.open) == 1 })
}

// TestRotationKeepsOrder: the new file under a rotated path waits until
// the old one has no unread bytes, even while the old one waits for
// acknowledgements, so the path's lines reach Kafka in order.
func TestRotationKeepsOrder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	const n = 10000
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "line-%d\n", i)
	}
	write(t, path, b.String())
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	cfg.MaxFileInflightBytes = 2 * 260 << 10
	p := &pipe{hold: true}
	r := start(t, cfg, p)
	eventually(t, "a held batch", func() bool { return p.heldCount() == 1 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path, fmt.Sprintf("line-%d\n", n))
	eventually(t, "the rotation", func() bool { return testutil.ToFloat64(r.fm.rotations.WithLabelValues(path)) == 1 })
	time.Sleep(5 * cfg.PollInterval)
	for i := 0; len(p.records()) < n+1; i++ {
		eventually(t, fmt.Sprintf("batch %d", i), func() bool { return p.heldCount() > i })
		p.release(i, nil)
	}
	p.releaseAll()
	got := p.values()
	checkExactlyOnce(t, got, n+1)
	if got[n] != fmt.Sprintf("line-%d", n) {
		t.Fatalf("the new file's line came before the old file's end: last is %q", got[n])
	}
}

// TestRenameWithinGlobs: a file renamed to a name the globs also match
// keeps its identity and position: nothing is read twice.
func TestRenameWithinGlobs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "line-0\nline-1\n")
	cfg := testConfig(t, dir)
	cfg.Include = []string{filepath.Join(dir, "app.log*")}
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the lines", func() bool { return len(p.records()) == 2 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path+".1", "line-2\n")
	write(t, path, "line-3\n")
	eventually(t, "the new lines", func() bool { return len(p.records()) == 4 })
	time.Sleep(5 * cfg.PollInterval)
	checkExactlyOnce(t, p.values(), 4)
	if got := testutil.ToFloat64(r.fm.rotations.WithLabelValues(cfg.Include[0])); got != 1 {
		t.Fatalf("rotations: %v", got)
	}
}

// TestRotatedWhileStopped: a file rotated away (out of the globs) while
// ferry was stopped is found by its inode beside its old path and read
// from its checkpoint to its end; the new file from its start.
func TestRotatedWhileStopped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "line-0\nline-1\n")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the lines", func() bool { return len(p.records()) == 2 })
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	write(t, path, "line-2\n")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path, "line-3\n")
	r = start(t, cfg, p)
	eventually(t, "the lines of both", func() bool { return len(p.records()) == 4 })
	time.Sleep(5 * cfg.PollInterval)
	checkExactlyOnce(t, p.values(), 4)
	eventually(t, "the rotated file let go", func() bool { return testutil.ToFloat64(r.fm.open) == 1 })
}

// TestCopyTruncate: the file is copied away and truncated in place; the
// lines written after the truncation arrive, the truncation is counted and
// the lines before it are not sent again.
func TestCopyTruncate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "first-0000000000-0\nfirst-0000000000-1\nfirst-0000000000-2\n")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the first lines", func() bool { return len(p.records()) == 3 })
	data, _ := os.ReadFile(path)
	_ = os.WriteFile(path+".1", data, 0o600)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the truncation", func() bool { return testutil.ToFloat64(r.fm.truncations.WithLabelValues(path)) == 1 })
	write(t, path, "after-3\nafter-4\n")
	eventually(t, "the new lines", func() bool { return len(p.records()) == 5 })
	got := p.records()
	if got[3].value != "after-3" || got[3].off != 0 || got[4].value != "after-4" || got[4].off != 8 {
		t.Fatalf("after the truncation: %+v", got[3:])
	}
	checkExactlyOnce(t, p.values(), 5)
}

// TestReplacedFile: a new file renamed over the old name is a new file,
// read from its start; the old one is not read again.
func TestReplacedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "old-0\nold-1\n")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path}
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "the old lines", func() bool { return len(p.records()) == 2 })
	tmp := filepath.Join(dir, "next.tmp")
	write(t, tmp, "new-2\nnew-3\nnew-4\n")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new lines", func() bool { return len(p.records()) == 5 })
	checkExactlyOnce(t, p.values(), 5)
	if g := p.records()[2]; g.value != "new-2" || g.off != 0 {
		t.Fatalf("%+v", g)
	}
	eventually(t, "the old file let go", func() bool { return testutil.ToFloat64(r.fm.watched.WithLabelValues(path)) == 1 })
}

// TestDeletedWhileOpen: a file deleted with lines not yet read (reading
// waits for acknowledgements at max_file_inflight_bytes) is read to its
// end through the descriptor still open, then let go.
func TestDeletedWhileOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	const n = 20000
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s-%d\n", strings.Repeat("x", 90), i)
	}
	write(t, path, b.String())
	cfg := testConfig(t, dir)
	cfg.MaxFileInflightBytes = 2 * 268 << 10
	p := &pipe{hold: true}
	r := start(t, cfg, p)
	eventually(t, "a held batch", func() bool { return p.heldCount() == 1 })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(p.records()) < n; i++ {
		eventually(t, fmt.Sprintf("batch %d", i), func() bool { return p.heldCount() > i })
		p.release(i, nil)
	}
	p.releaseAll()
	checkExactlyOnce(t, p.values(), n)
	eventually(t, "the deleted file let go", func() bool {
		return testutil.ToFloat64(r.fm.open) == 0 && testutil.ToFloat64(r.fm.watched.WithLabelValues(cfg.Include[0])) == 0
	})
}

// TestManyFilesFewDescriptors: with max_open_files 1, files take turns
// with the one descriptor and every line of each arrives.
func TestManyFilesFewDescriptors(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.MaxOpenFiles = 1
	p := &pipe{}
	r := start(t, cfg, p)
	for round := 0; round < 3; round++ {
		for f := 0; f < 4; f++ {
			write(t, filepath.Join(dir, fmt.Sprintf("f%d.log", f)), fmt.Sprintf("line-%d\n", round*4+f))
		}
		eventually(t, "the round's lines", func() bool { return len(p.records()) == (round+1)*4 })
		if o := testutil.ToFloat64(r.fm.open); o > 1 {
			t.Fatalf("%v files open", o)
		}
	}
	checkExactlyOnce(t, p.values(), 12)
}

// TestCheckpointOnlyPastAcknowledged: the committed offset passes a line
// only when it and every line before it are acknowledged. A stop without
// the acknowledgements, and a crash, both read the unacknowledged lines
// again and the acknowledged prefix not.
func TestCheckpointOnlyPastAcknowledged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	ckpt := cfg.CheckpointDir

	// Three batches, one line each; the second and third acknowledged,
	// the first not: nothing may be committed.
	p := &pipe{hold: true}
	r := start(t, cfg, p)
	for i := 0; i < 3; i++ {
		write(t, path, fmt.Sprintf("line-%d\n", i))
		eventually(t, "a batch", func() bool { return p.heldCount() == i+1 })
	}
	p.release(1, nil)
	p.release(2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := r.Shutdown(ctx)
	cancel()
	if err == nil {
		t.Fatal("Shutdown with a batch unacknowledged returned nil")
	}
	if off := savedOffset(t, ckpt, path); off != 0 {
		t.Fatalf("committed %d with line 0 unacknowledged", off)
	}
	p.release(0, nil) // Kafka answers after the stop: too late to count

	// Restart: all three again, in one batch; a fourth line in a second.
	// The first batch acknowledged, then a crash (kill -9) once the
	// periodic checkpoint has it: only the fourth line comes again.
	p = &pipe{hold: true}
	r = start(t, cfg, p)
	eventually(t, "the lines again", func() bool { return len(p.records()) == 3 })
	if got := p.values(); fmt.Sprint(got) != "[line-0 line-1 line-2]" {
		t.Fatalf("after restart: %q", got)
	}
	write(t, path, "line-3\n")
	eventually(t, "a second batch", func() bool { return p.heldCount() == 2 })
	p.release(0, nil)
	eventually(t, "the checkpoint", func() bool { return savedOffset(t, ckpt, path) == 21 })
	abandon(r)

	p = &pipe{}
	start(t, cfg, p)
	eventually(t, "the unacknowledged line", func() bool { return len(p.records()) == 1 })
	time.Sleep(5 * cfg.PollInterval)
	if got := p.records(); len(got) != 1 || got[0].value != "line-3" || got[0].off != 21 {
		t.Fatalf("after the crash: %+v", got)
	}
}

// TestRetryableRefusal: while the pipeline refuses (queue full), the same
// lines are offered again, nothing else of the file is read, and nothing
// is lost; while acknowledgements are held, reading stops at
// max_file_inflight_bytes.
func TestRetryableRefusal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	const n = 30000
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "line-%d\n", i)
	}
	write(t, path, b.String())
	cfg := testConfig(t, dir)
	cfg.MaxFileInflightBytes = 2 * 260 << 10
	p := &pipe{refuse: consumer.ErrFull}
	r := start(t, cfg, p)
	eventually(t, "refusals", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.refused >= 5 })
	r.mu.Lock()
	held := r.inflight
	r.mu.Unlock()
	if held > int64(cfg.MaxFileInflightBytes)+int64(maxBatchRecords)*(record.Overhead+200) {
		t.Fatalf("%d bytes held while refused", held)
	}
	if testutil.ToFloat64(r.m.Errors("queue_full")) < 5 {
		t.Fatal("refusals not counted")
	}
	// Accept, but hold the acknowledgements: reading stops at the bound.
	p.set(func(p *pipe) { p.refuse, p.hold = nil, true })
	eventually(t, "held batches", func() bool { return p.heldCount() >= 1 })
	time.Sleep(10 * cfg.PollInterval)
	p.mu.Lock()
	var mem int64
	for _, hb := range p.held {
		mem += hb.MemBytes
	}
	nheld := len(p.held)
	p.mu.Unlock()
	if limit := int64(cfg.MaxFileInflightBytes) + int64(maxBatchRecords)*(record.Overhead+200) + int64(cfg.chunkBytes()); mem > limit {
		t.Fatalf("%d batches hold %d bytes, over %d", nheld, mem, limit)
	}
	if len(p.records()) >= n {
		t.Fatal("the whole file was read while nothing was acknowledged")
	}
	p.releaseAll()
	eventually(t, "every line", func() bool { return len(p.records()) >= n })
	checkExactlyOnce(t, p.values(), n)
}

// TestPermanentFailureSkipped: lines refused for good are counted as
// dropped and the offset moves past them.
func TestPermanentFailureSkipped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "a\nb\n")
	cfg := testConfig(t, dir)
	p := &pipe{fail: consumer.TooLarge("record", 10, 5, nil)}
	r := start(t, cfg, p)
	eventually(t, "the lines", func() bool { return len(p.records()) == 2 })
	eventually(t, "the drops counted", func() bool {
		return testutil.ToFloat64(r.fm.dropped.WithLabelValues("record_too_large")) == 2
	})
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if off := savedOffset(t, cfg.CheckpointDir, path); off != 4 {
		t.Fatalf("committed %d, want 4 (past the skipped lines)", off)
	}
}

// TestRetryableFailureAfterAcceptance: a line the pipeline took and then
// failed retryably is read again, with the lines after it, in order.
func TestRetryableFailureAfterAcceptance(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	p := &pipe{hold: true}
	start(t, testConfig(t, dir), p)
	write(t, path, "line-0\n")
	eventually(t, "a batch", func() bool { return p.heldCount() == 1 })
	write(t, path, "line-1\n")
	eventually(t, "a second batch", func() bool { return p.heldCount() == 2 })
	p.set(func(p *pipe) { p.hold = false })
	p.release(1, nil)
	p.release(0, consumer.ErrFull)
	eventually(t, "the lines again", func() bool { return len(p.records()) == 4 })
	if got := p.values(); fmt.Sprint(got) != "[line-0 line-1 line-0 line-1]" {
		t.Fatalf("got %q", got)
	}
}

// TestCheckpointDirInUse: two agents cannot share a checkpoint directory.
func TestCheckpointDirInUse(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	start(t, cfg, &pipe{})
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &pipe{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "checkpoint_dir") {
		t.Fatalf("second Start: %v", err)
	}
	_ = r.Shutdown(context.Background())
}

// TestDamagedCheckpoint: a checkpoint that cannot be read is kept aside
// and every file read from its start (duplicates, not loss).
func TestDamagedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.log"), "a-0\n")
	cfg := testConfig(t, dir)
	cfg.StartAt = "end"
	_ = os.MkdirAll(cfg.CheckpointDir, 0o700)
	_ = os.WriteFile(filepath.Join(cfg.CheckpointDir, checkpointName), []byte("{torn"), 0o600)
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "the line", func() bool { return len(p.records()) == 1 })
	if _, err := os.Stat(filepath.Join(cfg.CheckpointDir, checkpointName+".bad")); err != nil {
		t.Fatal(err)
	}
}

// TestCheckErrors: every invalid key is reported at once, by name.
func TestCheckErrors(t *testing.T) {
	c := Config{Enabled: true, Include: []string{"[bad"}, Exclude: []string{""}, PollInterval: time.Millisecond,
		StartAt: "middle", MaxOpenFiles: 0, MaxLineBytes: 1 << 20, Topic: "a b", Key: "{nope}", Encoding: "utf-16",
		ReadRateBytes: 10, FingerprintBytes: 1, RotateWait: -1, MaxInflightBytes: 1 << 20, MaxFileInflightBytes: 1 << 20,
		Compression: "zip", Headers: map[string]string{"ferry.x": "{nope}"}, JSON: JSONLines{Enabled: true, TimestampFormat: "iso"},
		Multiline: Multiline{StartPattern: "(", ContinuePattern: "x", MaxLines: 1, FlushTimeout: time.Microsecond}}
	errs := c.Check(receiver.Bounds{MemoryLimit: 1 << 20, MaxRecordBytes: 1 << 20})
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	text := strings.Join(all, "\n")
	for _, key := range []string{"include:", "exclude:", "poll_interval:", "start_at:", "max_open_files:", "max_line_bytes:",
		"topic:", "key:", "encoding:", "read_rate_bytes:", "fingerprint_bytes:", "checkpoint_dir:", "rotate_wait:",
		"max_inflight_bytes:", "max_file_inflight_bytes:", "compression:", `headers: "ferry.x"`, "headers.ferry.x:",
		"json: enabled with neither", "json.timestamp_format:", "both set", "multiline.start_pattern:", "multiline.max_lines:",
		"multiline.flush_timeout:"} {
		if !strings.Contains(text, key) {
			t.Errorf("no error names %s:\n%s", key, text)
		}
	}
	if _, err := New(c, receiver.Env{Set: telemetry.TestSettings()}); err == nil {
		t.Fatal("New accepted an invalid configuration")
	}
	if errs := (&Config{}).Check(receiver.Bounds{}); errs != nil {
		t.Fatalf("a disabled section: %v", errs)
	}
	ok := testConfig(t, t.TempDir())
	if errs := ok.Check(receiver.Bounds{MemoryLimit: 256 << 20, MaxRecordBytes: 1000000}); errs != nil {
		t.Fatalf("a valid section: %v", errs)
	}
	// latin-1 doubles a line's bytes above 0x7F: 600 KB lines fit a 1 MB
	// record, but not once converted.
	ok.MaxLineBytes = 600000
	if errs := ok.Check(receiver.Bounds{MemoryLimit: 256 << 20, MaxRecordBytes: 1000000}); errs != nil {
		t.Fatalf("utf-8: %v", errs)
	}
	ok.MaxFileInflightBytes = 2 << 20
	ok.Encoding = "latin-1"
	if errs := ok.Check(receiver.Bounds{MemoryLimit: 256 << 20, MaxRecordBytes: 1000000}); len(errs) != 1 || !strings.Contains(errs[0].Error(), "latin-1") {
		t.Fatalf("latin-1: %v", errs)
	}
}

// TestReadRate: read_rate_bytes is kept on average: a read may overdraw
// it, and reading waits until the overdraft is paid back.
func TestReadRate(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.ReadRateBytes = 1024
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if !r.rateOK(now) {
		t.Fatal("no second's worth to start with")
	}
	r.tokens -= 3 * 1024 // a read of 3 KiB
	if r.rateOK(now.Add(time.Second)) {
		t.Fatal("read again 1 s after a 3 KiB read at 1 KiB/s")
	}
	r.nextScan = now.Add(time.Hour)
	if d := r.sleep(now.Add(time.Second)); d < 900*time.Millisecond || d > 1100*time.Millisecond {
		t.Fatalf("sleeps %s for the overdraft's last KiB", d)
	}
	if !r.rateOK(now.Add(2*time.Second + time.Millisecond)) {
		t.Fatal("still waiting once the overdraft is paid")
	}
}

// TestReload: any change needs a restart (it resumes at the checkpoint).
func TestReload(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings()})
	if err != nil {
		t.Fatal(err)
	}
	same := cfg
	if r.Reload(&same) {
		t.Fatal("the same configuration asks for a restart")
	}
	other := cfg
	other.Include = []string{"/elsewhere/*.log"}
	if !r.Reload(&other) {
		t.Fatal("new include globs do not ask for a restart")
	}
	if got := fmt.Sprint(r.Listening()); !strings.Contains(got, cfg.Include[0]) {
		t.Fatalf("Listening: %s", got)
	}
}

// TestDeletedFileKeptUntilAcknowledged: a deleted file read to its end is
// not let go while its lines are in flight: one that fails retryably after
// it was taken is read again through the descriptor still open.
func TestDeletedFileKeptUntilAcknowledged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "line-0\n")
	cfg := testConfig(t, dir)
	p := &pipe{hold: true}
	r := start(t, cfg, p)
	eventually(t, "a held batch", func() bool { return p.heldCount() == 1 })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion", func() bool { return testutil.ToFloat64(r.fm.rotations.WithLabelValues(cfg.Include[0])) == 1 })
	time.Sleep(3 * cfg.RotateWait)
	p.release(0, consumer.ErrShutdownTimeout)
	eventually(t, "the line again", func() bool { return p.heldCount() == 2 })
	p.release(1, nil)
	if got := p.values(); fmt.Sprint(got) != "[line-0 line-0]" {
		t.Fatalf("got %q", got)
	}
	eventually(t, "the file let go", func() bool { return testutil.ToFloat64(r.fm.open) == 0 })
}

// TestExclude: a file the include globs match and an exclude glob too is
// not read.
func TestExclude(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "app.log"), "kept-0\n")
	write(t, filepath.Join(dir, "debug-skip.log"), "skipped\n")
	cfg := testConfig(t, dir)
	cfg.Exclude = []string{filepath.Join(dir, "*skip*")}
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "the kept line", func() bool { return len(p.records()) == 1 })
	time.Sleep(5 * cfg.PollInterval)
	if got := p.values(); fmt.Sprint(got) != "[kept-0]" {
		t.Fatalf("got %q", got)
	}
}

// TestRefusedForGoodAtHandOff: a batch the pipeline refuses for good when
// it is handed on (a topic Kafka does not have) is counted and skipped,
// and the offset moves past it.
func TestRefusedForGoodAtHandOff(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "a\nb\n")
	cfg := testConfig(t, dir)
	p := &pipe{refuse: consumer.UnknownTopic("logs", nil)}
	r := start(t, cfg, p)
	eventually(t, "the drops counted", func() bool {
		return testutil.ToFloat64(r.fm.dropped.WithLabelValues("unknown_topic")) == 2
	})
	p.set(func(p *pipe) { p.refuse = nil })
	write(t, path, "c\n")
	eventually(t, "the next line", func() bool { return len(p.records()) == 1 })
	if got := p.values(); got[0] != "c" {
		t.Fatalf("got %q", got)
	}
}

// TestWholeBatchFailures: a batch completed with one error for all its
// records (as the spool does) is read again when the error is retryable,
// and counted and skipped when it is permanent.
func TestWholeBatchFailures(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "a\n")
	cfg := testConfig(t, dir)
	h := &consumertest.Holder{}
	r := start(t, cfg, h)
	eventually(t, "a held batch", func() bool { return h.Held() == 1 })
	h.Release(consumer.ErrShutdownTimeout)
	eventually(t, "the batch again", func() bool { return h.Held() == 1 })
	h.Release(consumer.TooLarge("record", 2, 1, nil))
	eventually(t, "the drop counted", func() bool {
		return testutil.ToFloat64(r.fm.dropped.WithLabelValues("record_too_large")) == 1
	})
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if off := savedOffset(t, cfg.CheckpointDir, path); off != 2 {
		t.Fatalf("committed %d, want 2", off)
	}
}

// TestClosedFileRotated: a file closed for max_open_files and renamed out
// of the globs with lines not yet read is found by its inode beside its
// old path and read to its end.
func TestClosedFileRotated(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	write(t, a, "a-0\n")
	cfg := testConfig(t, dir)
	cfg.MaxOpenFiles = 1
	p := &pipe{}
	r := start(t, cfg, p)
	eventually(t, "a's line", func() bool { return len(p.records()) == 1 })
	write(t, b, "b-1\n") // takes the one descriptor
	eventually(t, "b's line", func() bool { return len(p.records()) == 2 })
	write(t, a, "a-2\n")
	if err := os.Rename(a, filepath.Join(dir, "a.old")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's last line", func() bool { return len(p.records()) == 3 })
	checkExactlyOnce(t, p.values(), 3)
	if got := testutil.ToFloat64(r.fm.rotations.WithLabelValues(cfg.Include[0])); got != 1 {
		t.Fatalf("rotations: %v", got)
	}
}

// TestNewContentUnderTheSameInode: a closed file whose first bytes changed
// (rewritten in place, or its inode reused) is read from its start.
func TestNewContentUnderTheSameInode(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	write(t, a, "aaaaaaaaaaaaaaaa-0\n")
	cfg := testConfig(t, dir)
	cfg.MaxOpenFiles = 1
	cfg.FingerprintBytes = 16 // complete: only the check at reopening sees the change
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "a's line", func() bool { return len(p.records()) == 1 })
	write(t, b, "bbbb-1\n")
	eventually(t, "b's line", func() bool { return len(p.records()) == 2 })
	fd, err := os.OpenFile(a, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Same inode, never shorter: only the first bytes tell.
	if _, err := fd.WriteAt([]byte("cccccccccccccccc-2\ncccccccccccccccc-3\n"), 0); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	eventually(t, "the new content", func() bool { return len(p.records()) == 4 })
	checkExactlyOnce(t, p.values(), 4)
}

// TestFactory: the factory's section decodes into its Config, which is
// off, and valid once given a glob.
func TestFactory(t *testing.T) {
	f := NewFactory()
	if f.Type() != "files" || !strings.HasPrefix(string(f.DefaultYAML()), "  files:\n") {
		t.Fatalf("type %q, section %.20q", f.Type(), f.DefaultYAML())
	}
	var doc map[string]yaml.Node
	if err := yaml.Unmarshal(f.DefaultYAML(), &doc); err != nil {
		t.Fatal(err)
	}
	n := doc["files"]
	cfg := f.NewConfig().(*Config)
	if err := n.Decode(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.On() || cfg.CheckpointDir != "ferry-data/files" || cfg.FingerprintBytes != 1000 || cfg.StartAt != "end" {
		t.Fatalf("defaults: %+v", cfg)
	}
	cfg.Enabled = true
	cfg.Include = []string{"/var/log/*.log"}
	if errs := cfg.Check(receiver.Bounds{MemoryLimit: 256 << 20, MaxRecordBytes: 1000000}); errs != nil {
		t.Fatalf("the defaults do not pass: %v", errs)
	}
	cfg.CheckpointDir = filepath.Join(t.TempDir(), "ckpt")
	rc, err := f.Create(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &pipe{}})
	if err != nil || rc == nil {
		t.Fatal(err)
	}
}

// TestTotalInflightBound: with acknowledgements held, what every file
// read together stays within max_inflight_bytes plus one read.
func TestTotalInflightBound(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&b, "line-%d\n", i)
	}
	for f := 0; f < 4; f++ {
		write(t, filepath.Join(dir, fmt.Sprintf("f%d.log", f)), b.String())
	}
	cfg := testConfig(t, dir)
	cfg.MaxFileInflightBytes = 2 * 260 << 10
	cfg.MaxInflightBytes = cfg.MaxFileInflightBytes
	p := &pipe{hold: true}
	r := start(t, cfg, p)
	eventually(t, "held batches", func() bool { return p.heldCount() >= 1 })
	time.Sleep(10 * cfg.PollInterval)
	p.mu.Lock()
	var mem, most int64
	for _, hb := range p.held {
		mem += hb.MemBytes
		most = max(most, hb.MemBytes)
	}
	p.mu.Unlock()
	if mem > int64(cfg.MaxInflightBytes)+most {
		t.Fatalf("%d bytes held, over %s plus one read (%d)", mem, cfg.MaxInflightBytes, most)
	}
	r.mu.Lock()
	accounted := r.inflight
	r.mu.Unlock()
	if accounted != mem {
		t.Fatalf("the receiver counts %d bytes in flight, the batches hold %d", accounted, mem)
	}
	p.releaseAll()
	eventually(t, "every line", func() bool { return len(p.records()) == 4*20000 })
	eventually(t, "nothing left in flight", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.inflight == 0 && r.handed == 0
	})
}

// TestStartAtEndOnlyOnce: start_at applies to the very first start, even
// when no file matched then: a file that appears while ferry is stopped is
// read from its first byte at the next start (the first scan leaves a
// checkpoint of no file; without it the restart read the file from its end).
func TestStartAtEndOnlyOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.StartAt = "end"
	r := start(t, cfg, &pipe{})
	eventually(t, "the first poll", func() bool { return testutil.ToFloat64(r.fm.checkpoints) > 0 })
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "while-stopped.log"), "first\nsecond\n")
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "both lines", func() bool { return len(p.records()) == 2 })
	if got := p.values(); got[0] != "first" || got[1] != "second" {
		t.Fatalf("got %q", got)
	}
}

// TestGlobMissIsNotRotation: a poll whose glob misses a file that is still
// where it was (a directory unreadable for a moment, out of descriptors)
// is not a rotation: the file is not let go and read again from its start.
func TestGlobMissIsNotRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "line-0\nline-1\n")
	cfg := testConfig(t, dir)
	p := &pipe{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: p})
	if err != nil {
		t.Fatal(err)
	}
	var miss atomic.Bool
	r.glob = func(pat string) ([]string, error) {
		if miss.Load() {
			return nil, nil
		}
		return filepath.Glob(pat)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	eventually(t, "two lines", func() bool { return len(p.records()) == 2 })
	miss.Store(true)
	time.Sleep(10 * cfg.RotateWait) // long past rotate_wait
	write(t, path, "line-2\n")
	miss.Store(false)
	eventually(t, "three lines", func() bool { return len(p.records()) >= 3 })
	time.Sleep(10 * cfg.PollInterval)
	checkExactlyOnce(t, p.values(), 3)
	if n := testutil.ToFloat64(r.fm.rotations.WithLabelValues(cfg.Include[0])); n != 0 {
		t.Fatalf("%v rotations counted", n)
	}
}

// TestRotationUnterminatedLastLine: a file renamed away with a last line
// without "\n" sends it (at the let-go) before the new file's lines.
func TestRotationUnterminatedLastLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, "line-0\nline-1")
	cfg := testConfig(t, dir)
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "the first line", func() bool { return len(p.records()) == 1 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path, "line-2\n")
	eventually(t, "three lines", func() bool { return len(p.records()) == 3 })
	if got := fmt.Sprint(p.values()); got != "[line-0 line-1 line-2]" {
		t.Fatalf("order: %s", got)
	}
}
