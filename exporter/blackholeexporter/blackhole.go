// Package blackholeexporter owns an exporter that acknowledges every record
// at once and keeps nothing. It exists to measure ferry's own cost apart from
// the broker's (ferry-bench otlp compares the two); it is never a way to drop
// data in production, so its records are counted as sent to "blackhole" and
// the start-up log says so loudly.
package blackholeexporter

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Exporter acknowledges and discards.
type Exporter struct {
	sent      *prometheus.CounterVec
	sentBytes *prometheus.CounterVec
	topics    *telemetry.Labels
}

// New builds the exporter.
func New(set telemetry.Settings) *Exporter {
	lbl := prometheus.Labels{"exporter": "blackhole"}
	e := &Exporter{topics: set.Topics,
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_sent_records_total",
			Help: "Records acknowledged by Kafka.", ConstLabels: lbl}, []string{"topic"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_sent_bytes_total",
			Help: "Key and value bytes acknowledged by Kafka.", ConstLabels: lbl}, []string{"topic"}),
	}
	set.Registry.MustRegister(e.sent, e.sentBytes)
	set.Logger.Warn("exporter is blackhole: every record is acknowledged and DISCARDED (for benchmarks only)")
	return e
}

// Consume acknowledges every record of b before returning.
func (e *Exporter) Consume(_ context.Context, b *record.Batch) error {
	n, bytes := 0, 0
	topic := ""
	if len(b.Records) > 0 {
		topic = b.Records[0].Topic
	}
	for i := range b.Records {
		if b.Records[i].Topic != topic {
			e.sent.WithLabelValues(e.topics.Get(b.Records[i].Topic)).Inc()
			e.sentBytes.WithLabelValues(e.topics.Get(b.Records[i].Topic)).Add(float64(b.Records[i].Size()))
			continue
		}
		n++
		bytes += b.Records[i].Size()
	}
	if n > 0 {
		e.sent.WithLabelValues(e.topics.Get(topic)).Add(float64(n))
		e.sentBytes.WithLabelValues(e.topics.Get(topic)).Add(float64(bytes))
	}
	b.Arm()
	if len(b.Records) == 0 {
		b.Fail(nil)
		return nil
	}
	for range b.Records {
		b.Ack(nil)
	}
	return nil
}

// Up is always true.
func (e *Exporter) Up() bool { return true }

// Start does nothing.
func (e *Exporter) Start(context.Context) error { return nil }

// Shutdown does nothing: nothing is ever held.
func (e *Exporter) Shutdown(context.Context) error { return nil }
