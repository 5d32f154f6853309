package kafkaexporter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// flushes runs an adaptive flusher whose flush only counts, with no
// request beyond the budget (TestAdaptiveSecondRequestOnceArrivalsStop
// tests that).
func flushes(t *testing.T, budget int32) (*adaptive, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	a := newAdaptive(budget, time.Second, func() { n.Add(1) }, func() {})
	a.noMore = true
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { a.run(stop); close(done) }()
	t.Cleanup(func() { close(stop); <-done })
	return a, &n
}

// flushedTimes waits for n to reach want and checks it stays there.
func flushedTimes(t *testing.T, n *atomic.Int64, want int64, why string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); n.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: %d flushes, want %d", why, n.Load(), want)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if got := n.Load(); got != want {
		t.Fatalf("%s: %d flushes, want exactly %d", why, got, want)
	}
}

// The decision: flush when a batch is handed over and no broker has its
// budget in flight; otherwise wait for the answer that frees it.
func TestAdaptiveFlushesOnlyWhileKafkaIsIdle(t *testing.T) {
	a, n := flushes(t, 1)

	a.submitted(0)
	flushedTimes(t, n, 1, "idle: a submit is flushed at once")

	a.written(1)
	a.submitted(0)
	a.submitted(0)
	flushedTimes(t, n, 1, "broker 1 has its budget in flight: the submits wait")
	a.answered(1, 0, 0, true)
	flushedTimes(t, n, 2, "its answer sends what waited, in one flush")

	a.answered(1, 0, 0, true) // no request of ours in flight: ignored, nothing goes negative
	if a.busy.Load() != 0 {
		t.Fatalf("busy %d after an unmatched answer", a.busy.Load())
	}
	a.answered(1, 0, 0, true)
	flushedTimes(t, n, 2, "an answer with nothing submitted flushes nothing")

	// Two brokers: records wait while either is at its budget.
	a.written(1)
	a.written(2)
	a.submitted(0)
	a.answered(1, 0, 0, true)
	flushedTimes(t, n, 2, "broker 2 still busy")
	a.answered(2, 0, 0, true)
	flushedTimes(t, n, 3, "both answered")
	if len(a.perBroker) != 0 {
		t.Fatalf("brokers with nothing in flight kept: %v", a.perBroker)
	}
}

func TestAdaptiveBudgetCountsRequests(t *testing.T) {
	a, n := flushes(t, 2)
	a.written(7)
	a.submitted(0)
	flushedTimes(t, n, 1, "one of two requests in flight: still below the budget")
	a.written(7)
	a.written(7)
	a.submitted(0)
	a.answered(7, 0, 0, true)
	flushedTimes(t, n, 1, "two of two in flight after one answer")
	a.answered(7, 0, 0, true)
	flushedTimes(t, n, 2, "back below the budget")
}

// A flush is followed by a wait for the request it started to be written,
// so that the submits arriving meanwhile wait for that request's answer
// and share the next one, rather than racing the first in one each.
func TestAdaptiveCoalescesSubmitsDuringAFlush(t *testing.T) {
	var n atomic.Int64
	var a *adaptive
	a = newAdaptive(1, time.Second, func() {
		n.Add(1)
		go func() { time.Sleep(50 * time.Millisecond); a.written(1) }() // the client writes the request a little later
	}, func() {})
	a.noMore = true
	a.writeWait = time.Second
	stop := make(chan struct{})
	defer close(stop)
	go a.run(stop)
	a.submitted(0)
	for end := time.Now().Add(5 * time.Second); n.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("never flushed")
		}
	}
	for i := 0; i < 100; i++ {
		a.submitted(0)
	}
	flushedTimes(t, &n, 1, "a burst between a flush and its write")
	time.Sleep(100 * time.Millisecond) // written by now: the broker is busy
	flushedTimes(t, &n, 1, "the burst waits for the answer")
	a.answered(1, 0, 0, true)
	flushedTimes(t, &n, 2, "the answer sends the burst in one flush")
}

// Early sends are bounded to a tenth of the flusher's time: a flush that
// costs 5 ms (a client knowing tens of thousands of partitions) is not
// followed by another for 50 ms, however idle Kafka is.
func TestAdaptiveBoundsTheCostOfFlushing(t *testing.T) {
	var n atomic.Int64
	a := newAdaptive(1, time.Second, func() { n.Add(1); time.Sleep(5 * time.Millisecond) }, func() {})
	a.noMore = true
	stop := make(chan struct{})
	defer close(stop)
	go a.run(stop)
	a.submitted(0)
	for end := time.Now().Add(5 * time.Second); n.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("never flushed")
		}
	}
	t0 := time.Now()
	a.submitted(0)
	for end := time.Now().Add(5 * time.Second); n.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the second submit was never flushed")
		}
	}
	if d := time.Since(t0); d < 40*time.Millisecond {
		t.Fatalf("a second flush %s after one that took 5 ms; want ≥ 45 ms", d)
	}
}

// A broker with one request of ours in flight takes a second once nothing
// has been handed over for a quarter of the round trips lately: the few
// clients that keep the agent busy are all waiting, and what they handed
// over would go out unchanged when the answer comes. Not a third; not while
// records keep arriving; not while the brokers queue. On the old code every
// submit waited for the answer.
func TestAdaptiveSecondRequestOnceArrivalsStop(t *testing.T) {
	var n atomic.Int64
	start := func() *adaptive {
		a := newAdaptive(1, time.Second, func() { n.Add(1) }, func() {})
		a.srtt.Store(int64(400 * time.Millisecond)) // a quiet of 100 ms: room for a slow machine
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { a.run(stop); close(done) }()
		t.Cleanup(func() { close(stop); <-done })
		return a
	}
	a := start()
	a.submitted(0)
	flushedTimes(t, &n, 1, "idle: at once")
	a.written(1)
	t0 := time.Now()
	a.submitted(0)
	flushedTimes(t, &n, 2, "one request in flight and 100 ms without a submit: a second request")
	if d := time.Since(t0); d < 95*time.Millisecond {
		t.Fatalf("the second request left %v after the last submit, before the 100 ms quiet", d)
	}
	a.written(1)
	a.submitted(0)
	time.Sleep(250 * time.Millisecond)
	flushedTimes(t, &n, 2, "two in flight: no third, however quiet")
	a.answered(1, 0, 0, true)
	flushedTimes(t, &n, 3, "one answered: a second request again once quiet")
	a.answered(1, 0, 0, true)

	// Records arriving every 2 ms wait for the answer (the flusher looks
	// adaptiveQuietChecks times, then waits for it).
	a.written(1)
	looked := a.looked.Load()
	stopSending := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			select {
			case <-stopSending:
				return
			case <-time.After(2 * time.Millisecond):
				a.submitted(0)
			}
		}
	}()
	time.Sleep(700 * time.Millisecond) // time for 7 looks, were they not bounded
	close(stopSending)
	<-sent
	if got := n.Load(); got != 3 {
		t.Fatalf("records arriving every 2 ms: %d flushes while one request was in flight, want none beyond the 3 before", got)
	}
	if got := a.looked.Load() - looked; got < 1 || got > adaptiveQuietChecks {
		t.Fatalf("records arriving every 2 ms for 700 ms: the flusher looked for quiet %d times, want 1 to %d", got, adaptiveQuietChecks)
	}
	a.answered(1, 0, 0, true)
	flushedTimes(t, &n, 4, "the answer sends them in one request")

	// The brokers queue (pacing's gap above 0): no second request.
	a.written(1)
	a.gap.Store(int64(time.Millisecond))
	a.submitted(0)
	time.Sleep(100 * time.Millisecond)
	flushedTimes(t, &n, 4, "brokers queueing: the submit waits for the answer")
}

// The quiet follows the round trips: a moving average of them, an eighth
// of each new one, large requests too.
func TestAdaptiveRoundTripAverage(t *testing.T) {
	a := newAdaptive(1, time.Second, func() {}, func() {})
	for i := 0; i < 3; i++ {
		a.written(1)
	}
	a.answered(1, 8*time.Millisecond, 1<<20, true)
	if got := time.Duration(a.srtt.Load()); got != 8*time.Millisecond {
		t.Fatalf("first round trip: average %v, want 8ms", got)
	}
	a.answered(1, 16*time.Millisecond, 1<<20, true)
	if got := time.Duration(a.srtt.Load()); got != 9*time.Millisecond {
		t.Fatalf("after 16 ms: average %v, want 9ms", got)
	}
	a.answered(1, time.Second, 100, false)
	if got := time.Duration(a.srtt.Load()); got != 9*time.Millisecond {
		t.Fatalf("a failed request moved the average to %v", got)
	}
	if a.busy.Load() != 0 || a.busyMore.Load() != 0 {
		t.Fatalf("busy %d, busyMore %d with nothing in flight", a.busy.Load(), a.busyMore.Load())
	}
}

// holdProduce makes the cluster hold the next produce request until
// release is closed; held reports when it arrived.
func holdProduce(c *kfake.Cluster) (held <-chan struct{}, release chan struct{}) {
	h, r := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if once.CompareAndSwap(false, true) {
			c.DropControl()
			close(h)
			c.SleepControl(func() { <-r })
		}
		return nil, nil, false
	})
	return h, r
}

func consumeAsync(t *testing.T, e *Exporter, value string) <-chan error {
	t.Helper()
	b := &record.Batch{Records: []record.Record{{Topic: "t", Value: []byte(value)}}}
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return done
}

func waitDone(t *testing.T, done <-chan error, within time.Duration, what string) time.Duration {
	t.Helper()
	t0 := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(within):
		t.Fatalf("%s: not acknowledged within %s", what, within)
	}
	return time.Since(t0)
}

func readyExporter(t *testing.T, cfg Config) (*Exporter, *kfake.Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg.Brokers = c.ListenAddrs()
	e := newExporter(t, cfg, 64<<20)
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	// The first batch pays for metadata and the producer id.
	waitDone(t, consumeAsync(t, e, "warm"), 10*time.Second, "warm-up")
	return e, c
}

// With a long linger, a lone batch on an idle agent is answered after one
// round trip in adaptive mode and after the linger in fixed mode.
func TestAdaptiveIdleBatchSkipsTheLinger(t *testing.T) {
	const linger = time.Second
	cfg := testCfg(nil)
	cfg.Linger, cfg.LingerMode = linger, "adaptive"
	e, _ := readyExporter(t, cfg)
	skipped := testutil.ToFloat64(e.m.lingerSkipped)
	for i := 0; i < 3; i++ {
		if d := waitDone(t, consumeAsync(t, e, "idle"), 10*time.Second, "idle batch"); d > linger/2 {
			t.Fatalf("an idle batch took %s in adaptive mode; the %s linger should have been skipped", d, linger)
		}
	}
	if got := testutil.ToFloat64(e.m.lingerSkipped) - skipped; got < 3 {
		t.Fatalf("ferry_exporter_kafka_linger_skipped_total grew by %v for 3 idle batches", got)
	}
	// The produce round trips reach the pacing from the client's
	// end-to-end hook, and an idle broker leaves no gap.
	e.ad.mu.Lock()
	sampled := 0
	for _, b := range e.ad.rtt {
		sampled += b.n
	}
	e.ad.mu.Unlock()
	if sampled < 3 {
		t.Fatalf("pacing after 3 idle round trips: %d sampled", sampled)
	}
	if g, err := testutil.GatherAndCount(e.set.Registry, "ferry_exporter_kafka_linger_pacing_seconds"); err != nil || g != 1 {
		t.Fatalf("ferry_exporter_kafka_linger_pacing_seconds: %d series (%v)", g, err)
	}

	cfg.LingerMode = "fixed"
	f, _ := readyExporter(t, cfg)
	if f.ad != nil {
		t.Fatal("fixed mode built the adaptive flusher")
	}
	if d := waitDone(t, consumeAsync(t, f, "idle"), 10*time.Second, "fixed idle batch"); d < linger*9/10 {
		t.Fatalf("fixed mode answered in %s, before its %s linger", d, linger)
	}
}

// While a produce request is in flight, batches handed over together go
// in one second request once nothing more arrives (their clients would
// gain nothing by waiting for the answer), and a batch after them waits
// for an answer (two in flight), going as soon as one is back, long
// before the linger cap. Before 2026-11-29 every batch waited for the
// first answer.
func TestAdaptiveBusyBatchWaitsForTheAnswer(t *testing.T) {
	const linger = 3 * time.Second
	cfg := testCfg(nil)
	cfg.Linger, cfg.LingerMode = linger, "adaptive"
	e, c := readyExporter(t, cfg)
	var mu sync.Mutex
	var perRequest []int32 // records in each produce request the broker read
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		var n int32
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				var rb kmsg.RecordBatch
				if rb.ReadFrom(p.Records) == nil {
					n += rb.NumRecords
				}
			}
		}
		mu.Lock()
		perRequest = append(perRequest, n)
		mu.Unlock()
		return nil, nil, false
	})
	held, release := holdProduce(c)
	writes := func() float64 { return testutil.ToFloat64(e.m.requests[0]) }
	w0 := writes()
	first := consumeAsync(t, e, "first")
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the first batch was not sent at once")
	}
	// Round trips of 400 ms lately: a quiet of 100 ms, so the two
	// batches handed over together are quiet only after both.
	e.ad.srtt.Store(int64(400 * time.Millisecond))
	second := consumeAsync(t, e, "second")
	third := consumeAsync(t, e, strings.Repeat("third", 10))
	time.Sleep(300 * time.Millisecond)
	if got := writes() - w0; got != 2 {
		t.Fatalf("%v produce requests written while the first was unanswered, want 2 (the two batches that came together share a second)", got)
	}

	fourth := consumeAsync(t, e, "fourth")
	time.Sleep(300 * time.Millisecond)
	if got := writes() - w0; got != 2 {
		t.Fatalf("%v produce requests written with two unanswered, want 2 (the fourth waits for an answer)", got)
	}
	close(release)
	waitDone(t, first, 5*time.Second, "first")
	if d := waitDone(t, fourth, linger/2, "fourth"); d > linger/3 {
		t.Fatalf("the waiting batch took %s after the answer", d)
	}
	waitDone(t, second, time.Second, "second")
	waitDone(t, third, time.Second, "third")
	if got := writes() - w0; got != 3 {
		t.Fatalf("%v produce requests for four batches, want 3", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(perRequest) < 3 || fmt.Sprint(perRequest[len(perRequest)-3:]) != "[1 2 1]" {
		t.Fatalf("records per produce request %v, want the last three [1 2 1] (second and third together)", perRequest)
	}
}

// Without idempotence (acks below all) the Kafka client writes one produce
// request at a time to a broker: the flusher does not try for a second.
func TestAdaptiveNoSecondRequestWithoutIdempotence(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"})
	cfg.LingerMode, cfg.Linger = "adaptive", 50*time.Millisecond
	for _, idem := range []bool{true, false} {
		cfg.Idempotent = idem
		if !idem {
			cfg.Acks = "leader"
		}
		e, err := New(cfg, telemetry.TestSettings(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		noMore := e.ad.noMore
		_ = e.Shutdown(context.Background())
		if noMore == idem {
			t.Fatalf("idempotent %v: noMore %v", idem, noMore)
		}
	}
}

func TestLingerModeConfig(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"})
	cfg.LingerMode = "sometimes"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "linger_mode") {
		t.Fatalf("linger_mode sometimes: %v", err)
	}
	for _, tc := range []struct {
		mode     string
		linger   time.Duration
		adaptive bool
	}{{"adaptive", time.Millisecond, true}, {"", time.Millisecond, true}, {"fixed", time.Millisecond, false}, {"adaptive", 0, false}} {
		cfg.LingerMode, cfg.Linger = tc.mode, tc.linger
		e, err := New(cfg, telemetry.TestSettings(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if (e.ad != nil) != tc.adaptive {
			t.Errorf("linger_mode %q, linger %s: adaptive %v, want %v", tc.mode, tc.linger, e.ad != nil, tc.adaptive)
		}
		_ = e.Shutdown(context.Background())
	}
	// Delivery mode spool keeps its own fixed linger.
	cfg.LingerMode, cfg.Linger = "adaptive", time.Millisecond
	x, err := NewFactory().Create(&cfg, exporter.Env{Set: telemetry.TestSettings(), BufferedBytes: 1 << 20, Spooled: true, SpoolLinger: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := x.(*Exporter)
	if e.ad != nil || e.cfg.Linger != 50*time.Millisecond || e.cfg.LingerMode != "fixed" {
		t.Errorf("spool: adaptive %v, linger %s %s; want the spool's fixed 50ms", e.ad != nil, e.cfg.Linger, e.cfg.LingerMode)
	}
	// Changing the mode is reported for a restart, as the linger is.
	next := cfg
	next.LingerMode = "fixed"
	if restart, err := e.Reload(&next); err != nil || !restart {
		t.Errorf("reload to linger_mode fixed: restart %v, err %v", restart, err)
	}
	_ = e.Shutdown(context.Background())
}

// BenchmarkEarlyFlush is the cost of one early send (kgo.Client.Flush with
// a done context) as the client knows more partitions: franz-go stops the
// linger of every partition of every topic it has produced to.
func BenchmarkEarlyFlush(b *testing.B) {
	// 1,000 topics (12,000 partitions: 180 µs a flush) takes a minute to
	// set up against the fake broker; the cost grows linearly.
	for _, topics := range []int{1, 100} {
		b.Run(fmt.Sprintf("partitions=%d", topics*12), func(b *testing.B) {
			names := make([]string, topics)
			for i := range names {
				names[i] = fmt.Sprintf("t%d", i)
			}
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(12, names...))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			for _, n := range names {
				if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: n, Value: []byte("v")}).FirstErr(); err != nil {
					b.Fatal(err)
				}
			}
			flush := clientFlush(cl.Flush)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				flush()
			}
		})
	}
}

// The pacing gap rises by a quarter of the cap while the median round trip
// is beyond the dead band, up to the cap, and falls by an eighth of itself
// otherwise, to 0 under a millisecond.
func TestPacingGapRisesAndFalls(t *testing.T) {
	const limit = 40 * time.Millisecond
	base := time.Millisecond
	gap := time.Duration(0)
	for i, want := range []time.Duration{10, 20, 30, 40, 40} {
		if gap = nextGap(gap, 20*time.Millisecond, base, limit); gap != want*time.Millisecond {
			t.Fatalf("queueing, step %d: gap %v, want %v ms", i, gap, want)
		}
	}
	// Within the band (max(2 × base, base + 2 ms) = 3 ms): not queueing.
	if g := nextGap(0, 3*time.Millisecond, base, limit); g != 0 {
		t.Fatalf("a median at the band: gap %v, want 0", g)
	}
	if g := nextGap(0, 3*time.Millisecond+time.Microsecond, base, limit); g != 10*time.Millisecond {
		t.Fatalf("a median just past the band: gap %v, want 10 ms", g)
	}
	// A slow cluster's base widens the band to twice it.
	if g := nextGap(0, 19*time.Millisecond, 10*time.Millisecond, limit); g != 0 {
		t.Fatalf("base 10 ms, median 19 ms: gap %v, want 0", g)
	}
	steps := 0
	for gap > 0 {
		next := nextGap(gap, base, base, limit)
		if next != 0 && next != gap-gap/8 {
			t.Fatalf("idle: gap %v fell to %v, want an eighth less", gap, next)
		}
		gap = next
		steps++
	}
	if steps != 28 { // 40 ms × (7/8)^27 ≈ 1.09 ms, then under 1 ms: 0
		t.Fatalf("the gap fell from the cap to 0 in %d steps, want 28", steps)
	}
}

// The pacing gap follows a broker's median round trip against its least
// single one of the last one or two windows. An idle cluster whose round
// trip varies by itself (replica fetches: 1 or 3 ms) is not paced; a
// queueing one is, up to the cap; a request written behind another of ours
// is not sampled; the base forgets a least round trip older than two
// windows.
func TestPacingSampleFollowsTheMedian(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdaptive(1, 40*time.Millisecond, func() {}, func() {})
	a.now = func() time.Time { return now }
	answer := func(rtt time.Duration) { a.written(1); a.answered(1, rtt, 0, true) }
	ms := time.Millisecond
	for i := 0; i < 64; i++ {
		answer(time.Duration(1+2*(i%2)) * ms)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("idle cluster with a bimodal round trip: gap %v, want 0", g)
	}
	// 7 slow answers and a fast one: the 72nd answer is judged on 16 whose
	// median is still 3 ms (a mean, 14 ms, or the slowest would pace).
	for i := 0; i < 7; i++ {
		answer(30 * ms)
	}
	answer(ms)
	if g := a.Gap(); g != 0 {
		t.Fatalf("7 slow answers of 16: gap %v, want 0", g)
	}
	// Requests written behind one of ours in flight wait for it at the
	// broker: their round trips are not the broker's queueing.
	for i := 0; i < 64; i++ {
		a.written(1)
		a.written(1)
		a.answered(1, ms, 0, true)
		a.answered(1, 60*ms, 0, true)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("only the requests written behind our own were slow: gap %v, want 0", g)
	}
	for i, want := range []time.Duration{10, 20, 30, 40, 40} {
		for j := 0; j < rttRing/2; j++ {
			answer(30 * ms)
		}
		if g := a.Gap(); g != want*ms && !(i == 0 && g == 0) {
			t.Fatalf("queueing, evaluation %d: gap %v, want %v ms", i, g, want)
		}
	}
	if g := a.Gap(); g != 40*ms {
		t.Fatalf("queueing brokers: gap %v, want the 40 ms cap", g)
	}
	for i := 0; i < 240; i++ {
		answer(ms)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("idle again: gap %v, want 0", g)
	}
	// The broker gets slower for good (10 ms, 19 at times): a window
	// later 10 ms is its base and 19 ms no queueing.
	now = now.Add(2 * baseWindow) // idle for two windows: the old least is forgotten
	for i := 0; i < 64; i++ {
		answer(time.Duration(10+9*(i%2)) * ms)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("a slower broker after an idle spell: gap %v, want 0", g)
	}
	// A second broker has its own base: a far one (20 ms) is not queueing.
	for i := 0; i < 64; i++ {
		a.written(2)
		a.answered(2, 20*ms, 0, true)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("a far broker: gap %v, want 0", g)
	}
	// Failed requests are not sampled.
	for i := 0; i < 64; i++ {
		a.written(1)
		a.answered(1, 500*ms, 0, false)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("failed requests: gap %v, want 0", g)
	}
	// Nor are large ones: a request of a megabyte takes its own time at
	// the broker (the agent alone at full load), which is not the
	// brokers' queueing, and it is never paced anyway. Sampled, it paced
	// the small requests of the next seconds (pan's shape after a burst
	// ran at half its rate).
	for i := 0; i < 64; i++ {
		a.written(1)
		a.answered(1, 200*ms, 1<<20, true)
	}
	if g := a.Gap(); g != 0 {
		t.Fatalf("large requests: gap %v, want 0", g)
	}
	for i := 0; i < 64; i++ {
		a.written(1)
		a.answered(1, 200*ms, pacingSampleMaxBytes, true)
	}
	if g := a.Gap(); g == 0 {
		t.Fatal("small slow requests: no gap")
	}
}

// The flusher holds an early send for the gap from the first record that
// waits (a later submit does not postpone it); 16 KiB handed over go at
// once whatever the gap; a gap at the cap leaves the batch to the client's
// linger (no flush).
func TestPacingHoldsEarlySends(t *testing.T) {
	run := func(limit time.Duration) (*adaptive, *atomic.Int64) {
		var n atomic.Int64
		var a *adaptive
		a = newAdaptive(1, limit, func() { n.Add(1); a.written(1) }, func() {})
		stop := make(chan struct{})
		t.Cleanup(func() { close(stop) })
		go a.run(stop)
		return a, &n
	}
	// send hands over bytes (and more after 100 ms when more > 0) and
	// returns how long the flush took to come, if it came within d.
	send := func(a *adaptive, n *atomic.Int64, bytes, more int64, d time.Duration) (time.Duration, bool) {
		t0 := time.Now()
		want := n.Load() + 1
		a.submitted(bytes)
		if more > 0 {
			go func() { time.Sleep(100 * time.Millisecond); a.submitted(more) }()
		}
		for time.Since(t0) < d {
			if n.Load() >= want {
				took := time.Since(t0)
				a.answered(1, 0, 0, true)
				return took, true
			}
			time.Sleep(200 * time.Microsecond)
		}
		return 0, false
	}
	a, n := run(10 * time.Second)
	if d, ok := send(a, n, 100, 0, 5*time.Second); !ok || d > 200*time.Millisecond {
		t.Fatalf("no pacing: the early send left after %v (sent: %v)", d, ok)
	}
	a.gap.Store(int64(400 * time.Millisecond))
	if d, ok := send(a, n, 100, 100, 5*time.Second); !ok || d < 380*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("a 400 ms gap with a second submit after 100 ms: the send left after %v (sent: %v), want ≈ 400 ms", d, ok)
	}
	if d, ok := send(a, n, pacingMinBytes, 0, 5*time.Second); !ok || d > 300*time.Millisecond {
		t.Fatalf("16 KiB handed over were held: %v (sent: %v)", d, ok)
	}
	if d, ok := send(a, n, 100, pacingMinBytes, 5*time.Second); !ok || d < 90*time.Millisecond || d > 350*time.Millisecond {
		t.Fatalf("held until 16 KiB were handed over (after 100 ms): sent after %v (sent: %v)", d, ok)
	}

	c, cn := run(200 * time.Millisecond)
	c.gap.Store(int64(200 * time.Millisecond)) // the cap
	if _, ok := send(c, cn, 100, 0, 600*time.Millisecond); ok {
		t.Fatal("paced to the cap: the flusher sent early instead of leaving it to the client's linger")
	}
	if c.pending.Load() {
		t.Fatal("paced to the cap: the batch left to the client is still pending for the flusher")
	}
}

// A host whose brokers queued and which then went quiet is not kept
// paced: without the sampled answers an evaluation needs, the gap falls by
// an eighth a second, from the cap to none in about half a minute, and the
// next evaluation starts from what is left. On the old code the gap stayed
// at the cap however long the host was quiet.
func TestPacingFallsWhileQuiet(t *testing.T) {
	now := time.Unix(1000, 0)
	limit := 50 * time.Millisecond
	a := newAdaptive(1, limit, func() {}, func() {})
	a.now = func() time.Time { return now }
	answer := func(rtt time.Duration) { a.written(1); a.answered(1, rtt, 0, true) }
	ms := time.Millisecond
	for i := 0; i < 16; i++ {
		answer(ms)
	}
	for i := 0; a.Gap() < limit; i++ {
		if i > 100 {
			t.Fatalf("queueing answers: gap %v, never the cap", a.Gap())
		}
		answer(30 * ms)
	}
	now = now.Add(999 * ms)
	if g := a.Gap(); g != limit {
		t.Fatalf("under a second quiet: gap %v, want the cap", g)
	}
	now = now.Add(ms) // one second since the evaluation
	if g, want := a.Gap(), limit-limit/pacingFall; g != want {
		t.Fatalf("a second quiet: gap %v, want %v", g, want)
	}
	now = now.Add(9 * time.Second)
	want := limit
	for i := 0; i < 10; i++ {
		want -= want / pacingFall
	}
	if g := a.Gap(); g != want {
		t.Fatalf("ten seconds quiet: gap %v, want %v", g, want)
	}
	// The next evaluation (queueing again) rises from what is left.
	for i := 0; i < rttRing/2; i++ {
		answer(30 * ms)
	}
	if g := a.Gap(); g != want+limit/4 {
		t.Fatalf("queueing after ten quiet seconds: gap %v, want %v", g, want+limit/4)
	}
	now = now.Add(time.Minute)
	if g := a.Gap(); g != 0 {
		t.Fatalf("a minute quiet: gap %v, want 0", g)
	}
}

// With a long cap (fleets of thousands: 500 ms–1 s) the quiet period is
// 8 caps: an agent held at a 1 s cap evaluates less than once a second and
// must not fall out of its pacing between evaluations.
func TestPacingQuietPeriodFollowsALongCap(t *testing.T) {
	now := time.Unix(1000, 0)
	limit := time.Second
	a := newAdaptive(1, limit, func() {}, func() {})
	a.now = func() time.Time { return now }
	answer := func(rtt time.Duration) { a.written(1); a.answered(1, rtt, 0, true) }
	for i := 0; i < 16; i++ {
		answer(time.Millisecond)
	}
	for i := 0; a.Gap() < limit; i++ {
		if i > 100 {
			t.Fatalf("queueing answers: gap %v, never the cap", a.Gap())
		}
		answer(30 * time.Millisecond)
	}
	now = now.Add(8*limit - time.Millisecond)
	if g := a.Gap(); g != limit {
		t.Fatalf("under 8 caps quiet: gap %v, want the cap", g)
	}
	now = now.Add(time.Millisecond)
	if g, want := a.Gap(), limit-limit/pacingFall; g != want {
		t.Fatalf("8 caps quiet: gap %v, want %v", g, want)
	}
}
