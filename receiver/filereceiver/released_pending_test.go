package filereceiver

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// A file closed by the LRU while its span waits refused, then deleted: the
// span, already in memory, is handed on again; nothing stays counted in
// flight and the file is reaped (it leaked its in-flight bytes for good).
func TestReleasedFileHandsItsPendingSpan(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	p := &pipe{refuse: consumer.ErrFull}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: p})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	write(t, path, "line-0\nline-1\n")
	r.scan(now)
	f := r.list[0]
	_ = os.MkdirAll(cfg.CheckpointDir, 0o700)
	if err := r.checkpoint(true); err != nil { // as run does before reading a new file
		t.Fatal(err)
	}
	r.step(f, now)
	if f.pending == nil {
		t.Fatal("no pending span")
	}
	r.closeFile(f) // as evict does for the least recently read file
	os.Remove(path)
	p.set(func(p *pipe) { p.refuse = nil })
	for i := 0; i < 5; i++ {
		now = now.Add(time.Second)
		r.scan(now)
		r.round(now)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t.Logf("released=%v in list=%d inflight=%d handed=%d got=%d", f.released, len(r.list), r.inflight, r.handed, len(p.values()))
	if r.inflight != 0 || len(r.list) != 0 {
		t.Fatalf("leaked: inflight %d, files %d", r.inflight, len(r.list))
	}
}
