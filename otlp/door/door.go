// Package door holds what a door — another wire format of an OTLP signal
// (Zipkin, Prometheus remote write, Jaeger), converted to an OTLP request by
// a package under otlp/ and served by receiver/otlpreceiver — shares with
// the receiver that serves it, below both so neither imports the other.
//
// A door's conversion is
//
//	Convert(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error)
//
// It appends the OTLP protobuf request to dst within lim and counts in st
// what its mapping drops or collapses by rule:
//
//   - past lim.MaxBytes of OTLP it returns an error wrapping ErrTooLarge
//     (the receiver answers 413 request_too_large);
//   - as soon as it has seen more than lim.MaxItems items (spans, data
//     points: what receivers.otlp.max_items_per_request bounds in an OTLP
//     request) it returns an error wrapping ErrTooManyItems (413
//     too_many_items, as for OTLP), without converting the rest. A door
//     counts only items it knows will be in the converted request, so it
//     never refuses a request whose OTLP form the limit would let through;
//   - st (which may be nil) gets, by Reason, the items the mapping leaves
//     out or folds into another (a tag whose key repeats, a gauge
//     histogram, an exemplar …): the receiver exports them as
//     ferry_door_dropped_items_total{receiver, reason} and answers their
//     total in X-Ferry-Dropped, so that no loss is silent.
package door

import "errors"

// ErrTooLarge: the converted request would pass the bound the receiver
// reserved for it (Limits.MaxBytes). A door's Convert returns an error
// wrapping it; the receiver answers 413.
var ErrTooLarge = errors.New("the request converted to OTLP exceeds its bound")

// ErrTooManyItems: the request holds more items than Limits.MaxItems. A
// door's Convert returns an error wrapping it; the receiver answers as it
// does an OTLP request over receivers.otlp.max_items_per_request (413
// too_many_items).
var ErrTooManyItems = errors.New("more items than max_items_per_request")

// Limits bound one conversion.
type Limits struct {
	// MaxBytes bounds the OTLP bytes Convert appends to dst.
	MaxBytes int
	// MaxItems bounds the spans or data points of the converted request
	// (0: no bound).
	MaxItems int
}

// Over reports whether n items pass MaxItems.
func (l Limits) Over(n int) bool { return l.MaxItems > 0 && n > l.MaxItems }

// Reason is why a conversion dropped an item.
type Reason uint8

// The reasons, and what one count of each is.
const (
	// DuplicateKey: a tag (Jaeger span or process tag, log field; Zipkin
	// tag or v1 binary annotation) whose key an earlier one of the same
	// list has: OTLP attributes hold one value a key, the translators keep
	// the last. One a value lost.
	DuplicateKey Reason = iota
	// UnknownTagType: a Jaeger tag of a value type thrift does not define,
	// carried as a placeholder string without its value.
	UnknownTagType
	// UnknownSpanKind: a Jaeger span.kind tag of another value than
	// client, server, producer, consumer or internal: the tag is removed
	// and the kind left unspecified.
	UnknownSpanKind
	// EmptySpan: a Jaeger span whose every field is zero, which the
	// translator skips.
	EmptySpan
	// GaugeHistogram: a Prometheus gauge histogram sample or point (OTLP
	// has no gauge histogram; the Prometheus-to-OTLP spec drops them).
	GaugeHistogram
	// NoCount: a classic histogram or summary point without its _count
	// sample (dropped, per the spec), counted once a point.
	NoCount
	// Exemplar: a Prometheus exemplar (not carried).
	Exemplar
	// MixedSeries: a float sample of a remote write series that also
	// holds native histograms (the series becomes a histogram).
	MixedSeries
	// BadNativeHistogram: a native histogram OTLP cannot carry: a schema
	// outside -4..8 and -53 (custom buckets), one other than its family's
	// (custom or exponential), custom buckets beyond its bounds.
	BadNativeHistogram
	// NativeBuckets: a pushed histogram's native buckets (the push door
	// carries the classic buckets only), one a point.
	NativeBuckets
	// TargetInfo: a remote write target_info series beyond the first of
	// its job and instance, whose labels are not carried.
	TargetInfo
	NumReasons
)

var reasonNames = [NumReasons]string{
	DuplicateKey: "duplicate_key", UnknownTagType: "unknown_tag_type", UnknownSpanKind: "unknown_span_kind",
	EmptySpan: "empty_span", GaugeHistogram: "gauge_histogram", NoCount: "no_count", Exemplar: "exemplar",
	MixedSeries: "mixed_series", BadNativeHistogram: "bad_native_histogram", NativeBuckets: "native_buckets", TargetInfo: "target_info",
}

// String is the reason's metric label.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Stats is what one conversion dropped, by reason.
type Stats struct {
	Dropped [NumReasons]int
}

// Drop counts n items dropped for r; a nil Stats counts nothing.
func (s *Stats) Drop(r Reason, n int) {
	if s != nil && n > 0 {
		s.Dropped[r] += n
	}
}

// Total is every item dropped.
func (s *Stats) Total() int {
	n := 0
	for _, d := range s.Dropped {
		n += d
	}
	return n
}
