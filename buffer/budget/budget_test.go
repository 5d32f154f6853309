package budget

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestNeverPastLimit: stages reserving and releasing at once never hold
// more than the limit together, and exactly as much as fits is granted.
func TestNeverPastLimit(t *testing.T) {
	b := New(1000)
	var granted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				if b.TryReserve(7) {
					granted.Add(1)
					if u := b.Used(); u > b.Limit() {
						t.Errorf("used %d > limit %d", u, b.Limit())
					}
				}
			}
		}()
	}
	wg.Wait()
	if got, want := granted.Load(), int64(1000/7); got != want || b.Used() != want*7 {
		t.Fatalf("granted %d (used %d), want %d", got, b.Used(), want)
	}
	b.Release(b.Used())
	if b.Used() != 0 {
		t.Fatalf("used %d after releasing all", b.Used())
	}
}

// TestCeilingLeavesRoom: a stage under a ceiling (the spool's reader) stops
// there, and the room above it stays for the others (receivers).
func TestCeilingLeavesRoom(t *testing.T) {
	b := New(100)
	for b.Reserve(10, 60) {
	}
	if b.Used() != 60 {
		t.Fatalf("the ceiling stage took %d, want 60", b.Used())
	}
	if !b.TryReserve(40) {
		t.Fatal("the room above the ceiling was not left")
	}
	if b.TryReserve(1) {
		t.Fatal("reserved past the limit")
	}
	if b.Reserve(1, 1000) {
		t.Fatal("a ceiling above the limit let a stage pass the limit")
	}
}

func BenchmarkReserveRelease(b *testing.B) {
	bg := New(1 << 30)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if bg.TryReserve(1000) {
				bg.Release(1000)
			}
		}
	})
}
