package spool

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTailFromMemoryThenDisk: a backlog written before the reader starts
// is read from disk; once the reader has caught up, what is appended next
// is sent from memory, not read back. Every record arrives once, in order,
// across both and across segment rolls, and nothing counts as damage.
func TestTailFromMemoryThenDisk(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := open(t, cfg)
	defer s.Close()
	for i := 0; i < 50; i++ {
		appendOK(t, s, recs(i*20, 20)) // the backlog: no reader yet
	}
	c := &collector{}
	_ = start(t, s, Links{Next: c})
	c.waitFor(t, 1000)
	disk := testutil.ToFloat64(s.m.readBytes.WithLabelValues("disk"))
	if disk == 0 {
		t.Fatal("the backlog was not read from disk")
	}
	for i := 50; i < 400; i++ {
		appendOK(t, s, recs(i*20, 20))
		if i%10 == 0 {
			c.waitFor(t, i*20) // a reader that keeps up
			time.Sleep(3 * time.Millisecond)
		}
	}
	wantIDs(t, c.waitFor(t, 8000), 0, 8000)
	mem := testutil.ToFloat64(s.m.readBytes.WithLabelValues("memory"))
	disk = testutil.ToFloat64(s.m.readBytes.WithLabelValues("disk"))
	appended := testutil.ToFloat64(s.m.appendedBytes)
	t.Logf("appended %v bytes; read %v from memory, %v from disk", appended, mem, disk)
	if mem < appended/2 {
		t.Fatalf("only %v of %v bytes sent from memory while the reader kept up", mem, appended)
	}
	for _, k := range []string{"truncated", "skipped"} {
		if v := testutil.ToFloat64(s.m.corruptBytes.WithLabelValues(k)); v != 0 {
			t.Fatalf("%v bytes counted as damage (%s)", v, k)
		}
	}
	_ = s.Shutdown(context.Background())
	// Every kept buffer and every chunk gave its memory back.
	deadline := time.Now().Add(5 * time.Second)
	for s.budget.Used() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if u := s.budget.Used(); u != 0 {
		t.Fatalf("%d bytes of the memory budget still held after shutdown", u)
	}
}
