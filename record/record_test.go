package record

import (
	"errors"
	"sync"
	"testing"
)

func TestCompletionRunsOnceAfterLastAck(t *testing.T) {
	var b Batch
	b.Records = make([]Record, 100)
	var order []string
	var calls int
	var gotErr error
	b.OnDone(func(err error) { order = append(order, "receiver"); calls++; gotErr = err })
	b.OnDone(func(error) { order = append(order, "queue") })
	b.Arm()
	boom := errors.New("boom")
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if i == 42 {
				b.Ack(boom)
			} else {
				b.Ack(nil)
			}
		}(i)
	}
	wg.Wait()
	if calls != 1 || !errors.Is(gotErr, boom) || b.Failed() != 1 {
		t.Fatalf("calls=%d err=%v failed=%d", calls, gotErr, b.Failed())
	}
	if len(order) != 2 || order[0] != "queue" || order[1] != "receiver" {
		t.Fatalf("order %v: the stage nearest the exporter must release first", order)
	}
}

// AckN answers many records at once; the batch completes only when every
// record is answered, whichever comes last.
func TestAckNCountsWithSingleAcks(t *testing.T) {
	for _, failureLast := range []bool{false, true} {
		var b Batch
		b.Records = make([]Record, 5)
		calls := 0
		var gotErr error
		b.OnDone(func(err error) { calls++; gotErr = err })
		b.Arm()
		boom := errors.New("boom")
		if failureLast {
			b.AckN(4)
			if calls != 0 {
				t.Fatal("completed with a record unanswered")
			}
			b.Ack(boom)
		} else {
			b.Ack(boom)
			b.AckN(0) // no-op
			if calls != 0 {
				t.Fatal("completed early")
			}
			b.AckN(4)
		}
		if calls != 1 || !errors.Is(gotErr, boom) || b.Failed() != 1 {
			t.Fatalf("failure last %v: calls=%d err=%v failed=%d", failureLast, calls, gotErr, b.Failed())
		}
	}
}

func TestPopDoneAndManyCompletions(t *testing.T) {
	var b Batch
	b.Records = make([]Record, 1)
	n := 0
	for i := 0; i < 6; i++ { // past the inline array
		b.OnDone(func(error) { n++ })
	}
	b.OnDone(func(error) { t.Fatal("popped completion ran") })
	b.PopDone()
	b.Arm()
	b.Ack(nil)
	if n != 6 {
		t.Fatalf("%d completions ran, want 6", n)
	}
	b.Reset()
	if len(b.Records) != 0 || b.ndones != 0 || b.extra != nil {
		t.Fatal("Reset left state behind")
	}
}

func BenchmarkBatchAck(b *testing.B) {
	var batch Batch
	batch.Records = make([]Record, 1000)
	batch.OnDone(func(error) {})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		batch.Arm()
		for range batch.Records {
			batch.Ack(nil)
		}
	}
}

// Charge is what every receiver reserves for a batch: its buffers, an
// Overhead per record and the bytes the Kafka client copies per record.
func TestCharge(t *testing.T) {
	hs := []Header{{Key: "ferry.tenant", Value: []byte("app")}, {Key: "k"}}
	if n := HeaderBytes(hs); n != len("ferry.tenant")+3+1 {
		t.Fatalf("HeaderBytes %d", n)
	}
	b := &Batch{Records: make([]Record, 3)}
	for i := range b.Records {
		b.Records[i].Headers = hs
	}
	b.Charge(4096, 3*HeaderBytes(hs))
	if want := int64(4096 + 3*Overhead + 3*16); b.MemBytes != want {
		t.Fatalf("MemBytes %d, want %d", b.MemBytes, want)
	}
	r := Record{Key: []byte("ab"), Value: []byte("cde"), Headers: hs}
	if r.Size() != 5+16 {
		t.Fatalf("Size %d", r.Size())
	}
}

// TestReserveHeaders: headers' room is reserved a chunk at a time (one
// budget operation per 64 KiB, not per record), and only what a record
// needs when a chunk does not fit.
func TestReserveHeaders(t *testing.T) {
	var calls []int64
	budget := int64(100 << 10)
	reserve := func(n int64) bool {
		calls = append(calls, n)
		if n > budget {
			return false
		}
		budget -= n
		return true
	}
	var room int64
	for range 100 { // 100 records of 5 headers: 40,000 bytes, one chunk
		if !ReserveHeaders(&room, 5*int64(HeaderOverhead), reserve) {
			t.Fatal("refused within the first chunk")
		}
	}
	if len(calls) != 1 || calls[0] != 64<<10 || room != 64<<10-100*5*int64(HeaderOverhead) {
		t.Fatalf("reservations %v, %d left", calls, room)
	}
	// A record needing more than the budget's rest in chunks: only its need.
	need := room + 30<<10
	if !ReserveHeaders(&room, need, reserve) || room != 0 || calls[len(calls)-1] != 30<<10 {
		t.Fatalf("a need beyond the chunk that fits: reservations %v, %d left", calls, room)
	}
	if ReserveHeaders(&room, 10<<10, reserve) {
		t.Fatal("a need beyond the budget was granted")
	}
}
