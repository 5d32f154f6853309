package idempotency

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func newTest(t *testing.T, cfg Config) (*Store, *time.Time) {
	t.Helper()
	s, err := NewStore(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	s.SetClock(func() time.Time { return now })
	return s, &now
}

// TestVerdicts: a fresh key is reserved; while in flight a retry is told
// so; once committed a retry gets the original answer; another body under
// the key is a mismatch; an aborted key is fresh again.
func TestVerdicts(t *testing.T) {
	s, _ := newTest(t, Config{Window: time.Minute, MaxBytes: 1 << 20})
	k := Scope("http", "app", "k1")
	a, b := Fingerprint([]byte("body a")), Fingerprint([]byte("body b"))
	v, _, id := s.Begin(k, a, 3)
	if v != Fresh || id == nil {
		t.Fatalf("first: %v", v)
	}
	if v, _, _ := s.Begin(k, a, 3); v != InFlight {
		t.Fatalf("retry in flight: %v", v)
	}
	if v, _, _ := s.Begin(k, b, 3); v != Mismatch {
		t.Fatalf("other body in flight: %v", v)
	}
	s.Commit(id)
	if v, n, _ := s.Begin(k, a, 99); v != Replay || n != 3 {
		t.Fatalf("retry: %v %d", v, n)
	}
	if v, _, _ := s.Begin(k, b, 3); v != Mismatch {
		t.Fatalf("other body: %v", v)
	}
	if got := testutil.ToFloat64(s.replayed); got != 1 {
		t.Fatalf("replayed counted %v", got)
	}
	k2 := Scope("http", "app", "k2")
	_, _, id2 := s.Begin(k2, a, 1)
	s.Abort(id2)
	s.Commit(id2) // too late: aborted stays forgotten
	if v, _, _ := s.Begin(k2, a, 1); v != Fresh {
		t.Fatalf("after abort: %v", v)
	}
}

// TestScopesSeparateTenants: one client key under two applications (or
// two doors) is two keys.
func TestScopesSeparateTenants(t *testing.T) {
	s, _ := newTest(t, Config{Window: time.Minute, MaxBytes: 1 << 20})
	sum := Fingerprint([]byte("x"))
	_, _, id := s.Begin(Scope("http", "tenant-a", "k"), sum, 1)
	s.Commit(id)
	for _, k := range [][]byte{Scope("http", "tenant-b", "k"), Scope("local", "tenant-a", "k")} {
		if v, _, _ := s.Begin(k, Fingerprint([]byte("y")), 1); v != Fresh {
			t.Fatalf("%q: %v, want fresh", k, v)
		}
	}
}

// TestWindow: a key is forgotten once older than the window (counted),
// and a retry after it is fresh; Restore skips keys already past it.
func TestWindow(t *testing.T) {
	s, now := newTest(t, Config{Window: time.Minute, MaxBytes: 1 << 20})
	k, sum := Scope("http", "", "k"), Fingerprint([]byte("x"))
	_, _, id := s.Begin(k, sum, 1)
	s.Commit(id)
	*now = now.Add(59 * time.Second)
	if v, _, _ := s.Begin(k, sum, 1); v != Replay {
		t.Fatalf("inside the window: %v", v)
	}
	*now = now.Add(2 * time.Second)
	if v, _, _ := s.Begin(k, sum, 1); v != Fresh {
		t.Fatalf("past the window: %v", v)
	}
	if got := testutil.ToFloat64(s.evicted.WithLabelValues("age")); got != 1 {
		t.Fatalf("age evictions %v", got)
	}
	s.Restore(Scope("http", "", "old"), sum, 1, now.Add(-2*time.Minute))
	s.Restore(Scope("http", "", "new"), sum, 1, now.Add(-time.Second))
	if v, _, _ := s.Begin(Scope("http", "", "old"), sum, 1); v != Fresh {
		t.Fatalf("restored past the window: %v", v)
	}
	if v, n, _ := s.Begin(Scope("http", "", "new"), sum, 1); v != Replay || n != 1 {
		t.Fatalf("restored inside the window: %v", v)
	}
}

// TestBytesBound: many distinct keys never hold more than max_bytes; the
// oldest answered go first, counted; keys in flight are never evicted,
// and when they alone fill the bound a new key is refused (Full).
func TestBytesBound(t *testing.T) {
	const maxBytes = 64 << 10
	s, _ := newTest(t, Config{Window: time.Hour, MaxBytes: maxBytes})
	sum := Fingerprint([]byte("x"))
	for i := range 10000 {
		v, _, id := s.Begin(Scope("http", "", fmt.Sprintf("key-%06d", i)), sum, 1)
		if v != Fresh {
			t.Fatalf("key %d: %v", i, v)
		}
		s.Commit(id)
		if s.Bytes() > maxBytes {
			t.Fatalf("%d bytes held, bound %d", s.Bytes(), maxBytes)
		}
	}
	if v, _, _ := s.Begin(Scope("http", "", "key-000000"), sum, 1); v != Fresh {
		t.Fatalf("oldest key still known: %v", v)
	}
	if v, _, _ := s.Begin(Scope("http", "", "key-009999"), sum, 1); v != Replay {
		t.Fatalf("newest key forgotten: %v", v)
	}
	if got := testutil.ToFloat64(s.evicted.WithLabelValues("bytes")); got < 9000 {
		t.Fatalf("bytes evictions counted %v", got)
	}
	// Only reservations: they are not evicted, and fill the bound.
	s2, _ := newTest(t, Config{Window: time.Hour, MaxBytes: maxBytes})
	full := false
	for i := range 10000 {
		if v, _, _ := s2.Begin(Scope("http", "", fmt.Sprintf("key-%06d", i)), sum, 1); v == Full {
			full = true
			break
		}
	}
	if !full || s2.Bytes() > maxBytes {
		t.Fatalf("in-flight keys not bounded: full %v, %d bytes", full, s2.Bytes())
	}
}

func TestValidKey(t *testing.T) {
	for _, k := range []string{"a", "0f8fad5b-d9cb-469f-a165-70867728950e", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "YWJj+/=="} {
		if !ValidKey(k) {
			t.Errorf("%q refused", k)
		}
	}
	long := make([]byte, MaxKeyBytes+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, k := range []string{"", string(long), "a b", "a\x00", "é", "a\n"} {
		if ValidKey(k) {
			t.Errorf("%q accepted", k)
		}
	}
	if !ValidKey(string(long[:MaxKeyBytes])) {
		t.Error("a key of MaxKeyBytes refused")
	}
}

// A reservation in flight at the head of the order does not stop the
// accepted keys behind it from being evicted to make room.
func TestInFlightDoesNotBlockEviction(t *testing.T) {
	key := func(i int) []byte { return Scope("http", "", fmt.Sprintf("key-%06d", i)) }
	s, _ := newTest(t, Config{Window: time.Hour, MaxBytes: 64 << 10})
	sum := Fingerprint([]byte("x"))
	if v, _, _ := s.Begin(key(0), sum, 1); v != Fresh { // in flight, never answered
		t.Fatal(v)
	}
	for i := 1; i <= 5000; i++ { // ~10 times what 64 KiB holds
		v, _, id := s.Begin(key(i), sum, 1)
		if v != Fresh {
			t.Fatalf("key %d: %v with one reservation in flight and accepted keys to evict", i, v)
		}
		s.Commit(id)
	}
	if v, _, _ := s.Begin(key(0), sum, 1); v != InFlight {
		t.Fatalf("the reservation in flight was evicted: %v", v)
	}
}
