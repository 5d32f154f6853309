package spill

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// memory stands for queue → exporter: it refuses while full is set.
type memory struct {
	full atomic.Bool
	sink consumertest.Sink
}

func (m *memory) Consume(ctx context.Context, b *record.Batch) error {
	if m.full.Load() {
		return consumer.ErrFull
	}
	return m.sink.Consume(ctx, b)
}

func batch(v string) *record.Batch {
	return &record.Batch{Records: []record.Record{{Topic: "t", Value: []byte(v)}}}
}

// TestSpillsAndComesBack: memory while it has room; disk when it is full or
// Kafka is down, and everything to disk until the spool drains; then memory
// again. Nothing is refused and everything arrives.
func TestSpillsAndComesBack(t *testing.T) {
	set := telemetry.TestSettings()
	kafka := &consumertest.Holder{} // the spool's reader feeds a Kafka that is slow to answer
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), SegmentBytes: 1 << 20, MaxBytes: 64 << 20, Fsync: "never",
		WriteBuffer: 8 << 20, ReadAhead: 8 << 20}, set, spool.Links{Next: kafka})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	mem := &memory{}
	var up atomic.Bool
	up.Store(true)
	r := New(set, mem, sp, up.Load)
	if err := sp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	send := func(v string) {
		t.Helper()
		if err := r.Consume(context.Background(), batch(v)); err != nil {
			t.Fatalf("%s refused: %v", v, err)
		}
	}
	send("m1")
	if r.Spilling() || len(mem.sink.Records()) != 1 {
		t.Fatal("with room and Kafka up, a batch must go from memory")
	}
	mem.full.Store(true)
	send("d1")
	if !r.Spilling() {
		t.Fatal("a full memory queue must spill")
	}
	mem.full.Store(false)
	send("d2") // room again, but the spool is not drained: disk, to keep order
	if len(mem.sink.Records()) != 1 {
		t.Fatal("a batch overtook the spool")
	}
	waitFor(t, func() bool { return kafka.Held() == 2 || kafka.Held() == 1 })
	waitFor(t, func() bool { kafka.Release(nil); return sp.Backlog() == 0 })
	waitFor(t, func() bool { return !r.Spilling() })
	send("m2")
	if len(mem.sink.Records()) != 2 {
		t.Fatal("after draining, batches must go from memory again")
	}
	up.Store(false)
	send("d3")
	if !r.Spilling() {
		t.Fatal("Kafka down must spill")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
