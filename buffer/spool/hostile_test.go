package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/record"
)

// flip xors n bytes at off in file name.
func flip(t *testing.T, name string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0xA5
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestForgedFrameInValueNeverDelivered: a value that carries a well-formed
// frame for another topic, in a record whose own frame header is damaged,
// must not become a record of its own after the reader resynchronises: the
// damaged record is lost and counted, the records around it are delivered,
// and nothing reaches the topic the client named inside its value.
func TestForgedFrameInValueNeverDelivered(t *testing.T) {
	dir := t.TempDir()
	s := open(t, testConfig(dir))
	b := recs(0, 10)
	// A frame in the documented layout with a guessed secret, then one in
	// the first format's layout: what a client can build from the docs.
	evil := append([]byte("prefix-"), payloads.SpoolFrame("billing", "forged")...)
	b.Records[5] = record.Record{Topic: "app-logs", Value: evil}
	appendOK(t, s, b)
	appendOK(t, s, recs(10, 10))
	_ = s.Close()

	// Damage the length of record 5's frame so the reader must resync.
	segs := segments(t, dir)
	data, _ := os.ReadFile(segs[0])
	at := bytes.Index(data, []byte("prefix-"))
	if at < 0 {
		t.Fatal("value not found in the segment")
	}
	hdr := s.wfmt.Load().hdrLen()
	flip(t, segs[0], int64(at-hdr-3), 1) // inside the frame header, before the payload's topic
	s2 := open(t, testConfig(dir))
	defer s2.Close()
	c := &collector{}
	_ = start(t, s2, Links{Next: c})
	c.waitFor(t, 19)
	time.Sleep(300 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.got {
		if r.Topic == "billing" || string(r.Value) == "forged" {
			t.Fatalf("a frame inside a client's value was delivered as a record: topic %q value %q", r.Topic, r.Value)
		}
	}
	if len(c.got) != 19 {
		t.Fatalf("delivered %d records, want the 19 undamaged ones", len(c.got))
	}
}

// TestLoweredRecordLimitKeepsSpooledRecords: records acknowledged under a
// larger max_batch_bytes are still delivered (to let the exporter decide)
// after a restart with a smaller one, never skipped as damage.
func TestLoweredRecordLimitKeepsSpooledRecords(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := openLimit(t, cfg, 256<<10)
	b := &record.Batch{}
	for i := 0; i < 20; i++ {
		b.Records = append(b.Records, record.Record{Topic: "t", Value: bytes.Repeat([]byte{byte('a' + i)}, 100<<10)})
	}
	appendOK(t, s, b)
	_ = s.Close()

	s2 := openLimit(t, cfg, 16<<10)
	defer s2.Close()
	c := &collector{}
	_ = start(t, s2, Links{Next: c})
	got := c.waitFor(t, 20)
	for i, v := range got {
		if len(v) != 100<<10 || v[0] != byte('a'+i) {
			t.Fatalf("record %d: %d bytes starting %q", i, len(v), v[:1])
		}
	}
	if v := testutil.ToFloat64(s2.m.corruptBytes.WithLabelValues("skipped")); v != 0 {
		t.Fatalf("%v bytes counted as damage", v)
	}
	_ = s2.Shutdown(context.Background())
}

// rollWithWaiters appends one batch whose group-commit fsync is held, then
// four more that queue up behind it as waiters, then calls broken and
// appends a batch that rolls the segment. It returns that append's error
// and the waiting appends' answers.
func rollWithWaiters(t *testing.T, s *Spool, broken func()) (error, []chan error) {
	t.Helper()
	entered, gate := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	sync := s.fsync
	s.fsync = func(f *os.File) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-gate
		}
		return sync(f)
	}
	var waiting []chan error
	add := func(b *record.Batch) {
		done := make(chan error, 1)
		b.OnDone(func(err error) { done <- err })
		if err := s.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, done)
	}
	add(recs(0, 100))
	<-entered
	for i := 1; i < 5; i++ {
		add(recs(i*100, 100))
	}
	broken()
	time.AfterFunc(100*time.Millisecond, func() { close(gate) })
	big := &record.Batch{Records: []record.Record{{Topic: "t", Value: bytes.Repeat([]byte("x"), 60<<10)}}}
	return s.Consume(context.Background(), big), waiting
}

// TestRollThenCreateFailsAnswersWaiters: with fsync always, appends that
// were waiting for an fsync when their segment was sealed are answered by
// the seal's own fsync, even when the next segment cannot be created and no
// append follows (they used to wait for the client's timeout, whose retry
// duplicates them); the refusal does not name the spool's path.
func TestRollThenCreateFailsAnswersWaiters(t *testing.T) {
	root := t.TempDir()
	dir := root + "/spool"
	cfg := testConfig(dir)
	cfg.Fsync = "always"
	s := open(t, cfg)
	defer s.Close()
	_ = start(t, s, Links{Next: &collector{}})
	err, waiting := rollWithWaiters(t, s, func() {
		// The directory goes away: the next segment cannot be created.
		if err := os.Rename(dir, root+"/gone"); err != nil {
			t.Fatal(err)
		}
	})
	if err == nil {
		t.Fatal("append with no segment to write to was accepted")
	}
	if strings.Contains(err.Error(), root) {
		t.Fatalf("the client's answer names the spool's path: %v", err)
	}
	for i, done := range waiting {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("append %d: %v (its segment was fsynced when sealed)", i, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("append %d still waits for an fsync after its segment was sealed", i)
		}
	}
}

// TestFailedRollFsyncRefusesWaiters: a seal whose fsync fails answers the
// appends waiting on it with a retryable error (never success), promptly,
// without the spool's path.
func TestFailedRollFsyncRefusesWaiters(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Fsync = "always"
	s := open(t, cfg)
	defer s.Close()
	_ = start(t, s, Links{Next: &collector{}})
	var failing atomic.Bool
	s.fsync = func(f *os.File) error {
		if failing.Load() {
			return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EIO}
		}
		return f.Sync()
	}
	err, waiting := rollWithWaiters(t, s, func() { failing.Store(true) })
	if err == nil || strings.Contains(err.Error(), dir) {
		t.Fatalf("append over a failed seal: %v", err)
	}
	failed := 0
	for i, done := range waiting {
		select {
		case err := <-done:
			if err != nil {
				failed++
				if strings.Contains(err.Error(), dir) {
					t.Fatalf("append %d: answer names the spool's path: %v", i, err)
				}
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("append %d still waits after the seal's fsync failed", i)
		}
	}
	if failed < 4 {
		t.Fatalf("%d of the 4 appends behind the failed fsync were refused", failed)
	}
}

// TestV1SegmentsStillRead: a segment written by an older ferry (8-byte
// header and frames, no secret) left in the spool across an upgrade is
// delivered; damage in it ends that segment instead of resynchronising.
func TestV1SegmentsStillRead(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	seg := []byte(segMagicV1)
	fm := &segFormat{}
	for _, r := range recs(0, 50).Records {
		fr := appendFrame(nil, &r, fm)
		p := fr[frameHeader:]
		seg = binary.LittleEndian.AppendUint32(seg, uint32(len(p)))
		seg = binary.LittleEndian.AppendUint32(seg, crc32c(p))
		seg = append(seg, p...)
	}
	if err := os.WriteFile(dir+"/"+segName(3), seg, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, testConfig(dir))
	defer s.Close()
	deliversExactly(t, s, 0, 50)
}

// TestDeadLetterNotDurableKeepsRecord: a record Kafka refused for good is
// not done until its dead letter is durable (the dead-letter topic's own
// ack): until then the watermark stays before it, and a crash replays it
// instead of losing it from the spool, the topic and the file alike.
func TestDeadLetterNotDurableKeepsRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := open(t, cfg)
	c := &collector{fail: func(r *record.Record) error {
		if bytes.HasPrefix(r.Value, []byte("rec-00000003")) {
			return consumer.TooLarge("record", 10, 5, nil)
		}
		return nil
	}}
	dl := &deadLetters{hold: true}
	manualCheckpoints(s)
	_ = start(t, s, Links{Next: c, DeadLetter: dl})
	appendOK(t, s, recs(0, 10))
	// Kafka has answered every record and the dead letter is written,
	// not yet acknowledged (the chunk would be done by now if it did not
	// wait for that), and a checkpoint pass ran after (it would have
	// recorded a watermark past the chunk).
	c.waitAnswered(t, 10)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		dl.mu.Lock()
		n := len(dl.held)
		dl.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no dead letter written")
		}
	}
	checkpoint(t, s)
	if b := s.Backlog(); b == 0 {
		t.Fatal("the chunk completed while its dead letter was not durable")
	}
	crash(s)

	s2 := open(t, cfg)
	defer s2.Close()
	c2 := &collector{}
	_ = start(t, s2, Links{Next: c2})
	got := c2.waitFor(t, 10)
	found := false
	for _, v := range got {
		found = found || strings.HasPrefix(v, "rec-00000003")
	}
	if !found {
		t.Fatal("the record whose dead letter was never acknowledged is lost")
	}
	_ = s2.Shutdown(context.Background())

	// Once settled, the chunk completes.
	dl.mu.Lock()
	held := dl.held
	dl.mu.Unlock()
	if len(held) != 1 {
		t.Fatalf("%d dead letters held, want 1", len(held))
	}
}
