// Package memqueue owns ferry's memory bound: every batch between a receiver
// and Kafka's acknowledgement holds a byte reservation here, and a batch that
// does not fit is refused at once.
//
// Design: the queue is an admission counter, not a channel. A batch reserves
// its MemBytes with one compare-and-swap, is handed straight to the next
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

	"github.com/ferryhq/ferry/config/bytesize"
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
	limit    int64
	readyAt  int64
	next     consumer.Consumer
	upstream func() bool // is the destination reachable? (decides 429 vs 503)

	used    atomic.Int64
	records atomic.Int64
	// lastRefused (unix nanos): a queue that just refused a request is full
	// for that client even if its fill fraction is below ready_below.
	lastRefused atomic.Int64

	block   time.Duration
	waiters atomic.Int64
	freed   chan struct{}

	usedG    prometheus.Gauge
	recordsG prometheus.Gauge
	refused  *prometheus.CounterVec
}

// New builds a queue in front of next. up reports whether the destination is
// reachable; nil means always.
func New(cfg Config, set telemetry.Settings, next consumer.Consumer, up func() bool) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if up == nil {
		up = func() bool { return true }
	}
	q := &Queue{limit: int64(cfg.MemoryLimit), readyAt: int64(float64(cfg.MemoryLimit) * cfg.ReadyBelow), next: next, upstream: up,
		block: cfg.BlockTimeout, freed: make(chan struct{}, 1)}
	q.usedG = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_queue_bytes", Help: "Bytes held between receivers and Kafka's acknowledgement."})
	q.recordsG = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_queue_records", Help: "Records held between receivers and Kafka's acknowledgement."})
	limitG := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_queue_limit_bytes", Help: "The configured memory_limit."})
	limitG.Set(float64(q.limit))
	q.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_queue_refused_records_total",
		Help: "Records refused because the queue was full, by reason."}, []string{"reason"})
	set.Registry.MustRegister(q.usedG, q.recordsG, limitG, q.refused)
	set.Health.Register("queue", q.ready)
	return q, nil
}

// refusedRecently is how long a refusal keeps /readyz false.
const refusedRecently = 2 * time.Second

func (q *Queue) ready() error {
	u := q.used.Load()
	if u >= q.readyAt {
		return fmt.Errorf("queue %d%% full (%d of %d bytes)", u*100/q.limit, u, q.limit)
	}
	if t := q.lastRefused.Load(); t != 0 && time.Since(time.Unix(0, t)) < refusedRecently {
		return fmt.Errorf("queue refused data in the last %s (%d of %d bytes used)", refusedRecently, u, q.limit)
	}
	return nil
}

// Consume reserves b.MemBytes and passes b on, or refuses it at once.
func (q *Queue) Consume(ctx context.Context, b *record.Batch) error {
	size := b.MemBytes
	if size > q.limit {
		return consumer.TooLarge("request (in memory)", size, q.limit, nil)
	}
	var waitUntil time.Time
	for {
		u := q.used.Load()
		if u+size > q.limit && q.block > 0 && ctx.Err() == nil {
			if waitUntil.IsZero() {
				waitUntil = time.Now().Add(q.block)
			}
			if time.Now().Before(waitUntil) {
				q.wait(ctx, waitUntil)
				continue
			}
		}
		if u+size > q.limit {
			err := consumer.ErrFull
			if !q.upstream() {
				err = consumer.ErrUnavailable
			}
			q.refused.WithLabelValues(err.Reason).Add(float64(len(b.Records)))
			q.lastRefused.Store(time.Now().UnixNano())
			return err
		}
		if q.used.CompareAndSwap(u, u+size) {
			break
		}
	}
	n := int64(len(b.Records))
	q.records.Add(n)
	q.usedG.Add(float64(size))
	q.recordsG.Add(float64(n))
	b.OnDone(func(error) { q.release(size, n) })
	if err := q.next.Consume(ctx, b); err != nil {
		// Not taken: detach our completion and give the bytes back here.
		b.PopDone()
		q.release(size, n)
		return err
	}
	return nil
}

// Reserve takes n bytes for a stage that holds data outside Consume (the
// spool's reader, which reads ahead of Kafka), only while the total stays
// at or below ceiling, so that stage can never take the room receivers need.
// It reports whether the bytes were reserved; Release gives them back.
func (q *Queue) Reserve(n, ceiling int64) bool {
	if !reserve(&q.used, n, min(ceiling, q.limit)) {
		return false
	}
	q.usedG.Add(float64(n))
	return true
}

// reserve adds n to used while the total stays at or below ceiling.
func reserve(used *atomic.Int64, n, ceiling int64) bool {
	for {
		u := used.Load()
		if u+n > ceiling {
			return false
		}
		if used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Release gives back bytes taken with Reserve.
func (q *Queue) Release(n int64) {
	q.used.Add(-n)
	q.usedG.Sub(float64(n))
	q.poke()
}

// wait blocks until some bytes are released, the deadline or ctx ends.
// Releases poke freed only while someone waits, so the common path pays
// one atomic load.
func (q *Queue) wait(ctx context.Context, until time.Time) {
	q.waiters.Add(1)
	defer q.waiters.Add(-1)
	t := time.NewTimer(min(time.Until(until), 10*time.Millisecond))
	defer t.Stop()
	select {
	case <-q.freed:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (q *Queue) poke() {
	if q.waiters.Load() > 0 {
		select {
		case q.freed <- struct{}{}:
		default:
		}
	}
}

func (q *Queue) release(size, n int64) {
	defer q.poke()
	q.used.Add(-size)
	q.records.Add(-n)
	q.usedG.Sub(float64(size))
	q.recordsG.Sub(float64(n))
}

// Used returns the reserved bytes.
func (q *Queue) Used() int64 { return q.used.Load() }

// Limit returns the configured bound.
func (q *Queue) Limit() int64 { return q.limit }

// Start is a no-op: the queue has no goroutines.
func (q *Queue) Start(context.Context) error { return nil }

// Shutdown is a no-op: reservations drain as the exporter completes batches.
func (q *Queue) Shutdown(context.Context) error { return nil }

// Budget is a byte bound on its own, for memory held outside the queue:
// in spill mode, request bodies being read, which must not take the
// queue's room (a full queue is what sends spill mode to disk).
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Reserve takes n bytes while the total stays at or below ceiling (and
// the limit).
func (b *Budget) Reserve(n, ceiling int64) bool { return reserve(&b.used, n, min(ceiling, b.limit)) }

// Release gives back n bytes.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

// Limit is the bound.
func (b *Budget) Limit() int64 { return b.limit }

// Used is what is reserved.
func (b *Budget) Used() int64 { return b.used.Load() }
