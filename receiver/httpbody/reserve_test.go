package httpbody

import (
	"bytes"
	"context"
	"errors"
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

// TestReadAllChargesWhatItHolds: a source read in growing steps ends with
// its buffer's own capacity reserved (the smaller buffers it replaced are
// given back), exactly max bytes pass without a buffer past the limit, and
// one byte more is refused with nothing left reserved once put back.
func TestReadAllChargesWhatItHolds(t *testing.T) {
	const max = 256 << 10
	b := budget.New(4 << 20)
	r := NewReader(max)
	r.SetBudget(b)
	for _, n := range []int{10, 5000, 100_000, max} {
		buf, err := r.ReadAll(bytes.NewReader(make([]byte, n)), 4<<10, max)
		if err != nil || len(buf.B) != n {
			t.Fatalf("%d bytes: %v, read %d", n, err, len(buf.B))
		}
		if buf.Reserved() != int64(cap(buf.B)) || b.Used() != int64(cap(buf.B)) {
			t.Fatalf("%d bytes: reserved %d, budget used %d, capacity %d", n, buf.Reserved(), b.Used(), cap(buf.B))
		}
		if cap(buf.B) > max {
			t.Fatalf("%d bytes: a buffer of %d past the limit %d", n, cap(buf.B), max)
		}
		r.Put(buf)
	}
	buf, err := r.ReadAll(bytes.NewReader(make([]byte, max+1)), 4<<10, max)
	if !errors.Is(err, ErrTooLarge) || cap(buf.B) > max {
		t.Fatalf("one byte over: %v, capacity %d", err, cap(buf.B))
	}
	r.Put(buf)
	if b.Used() != 0 {
		t.Fatalf("%d bytes still reserved", b.Used())
	}
}

// TestGetReservedTakesNothingWithoutRoom: a body the budget has no room
// for costs no buffer (no allocation, nothing reserved); one that fits
// reserves exactly its buffer's capacity, given back by Put.
func TestGetReservedTakesNothingWithoutRoom(t *testing.T) {
	b := budget.New(16 << 20)
	r := NewReader(16 << 20)
	r.SetBudget(b)
	got, ok := r.GetReserved(5 << 20)
	if !ok || got.Reserved() != int64(cap(got.B)) || cap(got.B) != 8<<20 || b.Used() != 8<<20 {
		t.Fatalf("5 MiB: ok %v, cap %d, reserved %d, used %d", ok, cap(got.B), got.Reserved(), b.Used())
	}
	held := r.Get(0)
	if !r.Reserve(held, b.Limit()-b.Used()) {
		t.Fatal("the rest of the budget")
	}
	if allocs := testing.AllocsPerRun(20, func() {
		if nb, ok := r.GetReserved(5 << 20); ok || nb != nil {
			t.Fatal("a buffer with the budget full")
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations a refused body", allocs)
	}
	r.Put(held)
	r.Put(got)
	if b.Used() != 0 {
		t.Fatalf("%d bytes still reserved", b.Used())
	}
	// Unbudgeted, it is Get.
	u := NewReader(1 << 20)
	if nb, ok := u.GetReserved(100); !ok || cap(nb.B) != 4096 || nb.Reserved() != 0 {
		t.Fatalf("unbudgeted: %v %d %d", ok, cap(nb.B), nb.Reserved())
	}
}

// TestGetReservedWait: a waiter gets its buffer once room is released, or
// nothing at its deadline; it reserves only what it then holds.
func TestGetReservedWait(t *testing.T) {
	b := budget.New(64 << 10)
	r := NewReader(64 << 10)
	r.SetBudget(b)
	held := r.Get(0)
	if !r.Reserve(held, b.Limit()) {
		t.Fatal("the whole budget")
	}
	if nb, ok := r.GetReservedWait(context.Background(), 5000, time.Now().Add(30*time.Millisecond)); ok || nb != nil || b.Used() != b.Limit() {
		t.Fatalf("with no room: %v %v, used %d", ok, nb, b.Used())
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		r.Put(held)
	}()
	nb, ok := r.GetReservedWait(context.Background(), 5000, time.Now().Add(5*time.Second))
	if !ok || nb.Reserved() != int64(cap(nb.B)) || b.Used() != nb.Reserved() {
		t.Fatalf("after room came: %v, reserved %d, used %d", ok, nb.Reserved(), b.Used())
	}
	r.Put(nb)
}

// TestGetReservedSettles: a pooled buffer smaller than its size class (one
// made at a limit that is not a power of two) is charged its capacity, not
// the class's; GetMoved takes its room from a lease first.
func TestGetReservedSettles(t *testing.T) {
	b := budget.New(64 << 20)
	r := NewReader(10_000_000)
	r.SetBudget(b)
	// A pooled buffer of 10,000,000 bytes in the 16 MiB class, its class
	// reserved: charged its capacity.
	small := &Buf{B: make([]byte, 0, 10_000_000), class: classFor(10_000_000)}
	if !b.TryReserve(16<<20) || !r.settle(small, 16<<20, nil) || small.Reserved() != 10_000_000 || b.Used() != 10_000_000 {
		t.Fatalf("smaller: reserved %d, used %d", small.Reserved(), b.Used())
	}
	r.Put(small)
	// Through a lease: what the buffer does not need goes back to it.
	lease0 := r.Get(0)
	small = &Buf{B: make([]byte, 0, 10_000_000), class: classFor(10_000_000)}
	if !b.TryReserve(16<<20) || !r.settle(small, 16<<20, lease0) || small.Reserved() != 10_000_000 || lease0.Reserved() != 16<<20-10_000_000 {
		t.Fatalf("through a lease: reserved %d, lease %d", small.Reserved(), lease0.Reserved())
	}
	r.Put(small)
	r.Put(lease0)
	// One larger than its class (made at n past a power of two): charged
	// its capacity too, or refused with nothing held.
	large := &Buf{B: make([]byte, 0, 5<<20), class: classFor(4 << 20)}
	if !b.TryReserve(4<<20) || !r.settle(large, 4<<20, nil) || large.Reserved() != 5<<20 || b.Used() != 5<<20 {
		t.Fatalf("larger: reserved %d, used %d", large.Reserved(), b.Used())
	}
	r.Put(large)
	got, ok := r.GetReserved(9 << 20)
	if !ok || got.Reserved() != int64(cap(got.B)) || b.Used() != got.Reserved() {
		t.Fatalf("cap %d, reserved %d, used %d", cap(got.B), got.Reserved(), b.Used())
	}
	r.Put(got)
	lease := r.Get(0)
	if !r.Reserve(lease, 8<<20) {
		t.Fatal("the lease")
	}
	moved, ok := r.GetMoved(lease, 5<<20)
	if !ok || moved.Reserved() != 8<<20 || lease.Reserved() != 0 || b.Used() != 8<<20 {
		t.Fatalf("moved: reserved %d, lease %d, used %d", moved.Reserved(), lease.Reserved(), b.Used())
	}
	r.Put(moved)
	r.Put(lease)
	if b.Used() != 0 {
		t.Fatalf("%d bytes still reserved", b.Used())
	}
}
