// Package consumer owns the contract between pipeline stages and the error
// kinds that cross it.
//
// A stage hands a *record.Batch to the next with Consume. If Consume returns
// nil the next stage owns the batch and guarantees that the batch's
// completions run exactly once, later, with the delivery outcome. If Consume
// returns an error the batch was not taken: no completion of the callee runs
// and the caller still owns it. Errors are classified so that a receiver can
// answer its client correctly without knowing which stage refused:
// retryable refusals (full, unavailable, shutting down) become 429/503 with
// Retry-After; permanent ones (too large, unknown topic) become 4xx.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/record"
)

// Consumer is a pipeline stage that accepts batches.
type Consumer interface {
	Consume(ctx context.Context, b *record.Batch) error
}

// Func adapts a function to Consumer.
type Func func(ctx context.Context, b *record.Batch) error

// Consume calls f.
func (f Func) Consume(ctx context.Context, b *record.Batch) error { return f(ctx, b) }

// Retryable refusals. The client should retry after RetryAfter.
var (
	// ErrFull: a byte-bounded buffer has no room; Kafka is reachable.
	ErrFull = &RetryableError{Reason: "queue_full", Msg: "ferry's buffer is full; retry later", After: time.Second, Busy: true}
	// ErrSpoolFull: the disk spool is at its max_bytes; Kafka is reachable.
	ErrSpoolFull = &RetryableError{Reason: "spool_full", Msg: "ferry's disk spool is full; retry later", After: time.Second, Busy: true}
	// ErrUnavailable: no room and Kafka is unreachable, so room will not free up soon.
	ErrUnavailable = &RetryableError{Reason: "kafka_unavailable", Msg: "Kafka is unreachable and ferry's buffer is full; retry later", After: 5 * time.Second}
	// ErrShutdownTimeout: the agent stopped before Kafka answered for a
	// record. The record was not given up on: in spool mode it stays on
	// disk for the next start; otherwise the client should send it again.
	ErrShutdownTimeout = &RetryableError{Reason: "shutdown_timeout", Msg: "ferry stopped before Kafka acknowledged the record", After: 5 * time.Second}
	// ErrShuttingDown: the agent is stopping.
	ErrShuttingDown = &RetryableError{Reason: "shutting_down", Msg: "ferry is shutting down", After: 5 * time.Second}
)

// Kind is what an error means for the client, whichever stage raised it.
// Every receiver maps a Kind to its protocol's answer in one table (the
// messages API's HTTP statuses, OTLP's per its specification); nothing
// switches on reason strings.
type Kind uint8

// The kinds.
const (
	KindInternal        Kind = iota // unclassified: a bug or an unexpected failure
	KindInvalid                     // the request is malformed
	KindUnauthenticated             // no valid token
	KindForbidden                   // the client may not write there
	KindUnknownTopic                // the topic does not exist in Kafka
	KindTooLarge                    // over a size or count limit: send less, not again
	KindBusy                        // over capacity while Kafka is reachable: retry soon
	KindUnavailable                 // cannot serve now (Kafka down and full, stopping, disk failing): retry later
	KindTimeout                     // Kafka did not answer in time; the data may still arrive
	KindRefused                     // Kafka refused the data for good
)

// KindOf classifies err.
func KindOf(err error) Kind {
	var re *RetryableError
	if errors.As(err, &re) {
		switch {
		case re.Kind != KindInternal:
			return re.Kind
		case re.Busy:
			return KindBusy
		}
		return KindUnavailable
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		if pe.Kind == KindInternal {
			return KindRefused
		}
		return pe.Kind
	}
	return KindInternal
}

// RetryableError is a refusal the client should retry.
type RetryableError struct {
	Reason string // short counter label
	Msg    string
	After  time.Duration
	// Busy: ferry is working but over capacity (HTTP 429, gRPC
	// RESOURCE_EXHAUSTED); otherwise it cannot serve at all (503, UNAVAILABLE).
	Busy bool
	// Kind, when set, overrides what Busy says (KindTimeout).
	Kind Kind
}

func (e *RetryableError) Error() string { return e.Msg }

// PermanentError is a failure retrying the same data cannot fix.
type PermanentError struct {
	Reason string // short counter label: record_too_large, unknown_topic, ...
	Msg    string
	Err    error // the underlying cause, if any
	// Kind: what the client is told (KindTooLarge, KindForbidden, ...);
	// unset means Kafka refused the data (KindRefused).
	Kind Kind
}

func (e *PermanentError) Error() string { return e.Msg }
func (e *PermanentError) Unwrap() error { return e.Err }

// TooLarge reports a record or request larger than a limit.
func TooLarge(what string, size, limit int64, cause error) *PermanentError {
	return &PermanentError{Reason: "record_too_large", Err: cause, Kind: KindTooLarge,
		Msg: fmt.Sprintf("%s of %d bytes exceeds the limit of %d bytes", what, size, limit)}
}

// OverLimit reports a request that exceeds a configured bound (items,
// records, the bytes it expands to), named by its config key so the client's
// operator knows what to change; the request was refused before it was
// built in full.
func OverLimit(reason, what string, limit int64, key string) *PermanentError {
	return &PermanentError{Reason: reason, Kind: KindTooLarge,
		Msg: fmt.Sprintf("request refused: %s exceeds the limit of %d (%s)", what, limit, key)}
}

// UnknownTopic reports a topic that does not exist in Kafka, and what
// the client (or its operator) can do about it: ferry creates only the
// topics its own configuration names, never one a request chose.
func UnknownTopic(topic string, cause error) *PermanentError {
	return &PermanentError{Reason: "unknown_topic", Err: cause, Kind: KindUnknownTopic,
		Msg: fmt.Sprintf("topic %q does not exist in Kafka and ferry does not create topics a request names: "+
			"create it (kafka-topics.sh --create --topic %s), send to a topic that exists, "+
			"or make it a topic of ferry's configuration (created when missing with exporter.kafka.create_topics; "+
			"see ferry's log if that failed)", topic, topic)}
}

// Reason returns the counter label of err: the Reason of a classified error,
// "error" otherwise.
func Reason(err error) string {
	var re *RetryableError
	if errors.As(err, &re) {
		return re.Reason
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return "error"
}
