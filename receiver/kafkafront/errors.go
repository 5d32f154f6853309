package kafkafront

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/routing"
)

var (
	errUnreachable  = errors.New("the Kafka cluster could not be asked for this topic's partitions")
	errUnknownTopic = errors.New("the topic does not exist in the Kafka cluster")
)

// kafkaCode is the one table from what an error means for the client to
// the Kafka error code a producer acts on. Retriable codes are chosen
// among those the Java client and librdkafka retry without giving up the
// connection; the error message (Produce v8 and later) carries ferry's own
// words, and throttle time carries its retry-after.
var kafkaCode = map[consumer.Kind]*kerr.Error{
	consumer.KindInternal:        kerr.UnknownServerError,
	consumer.KindInvalid:         kerr.InvalidRecord,
	consumer.KindUnauthenticated: kerr.SaslAuthenticationFailed,
	consumer.KindForbidden:       kerr.TopicAuthorizationFailed,
	consumer.KindUnknownTopic:    kerr.UnknownTopicOrPartition,
	consumer.KindTooLarge:        kerr.MessageTooLarge,
	consumer.KindBusy:            kerr.NotEnoughReplicas,
	consumer.KindUnavailable:     kerr.NotEnoughReplicas,
	consumer.KindTimeout:         kerr.RequestTimedOut,
	consumer.KindRefused:         kerr.InvalidRecord,
}

// codeFor maps a pipeline error to its Kafka error.
func codeFor(err error) *kerr.Error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, errOldFormat):
		return kerr.UnsupportedForMessageFormat
	case errors.Is(err, errCorrupt):
		return kerr.CorruptMessage
	case errors.Is(err, errUnknownTopic):
		return kerr.UnknownTopicOrPartition
	case errors.Is(err, errUnreachable):
		return kerr.LeaderNotAvailable
	case errors.Is(err, routing.ErrInvalidTopic):
		return kerr.InvalidTopicException
	}
	// Kafka's own refusal (too large, authorization) is passed on as is.
	var ke *kerr.Error
	if consumer.KindOf(err) == consumer.KindRefused && errors.As(err, &ke) {
		return ke
	}
	return kafkaCode[consumer.KindOf(err)]
}
