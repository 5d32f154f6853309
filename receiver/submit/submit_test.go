package submit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

type fixture struct {
	s        *Submitter
	budget   *budget.Budget
	recycled atomic.Int64
}

func newFixture(next consumer.Consumer) *fixture {
	f := &fixture{budget: budget.New(1 << 20)}
	rd := httpbody.NewReader(64 << 10)
	rd.SetBudget(f.budget)
	f.s = &Submitter{Next: next, Bodies: rd, AckTimeout: 200 * time.Millisecond,
		M:       receivermetrics.New(telemetry.TestSettings().Registry, "test"),
		Recycle: func(*record.Batch) { f.recycled.Add(1) }}
	return f
}

// request is a body as a receiver holds it: a pooled buffer that reserved
// its memory, and a batch whose record points into it.
func (f *fixture) request(t *testing.T) (*record.Batch, *httpbody.Buf) {
	t.Helper()
	raw := f.s.Bodies.Get(1000)
	if !f.s.Bodies.Reserve(raw, int64(cap(raw.B))) {
		t.Fatal("no room")
	}
	raw.B = append(raw.B, "payload"...)
	return &record.Batch{Records: []record.Record{{Topic: "t", Value: raw.B}}, MemBytes: 1000}, raw
}

func TestAcknowledged(t *testing.T) {
	h := &consumertest.Holder{}
	f := newFixture(h)
	b, raw := f.request(t)
	tk, err := f.s.Submit(context.Background(), b, true, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.budget.Used() != 0 {
		t.Fatalf("the body kept its reservation (%d bytes) after the queue took the batch", f.budget.Used())
	}
	go func() { time.Sleep(20 * time.Millisecond); h.Release(nil) }()
	if failed, err := tk.Wait(context.Background()); err != nil || failed != 0 {
		t.Fatalf("Wait: %d %v", failed, err)
	}
	if f.recycled.Load() != 1 {
		t.Fatalf("recycled %d times, want 1", f.recycled.Load())
	}
}

// TestRefusedGivesEverythingBack: a batch the pipeline refuses is detached
// (its completion never runs later), its buffers and reservation are back
// at once, and the pipeline's error is returned as is.
func TestRefusedGivesEverythingBack(t *testing.T) {
	f := newFixture(consumertest.Refuse{Err: consumer.ErrFull})
	b, raw := f.request(t)
	tk, err := f.s.Submit(context.Background(), b, true, raw, nil)
	if !errors.Is(err, consumer.ErrFull) || tk != nil {
		t.Fatalf("Submit: %v %v", tk, err)
	}
	if f.budget.Used() != 0 || f.recycled.Load() != 1 {
		t.Fatalf("after a refusal: %d bytes still reserved, recycled %d times", f.budget.Used(), f.recycled.Load())
	}
	b.Complete(nil) // a stray completion must find nothing attached
	if f.recycled.Load() != 1 {
		t.Fatal("the refused batch's completion ran again")
	}
}

// TestTimeoutLeavesBuffersToKafka: after ack_timeout the request is
// answered, but the records still point into its buffers, so those go back
// only when Kafka answers.
func TestTimeoutLeavesBuffersToKafka(t *testing.T) {
	h := &consumertest.Holder{}
	f := newFixture(h)
	b, raw := f.request(t)
	tk, err := f.s.Submit(context.Background(), b, true, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := tk.Wait(context.Background())
	if consumer.KindOf(err) != consumer.KindTimeout || consumer.Reason(err) != "ack_timeout" || failed != 1 {
		t.Fatalf("Wait: %d %v (kind %v)", failed, err, consumer.KindOf(err))
	}
	if f.recycled.Load() != 0 {
		t.Fatal("buffers went back while Kafka still held the records")
	}
	h.Release(nil)
	if f.recycled.Load() != 1 {
		t.Fatalf("recycled %d times after Kafka answered, want 1", f.recycled.Load())
	}
}

func TestClientGone(t *testing.T) {
	h := &consumertest.Holder{}
	f := newFixture(h)
	b, raw := f.request(t)
	ctx, cancel := context.WithCancel(context.Background())
	tk, err := f.s.Submit(ctx, b, true, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := tk.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after the client left: %v", err)
	}
	h.Release(nil)
	if f.recycled.Load() != 1 {
		t.Fatal("buffers not returned when Kafka answered for a request whose client left")
	}
}

// acker acknowledges every batch at once, as a Kafka that never waits.
type acker struct{}

func (acker) Consume(_ context.Context, b *record.Batch) error { b.Complete(nil); return nil }

func BenchmarkSubmitWait(b *testing.B) {
	f := newFixture(acker{})
	f.s.Recycle = nil
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		raw := f.s.Bodies.Get(100)
		batch := &record.Batch{Records: []record.Record{{Topic: "t", Value: raw.B}}}
		tk, err := f.s.Submit(context.Background(), batch, true, raw, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tk.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// A ticket goes back to the pool with its timer: a request after many
// answered ones still gets its whole ack_timeout, from its own start (a
// timer left running from before, or a stale tick, would answer it early).
func TestReusedTicketTimesOutOnItsOwn(t *testing.T) {
	h := &consumertest.Holder{}
	f := newFixture(h)
	for i := 0; i < 50; i++ {
		b, raw := f.request(t)
		tk, err := f.s.Submit(context.Background(), b, true, raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.Release(nil)
		if failed, err := tk.Wait(context.Background()); err != nil || failed != 0 {
			t.Fatalf("request %d: %d %v", i, failed, err)
		}
	}
	time.Sleep(f.s.AckTimeout) // a timer still running from those would have fired by now
	b, raw := f.request(t)
	tk, err := f.s.Submit(context.Background(), b, true, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = tk.Wait(context.Background())
	if consumer.Reason(err) != "ack_timeout" || time.Since(start) < f.s.AckTimeout {
		t.Fatalf("Wait: %v after %s; want ack_timeout after %s", err, time.Since(start), f.s.AckTimeout)
	}
	h.Release(nil)
}
