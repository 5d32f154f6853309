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
// limit), not its credentials.
func refusedPayload(err error) bool {
	var de *decodeError
	var pe *consumer.PermanentError
	return errors.As(err, &de) || errors.As(err, &pe)
}

func classify(err error) answer {
	var de *decodeError
	if errors.As(err, &de) {
		return answer{http.StatusBadRequest, codes.InvalidArgument, 0, "invalid_payload", de.Error()}
	}
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		switch {
		case re.Busy:
			return answer{http.StatusTooManyRequests, codes.ResourceExhausted, re.After, re.Reason, re.Msg}
		case re == errAckTimeout:
			return answer{http.StatusGatewayTimeout, codes.Unavailable, re.After, re.Reason, re.Msg}
		}
		return answer{http.StatusServiceUnavailable, codes.Unavailable, re.After, re.Reason, re.Msg}
	}
	var pe *consumer.PermanentError
	if errors.As(err, &pe) {
		if pe.Reason == "shutdown_timeout" {
			return answer{http.StatusServiceUnavailable, codes.Unavailable, 5 * time.Second, pe.Reason, pe.Msg}
		}
		if pe.Forbidden {
			return answer{http.StatusForbidden, codes.PermissionDenied, 0, pe.Reason, pe.Msg}
		}
		if pe.TooLarge {
			// RESOURCE_EXHAUSTED without RetryInfo: OTLP clients do not
			// retry it (the same data would be refused again).
			return answer{http.StatusRequestEntityTooLarge, codes.ResourceExhausted, 0, pe.Reason, pe.Msg}
		}
		return answer{http.StatusInternalServerError, codes.Internal, 0, pe.Reason, pe.Msg}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return answer{http.StatusServiceUnavailable, codes.Canceled, 0, "client_gone", err.Error()}
	}
	return answer{http.StatusInternalServerError, codes.Internal, 0, "internal", err.Error()}
}
