package kafkaexporter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Fast unit tests against franz-go's in-process fake broker; the behaviour
// against a real broker is covered by the pipeline's integration tests.

func testCfg(brokers []string) Config {
	return Config{Brokers: brokers, ClientID: "test", Acks: "all", Idempotent: true, Compression: "lz4",
		Linger: time.Millisecond, MaxBatchBytes: 1_000_000, Partitioner: "murmur2", RequestTimeout: 5 * time.Second,
		DialTimeout: time.Second, RetryBackoffMax: 200 * time.Millisecond, HealthCheckInterval: 100 * time.Millisecond, MaxPendingTopics: 1000,
		CreateTopics: CreateTopics{Partitions: -1, ReplicationFactor: -1}}
}

func newExporter(t *testing.T, cfg Config, buffered int64) *Exporter {
	t.Helper()
	e, err := New(cfg, telemetry.TestSettings(), buffered)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// send consumes a batch and waits for its completion.
func send(t *testing.T, e *Exporter, recs []record.Record) (error, int) {
	t.Helper()
	b := &record.Batch{Records: recs}
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := e.Consume(context.Background(), b); err != nil {
		return err, len(recs)
	}
	select {
	case err := <-done:
		return err, b.Failed()
	case <-time.After(60 * time.Second):
		// An unknown topic is failed after 4 metadata checks, which franz-go
		// spaces by up to MetadataMinAge (5 s): up to ~20 s under load.
		t.Fatal("batch never completed")
		return nil, 0
	}
}

func TestDeliversKeysHeadersInOrder(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := newExporter(t, testCfg(c.ListenAddrs()), 64<<20)
	defer e.Shutdown(context.Background())

	hdrs := []record.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}}
	var recs []record.Record
	for i := 0; i < 300; i++ {
		recs = append(recs, record.Record{Topic: "t", Key: []byte{'k', byte('0' + i%3)}, Value: []byte{byte(i >> 8), byte(i)}, Headers: hdrs})
	}
	if err, failed := send(t, e, recs); err != nil || failed != 0 {
		t.Fatalf("err %v, failed %d", err, failed)
	}
	if v := testutil.ToFloat64(e.m.sent.WithLabelValues("t")); v != 300 {
		t.Fatalf("sent counter %v", v)
	}

	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	last := map[string]int{}
	got := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for got < 300 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			got++
			if len(r.Headers) != 2 || r.Headers[0].Key != "a" || string(r.Headers[1].Value) != "2" {
				t.Fatalf("headers %+v", r.Headers)
			}
			seq := int(r.Value[0])<<8 | int(r.Value[1])
			if p, ok := last[string(r.Key)]; ok && seq <= p {
				t.Fatalf("key %s: %d after %d", r.Key, seq, p)
			}
			last[string(r.Key)] = seq
		})
	}
	if got != 300 {
		t.Fatalf("consumed %d", got)
	}
}

// The promise answers a batch's failures one by one and its deliveries
// together, with its counters, when the last record is answered: a batch
// mixing topics, with failures on both, must still report every failure
// by index, count exactly what was sent, and leave nothing in flight.
func TestMixedBatchAnswersEveryRecordOnce(t *testing.T) {
	e := smallBatchExporter(t, 3, "t", "u")

	var recs []record.Record
	wantFail := map[int]bool{}
	for i := 0; i < 200; i++ {
		r := record.Record{Topic: "t", Key: []byte{byte(i)}, Value: []byte("value")}
		if i%3 == 2 { // the batch's first topic is t: its sent metrics are settled by the last record
			r.Topic = "u"
		}
		if i%17 == 0 { // too large for a batch: Kafka's client refuses it
			r.Value = make([]byte, 10_000)
			wantFail[i] = true
		}
		recs = append(recs, r)
	}
	var sentT, bytesT, sentU, bytesU int
	for i, r := range recs {
		if wantFail[i] {
			continue
		}
		if r.Topic == "t" {
			sentT++
			bytesT += len(r.Key) + len(r.Value)
		} else {
			sentU++
			bytesU += len(r.Key) + len(r.Value)
		}
	}
	var mu sync.Mutex
	failedAt := map[int]int{}
	b := &record.Batch{Records: recs}
	b.OnFailure = func(i int, _ error) { mu.Lock(); failedAt[i]++; mu.Unlock() }
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var pe *consumer.PermanentError
		if !errors.As(err, &pe) || pe.Reason != "record_too_large" {
			t.Fatalf("completion error %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("batch never completed")
	}
	mu.Lock()
	defer mu.Unlock()
	if b.Failed() != len(wantFail) || len(failedAt) != len(wantFail) {
		t.Fatalf("failed %d, OnFailure for %d indexes, want %d", b.Failed(), len(failedAt), len(wantFail))
	}
	for i, n := range failedAt {
		if !wantFail[i] || n != 1 {
			t.Fatalf("OnFailure for record %d %d times", i, n)
		}
	}
	if v := testutil.ToFloat64(e.m.sent.WithLabelValues("t")); v != float64(sentT) {
		t.Fatalf("sent t %v, want %d", v, sentT)
	}
	if v := testutil.ToFloat64(e.m.sentBytes.WithLabelValues("t")); v != float64(bytesT) {
		t.Fatalf("sent bytes t %v, want %d", v, bytesT)
	}
	if v := testutil.ToFloat64(e.m.sent.WithLabelValues("u")); v != float64(sentU) {
		t.Fatalf("sent u %v, want %d", v, sentU)
	}
	if v := testutil.ToFloat64(e.m.sentBytes.WithLabelValues("u")); v != float64(bytesU) {
		t.Fatalf("sent bytes u %v, want %d", v, bytesU)
	}
	// The in-flight counts fall just after the completion ran.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		v := testutil.ToFloat64(e.m.inflight)
		if v == 0 && e.Inflight() == 0 && atomic.LoadInt64(&e.buffered) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left in flight: gauge %v, records %d, buffered bytes %d", v, e.Inflight(), atomic.LoadInt64(&e.buffered))
		}
	}
}

// The promise in every order franz-go could answer a batch's records,
// from one goroutine or several: failures first, last, only; spooled or
// not. Every record is acknowledged once, the completion runs once, the
// counters return to zero, and nothing is counted sent that failed.
func TestPromiseInEveryOrder(t *testing.T) {
	e, err := New(testCfg([]string{"127.0.0.1:1"}), telemetry.TestSettings(), 1<<20) // never started: promises are called by hand
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	e.tp.known.Store("t", struct{}{})
	e.tp.known.Store("u", struct{}{})
	tooLarge := kerr.MessageTooLarge
	cases := []struct {
		name      string
		fail      []int // records Kafka refuses
		order     []int // the order promises run in; nil: all at once, concurrently
		spooled   bool
		onFailure bool
	}{
		{name: "all delivered", order: []int{0, 1, 2, 3, 4, 5}},
		{name: "failure first", fail: []int{0}, order: []int{0, 1, 2, 3, 4, 5}, onFailure: true},
		{name: "failure last", fail: []int{5}, order: []int{0, 1, 2, 3, 4, 5}, onFailure: true},
		{name: "failure answered last, reversed", fail: []int{1}, order: []int{5, 4, 3, 2, 0, 1}},
		{name: "all failed", fail: []int{0, 1, 2, 3, 4, 5}, order: []int{3, 1, 0, 2, 5, 4}, spooled: true, onFailure: true},
		{name: "spooled, concurrent", fail: []int{2, 4}, spooled: true, onFailure: true},
		{name: "concurrent", fail: []int{3}},
	}
	var wantSentT, wantBytesT, wantSentU float64
	for _, c := range cases {
		for round := 0; round < 50; round++ {
			recs := make([]record.Record, 6)
			for i := range recs {
				recs[i] = record.Record{Topic: "t", Value: []byte("0123456789")}
				if i%2 == 1 {
					recs[i].Topic = "u"
				}
			}
			fails := map[int]bool{}
			for _, i := range c.fail {
				fails[i] = true
			}
			for i, r := range recs {
				if fails[i] {
					continue
				}
				if r.Topic == "t" {
					wantSentT++
					wantBytesT += float64(len(r.Value))
				} else {
					wantSentU++
				}
			}
			b := &record.Batch{Records: recs, Spooled: c.spooled}
			var mu sync.Mutex
			failedAt := map[int]int{}
			if c.onFailure {
				b.OnFailure = func(i int, _ error) { mu.Lock(); failedAt[i]++; mu.Unlock() }
			}
			var completions atomic.Int32
			var doneErr error
			b.OnDone(func(err error) { completions.Add(1); doneErr = err })
			eb, err := e.begin(b)
			if err != nil {
				t.Fatal(err)
			}
			recsK := eb.recs
			answer := func(i int) {
				var err error
				if fails[i] {
					err = tooLarge
				}
				e.promise(&recsK[i], err)
			}
			if c.order != nil {
				for _, i := range c.order {
					answer(i)
				}
			} else {
				var wg sync.WaitGroup
				for i := range recsK {
					wg.Add(1)
					go func() { defer wg.Done(); answer(i) }()
				}
				wg.Wait()
			}
			if n := completions.Load(); n != 1 {
				t.Fatalf("%s: completion ran %d times", c.name, n)
			}
			if (len(c.fail) > 0) != (doneErr != nil) || b.Failed() != len(c.fail) {
				t.Fatalf("%s: completion error %v, %d failed, want %d", c.name, doneErr, b.Failed(), len(c.fail))
			}
			if c.onFailure && len(failedAt) != len(c.fail) {
				t.Fatalf("%s: OnFailure for %v, want %v", c.name, failedAt, c.fail)
			}
			if e.Inflight() != 0 || e.spooled.Load() != 0 || atomic.LoadInt64(&e.buffered) != 0 || testutil.ToFloat64(e.m.inflight) != 0 {
				t.Fatalf("%s: left in flight %d, spooled %d, buffered %d, gauge %v", c.name, e.Inflight(), e.spooled.Load(), atomic.LoadInt64(&e.buffered), testutil.ToFloat64(e.m.inflight))
			}
		}
	}
	if v := testutil.ToFloat64(e.m.sent.WithLabelValues("t")); v != wantSentT {
		t.Fatalf("sent t %v, want %v", v, wantSentT)
	}
	if v := testutil.ToFloat64(e.m.sentBytes.WithLabelValues("t")); v != wantBytesT {
		t.Fatalf("sent bytes t %v, want %v", v, wantBytesT)
	}
	if v := testutil.ToFloat64(e.m.sent.WithLabelValues("u")); v != wantSentU {
		t.Fatalf("sent u %v, want %v", v, wantSentU)
	}
}

// smallBatchExporter: a started exporter on a fake cluster seeding topics
// with partitions each, whose batches hold 4 KiB, so that a 10 KB record
// is refused by the Kafka client; both end with the test.
func smallBatchExporter(t *testing.T, partitions int32, topics ...string) *Exporter {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := testCfg(c.ListenAddrs())
	cfg.MaxBatchBytes = 4096
	e := newExporter(t, cfg, 64<<20)
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e
}

func TestPermanentErrorsAreClassified(t *testing.T) {
	e := smallBatchExporter(t, 1, "t")

	var pe *consumer.PermanentError
	err, failed := send(t, e, []record.Record{{Topic: "t", Value: make([]byte, 10_000)}, {Topic: "t", Value: []byte("ok")}})
	if !errors.As(err, &pe) || pe.Reason != "record_too_large" || failed != 1 {
		t.Fatalf("too large: %v (failed %d)", err, failed)
	}
	err, _ = send(t, e, []record.Record{{Topic: "missing", Value: []byte("x")}})
	if !errors.As(err, &pe) || pe.Reason != "unknown_topic" {
		t.Fatalf("unknown topic: %v", err)
	}
	if v := testutil.ToFloat64(e.m.dropped.WithLabelValues("missing", "unknown_topic")); v != 1 {
		t.Fatalf("dropped counter %v", v)
	}
}

// TestNeverBlocks: with the client's buffer smaller than a batch, Consume
// returns at once: the batch that does not fit is refused whole with
// ErrFull (see TestBatchNeverPartlyProduced), one that fits is taken.
func TestNeverBlocks(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"}) // nothing listens: records stay buffered
	cfg.MaxBufferedBytes = 1 << 10
	e := newExporter(t, cfg, 0)
	mk := func(n int) []record.Record {
		recs := make([]record.Record, n)
		for i := range recs {
			recs[i] = record.Record{Topic: "t", Value: make([]byte, 100)}
		}
		return recs
	}
	start := time.Now()
	if err := e.Consume(context.Background(), &record.Batch{Records: mk(50)}); !errors.Is(err, consumer.ErrFull) {
		t.Fatalf("50 records in a 1 KiB buffer: %v, want ErrFull", err)
	}
	b := &record.Batch{Records: mk(5)}
	var mu sync.Mutex
	var got error
	b.OnDone(func(err error) { mu.Lock(); got = err; mu.Unlock() })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Consume blocked for %s", d)
	}
	// Shutdown with a short deadline fails the rest and reports them.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := e.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown reported success with unacknowledged records")
	}
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(got, consumer.ErrFull) && consumer.Reason(got) != "shutdown_timeout" {
		t.Fatalf("completion error %v", got)
	}
	if v := testutil.ToFloat64(e.m.dropped.WithLabelValues("t", "shutdown_timeout")); v == 0 {
		t.Fatal("records failed at shutdown were not counted")
	}
	if e.Inflight() != 0 {
		t.Fatalf("%d records still in flight after Shutdown", e.Inflight())
	}
}

func TestReadinessFollowsTheBroker(t *testing.T) {
	e := newExporter(t, testCfg([]string{"127.0.0.1:1"}), 1<<20)
	defer e.Shutdown(context.Background())
	time.Sleep(300 * time.Millisecond)
	if err := e.ready(); err == nil {
		t.Fatal("ready with no broker")
	}
	if err := e.Consume(context.Background(), &record.Batch{}); err != nil {
		t.Fatal(err)
	}
}

func TestBackoffIsCapped(t *testing.T) {
	f := backoff(5 * time.Second)
	if f(1) != 100*time.Millisecond || f(2) != 200*time.Millisecond || f(100) != 5*time.Second {
		t.Fatalf("%v %v %v", f(1), f(2), f(100))
	}
}

func TestValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"acks":                func(c *Config) { c.Acks = "2" },
		"compression":         func(c *Config) { c.Compression = "brotli" },
		"partitioner":         func(c *Config) { c.Partitioner = "random" },
		"brokers":             func(c *Config) { c.Brokers = []string{"nohost"} },
		"idempotent":          func(c *Config) { c.Acks = "leader" },
		"tls half a key pair": func(c *Config) { c.TLS = TLSConfig{Enabled: true, CertFile: "c.pem"} },
		"tls version":         func(c *Config) { c.TLS = TLSConfig{Enabled: true, MinVersion: "1.0"} },
		"tls files, not on":   func(c *Config) { c.TLS = TLSConfig{CAFile: "ca.pem"} },
		"sasl mechanism":      func(c *Config) { c.SASL = SASLConfig{Mechanism: "GSSAPI", Username: "u", Password: "p"} },
		"sasl no user":        func(c *Config) { c.SASL = SASLConfig{Mechanism: "PLAIN", Password: "p"} },
		"sasl no password":    func(c *Config) { c.SASL = SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u"} },
		"sasl two passwords": func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "PLAIN", Username: "u", Password: "p", PasswordFile: "f"}
		},
		"sasl user, no mechanism": func(c *Config) { c.SASL = SASLConfig{Username: "u"} },
	} {
		c := testCfg([]string{"127.0.0.1:9092"})
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
}

// BenchmarkConsume1000: one batch of 1000 records at a time, waited for, in
// the default adaptive linger mode (sent at once: nothing else in flight);
// BenchmarkConsume1000Fixed waits the 1 ms linger every time.
func BenchmarkConsume1000(b *testing.B)      { benchConsume(b, "adaptive") }
func BenchmarkConsume1000Fixed(b *testing.B) { benchConsume(b, "fixed") }

func benchConsume(b *testing.B, mode string) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cfg := testCfg(c.ListenAddrs())
	cfg.LingerMode = mode
	e, _ := New(cfg, telemetry.TestSettings(), 256<<20)
	_ = e.Start(context.Background()) // the adaptive flusher runs from Start
	defer e.Shutdown(context.Background())
	recs := make([]record.Record, 1000)
	for i := range recs {
		recs[i] = record.Record{Topic: "t", Value: make([]byte, 100)}
	}
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bt := &record.Batch{Records: recs}
		bt.OnDone(func(err error) { done <- err })
		_ = e.Consume(context.Background(), bt)
		<-done
	}
}

// BenchmarkReferenceKgo1000 is the reference for BenchmarkConsume1000: the
// same 1000 records produced with plain franz-go and waited for, so the
// exporter's own cost reads as the ratio of the two.
func BenchmarkReferenceKgo1000(b *testing.B) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerLinger(time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	recs := make([]kgo.Record, 1000)
	val := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		wg.Add(len(recs))
		for j := range recs {
			recs[j] = kgo.Record{Topic: "t", Value: val}
			cl.Produce(context.Background(), &recs[j], func(*kgo.Record, error) { wg.Done() })
		}
		wg.Wait()
	}
}

// The fleet sizing in docs/scaling.md is read from these: requests by API
// and open connections, counted by the client's hooks.
func TestCountsRequestsAndConnections(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(4, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := newExporter(t, testCfg(c.ListenAddrs()), 64<<20)
	var recs []record.Record
	for i := 0; i < 100; i++ {
		recs = append(recs, record.Record{Topic: "t", Key: []byte{byte(i)}, Value: []byte("v")})
	}
	if err, failed := send(t, e, recs); err != nil || failed != 0 {
		t.Fatalf("err %v, failed %d", err, failed)
	}
	produce := testutil.ToFloat64(e.m.requests[0])
	metadata := testutil.ToFloat64(e.m.requests[3])
	if produce < 1 || metadata < 1 {
		t.Fatalf("requests counted: Produce %v, Metadata %v; want both ≥ 1", produce, metadata)
	}
	if v := testutil.ToFloat64(e.m.conns); v < 2 {
		t.Fatalf("%v open connections counted, want ≥ 2 (a seed, then both brokers)", v)
	}
	e.Shutdown(context.Background())
	if v := testutil.ToFloat64(e.m.conns); v != 0 {
		t.Fatalf("%v connections still counted after shutdown", v)
	}
}

// A broker answering produce requests needs no probe: probes are Metadata
// requests, and a fleet of agents probing every interval adds up. An idle
// agent still probes, so readiness keeps following the broker.
func TestTrafficReplacesTheProbe(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := testCfg(c.ListenAddrs())
	cfg.HealthCheckInterval = 50 * time.Millisecond
	e := newExporter(t, cfg, 64<<20)
	defer e.Shutdown(context.Background())
	metadata := func() float64 { return testutil.ToFloat64(e.m.requests[3]) }
	for end := time.Now().Add(5 * time.Second); e.ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("never ready")
		}
	}
	// Busy: produce without pause for 1 s (20 probe intervals).
	m0 := metadata()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if err, failed := send(t, e, []record.Record{{Topic: "t", Value: []byte("v")}}); err != nil || failed != 0 {
			t.Fatalf("err %v, failed %d", err, failed)
		}
	}
	busy := metadata() - m0
	// Idle for the same time.
	m1 := metadata()
	time.Sleep(time.Second)
	idle := metadata() - m1
	// The probe would send ~20 in each second. Under traffic only the Kafka
	// client's own refreshes remain (a few; more under -race, where a
	// produce round trip is slower).
	if busy > idle/2 {
		t.Fatalf("%v Metadata requests in 1 s of traffic against %v idle; the produce answers should stand in for the probe", busy, idle)
	}
	if idle < 5 {
		t.Fatalf("only %v Metadata requests in 1 s idle at a 50 ms probe interval; the idle probe stopped", idle)
	}
}

// TestReceiptsPointAtTheRecords: a batch that asks for a receipt learns
// each record's partition and offset, and reading Kafka there gives back
// exactly that record; ranges compress the consecutive offsets.
func TestReceiptsPointAtTheRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := newExporter(t, testCfg(c.ListenAddrs()), 64<<20)
	defer e.Shutdown(context.Background())

	var recs []record.Record
	for i := 0; i < 300; i++ {
		// Runs of 100 records per key: each run is one partition's
		// consecutive offsets.
		recs = append(recs, record.Record{Topic: "t", Key: []byte{'k', byte('0' + i/100)}, Value: []byte(fmt.Sprintf("v%03d", i))})
	}
	b := &record.Batch{Records: recs}
	rc := record.NewReceipt(len(recs))
	b.Receipt = rc
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ranges := rc.Ranges(nil)
	total := 0
	for _, r := range ranges {
		total += r.Count
	}
	if total != 300 || len(ranges) > 300 {
		t.Fatalf("ranges cover %d records in %d ranges", total, len(ranges))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	at := map[[2]int64]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(at) < 300 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { at[[2]int64{int64(r.Partition), r.Offset}] = string(r.Value) })
	}
	for i := range recs {
		if rc.Topic[i] != "t" || rc.Offset[i] < 0 {
			t.Fatalf("record %d: no receipt (%q %d %d)", i, rc.Topic[i], rc.Partition[i], rc.Offset[i])
		}
		if got := at[[2]int64{int64(rc.Partition[i]), rc.Offset[i]}]; got != string(recs[i].Value) {
			t.Fatalf("record %d: receipt %d/%d holds %q, sent %q", i, rc.Partition[i], rc.Offset[i], got, recs[i].Value)
		}
	}
	// Records of one key go to one partition in order: a few ranges per
	// run (one per produce batch at most), not one per record.
	if len(ranges) > 12 {
		t.Fatalf("%d ranges for 300 records over 3 partitions: offsets not merged", len(ranges))
	}
}
