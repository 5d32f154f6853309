// Package spill owns the spill delivery mode: batches go to Kafka from
// memory while Kafka keeps up, and to the disk spool when the memory queue
// is full or Kafka is unreachable (as pan does), so a Kafka outage or a
// burst costs disk instead of refusals.
//
// A client is answered as the path its batch took says: after Kafka's
// acknowledgement from memory, after the append (under the fsync policy)
// from disk. Once anything is on disk, every batch goes to disk until the
// spool has drained, so records are not overtaken by later ones and
// per-key order holds across the switch (except for batches already in
// flight to Kafka from memory at the moment of the switch, which Kafka may
// still be retrying).
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
	state    prometheus.Gauge
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
	r.state = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_spill_active", Help: "1 while batches go to the disk spool."})
	r.switches = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_spill_switches_total", Help: "Switches from memory to disk."})
	set.Registry.MustRegister(r.spilled, r.state, r.switches)
	if disk.Backlog() > 0 {
		r.spilling = true
		r.state.Set(1)
	}
	return r
}

// Consume sends b to Kafka from memory when it can, else to disk.
func (r *Router) Consume(ctx context.Context, b *record.Batch) error {
	reason := "spilling"
	r.mu.Lock()
	spilling := r.spilling
	r.mu.Unlock()
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
		r.state.Set(1)
		r.switches.Inc()
		r.set.Logger.Warn("spilling to disk until Kafka catches up", "component", "buffer/spill", "reason", reason)
	}
	r.spilled.WithLabelValues(reason).Add(float64(n))
	return nil
}

// Drained is the spool's OnDrained: with nothing left on disk, batches go
// to Kafka from memory again.
func (r *Router) Drained() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.spilling && r.disk.Backlog() == 0 {
		r.spilling = false
		r.state.Set(0)
		r.set.Logger.Info("spool drained; sending from memory again", "component", "buffer/spill")
	}
}

// Spilling reports whether batches go to disk.
func (r *Router) Spilling() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spilling
}
