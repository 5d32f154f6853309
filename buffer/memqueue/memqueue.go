// Package memqueue owns ferry's memory bound: every batch between a receiver
// and Kafka's acknowledgement holds a byte reservation here, and a batch that
// does not fit is refused at once.
//
// Design: the queue is an admission counter, not a channel. A batch reserves
// its MemBytes from the shared budget (package budget) with one
// compare-and-swap, is handed straight to the next
// stage in the caller's goroutine (no hand-off, no extra copy), and gives its
// reservation back when its completion runs — that is, when Kafka has
// answered for every record. So the reserved bytes cover everything ferry
// holds for a client: decoded buffers, records waiting in the Kafka client,
// records in flight to the broker. The bound can never be exceeded, because a
// reservation is made before the data is accepted; and the queue never
// blocks, because a refusal is returned to the receiver, which answers 429
// (or 503 when Kafka is unreachable, since then room will not free up soon).
//
// Per-key order is kept because batches are passed on in the order they are
// admitted, by the goroutine that admitted them.
package memqueue

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Config is the user configuration (YAML queue).
type Config struct {
	// MemoryLimit bounds the bytes of all data ferry holds between a
	// receiver and Kafka's acknowledgement.
	MemoryLimit bytesize.Size `yaml:"memory_limit"`
	// ReadyBelow: /readyz reports not ready while usage is at or above this
	// fraction of MemoryLimit (default 0.95), so load balancers back off
	// before clients see 429s.
	ReadyBelow float64 `yaml:"ready_below"`
	// BlockTimeout: when full, a request waits up to this for room before
	// it is refused (backpressure instead of an error, for clients that
	// prefer to wait); 0 refuses at once.
	BlockTimeout time.Duration `yaml:"block_timeout"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.MemoryLimit < 1<<20 {
		return fmt.Errorf("memory_limit: %s is below 1MiB", c.MemoryLimit)
	}
	if c.ReadyBelow <= 0 || c.ReadyBelow > 1 {
		return fmt.Errorf("ready_below: %v is outside (0, 1]", c.ReadyBelow)
	}
	if c.BlockTimeout < 0 || c.BlockTimeout > time.Minute {
		return fmt.Errorf("block_timeout: %s is outside 0..1m", c.BlockTimeout)
	}
	return nil
}

// Queue admits batches while their bytes fit.
type Queue struct {
	budget   *budget.Budget
	readyAt  int64
	next     consumer.Consumer
	upstream func() bool // is the destination reachable? (decides 429 vs 503)

	records atomic.Int64
	// lastRefused (unix nanos): a queue that just refused a request is full
	// for that client even if its fill fraction is below ready_below.
	lastRefused atomic.Int64

	block time.Duration

	refused *prometheus.CounterVec
}

// New builds a queue in front of next that admits batches from b (built
// from cfg.MemoryLimit and shared with the other stages that hold data).
// up reports whether the destination is reachable; nil means always.
func New(cfg Config, set telemetry.Settings, b *budget.Budget, next consumer.Consumer, up func() bool) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if up == nil {
		up = func() bool { return true }
	}
	q := &Queue{budget: b, readyAt: int64(float64(b.Limit()) * cfg.ReadyBelow), next: next, upstream: up, block: cfg.BlockTimeout}
	// Read at scrape time: the budget is the one count, whoever reserved.
	usedG := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_queue_bytes",
		Help: "Bytes held between receivers and Kafka's acknowledgement."}, func() float64 { return float64(b.Used()) })
	recordsG := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_queue_records",
		Help: "Records held between receivers and Kafka's acknowledgement."}, func() float64 { return float64(q.records.Load()) })
	limitG := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_queue_limit_bytes", Help: "The configured memory_limit."})
	limitG.Set(float64(b.Limit()))
	q.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_queue_refused_records_total",
		Help: "Records refused because the queue was full, by reason."}, []string{"reason"})
	set.Registry.MustRegister(usedG, recordsG, limitG, q.refused)
	set.Health.Register("queue", q.ready)
	return q, nil
}

// refusedRecently is how long a refusal keeps /readyz false.
const refusedRecently = 2 * time.Second

func (q *Queue) ready() error {
	u, limit := q.budget.Used(), q.budget.Limit()
	if u >= q.readyAt {
		return fmt.Errorf("queue %d%% full (%d of %d bytes)", u*100/limit, u, limit)
	}
	if t := q.lastRefused.Load(); t != 0 && time.Since(time.Unix(0, t)) < refusedRecently {
		return fmt.Errorf("queue refused data in the last %s (%d of %d bytes used)", refusedRecently, u, limit)
	}
	return nil
}

// Consume reserves b.MemBytes and passes b on, or refuses it at once.
func (q *Queue) Consume(ctx context.Context, b *record.Batch) error {
	size := b.MemBytes
	if limit := q.budget.Limit(); size > limit {
		return consumer.TooLarge("request (in memory)", size, limit, nil)
	}
	var waitUntil time.Time
	for !q.budget.TryReserve(size) {
		if q.block > 0 && ctx.Err() == nil {
			if waitUntil.IsZero() {
				waitUntil = time.Now().Add(q.block)
			}
			if time.Now().Before(waitUntil) {
				q.budget.Wait(ctx, waitUntil)
				continue
			}
		}
		err := consumer.ErrFull
		if !q.upstream() {
			err = consumer.ErrUnavailable
		}
		q.refused.WithLabelValues(err.Reason).Add(float64(len(b.Records)))
		q.lastRefused.Store(time.Now().UnixNano())
		return err
	}
	n := int64(len(b.Records))
	q.records.Add(n)
	b.OnDone(func(error) { q.release(size, n) })
	if err := q.next.Consume(ctx, b); err != nil {
		// Not taken: detach our completion and give the bytes back here.
		b.PopDone()
		q.release(size, n)
		return err
	}
	return nil
}

func (q *Queue) release(size, n int64) {
	q.records.Add(-n)
	q.budget.Release(size)
}

// Used returns the reserved bytes (the whole budget's).
func (q *Queue) Used() int64 { return q.budget.Used() }

// Limit returns the configured bound.
func (q *Queue) Limit() int64 { return q.budget.Limit() }

// Start is a no-op: the queue has no goroutines.
func (q *Queue) Start(context.Context) error { return nil }

// Shutdown is a no-op: reservations drain as the exporter completes batches.
func (q *Queue) Shutdown(context.Context) error { return nil }
