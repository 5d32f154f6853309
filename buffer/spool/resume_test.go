package spool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/record"
)

// ends records where each batch the reader sent ends, and how many
// records were sent up to and including it.
type ends struct {
	*collector
	mu    sync.Mutex
	total int
	at    []record.SpoolPos
	upTo  []int
}

func (e *ends) Consume(ctx context.Context, b *record.Batch) error {
	e.mu.Lock()
	e.total += len(b.Records)
	e.at = append(e.at, b.End)
	e.upTo = append(e.upTo, e.total)
	e.mu.Unlock()
	return e.collector.Consume(ctx, b)
}

// spoolOf4000 writes 4000 records that Kafka never acknowledges and
// returns where a batch in the middle ended and how many records precede
// that place.
func spoolOf4000(t *testing.T, dir string) (record.SpoolPos, int) {
	t.Helper()
	s := open(t, testConfig(dir))
	e := &ends{collector: &collector{}}
	e.hold.Store(true)
	_ = start(t, s, Links{Next: e})
	for i := 0; i < 40; i++ {
		appendOK(t, s, recs(i*100, 100))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		total := e.total
		e.mu.Unlock()
		if total == 4000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reader sent %d of 4000 records", total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.at) < 3 {
		t.Fatalf("only %d batches: no middle to resume at", len(e.at))
	}
	mid := len(e.at) / 2
	if e.at[mid] == (record.SpoolPos{}) {
		t.Fatal("the reader's batches carry no spool position")
	}
	return e.at[mid], e.upTo[mid]
}

// Exactly once: a restart resumes after the place Kafka committed, past
// the checkpoint, so what Kafka has is never sent again; and what it
// skipped is gone from the spool for good (the checkpoint moved).
func TestResumeAfterWhatKafkaCommitted(t *testing.T) {
	dir := t.TempDir()
	at, before := spoolOf4000(t, dir)

	s := open(t, testConfig(dir))
	c := &collector{}
	if err := start(t, s, Links{Next: c, Resume: func(context.Context) (record.SpoolPos, bool, error) { return at, true, nil }}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, 4000-before)
	time.Sleep(100 * time.Millisecond)
	wantIDs(t, c.values(), before, 4000)
	if v := testutil.ToFloat64(s.m.resumeSkipped); v <= 0 {
		t.Fatalf("skipped bytes counter %v", v)
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	// Nothing left: everything Kafka committed or acknowledged since.
	s3 := open(t, testConfig(dir))
	defer s3.Close()
	c3 := &collector{}
	_ = start(t, s3, Links{Next: c3})
	time.Sleep(300 * time.Millisecond)
	if n := len(c3.values()); n != 0 {
		t.Fatalf("%d records sent again after the resumed run acknowledged them", n)
	}
	_ = s3.Shutdown(context.Background())
}

// A committed place this spool does not hold (another directory's, or a
// damaged state) is not applied: the checkpoint rules, and it is counted.
func TestResumeElsewhereIgnored(t *testing.T) {
	dir := t.TempDir()
	_, _ = spoolOf4000(t, dir)
	s := open(t, testConfig(dir))
	defer s.Close()
	c := &collector{}
	_ = start(t, s, Links{Next: c, Resume: func(context.Context) (record.SpoolPos, bool, error) {
		return record.SpoolPos{Seg: 999999, Off: 40}, true, nil
	}})
	c.waitFor(t, 4000)
	wantIDs(t, c.values(), 0, 4000)
	if v := testutil.ToFloat64(s.m.resumeMismatch); v != 1 {
		t.Fatalf("mismatch counter %v", v)
	}
	_ = s.Shutdown(context.Background())
}

// Until Kafka says how far it committed, nothing is sent (sending from
// the checkpoint could duplicate); the reader asks again.
func TestResumeWaitsForKafka(t *testing.T) {
	dir := t.TempDir()
	at, before := spoolOf4000(t, dir)
	s := open(t, testConfig(dir))
	defer s.Close()
	c := &collector{}
	var asked atomic.Int64
	_ = start(t, s, Links{Next: c, Resume: func(context.Context) (record.SpoolPos, bool, error) {
		if asked.Add(1) < 3 {
			return record.SpoolPos{}, false, errors.New("kafka unreachable")
		}
		return at, true, nil
	}})
	deadline := time.Now().Add(10 * time.Second)
	for asked.Load() < 3 && time.Now().Before(deadline) {
		if n := len(c.values()); n > 0 {
			t.Fatalf("%d records sent before Kafka said where to start", n)
		}
		time.Sleep(time.Millisecond)
	}
	c.waitFor(t, 4000-before)
	time.Sleep(100 * time.Millisecond)
	wantIDs(t, c.values(), before, 4000)
	_ = s.Shutdown(context.Background())
}

func TestDirIDStable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	a, err := DirID(dir)
	if err != nil || len(a) != 32 {
		t.Fatalf("%q %v", a, err)
	}
	b, err := DirID(dir)
	if err != nil || b != a {
		t.Fatalf("second read %q %v, want %q", b, err, a)
	}
	other, _ := DirID(t.TempDir())
	if other == a {
		t.Fatal("two directories share an id")
	}
	if err := os.WriteFile(filepath.Join(dir, "id"), []byte("not-an-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := DirID(dir); err == nil || !strings.Contains(err.Error(), "not a spool id") {
		t.Fatalf("damaged id file: %v", err)
	}
}
