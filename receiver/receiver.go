// Package receiver holds what every receiver is built with besides its own
// configuration: the factory contract (factory.go: Factory, Config, Env,
// Bounds, Receiver), the shared pre-checks and the topic check. The
// receivers themselves are its subpackages: httpreceiver (messages),
// otlpreceiver (OTLP over HTTP and gRPC), localreceiver (the local record
// protocol and its text mode), kafkafront (unmodified Kafka producers),
// filereceiver (files on the host, tailed line by line); the
// plumbing they share is in httpbody (bounded body reading), submit (the
// hand-off to the pipeline and the wait for Kafka), origin (browser
// requests) and receivermetrics.
package receiver

import (
	"fmt"
	"unicode/utf8"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/routing"
)

// Prechecks are the shared stages every receiver runs on a request before
// anything is queued: token verification, per-application rate limits, and
// the processors the OTLP receiver applies in its single decode pass
// (sampler, attribute filters, span metrics). Any may be nil.
type Prechecks struct {
	Checker    *auth.Checker
	Limiter    *ratelimit.Limiter
	Sampler    *sampler.Sampler
	Attributes *attributes.Processor
	// SpanMetrics sees every traces request the OTLP receiver decodes,
	// before sampling, and flushes through the receiver's metrics path.
	SpanMetrics *spanmetrics.Processor
}

// Gate returns the token and rate-limit gate for one receiver's auth
// configuration.
func (p *Prechecks) Gate(c auth.ReceiverConfig) *auth.Gate {
	if p == nil {
		return auth.NewGate(c, nil, nil)
	}
	return auth.NewGate(c, p.Checker, p.Limiter)
}

// CheckTopic refuses a record, from a client that names its topics (the
// local protocol, the Kafka front), whose topic is not a valid Kafka name
// (wrapping routing.ErrInvalidTopic) or not one this client may write to:
// a token bound to one messages topic, the receiver's topic patterns, the
// token's topic pattern.
func CheckTopic(allow *routing.Allow, claims *token.Claims, topic string) error {
	if !routing.ValidTopic(topic) {
		return &consumer.PermanentError{Reason: "invalid_topic", Kind: consumer.KindInvalid, Err: routing.ErrInvalidTopic,
			Msg: fmt.Sprintf("invalid topic name %s: use 1 to 249 of a-z A-Z 0-9 . _ -", routing.QuoteTopic(topic))}
	}
	if claims != nil && claims.Topics[token.Messages] != "" && claims.Topics[token.Messages] != topic {
		return &consumer.PermanentError{Reason: "topic_not_allowed", Kind: consumer.KindForbidden,
			Msg: fmt.Sprintf("this token may write to topic %q only", claims.Topics[token.Messages])}
	}
	if err := allow.Check(topic, claims); err != nil {
		return &consumer.PermanentError{Reason: "topic_not_allowed", Kind: consumer.KindForbidden, Msg: err.Error(), Err: err}
	}
	return nil
}

// MaxMessages is how many items (a Kafka answer's partitions, a local
// result's ranges) of one answer carry words with their error code:
// enough for every item a client usually sends, and the reason is the
// same for the rest. With words on each, an answer naming 10,000 refused
// partitions would be 16 times its request.
const MaxMessages = 100

// MaxMessageBytes is the most of a refusal's words an answer carries per
// item (a range of records, a partition): words quote what a client sent,
// and an answer must not grow with it.
const MaxMessageBytes = 512

// ClipMessage cuts msg to MaxMessageBytes, at a character's start.
func ClipMessage(msg string) string {
	if len(msg) <= MaxMessageBytes {
		return msg
	}
	n := MaxMessageBytes - len("…")
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:n] + "…"
}

// CheckAuth refuses token settings that cannot work: a receiver that
// checks tokens when there is no key to check them with.
func CheckAuth(c auth.ReceiverConfig, b Bounds) error {
	if c.Mode != "none" && c.Mode != "" && !b.Keys {
		return fmt.Errorf("auth.mode is %s but auth.keys is empty: add a key (ferry token keygen)", c.Mode)
	}
	return nil
}
