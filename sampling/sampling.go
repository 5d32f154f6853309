// Package sampling is the decision of consistent probabilistic sampling:
// keep or drop by trace id for one percentage, the same rule as
// OpenTelemetry's TraceIDRatioBased sampler (the low 63 bits of the trace
// id's second half against the ratio). A leaf value type, so the stages
// that apply a decision (the OTLP encoding) need not import the processor
// that picks it (processor/sampler).
package sampling

import (
	"encoding/binary"
	"math"
)

// Decision keeps or drops by trace id for one percentage. The zero value
// keeps everything.
type Decision struct {
	sample bool
	bound  uint64
}

// For returns the decision for percent.
func For(percent float64) Decision {
	if percent >= 100 {
		return Decision{}
	}
	return Decision{sample: true, bound: uint64(percent / 100 * math.Exp2(63))}
}

// All reports whether everything is kept.
func (d Decision) All() bool { return !d.sample }

// Keep reports whether the item with traceID is kept. An empty or short id
// is kept.
func (d Decision) Keep(traceID []byte) bool {
	if !d.sample || len(traceID) != 16 {
		return true
	}
	return binary.BigEndian.Uint64(traceID[8:16])>>1 < d.bound
}
