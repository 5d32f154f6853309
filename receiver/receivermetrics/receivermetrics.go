// Package receivermetrics owns the metrics every receiver reports, so that
// all receivers share one definition of each name (Prometheus refuses the
// same name with different labels) and users can add them up across
// receivers: received − sent − dropped is what is in flight.
package receivermetrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// Metrics are one receiver's view of the shared vectors.
type Metrics struct {
	reg        prometheus.Registerer
	name       string
	requests   *prometheus.CounterVec
	errors     *prometheus.CounterVec
	records    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	items      *prometheus.CounterVec
	noWait     *prometheus.CounterVec
	ReqBytes   prometheus.Observer
	AckLatency prometheus.Observer
}

// New registers (or reuses) the shared vectors in reg for the receiver name.
func New(reg prometheus.Registerer, name string) *Metrics {
	m := &Metrics{reg: reg, name: name}
	m.requests = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_requests_total",
		Help: "Requests answered, by status code (HTTP status, or gRPC code name)."}, []string{"receiver", "code"}))
	m.errors = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_errors_total",
		Help: "Requests refused or failed, by reason."}, []string{"receiver", "reason"}))
	m.records = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_received_records_total",
		Help: "Kafka records accepted into the pipeline."}, []string{"receiver", "topic"}))
	m.bytes = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_received_bytes_total",
		Help: "Key and value bytes accepted into the pipeline."}, []string{"receiver", "topic"}))
	m.items = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_received_items_total",
		Help: "Telemetry items (spans, log records, data points; messages for HTTP) accepted."}, []string{"receiver", "signal"}))
	m.noWait = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_fire_and_forget_records_total",
		Help: "Records answered before Kafka acknowledged them (wait=false)."}, []string{"receiver"}))
	rb := telemetry.Shared(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_receiver_request_bytes",
		Help: "Decoded request body size.", Buckets: prometheus.ExponentialBuckets(64, 4, 12)}, []string{"receiver"}))
	al := telemetry.Shared(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_receiver_ack_latency_seconds",
		Help:    "From request read to Kafka's acknowledgement of all its records.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"receiver"}))
	m.ReqBytes = rb.WithLabelValues(name)
	m.AckLatency = al.WithLabelValues(name)
	return m
}

// UnreadAnswers is the gauge of bytes of answers a stream receiver holds
// for clients that have not read them (server.Answers).
func (m *Metrics) UnreadAnswers() prometheus.Gauge {
	return telemetry.Shared(m.reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_receiver_unread_answer_bytes",
		Help: "Bytes of answers held for clients that have not read them yet; an answer still owed counts as an estimate of what it will hold."}, []string{"receiver"})).WithLabelValues(m.name)
}

// Request counts an answered request by code.
func (m *Metrics) Request(code int) { m.requests.WithLabelValues(m.name, strconv.Itoa(code)).Inc() }

// RequestCode counts an answered request by a named code (gRPC).
func (m *Metrics) RequestCode(code string) { m.requests.WithLabelValues(m.name, code).Inc() }

// Error counts a refusal or failure by reason.
func (m *Metrics) Error(reason string) { m.errors.WithLabelValues(m.name, reason).Inc() }

// Errors is the refusals counter for reason (for tests and reports).
func (m *Metrics) Errors(reason string) prometheus.Counter {
	return m.errors.WithLabelValues(m.name, reason)
}

// Received counts accepted records and bytes for a topic label.
func (m *Metrics) Received(topic string, records, bytes int) {
	m.records.WithLabelValues(m.name, topic).Add(float64(records))
	m.bytes.WithLabelValues(m.name, topic).Add(float64(bytes))
}

// Records is the received-records counter for topic.
func (m *Metrics) Records(topic string) prometheus.Counter {
	return m.records.WithLabelValues(m.name, topic)
}

// Items counts accepted telemetry items of a signal.
func (m *Metrics) Items(signal string, n int) {
	m.items.WithLabelValues(m.name, signal).Add(float64(n))
}

// NoWait counts records answered before Kafka's acknowledgement.
func (m *Metrics) NoWait(n int) { m.noWait.WithLabelValues(m.name).Add(float64(n)) }

// NoWaitCounter is the fire-and-forget counter (for tests).
func (m *Metrics) NoWaitCounter() prometheus.Counter { return m.noWait.WithLabelValues(m.name) }
