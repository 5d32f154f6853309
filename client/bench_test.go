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
