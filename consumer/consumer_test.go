package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestKindOf: every error the stages raise has the kind receivers answer
// by, wrapped or not; what nothing classified is internal.
func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Kind
	}{
		{ErrFull, KindBusy},
		{ErrSpoolFull, KindBusy},
		{ErrUnavailable, KindUnavailable},
		{ErrShuttingDown, KindUnavailable},
		{ErrShutdownTimeout, KindUnavailable},
		{&RetryableError{Reason: "ack_timeout", Kind: KindTimeout}, KindTimeout},
		{TooLarge("record", 10, 5, nil), KindTooLarge},
		{OverLimit("too_many_items", "items", 5, "key"), KindTooLarge},
		{UnknownTopic("t", nil), KindUnknownTopic},
		{&PermanentError{Reason: "topic_not_allowed", Kind: KindForbidden}, KindForbidden},
		{&PermanentError{Reason: "kafka_error"}, KindRefused},
		{fmt.Errorf("wrapped: %w", UnknownTopic("t", nil)), KindUnknownTopic},
		{context.Canceled, KindInternal},
		{errors.New("anything"), KindInternal},
	} {
		if got := KindOf(c.err); got != c.want {
			t.Errorf("%v: kind %d, want %d", c.err, got, c.want)
		}
	}
}

// The answer for a missing topic names it and tells the client what to do.
func TestUnknownTopicSaysWhatToDo(t *testing.T) {
	msg := UnknownTopic("otlp_spans", nil).Error()
	for _, want := range []string{`topic "otlp_spans" does not exist in Kafka`, "kafka-topics.sh --create --topic otlp_spans", "exporter.kafka.create_topics"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}
