// Package spill owns the spill delivery mode: batches go to Kafka from
// memory while Kafka keeps up, and to the disk spool when the memory queue
// is full or Kafka is unreachable so a Kafka outage or a
// burst costs disk instead of refusals.
//
// A client is answered as the path its batch took says: after Kafka's
// acknowledgement from memory, after the append (under the fsync policy)
// from disk. Once anything is on disk, every batch goes to disk until the
// spool has drained, so records are not overtaken by later ones and
// per-key order holds across the switch (except for batches already in
// flight to Kafka from memory at the moment of the switch, which Kafka may
// still be retrying).
//
// The router asks the spool, never the other way round: whether the spool
// has drained is checked when a batch arrives (and when the state is
// scraped), under the lock that orders appends, so no batch can be appended
// between the check and the switch back to memory.
package spill

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Router sends each batch to memory or disk.
type Router struct {
	mem  consumer.Consumer
	disk Disk
	up   func() bool
	set  telemetry.Settings

	mu       sync.Mutex
	spilling bool

	spilled  *prometheus.CounterVec
	switches prometheus.Counter
}

// Disk is what the router needs of the spool.
type Disk interface {
	consumer.Consumer
	Backlog() int64
}

// New builds a router over mem (the memory queue in front of the exporter)
// and disk. up reports whether Kafka is reachable. If disk holds a backlog
// the router starts spilling, so the backlog is not overtaken.
func New(set telemetry.Settings, mem consumer.Consumer, disk Disk, up func() bool) *Router {
	r := &Router{mem: mem, disk: disk, up: up, set: set}
	r.spilled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_spill_records_total",
		Help: "Records sent to the disk spool instead of straight to Kafka, by why."}, []string{"reason"})
	state := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_spill_active", Help: "1 while batches go to the disk spool."},
		func() float64 {
			if r.Spilling() {
				return 1
			}
			return 0
		})
	r.switches = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_spill_switches_total", Help: "Switches from memory to disk."})
	set.Registry.MustRegister(r.spilled, state, r.switches)
	r.spilling = disk.Backlog() > 0
	return r
}

// Consume sends b to Kafka from memory when it can, else to disk.
func (r *Router) Consume(ctx context.Context, b *record.Batch) error {
	reason := "spilling"
	spilling := r.Spilling()
	if !spilling {
		if !r.up() {
			reason = "kafka_unavailable"
		} else {
			err := r.mem.Consume(ctx, b)
			var re *consumer.RetryableError
			if err == nil || !errors.As(err, &re) || re == consumer.ErrShuttingDown {
				return err
			}
			reason = re.Reason
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(b.Records)
	if err := r.disk.Consume(ctx, b); err != nil {
		return err
	}
	if !r.spilling {
		r.spilling = true
		r.switches.Inc()
		r.set.Logger.Warn("spilling to disk until Kafka catches up", "component", "buffer/spill", "reason", reason)
	}
	r.spilled.WithLabelValues(reason).Add(float64(n))
	return nil
}

// Spilling reports whether batches go to disk. With nothing left on disk,
// they go to Kafka from memory again.
func (r *Router) Spilling() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refresh()
}

// refresh ends spilling once the spool has drained; r.mu is held.
func (r *Router) refresh() bool {
	if r.spilling && r.disk.Backlog() == 0 {
		r.spilling = false
		r.set.Logger.Info("spool drained; sending from memory again", "component", "buffer/spill")
	}
	return r.spilling
}
