package otlpreceiver

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ferryhq/ferry/consumer"
)

// answer is how one outcome is told to a client over either transport.
type answer struct {
	httpStatus int
	code       codes.Code
	retryAfter time.Duration // > 0: retryable, say when
	reason     string
	msg        string
}

// classify maps an outcome's error to the OTLP answer. The choice of codes
// follows the OTLP specification's retry rules: 429/502/503/504 and
// UNAVAILABLE or RESOURCE_EXHAUSTED-with-RetryInfo are retried by exporters,
// everything else is not.
// refusedPayload: err is about the request's content (malformed, over a
// limit) or the room to hold it, not its credentials.
func refusedPayload(err error) bool {
	var de *decodeError
	var pe *consumer.PermanentError
	// ErrFull: no room to hold the request's copy; refused, retryable.
	return errors.As(err, &de) || errors.As(err, &pe) || errors.Is(err, consumer.ErrFull)
}

// otlpAnswers is the OTLP specification's answer for each kind: HTTP
// status and gRPC code; RESOURCE_EXHAUSTED is retried by exporters only
// with RetryInfo, which classify adds for retryable kinds.
var otlpAnswers = [...]struct {
	status int
	code   codes.Code
}{
	consumer.KindInternal:        {http.StatusInternalServerError, codes.Internal},
	consumer.KindInvalid:         {http.StatusBadRequest, codes.InvalidArgument},
	consumer.KindUnauthenticated: {http.StatusUnauthorized, codes.Unauthenticated},
	consumer.KindForbidden:       {http.StatusForbidden, codes.PermissionDenied},
	consumer.KindUnknownTopic:    {http.StatusInternalServerError, codes.Internal},
	consumer.KindTooLarge:        {http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	consumer.KindBusy:            {http.StatusTooManyRequests, codes.ResourceExhausted},
	consumer.KindUnavailable:     {http.StatusServiceUnavailable, codes.Unavailable},
	consumer.KindTimeout:         {http.StatusGatewayTimeout, codes.Unavailable},
	consumer.KindRefused:         {http.StatusInternalServerError, codes.Internal},
}

func classify(err error) answer {
	var de *decodeError
	if errors.As(err, &de) {
		return answer{http.StatusBadRequest, codes.InvalidArgument, 0, "invalid_payload", de.Error()}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return answer{http.StatusServiceUnavailable, codes.Canceled, 0, "client_gone", err.Error()}
	}
	a := otlpAnswers[consumer.KindOf(err)]
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		return answer{a.status, a.code, re.After, re.Reason, re.Msg}
	}
	var pe *consumer.PermanentError
	if errors.As(err, &pe) {
		return answer{a.status, a.code, 0, pe.Reason, pe.Msg}
	}
	return answer{a.status, a.code, 0, "internal", err.Error()}
}
