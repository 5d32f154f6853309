package httpbody

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
)

// TestReserveBelowAndWait: a first step stays under its ceiling, and a
// waiting reservation gets room released while it waits, or gives up at
// its deadline with nothing taken.
func TestReserveBelowAndWait(t *testing.T) {
	b := budget.New(10)
	r := NewReader(100)
	r.SetBudget(b)
	first := r.Get(0)
	if r.ReserveBelow(first, 5, 4) {
		t.Fatal("5 bytes reserved under a ceiling of 4")
	}
	if !r.ReserveBelow(first, 4, 4) || first.Reserved() != 4 || b.Used() != 4 {
		t.Fatalf("4 under a ceiling of 4: reserved %d, used %d", first.Reserved(), b.Used())
	}
	held := r.Get(0)
	if !r.Reserve(held, 6) {
		t.Fatal("the rest of the budget")
	}
	// No room, none released: false at the deadline, nothing taken.
	start := time.Now()
	if r.ReserveWait(context.Background(), first, 3, time.Now().Add(50*time.Millisecond)) {
		t.Fatal("reserved with the budget full")
	}
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("gave up after %v, before its deadline", waited)
	}
	if first.Reserved() != 4 || b.Used() != 10 {
		t.Fatalf("after giving up: reserved %d, used %d", first.Reserved(), b.Used())
	}
	// Room released while it waits: it takes it.
	go func() {
		time.Sleep(20 * time.Millisecond)
		r.Put(held)
	}()
	if !r.ReserveWait(context.Background(), first, 3, time.Now().Add(5*time.Second)) {
		t.Fatal("room released while waiting was not taken")
	}
	if first.Reserved() != 7 || b.Used() != 7 {
		t.Fatalf("after the wait: reserved %d, used %d", first.Reserved(), b.Used())
	}
	// A cancelled request stops waiting.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r.ReserveWait(ctx, first, 5, time.Now().Add(5*time.Second)) {
		t.Fatal("reserved 5 more with 3 free")
	}
	r.Put(first)
	if b.Used() != 0 {
		t.Fatalf("used %d after Put", b.Used())
	}
}
