package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/exporter/kafkaexporter"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// TestReceiptsFromKafka: with Receipts, every record's Result names the
// partition and offset where Kafka (a fake broker behind the real
// exporter and local receiver) holds exactly that record, and RequestIDs
// puts each record's request id on it as ferry.request_id.
func TestReceiptsFromKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ecfg := kafkaexporter.Config{Brokers: c.ListenAddrs(), ClientID: "test", Acks: "all", Idempotent: true, Compression: "none",
		Linger: time.Millisecond, MaxBatchBytes: 1_000_000, Partitioner: "murmur2", RequestTimeout: 5 * time.Second,
		DialTimeout: time.Second, RetryBackoffMax: 200 * time.Millisecond, HealthCheckInterval: 100 * time.Millisecond, MaxPendingTopics: 1000,
		CreateTopics: kafkaexporter.CreateTopics{Partitions: -1, ReplicationFactor: -1}}
	e, err := kafkaexporter.New(ecfg, telemetry.TestSettings(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Start(context.Background())
	defer e.Shutdown(context.Background())
	_, sock := agent(t, e, nil)
	cl := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, Receipts: true, RequestIDs: true, Compression: "zstd"})

	const n = 400
	type out struct {
		res client.Result
		err error
	}
	results := make([]out, n)
	var wg sync.WaitGroup
	wg.Add(n)
	recs := make([]*client.Record, n)
	for i := range recs {
		recs[i] = &client.Record{Topic: []string{"a", "b"}[i%2], Key: []byte{byte(i % 7)}, Value: []byte(fmt.Sprintf("v%d", i)),
			RequestID: fmt.Sprintf("req-%d", i/100)}
		i := i
		cl.ProduceResult(context.Background(), recs[i], func(_ *client.Record, res client.Result, err error) {
			results[i] = out{res, err}
			wg.Done()
		})
	}
	wg.Wait()
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("a", "b"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	type place struct {
		t string
		p int32
		o int64
	}
	got := map[place]*kgo.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(got) < n && ctx.Err() == nil {
		kc.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[place{r.Topic, r.Partition, r.Offset}] = r })
	}
	for i, o := range results {
		if o.err != nil || o.res.Offset < 0 || o.res.ReceiptID != "" {
			t.Fatalf("record %d: %+v %v", i, o.res, o.err)
		}
		r := got[place{o.res.Topic, o.res.Partition, o.res.Offset}]
		if r == nil || string(r.Value) != string(recs[i].Value) || r.Topic != recs[i].Topic {
			t.Fatalf("record %d (%s): its receipt %+v holds %v", i, recs[i].Value, o.res, r)
		}
		var id string
		for _, h := range r.Headers {
			if h.Key == receipt.HeaderKey {
				id = string(h.Value)
			}
		}
		if id != recs[i].RequestID {
			t.Fatalf("record %d: ferry.request_id %q, want %q", i, id, recs[i].RequestID)
		}
	}
}

// spoolLike answers as the spool does: at once, with a receipt id.
type spoolLike struct{}

func (spoolLike) Consume(_ context.Context, b *record.Batch) error {
	if b.Receipt != nil {
		b.Receipt.SpoolID = "3-64-abcdef"
	}
	b.Complete(nil)
	return nil
}

func TestReceiptIDFromTheSpool(t *testing.T) {
	_, sock := agent(t, spoolLike{}, nil)
	cl := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, Receipts: true})
	done := make(chan client.Result, 1)
	cl.ProduceResult(context.Background(), &client.Record{Topic: "t", Value: []byte("x")}, func(_ *client.Record, res client.Result, err error) {
		if err != nil {
			t.Error(err)
		}
		done <- res
	})
	if res := <-done; res.ReceiptID != "3-64-abcdef" || res.Offset != -1 {
		t.Fatalf("%+v", res)
	}
	// Without Receipts (version 1) ProduceResult still works: no receipt.
	cl1 := newClient(t, client.Options{Addrs: []string{"unix:" + sock}})
	cl1.ProduceResult(context.Background(), &client.Record{Topic: "t", Value: []byte("x")}, func(_ *client.Record, res client.Result, err error) {
		done <- res
	})
	if res := <-done; res.ReceiptID != "" || res.Offset != -1 {
		t.Fatalf("%+v", res)
	}
}

// TestBadRequestIDRefused: the agent refuses a request id with characters
// it would have to escape, for good, naming the reason.
func TestBadRequestIDRefused(t *testing.T) {
	_, sock := agent(t, spoolLike{}, nil)
	cl := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, RequestIDs: true})
	err := cl.ProduceSync(context.Background(), &client.Record{Topic: "t", Value: []byte("x"), RequestID: "has space"})
	var fe *client.Error
	if !errorsAs(err, &fe) || fe.Reason != "invalid_request_id" || fe.Retryable {
		t.Fatalf("%v", err)
	}
}

func errorsAs(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}
