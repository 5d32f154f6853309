package kafkaexporter

import (
	"context"
	"errors"
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

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

func eoCfg(spool string) exporter.ExactlyOnce {
	return exporter.ExactlyOnce{StateTopic: "ferry-state", CommitInterval: 20 * time.Millisecond, TransactionTimeout: 10 * time.Second, SpoolID: spool}
}

func newEO(t *testing.T, brokers []string, cfg Config, eo exporter.ExactlyOnce) (*Exporter, telemetry.Settings) {
	t.Helper()
	set := telemetry.TestSettings()
	e, err := New(cfg, set, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.enableExactlyOnce(eo); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e, set
}

// spooled is a spool batch ending at end, completed into done.
func spooled(topic string, end record.SpoolPos, values ...string) (*record.Batch, chan error) {
	b := &record.Batch{Spooled: true, End: end}
	for _, v := range values {
		b.Records = append(b.Records, record.Record{Topic: topic, Value: []byte(v)})
	}
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	return b, done
}

func wait(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("batch never completed")
		return nil
	}
}

// readCommitted returns every value in topic a read_committed consumer
// sees, reading until n values came (or 10 s).
func readCommitted(t *testing.T, brokers []string, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && len(got) < n {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	// A little longer: anything past n is a duplicate.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	cancel()
	return got
}

func TestExactlyOnceCommitsResumesAndFences(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	spool := strings.Repeat("ab", 16)
	e1, _ := newEO(t, brokers, testCfg(brokers), eoCfg(spool))
	defer e1.Shutdown(context.Background())

	if err := e1.eo.health(); err == nil {
		t.Fatal("ready before Kafka said how far it committed the spool")
	}
	if _, ok, err := e1.Committed(context.Background()); err != nil || ok {
		t.Fatalf("fresh state topic: committed %v, err %v", ok, err)
	}
	if err := e1.eo.health(); err != nil {
		t.Fatalf("not ready after the committed position was read: %v", err)
	}
	ends := []record.SpoolPos{{Seg: 1, Off: 100}, {Seg: 1, Off: 200}, {Seg: 2, Off: 50}}
	var dones []chan error
	for i, end := range ends {
		b, done := spooled("t", end, fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i))
		if err := e1.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
	}
	for _, d := range dones {
		if err := wait(t, d); err != nil {
			t.Fatal(err)
		}
	}
	if v := testutil.ToFloat64(e1.eo.m.txns.WithLabelValues("committed")); v < 1 {
		t.Fatalf("committed transactions %v", v)
	}
	if got := readCommitted(t, brokers, "t", 6); len(got) != 6 {
		t.Fatalf("read_committed saw %d records, want 6 once each: %v", len(got), got)
	}

	// A second instance on the same spool (same transactional id): it
	// reads where Kafka got, and fences the first.
	e2, _ := newEO(t, brokers, testCfg(brokers), eoCfg(spool))
	defer e2.Shutdown(context.Background())
	p, ok, err := e2.Committed(context.Background())
	if err != nil || !ok || p != ends[2] {
		t.Fatalf("committed %v %v, err %v; want %v", p, ok, err, ends[2])
	}
	b, done := spooled("t", record.SpoolPos{Seg: 2, Off: 90}, "zombie")
	if err := e1.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e1.eo.health() == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := e1.eo.health(); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("the fenced instance reports %v", err)
	}
	if v := testutil.ToFloat64(e1.eo.m.fenced); v != 1 {
		t.Fatalf("fenced gauge %v", v)
	}
	select {
	case err := <-done:
		t.Fatalf("the fenced instance completed a batch: %v", err)
	default:
	}
	// Its batch goes back to the spool at shutdown, not to Kafka.
	b.OnFailure = func(int, error) {}
	_ = e1.Shutdown(context.Background())
	if err := wait(t, done); err == nil {
		t.Fatal("the fenced instance's batch completed without an error")
	}
	// The new instance delivers it.
	b2, done2 := spooled("t", record.SpoolPos{Seg: 2, Off: 90}, "zombie")
	if err := e2.Consume(context.Background(), b2); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done2); err != nil {
		t.Fatal(err)
	}
	got := readCommitted(t, brokers, "t", 7)
	if len(got) != 7 {
		t.Fatalf("read_committed saw %v, want 7 records", got)
	}
	e3, _ := newEO(t, brokers, testCfg(brokers), eoCfg(spool))
	defer e3.Shutdown(context.Background())
	if p, ok, err := e3.Committed(context.Background()); err != nil || !ok || p != (record.SpoolPos{Seg: 2, Off: 90}) {
		t.Fatalf("committed %v %v %v", p, ok, err)
	}
	// Another spool's id under the same transactional id: not applied.
	other := eoCfg(strings.Repeat("cd", 16))
	other.TransactionalID = "ferry-" + spool
	e4, _ := newEO(t, brokers, testCfg(brokers), other)
	defer e4.Shutdown(context.Background())
	if _, ok, err := e4.Committed(context.Background()); err != nil || ok {
		t.Fatalf("another spool's position applied: %v %v", ok, err)
	}
}

// A record Kafka refuses for good is dead-lettered before the commit that
// passes it, and left out; the rest of its transaction commits once.
func TestExactlyOnceDeadLettersBeforeCommit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	cfg := testCfg(brokers)
	cfg.MaxBatchBytes = 1024
	e, _ := newEO(t, brokers, cfg, eoCfg(strings.Repeat("ef", 16)))
	defer e.Shutdown(context.Background())
	if _, _, err := e.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, done := spooled("t", record.SpoolPos{Seg: 1, Off: 10}, "small1", strings.Repeat("x", 2000), "small2", "forged-position")
	// A client's record for the state topic: only ferry writes there.
	b.Records[3].Topic = "ferry-state"
	var dead []int
	var mu sync.Mutex
	b.DeadLetterNow = func(i int, err error) bool {
		var pe *consumer.PermanentError
		if want := map[int]string{1: "record_too_large", 3: "topic_rejected"}[i]; !errors.As(err, &pe) || pe.Reason != want {
			t.Errorf("dead letter %d for %v", i, err)
		}
		mu.Lock()
		dead = append(dead, i)
		mu.Unlock()
		return true
	}
	var failures atomic.Int64
	b.OnFailure = func(int, error) { failures.Add(1) }
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(dead) != "[3 1]" {
		t.Fatalf("dead-lettered %v, want [3 1] (the state topic's at once, the large one when Kafka refused it)", dead)
	}
	if failures.Load() != 0 {
		t.Fatalf("%d records failed back to the spool", failures.Load())
	}
	got := readCommitted(t, brokers, "t", 2)
	if len(got) != 2 || got[0] != "small1" || got[1] != "small2" {
		t.Fatalf("read_committed saw %v", got)
	}
	if v := testutil.ToFloat64(e.eo.m.txns.WithLabelValues("aborted")); v < 1 {
		t.Fatalf("aborted %v: the failed attempt was not aborted", v)
	}
}

// A commit whose outcome the client cannot know (the broker answered
// UNKNOWN_SERVER_ERROR without committing) is settled by reading the
// state topic: not committed, so the batch goes again, once.
func TestExactlyOnceLostCommitIsResolved(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	e, _ := newEO(t, brokers, testCfg(brokers), eoCfg(strings.Repeat("12", 16)))
	defer e.Shutdown(context.Background())
	if _, _, err := e.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	var broke atomic.Bool
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if r := req.(*kmsg.EndTxnRequest); r.Commit && broke.CompareAndSwap(false, true) {
			// An answer that leaves the outcome unknown to the client.
			resp := r.ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = -1 // UNKNOWN_SERVER_ERROR
			return resp, nil, true
		}
		return nil, nil, false
	})
	b, done := spooled("t", record.SpoolPos{Seg: 3, Off: 30}, "once")
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if !broke.Load() {
		t.Fatal("the commit was never cut")
	}
	if got := readCommitted(t, brokers, "t", 1); len(got) != 1 {
		t.Fatalf("read_committed saw %v, want the record once", got)
	}
	if v := testutil.ToFloat64(e.eo.m.txns.WithLabelValues("unknown")); v < 1 {
		t.Fatalf("unknown outcomes %v", v)
	}
	p, ok, err := e.Committed(context.Background())
	if err != nil || !ok || p != (record.SpoolPos{Seg: 3, Off: 30}) {
		t.Fatalf("committed %v %v %v", p, ok, err)
	}
}

// A transaction takes at most its share of memory, so the next one fills
// while it commits: many batches go in several transactions, in order,
// each once.
func TestExactlyOnceTransactionsTakeTheirShare(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	e, err := New(testCfg(brokers), telemetry.TestSettings(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.enableExactlyOnce(eoCfg(strings.Repeat("34", 16))); err != nil {
		t.Fatal(err)
	}
	e.eo.maxTxnBytes = 3000 // three batches of 1,000 below
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	if _, _, err := e.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	var dones []chan error
	var want []string
	for i := 0; i < 30; i++ {
		b, done := spooled("t", record.SpoolPos{Seg: 1, Off: int64(100 * (i + 1))}, fmt.Sprintf("v%02d", i))
		b.MemBytes = 1000
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
		want = append(want, fmt.Sprintf("v%02d", i))
	}
	for _, d := range dones {
		if err := wait(t, d); err != nil {
			t.Fatal(err)
		}
	}
	if got := readCommitted(t, brokers, "t", 30); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("read_committed saw %v", got)
	}
	if v := testutil.ToFloat64(e.eo.m.txns.WithLabelValues("committed")); v < 10 {
		t.Fatalf("%v transactions for 30 batches of a third of the share each: the share is not kept", v)
	}
	if p, ok, err := e.Committed(context.Background()); err != nil || !ok || p != (record.SpoolPos{Seg: 1, Off: 3000}) {
		t.Fatalf("committed %v %v %v", p, ok, err)
	}
}

// A spool batch that reaches the transactional queue after Shutdown took it
// (a Consume that passed the closing check just before) is refused, not
// queued where no one would ever complete it.
func TestExactlyOnceRefusesBatchesAfterShutdown(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e, _ := newEO(t, c.ListenAddrs(), testCfg(c.ListenAddrs()), eoCfg(t.TempDir()))
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, _ := spooled("t", record.SpoolPos{Seg: 1, Off: 1}, "late")
	if err := e.eo.enqueue(b); !errors.Is(err, consumer.ErrShuttingDown) {
		t.Fatalf("enqueue after shutdown: %v, want ErrShuttingDown", err)
	}
}
