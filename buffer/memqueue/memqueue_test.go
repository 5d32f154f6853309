package memqueue

import (
	"context"
	"errors"
	"github.com/ferryhq/ferry/buffer/budget"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// gauge reads a gauge as a scrape would.
func gauge(t *testing.T, set telemetry.Settings, name string) float64 {
	t.Helper()
	mfs, err := set.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func batch(size int64) *record.Batch {
	return &record.Batch{Records: make([]record.Record, 1), MemBytes: size}
}

// TestBoundUnderConcurrency: many goroutines offering at once never push the
// reserved bytes past the limit, and every refusal is ErrFull.
func TestBoundUnderConcurrency(t *testing.T) {
	set := telemetry.TestSettings()
	p := &consumertest.Holder{}
	q, err := New(Config{MemoryLimit: 1 << 20, ReadyBelow: 0.9}, set, budget.New(1<<20), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	var accepted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				err := q.Consume(context.Background(), batch(10_000))
				if err == nil {
					accepted.Add(1)
				} else if errors.Is(err, consumer.ErrFull) {
					refused.Add(1)
				} else {
					t.Error(err)
				}
				if u := q.Used(); u > q.Limit() {
					t.Errorf("used %d > limit %d", u, q.Limit())
				}
			}
		}()
	}
	wg.Wait()
	if got := accepted.Load(); got != (1<<20)/10_000 {
		t.Fatalf("accepted %d batches, want exactly %d to fit", got, (1<<20)/10_000)
	}
	if g := gauge(t, set, "ferry_queue_bytes"); g != float64(q.Used()) || g > float64(q.Limit()) {
		t.Fatalf("gauge %v, used %d", g, q.Used())
	}
	if v := testutil.ToFloat64(q.refused.WithLabelValues("queue_full")); v != float64(refused.Load()) {
		t.Fatalf("refused counter %v, refusals %d", v, refused.Load())
	}
	p.Release(nil)
	if q.Used() != 0 || gauge(t, set, "ferry_queue_records") != 0 {
		t.Fatalf("after acks: used %d", q.Used())
	}
}

func TestUnavailableWhenDownstreamDown(t *testing.T) {
	q, _ := New(Config{MemoryLimit: 1 << 20, ReadyBelow: 0.9}, telemetry.TestSettings(), budget.New(1<<20), &consumertest.Holder{}, func() bool { return false })
	if err := q.Consume(context.Background(), batch(1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := q.Consume(context.Background(), batch(1)); !errors.Is(err, consumer.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
	var pe *consumer.PermanentError
	if err := q.Consume(context.Background(), batch(2<<20)); !errors.As(err, &pe) || pe.Reason != "record_too_large" {
		t.Fatalf("batch over the whole limit: got %v", err)
	}
}

// TestRefusedByNextReleases: when the next stage refuses, the reservation is
// returned and the queue's completion is detached from the batch.
func TestRefusedByNextReleases(t *testing.T) {
	boom := errors.New("no")
	q, _ := New(Config{MemoryLimit: 1 << 20, ReadyBelow: 0.9}, telemetry.TestSettings(), budget.New(1<<20),
		consumer.Func(func(context.Context, *record.Batch) error { return boom }), nil)
	b := batch(1000)
	if err := q.Consume(context.Background(), b); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if q.Used() != 0 {
		t.Fatalf("used %d after refusal", q.Used())
	}
	b.Fail(boom) // the owner completes it: must not release a second time
	if q.Used() != 0 {
		t.Fatalf("used %d after owner's Fail: double release", q.Used())
	}
}

func BenchmarkConsume(b *testing.B) {
	q, _ := New(Config{MemoryLimit: 1 << 30, ReadyBelow: 0.9}, telemetry.TestSettings(), budget.New(1<<30),
		consumer.Func(func(_ context.Context, bt *record.Batch) error { bt.Arm(); bt.Ack(nil); return nil }), nil)
	bt := batch(1000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		bt.Reset()
		bt.Records = bt.Records[:1]
		bt.MemBytes = 1000
		_ = q.Consume(context.Background(), bt)
	}
}

// TestBlockTimeoutWaitsForRoom: with block_timeout a request that does not
// fit waits, and is taken as soon as room is released; without room it is
// refused after the timeout, not before.
func TestBlockTimeoutWaitsForRoom(t *testing.T) {
	set := telemetry.TestSettings()
	h := &consumertest.Holder{}
	q, err := New(Config{MemoryLimit: 1 << 20, ReadyBelow: 0.9, BlockTimeout: 300 * time.Millisecond}, set, budget.New(1<<20), h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Consume(context.Background(), batch(900<<10)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := q.Consume(context.Background(), batch(900<<10)); err != consumer.ErrFull {
		t.Fatalf("got %v, want ErrFull after the timeout", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("refused after %s, before block_timeout", d)
	}
	go func() { time.Sleep(50 * time.Millisecond); h.Release(nil) }()
	start = time.Now()
	if err := q.Consume(context.Background(), batch(900<<10)); err != nil {
		t.Fatalf("room was released but the request was refused: %v", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Fatalf("took %s to notice the released room", d)
	}
}
