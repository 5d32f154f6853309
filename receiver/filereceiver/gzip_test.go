package filereceiver

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func gz(t *testing.T, text string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func lines(prefix string, from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "%s-%d\n", prefix, i)
	}
	return b.String()
}

// TestGzipFile: a .gz file is read decompressed once it is whole, its
// offsets in the decompressed text; while its trailer is missing (still
// being written) nothing of it is read.
func TestGzipFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "old.log.gz")
	text := lines("z", 0, 5000)
	data := gz(t, text)
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, dir)
	cfg.Include = []string{filepath.Join(dir, "*.gz")}
	cfg.Compression = "auto"
	p := &pipe{}
	start(t, cfg, p)
	time.Sleep(20 * cfg.PollInterval)
	if n := len(p.records()); n != 0 {
		t.Fatalf("%d lines read from an incomplete gzip file", n)
	}
	write(t, path, string(data[len(data)/2:]))
	eventually(t, "every line", func() bool { return len(p.records()) == 5000 })
	checkExactlyOnce(t, p.values(), 5000)
	if g := p.records()[4999]; g.off != int64(strings.LastIndex(text, "z-4999")) {
		t.Fatalf("last line's offset %d", g.off)
	}
}

// TestGzipCompressedCopy: logrotate's compress. app.log is renamed to
// app.log.1 (both under the glob), read to its end; app.log.1.gz replaces
// it: its lines are not sent again, nor after a restart (the finished
// files are in the checkpoint). A gzip file of other lines is read.
func TestGzipCompressedCopy(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "app.log")
			cfg := testConfig(t, dir)
			cfg.Include = []string{path + "*"}
			cfg.Compression = "auto"
			first := lines("a", 0, 3000)
			write(t, path, first)
			p := &pipe{}
			r := start(t, cfg, p)
			eventually(t, "the first lines", func() bool { return len(p.records()) == 3000 })
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
			write(t, path, lines("b", 0, 10))
			eventually(t, "the new file's lines", func() bool { return len(p.records()) == 3010 })
			// gzip app.log.1 (as logrotate does: the .gz written, then the
			// original removed); with restart, ferry is stopped after it let
			// app.log.1 go and before the .gz appears.
			if restart {
				if err := os.Remove(path + ".1"); err != nil {
					t.Fatal(err)
				}
				eventually(t, "app.log.1 let go", func() bool { return doneInCheckpoint(t, cfg.CheckpointDir) == 1 })
				if err := r.Shutdown(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(path+".1.gz", gz(t, first), 0o600); err != nil {
				t.Fatal(err)
			}
			if restart {
				p = &pipe{}
				r = start(t, cfg, p)
			} else if err := os.Remove(path + ".1"); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the copy found", func() bool { return testutil.ToFloat64(r.fm.compressedCopies) == 1 })
			// Another gzip file, of lines never read: read whole.
			if err := os.WriteFile(path+".9.gz", gz(t, lines("c", 0, 7)), 0o600); err != nil {
				t.Fatal(err)
			}
			want := 3010
			if restart {
				want = 0
			}
			eventually(t, "the other gzip file", func() bool { return len(p.records()) == want+7 })
			time.Sleep(20 * cfg.PollInterval)
			for _, g := range p.records() {
				if strings.HasPrefix(g.value, "a-") && g.path == path+".1.gz" {
					t.Fatalf("a line of the compressed copy was sent again: %+v", g)
				}
			}
			if n := len(p.records()); n != want+7 {
				t.Fatalf("%d records, want %d", n, want+7)
			}
		})
	}
}

func doneInCheckpoint(t *testing.T, dir string) int {
	doc, _, err := loadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(doc.Done)
}

// TestGzipGrows: a gzip file that grows by a whole member (gzip -c >>
// file.gz, or a writer that closes a member at every flush) is read on:
// the decompressor that had reached the first member's end answered EOF
// for good, so the new size was taken back to the old one (a read shorter
// than the poll saw) and nothing more of the file was ever read.
func TestGzipGrows(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "old.log.gz")
	write(t, path, string(gz(t, lines("z", 0, 5))))
	cfg := testConfig(t, dir)
	cfg.Include = []string{filepath.Join(dir, "*.gz")}
	cfg.Compression = "auto"
	p := &pipe{}
	start(t, cfg, p)
	eventually(t, "the first member's lines", func() bool { return len(p.records()) == 5 })
	write(t, path, string(gz(t, lines("z", 5, 10))))
	eventually(t, "the second member's lines", func() bool { return len(p.records()) == 10 })
	checkExactlyOnce(t, p.values(), 10)
}

// TestGzipShortFinishedFileIsNoPrefix: a finished file shorter than
// fingerprint_bytes is known by nothing but its whole content. A file
// that held only a banner line ("started"), rotated and let go, matched
// every later gzip file that begins with the same banner, and that line of
// each was skipped: lost. A short file's compressed copy is recognised only
// when it is that content exactly.
func TestGzipShortFinishedFileIsNoPrefix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	cfg.Include = []string{path + "*"}
	cfg.Compression = "auto"
	p := &pipe{}
	r := manual(t, cfg, p)
	now := time.Now()
	write(t, path, "started\n")
	drive(t, r, &now)
	if err := os.Remove(path); err != nil { // let go: remembered
		t.Fatal(err)
	}
	drive(t, r, &now)
	if len(r.finished) != 1 {
		t.Fatalf("%d files remembered", len(r.finished))
	}
	// Its own compressed copy is still recognised.
	if err := os.WriteFile(path+".1.gz", gz(t, "started\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Another file that begins with the same banner is not.
	if err := os.WriteFile(path+".2.gz", gz(t, "started\nline-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	drive(t, r, &now)
	if got := fmt.Sprint(p.values()); got != "[started started line-1]" {
		t.Fatalf("got %s", got)
	}
	if n := testutil.ToFloat64(r.fm.compressedCopies); n != 1 {
		t.Fatalf("compressed copies %v", n)
	}
}
