package filereceiver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// restartManual is Start without the run goroutine: a receiver driven by
// hand that resumes from cfg's checkpoint, as after a kill -9.
func restartManual(t *testing.T, cfg Config, p *pipe) *Receiver {
	t.Helper()
	r := manual(t, cfg, p)
	doc, found, err := loadCheckpoint(cfg.CheckpointDir)
	if err != nil {
		t.Fatal(err)
	}
	r.resume(doc, found)
	return r
}

// checkFirstCopiesInOrder: the first copy of every line comes after the
// first copies of the lines before it (lines are prefix-N, N from 0 up),
// as tools/bench/fileload's verifier counts it; every line of 0..n-1 came.
func checkFirstCopiesInOrder(t *testing.T, values []string, n int) {
	t.Helper()
	seen := map[int]bool{}
	last, bad := -1, 0
	for _, v := range values {
		i, err := strconv.Atoi(v[strings.LastIndexByte(v, '-')+1:])
		if err != nil {
			t.Fatalf("unexpected value %q", v)
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		if i < last {
			bad++
		}
		last = max(last, i)
	}
	if bad > 0 {
		t.Errorf("%d lines out of order", bad)
	}
	if len(seen) != n {
		t.Errorf("%d distinct lines, not %d", len(seen), n)
	}
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// TestOrphansOfOnePathInOrder: two generations of one path are both
// rotated away before ferry has read them (ferry busy: here, no round
// between the polls). Both are orphans of the path; the younger waited for
// the older while it was the path's file, but as an orphan it was read
// round-robin beside the older: their lines interleaved.
func TestOrphansOfOnePathInOrder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	p := &pipe{}
	r := manual(t, cfg, p)
	now := time.Now()
	step := func() {
		now = now.Add(cfg.PollInterval)
		r.scan(now)
		if err := r.checkpoint(true); err != nil {
			t.Fatal(err)
		}
	}
	write(t, path, lines("line", 0, 5000))
	step()
	rename(t, path, path+".1")
	write(t, path, lines("line", 5000, 10000))
	step()
	rename(t, path, path+".2")
	write(t, path, lines("line", 10000, 10010))
	step()
	drive(t, r, &now)
	checkFirstCopiesInOrder(t, p.values(), 10010)
}

// TestGenerationsRotatedWhileDownInOrder: killed while an orphan (app.log.1)
// still had lines in flight and its successor waited; while ferry was down
// the successor was rotated too (app.log.2) and a third file created. At the
// restart both rotated files are found by inode from the checkpoint: the
// older's lines first, then the younger's, then the new file's.
func TestGenerationsRotatedWhileDownInOrder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	cfg := testConfig(t, dir)
	p := &pipe{hold: true} // nothing acknowledged before the kill
	r := manual(t, cfg, p)
	now := time.Now()
	step := func() {
		now = now.Add(cfg.PollInterval)
		r.scan(now)
		if err := r.checkpoint(true); err != nil {
			t.Fatal(err)
		}
	}
	write(t, path, lines("line", 0, 5000))
	step()
	r.round(now) // one read of app.log, in flight
	rename(t, path, path+".1")
	write(t, path, lines("line", 5000, 10000))
	step()
	for r.round(now) { // app.log.1 read to its end; app.log waits
	}
	for _, f := range r.list {
		r.closeFile(f)
	}
	// kill -9; while down, the next rotation.
	rename(t, path, path+".2")
	write(t, path, lines("line", 10000, 10010))

	p = &pipe{}
	r = restartManual(t, cfg, p)
	drive(t, r, &now)
	checkFirstCopiesInOrder(t, p.values(), 10010)
}
