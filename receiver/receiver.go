// Package receiver holds what every receiver is built with besides its own
// configuration. The receivers themselves are its subpackages: httpreceiver
// (messages), otlpreceiver (OTLP over HTTP and gRPC); the plumbing they
// share is in httpbody (bounded body reading), submit (the hand-off to the
// pipeline and the wait for Kafka), origin (browser requests) and
// receivermetrics.
package receiver

import (
	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
)

// Prechecks are the shared stages every receiver runs on a request before
// anything is queued: token verification, per-application rate limits, and
// the processors the OTLP receiver applies in its single decode pass
// (sampler, attribute filters). Any may be nil.
type Prechecks struct {
	Checker    *auth.Checker
	Limiter    *ratelimit.Limiter
	Sampler    *sampler.Sampler
	Attributes *attributes.Processor
}

// Gate returns the token and rate-limit gate for one receiver's auth
// configuration.
func (p *Prechecks) Gate(c auth.ReceiverConfig) *auth.Gate {
	if p == nil {
		return auth.NewGate(c, nil, nil)
	}
	return auth.NewGate(c, p.Checker, p.Limiter)
}
