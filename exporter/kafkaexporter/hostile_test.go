package kafkaexporter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// TestBatchNeverPartlyProduced: a batch that does not fit in the Kafka
// client's buffer is refused whole (retryable), with none of its records
// handed to the client: a partly produced batch answered 429 would be sent
// again in full by the client, duplicating the part that went through.
func TestBatchNeverPartlyProduced(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"}) // nothing listens: records stay buffered
	cfg.MaxBufferedBytes = 64 << 10
	e := newExporter(t, cfg, 0)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	}()
	hdr := []record.Header{{Key: "h", Value: bytes.Repeat([]byte("v"), 100)}}
	mk := func(n int) *record.Batch {
		b := &record.Batch{}
		for i := 0; i < n; i++ {
			b.Records = append(b.Records, record.Record{Topic: "t", Value: []byte("0123456789"), Headers: hdr})
		}
		b.OnDone(func(error) {})
		return b
	}
	// 200 records of ~111 bytes each fit; 1000 more do not.
	if err := e.Consume(context.Background(), mk(200)); err != nil {
		t.Fatal(err)
	}
	err := e.Consume(context.Background(), mk(1000))
	if !errors.Is(err, consumer.ErrFull) {
		t.Fatalf("over the client's buffer: %v, want ErrFull", err)
	}
	if n := e.inflight.Load(); n != 200 {
		t.Fatalf("%d records in the Kafka client, want the first batch's 200 only", n)
	}
}

// TestPendingTopicsBounded: records may wait on at most max_pending_topics
// topics Kafka has not confirmed; a batch for one more is refused whole
// (retryable) before it reaches the Kafka client, while topics already
// pending still take records.
func TestPendingTopicsBounded(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"}) // nothing listens: every topic stays pending
	cfg.MaxPendingTopics = 5
	e := newExporter(t, cfg, 64<<20)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	}()
	one := func(topic string) error {
		b := &record.Batch{Records: []record.Record{{Topic: topic, Value: []byte("x")}}}
		b.OnDone(func(error) {})
		return e.Consume(context.Background(), b)
	}
	for i := 0; i < 5; i++ {
		if err := one(fmt.Sprintf("made-up-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := one("made-up-5"); consumer.Reason(err) != "too_many_pending_topics" {
		t.Fatalf("sixth pending topic: %v", err)
	}
	if n := e.inflight.Load(); n != 5 {
		t.Fatalf("%d records in the Kafka client, want 5", n)
	}
	if err := one("made-up-2"); err != nil {
		t.Fatalf("a topic already pending: %v", err)
	}
}

// TestUnknownTopicsPurged: a topic that turns out not to exist is removed
// from the Kafka client once none of its records is in flight, and stops
// counting as pending; a topic Kafka confirmed is known from then on.
func TestUnknownTopicsPurged(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := newExporter(t, testCfg(c.ListenAddrs()), 64<<20)
	defer e.Shutdown(context.Background())
	if err, _ := send(t, e, []record.Record{{Topic: "t", Value: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.tp.known.Load("t"); !ok {
		t.Fatal("an acknowledged topic is not known")
	}
	err, _ = send(t, e, []record.Record{{Topic: "nope", Value: []byte("x")}, {Topic: "nope", Value: []byte("y")}})
	if consumer.Reason(err) != "unknown_topic" {
		t.Fatalf("unknown topic: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.m.purged) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("purged %v topics, want 1", testutil.ToFloat64(e.m.purged))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p := e.tp.Pending(); p != 0 {
		t.Fatalf("%d topics still pending", p)
	}
}
