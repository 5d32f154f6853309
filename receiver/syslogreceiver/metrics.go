package syslogreceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// Transports, the "transport" label.
const (
	tUDP = iota
	tTCP
	tTLS
	tUnix
	nTransports
)

var transportNames = [nTransports]string{"udp", "tcp", "tls", "unix"}

// syslogMetrics are the syslog-specific metrics, besides the
// ferry_receiver_* ones every receiver shares. Labels are bounded: a fixed
// transport, protocol and reason set.
type syslogMetrics struct {
	// messages by transport and protocol (rfc5424, rfc3164, unknown),
	// resolved once: the hot path adds to them without a label lookup.
	messages  [nTransports][len(protoNames)]prometheus.Counter
	truncated [nTransports]prometheus.Counter
	dropped   *prometheus.CounterVec
}

func newSyslogMetrics(reg prometheus.Registerer) *syslogMetrics {
	m := &syslogMetrics{}
	msgs := telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_syslog_messages_total",
		Help: "Syslog messages read, by transport and by the protocol they parsed as (unknown: delivered whole, with parse_error)."}, []string{"transport", "protocol"}))
	trunc := telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_syslog_truncated_messages_total",
		Help: "Messages longer than max_message_bytes, delivered truncated to it, by transport."}, []string{"transport"}))
	m.dropped = telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_syslog_dropped_records_total",
		Help: "Messages read that will not reach Kafka, by transport and reason (queue_full, rate_limited, frame_too_large, frame_timeout, shutting_down, ...)."}, []string{"transport", "reason"}))
	for t := range nTransports {
		for p := range protoNames {
			m.messages[t][p] = msgs.WithLabelValues(transportNames[t], protoNames[p])
		}
		m.truncated[t] = trunc.WithLabelValues(transportNames[t])
		// The usual reasons exist from the start, at 0.
		for _, r := range []string{"queue_full", "rate_limited"} {
			m.dropped.WithLabelValues(transportNames[t], r)
		}
	}
	return m
}
