package spool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// acker acknowledges every record at once, standing for a Kafka that keeps
// up, so the benchmark measures the spool's own cost.
type acker struct{}

func (acker) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	for range b.Records {
		b.Ack(nil)
	}
	return nil
}

// BenchmarkSpool: 1000 records of 100 B per append, appended and then read
// back and acknowledged, per fsync policy; "direct" is the same batches
// acknowledged without the spool, the reference the ratio is taken from,
// and "interval, no spares" is interval with every passed segment deleted
// rather than recycled. Run with -benchmem; compare records/s and
// cpu-µs/op (the process's user+system time per append, reader included)
// across the sub-benchmarks.
func BenchmarkSpool(b *testing.B) {
	const perBatch = 1000
	val := make([]byte, 100)
	mk := func() *record.Batch {
		bt := &record.Batch{Records: make([]record.Record, perBatch)}
		for i := range bt.Records {
			bt.Records[i] = record.Record{Topic: "bench", Value: val}
		}
		return bt
	}
	for _, mode := range []string{"direct", "never", "interval", "interval, no spares", "always"} {
		b.Run(mode, func(b *testing.B) {
			var next interface {
				Consume(context.Context, *record.Batch) error
			} = acker{}
			var s *Spool
			if mode != "direct" {
				cfg := testConfig(b.TempDir())
				cfg.Fsync, cfg.SegmentBytes, cfg.MaxBytes, cfg.ReadAhead = mode, 64<<20, 8<<30, 64<<20
				if mode == "interval, no spares" {
					cfg.Fsync = "interval"
				}
				var err error
				if s, err = Open(cfg, telemetry.TestSettings(), Links{Next: acker{}}); err != nil {
					b.Fatal(err)
				}
				if mode == "interval, no spares" {
					s.maxSpares = 0
				}
				_ = s.Start(context.Background())
				next = s
				defer func() {
					_ = s.Shutdown(context.Background())
					_ = s.Close()
				}()
			}
			batches := make(chan *record.Batch, 64)
			for i := 0; i < 64; i++ {
				batches <- mk()
			}
			b.SetBytes(perBatch * 100)
			b.ResetTimer()
			c0 := cpuTime()
			var wg sync.WaitGroup
			for i := 0; i < b.N; i++ {
				bt := <-batches
				bt.Reset()
				bt.Records = bt.Records[:perBatch]
				for j := range bt.Records {
					bt.Records[j] = record.Record{Topic: "bench", Value: val}
				}
				wg.Add(1)
				bt.OnDone(func(error) { wg.Done(); batches <- bt })
				if err := next.Consume(context.Background(), bt); err != nil {
					b.Fatal(err)
				}
			}
			wg.Wait()
			if s != nil {
				for s.Backlog() > 0 {
					time.Sleep(time.Millisecond)
				}
			}
			b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(cpuTime()-c0)/1e3/float64(b.N), "cpu-µs/op")
		})
	}
}
