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

// A retryable failure completing between step's rewind check and read's
// gen sampling: the span read at the stale readOff got the new gen and,
// acknowledged, committed past the failed line (it must not).
func TestSpanReadDuringRewindDoesNotCommit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	p := &pipe{hold: true}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: p})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, f := range r.list {
			r.closeFile(f)
		}
	}()
	now := time.Now()
	write(t, path, "line-0\n")
	r.scan(now)
	f := r.list[0]
	// As run does: a new file is read once a checkpoint knows it.
	_ = os.MkdirAll(cfg.CheckpointDir, 0o700)
	if err := r.checkpoint(true); err != nil || f.unsaved {
		t.Fatalf("checkpoint: %v (unsaved %v)", err, f.unsaved)
	}
	r.hand(f, r.read(f, now, false, false), now) // held 0: [0,7)
	write(t, path, "line-1\n")
	r.scan(now)
	r.hand(f, r.read(f, now, false, false), now) // held 1: [7,14)
	write(t, path, "line-2\n")
	r.scan(now)
	// step(f) would check f.rewind here (false) ... then, on the exporter's
	// goroutine, batch 0 fails retryably:
	p.release(0, consumer.ErrShutdownTimeout)
	// ... and step goes on to read at the old readOff:
	s3 := r.read(f, now, false, false) // [14,21)
	r.hand(f, s3, now)                 // held 2
	r.step(f, now)                     // the rewind is seen now: readOff = 0
	p.release(1, nil)
	p.release(2, nil) // line-2 acknowledged; line-0 failed and not yet sent again
	r.mu.Lock()
	c := f.committed
	r.mu.Unlock()
	_ = r.checkpoint(true)
	t.Logf("committed=%d checkpoint=%d values=%q", c, savedOffset(t, cfg.CheckpointDir, path), p.values())
	if c > 0 {
		t.Fatalf("committed %d past line-0 (failed, not re-delivered)", c)
	}
}
