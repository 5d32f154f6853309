package idempotency

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestAbortedReservationsStayBounded: a reservation whose request is then
// refused (queue_full, spool_full, write_buffer_full, record_too_large:
// Submit fails after Begin) is aborted; its entry must not stay in memory
// beyond max_bytes. Today Abort only marks the entry dead: it stays in
// s.order (with its key) until every entry before it has expired, so one
// accepted key at the head pins every aborted reservation made within the
// window, uncounted in max_bytes.
func TestAbortedReservationsStayBounded(t *testing.T) {
	cfg := Config{Window: 10 * time.Minute, MaxBytes: 64 << 10}
	s, now := newTest(t, cfg)
	_, _, first := s.Begin(Scope("http", "app", "accepted"), Fingerprint([]byte("x")), 1)
	s.Commit(first)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	const n = 200_000
	for i := range n {
		// A client retrying through an outage, a new key per request.
		v, _, id := s.Begin(Scope("http", "app", fmt.Sprintf("%064d", i)), Fingerprint([]byte("x")), 1)
		if v != Fresh {
			t.Fatalf("request %d: %v", i, v)
		}
		s.Abort(id)
		if i%1000 == 0 {
			*now = now.Add(time.Millisecond) // all well within the window
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := len(s.order) - s.head
	maxEntries := int(int64(cfg.MaxBytes) / entryOverhead)
	t.Logf("store counts %d bytes for %d keys; order holds %d entries; heap grew %d KiB (max_bytes %d KiB)",
		s.Bytes(), s.Len(), held, (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10, cfg.MaxBytes>>10)
	if held > 2*maxEntries+1024 {
		t.Fatalf("%d aborted reservations still held in memory (max_bytes allows ~%d keys): memory not bounded by max_bytes", held, maxEntries)
	}
}
