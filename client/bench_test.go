package client_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/record"
)

// acker stands for a Kafka that acknowledges at once: the benchmarks
// measure the client, the protocol and the agent's receiver, not Kafka.
type acker struct{}

func (acker) Consume(_ context.Context, b *record.Batch) error { b.Complete(nil); return nil }

// The names are those of pan's client benchmarks (kafkautil's
// BenchmarkKafkaFor*Byte, ~50 µs/op there: one synchronous round trip per
// message), so the two compare by name. async: Produce with a callback,
// the send amortised over batches; sync: ProduceSync of one record, a
// round trip to the agent per op.
func benchKafka(b *testing.B, size int) {
	for _, mode := range []string{"async", "sync"} {
		b.Run(mode, func(b *testing.B) {
			_, sock := agent(b, acker{}, nil)
			c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			rec := &client.Record{Topic: "bench", Value: bytes.Repeat([]byte("x"), size)}
			var failed int
			cb := func(_ *client.Record, err error) {
				if err != nil {
					failed++
				}
			}
			ctx := context.Background()
			// Warm the connection and the pools.
			if err := c.ProduceSync(ctx, rec); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			if mode == "async" {
				for i := 0; i < b.N; i++ {
					c.Produce(ctx, rec, cb)
				}
				if err := c.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			} else {
				for i := 0; i < b.N; i++ {
					if err := c.ProduceSync(ctx, rec); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			if failed > 0 {
				b.Fatalf("%d records failed", failed)
			}
		})
	}
}

func BenchmarkKafkaFor10Byte(b *testing.B)   { benchKafka(b, 10) }
func BenchmarkKafkaFor100Byte(b *testing.B)  { benchKafka(b, 100) }
func BenchmarkKafkaFor1000Byte(b *testing.B) { benchKafka(b, 1000) }
func BenchmarkKafkaFor5000Byte(b *testing.B) { benchKafka(b, 5000) }

// placer stands for a Kafka that acknowledges at once and, as the
// exporter does, tells a batch that asks where each record went.
type placer struct{}

func (placer) Consume(_ context.Context, b *record.Batch) error {
	if rc := b.Receipt; rc != nil {
		for i := range b.Records {
			rc.Acked(i, b.Records[i].Topic, 0, int64(i))
		}
	}
	b.Complete(nil)
	return nil
}

// BenchmarkReceipts: the whole local path (client encode, agent decode,
// the batch, the answer) with receipts off (protocol version 1, as
// before) and on (version 2, a receipt per frame). Off must allocate no
// more per record than before receipts existed; on costs the Receipt's
// columns per frame and a Result per record on the client.
func BenchmarkReceipts(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			_, sock := agent(b, placer{}, nil)
			c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, Receipts: on})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			rec := &client.Record{Topic: "bench", Value: bytes.Repeat([]byte("x"), 100)}
			var failed, placed int
			cb := func(_ *client.Record, res client.Result, err error) {
				if err != nil {
					failed++
				}
				if res.Offset >= 0 {
					placed++
				}
			}
			ctx := context.Background()
			if err := c.ProduceSync(ctx, rec); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.ProduceResult(ctx, rec, cb)
			}
			if err := c.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if failed > 0 || on && placed != b.N || !on && placed != 0 {
				b.Fatalf("%d failed, %d placed of %d", failed, placed, b.N)
			}
		})
	}
}

// BenchmarkRequestIDs: the local path with a request id on every frame:
// the agent writes the ferry.request_id header on every record.
func BenchmarkRequestIDs(b *testing.B) {
	_, sock := agent(b, placer{}, nil)
	c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, RequestIDs: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	rec := &client.Record{Topic: "bench", Value: bytes.Repeat([]byte("x"), 100), RequestID: "req-1"}
	ctx := context.Background()
	if err := c.ProduceSync(ctx, rec); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Produce(ctx, rec, nil)
	}
	if err := c.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}
