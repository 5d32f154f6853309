package receipt

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/record"
)

// largeSettledReceipt is a store holding one done receipt of n records
// (owner 7) whose records alternate partitions: a range a record, the
// largest answer a lookup can build.
func largeSettledReceipt(n int) (*Store, string) {
	s, _ := NewStore(Config{MaxBytes: 16 << 20, MaxAge: time.Hour}, prometheus.NewRegistry())
	rel := make([]uint32, n)
	at := make([]Pos, n)
	for i := range rel {
		rel[i] = uint32(i * 40)
		at[i] = Pos{1, 64 + int64(i*40)}
	}
	id := s.Add(Pos{1, 64}, 64+int64(n)*40, rel, 7)
	rc := record.NewReceipt(n)
	for i := 0; i < n; i++ {
		rc.Acked(i, "topic", int32(i%2), int64(i))
	}
	s.Settle(at, rc)
	return s, id
}

// TestLookupsDoNotStallSettle: Settle runs on the Kafka client's promise
// goroutine (every record's acknowledgement, every tenant's) and Add under
// the spool's append lock. A client that looks up one large receipt in a
// loop must not hold them off for milliseconds at a time.
func TestLookupsDoNotStallSettle(t *testing.T) {
	const n = 100000
	s, id := largeSettledReceipt(n)

	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			s.Lookup(id, 7)
		}
	}()
	one := record.NewReceipt(1)
	one.Acked(0, "topic", 0, 1)
	var worst time.Duration
	for i := 0; i < 50; i++ {
		t0 := time.Now()
		s.Settle([]Pos{{2, 64}}, one) // another tenant's record
		worst = max(worst, time.Since(t0))
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	<-done
	if worst > 5*time.Millisecond {
		t.Fatalf("a promise waited %v for the receipt store's lock while a client looked up a receipt", worst)
	}
}
