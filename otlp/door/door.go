// Package door holds what a door — another wire format of an OTLP signal
// (Zipkin, Prometheus remote write, Jaeger), converted to an OTLP request by
// a package under otlp/ and served by receiver/otlpreceiver — shares with
// the receiver that serves it, below both so neither imports the other.
package door

import "errors"

// ErrTooLarge: the converted request would pass the bound the receiver
// reserved for it (Convert's max). A door's Convert returns an error
// wrapping it; the receiver answers 413.
var ErrTooLarge = errors.New("the request converted to OTLP exceeds its bound")
