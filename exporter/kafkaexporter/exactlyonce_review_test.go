package kafkaexporter

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/record"
)

// Review finding: a shutdown whose ctx ends while the transaction's
// records are still buffered in the transactional client (Kafka not
// answering) returns those batches to the spool (fail: clear(tb.recs),
// pool.Put) while franz-go's promise goroutine, started by cl.Close, still
// runs eo.promise on &tb.recs[i]: a data race, and kr.Context.(*eoBatch)
// on a cleared record panics.
func TestExactlyOnceReviewShutdownTimeoutRacesPromises(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	e, _ := newEO(t, brokers, testCfg(brokers), eoCfg(strings.Repeat("56", 16)))
	if _, _, err := e.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Kafka stops taking records (a retriable error, forever): they stay
	// buffered in the client.
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, tp := range r.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic = tp.Topic
			for _, p := range tp.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = 19 // NOT_ENOUGH_REPLICAS: retriable
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	var dones []chan error
	for i := 0; i < 20; i++ {
		b, done := spooled("t", record.SpoolPos{Seg: 1, Off: int64(10 * (i + 1))}, strings.Repeat("x", 100), strings.Repeat("y", 100))
		b.OnFailure = func(int, error) {}
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		dones = append(dones, done)
	}
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = e.Shutdown(ctx)
	for _, d := range dones {
		if err := wait(t, d); err == nil {
			t.Fatal("a batch Kafka never took completed without an error")
		}
	}
	// Give the promise goroutine time to run over the cleared records.
	time.Sleep(500 * time.Millisecond)
}

// Review finding: a lost commit answer is resolved by comparing only the
// state's transaction number with ours. A second instance with this
// transactional id (a copied spool directory, as the docs describe) that
// took over meanwhile commits its own transaction under the same number:
// the first instance takes that for its own commit and completes batches
// Kafka never got (its transaction was aborted by the fence). Their
// records are then past the spool's watermark: acknowledged and lost.
func TestExactlyOnceReviewLostCommitResolvedByAnotherInstancesTxn(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	spool := strings.Repeat("78", 16)
	a, _ := newEO(t, brokers, testCfg(brokers), eoCfg(spool))
	defer a.Shutdown(context.Background())
	if _, _, err := a.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	fired, release := make(chan struct{}), make(chan struct{})
	armed.Store(true)
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if !r.Commit || !armed.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		// A's commit: before it is answered, B (a copy of A's spool
		// directory) starts and commits a transaction of its own.
		close(fired)
		c.SleepControl(func() { <-release })
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = -1 // UNKNOWN_SERVER_ERROR: the outcome is unknown to A
		return resp, nil, true
	})
	ba, doneA := spooled("t", record.SpoolPos{Seg: 1, Off: 100}, "appended-to-A-only")
	ba.OnFailure = func(int, error) {}
	if err := a.Consume(context.Background(), ba); err != nil {
		t.Fatal(err)
	}
	<-fired
	b, _ := newEO(t, brokers, testCfg(brokers), eoCfg(spool))
	defer b.Shutdown(context.Background())
	if _, _, err := b.Committed(context.Background()); err != nil {
		t.Fatal(err)
	}
	bb, doneB := spooled("t", record.SpoolPos{Seg: 1, Off: 100}, "appended-to-B-only")
	if err := b.Consume(context.Background(), bb); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, doneB); err != nil {
		t.Fatal(err)
	}
	close(release)
	// A finds B's newer start record and stops: fenced, not ready, its
	// batch unanswered (it stays in A's spool), never written by A.
	deadline := time.Now().Add(10 * time.Second)
	for a.eo.health() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.eo.health(); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("A after a lost commit while B took over: %v", err)
	}
	select {
	case err := <-doneA:
		t.Fatalf("A's batch was answered (%v) though A was fenced", err)
	default:
	}
	for _, v := range readCommitted(t, brokers, "t", 1) {
		if v == "appended-to-A-only" {
			t.Fatal("the fenced instance's record reached Kafka")
		}
	}
}
