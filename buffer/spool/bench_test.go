package spool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
			if s != nil {
				b.ReportMetric(testutil.ToFloat64(s.m.readBytes.WithLabelValues("memory"))/float64(b.N*perBatch*100), "mem-frac")
			}
		})
	}
}

// BenchmarkSpoolCaughtUp: one append of 1000 records of 1 KB at a time,
// each read back and acknowledged before the next (a reader that keeps
// up, as at any steady rate the exporter sustains), sent from the kept
// appends in memory ("tail") or read back from the page cache ("no tail",
// the reference). cpu-µs/op is the process's CPU per append. Here, with
// every byte still in the CPU's caches, the two differ by ~1.5% (medians
// of six runs); in the agent at 50k logs/s, where the page cache copy
// misses the caches, by ~4.5% of its CPU per item (median of 5 pairs).
func BenchmarkSpoolCaughtUp(b *testing.B) {
	const perBatch = 1000
	val := make([]byte, 1000)
	for _, mode := range []string{"tail", "no tail"} {
		b.Run(mode, func(b *testing.B) {
			cfg := testConfig(b.TempDir())
			cfg.SegmentBytes, cfg.MaxBytes, cfg.ReadAhead = 64<<20, 8<<30, 64<<20
			got := make(chan int, 64)
			s, err := Open(cfg, telemetry.TestSettings(), Links{Next: signalAcker(got)})
			if err != nil {
				b.Fatal(err)
			}
			_ = s.Start(context.Background())
			if mode == "no tail" {
				s.mu.Lock()
				s.tailMax = 0
				s.mu.Unlock()
			}
			defer func() {
				_ = s.Shutdown(context.Background())
				_ = s.Close()
			}()
			bt := &record.Batch{Records: make([]record.Record, perBatch)}
			b.SetBytes(perBatch * 1000)
			b.ResetTimer()
			c0 := cpuTime()
			for i := 0; i < b.N; i++ {
				bt.Reset()
				bt.Records = bt.Records[:perBatch]
				for j := range bt.Records {
					bt.Records[j] = record.Record{Topic: "bench", Value: val}
				}
				if err := s.Consume(context.Background(), bt); err != nil {
					b.Fatal(err)
				}
				for n := 0; n < perBatch; n += <-got {
				}
			}
			b.ReportMetric(float64(cpuTime()-c0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(testutil.ToFloat64(s.m.readBytes.WithLabelValues("memory"))/float64(b.N*perBatch*1000), "mem-frac")
		})
	}
}

// signalAcker acknowledges every record at once and then reports how many
// it took on c.
type signalAcker chan int

func (c signalAcker) Consume(_ context.Context, b *record.Batch) error {
	n := len(b.Records) // the last ack completes the batch, which resets it
	b.Arm()
	for range n {
		b.Ack(nil)
	}
	c <- n
	return nil
}
