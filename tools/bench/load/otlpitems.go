package load

import "google.golang.org/protobuf/encoding/protowire"

// OTLPItems counts the log records or spans of an OTLP logs or traces
// request in protobuf (ExportLogsServiceRequest, ExportTraceServiceRequest:
// what an otlp_proto Kafka record holds), without decoding them: both nest
// items at the same field numbers (resource_* = 1, scope_* = 2, items = 2),
// so one walk counts either. ok is false when v is not such a message.
// Counting what reached Kafka this way is how the benchmarks tell items
// delivered from items only acknowledged.
func OTLPItems(v []byte) (n int64, ok bool) {
	err := eachField(v, func(num protowire.Number, typ protowire.Type, b []byte) bool {
		if num != 1 || typ != protowire.BytesType {
			return true
		}
		return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) bool {
			if num != 2 || typ != protowire.BytesType {
				return true
			}
			return eachField(b, func(num protowire.Number, typ protowire.Type, _ []byte) bool {
				if num == 2 && typ == protowire.BytesType {
					n++
				}
				return true
			}) == nil
		}) == nil
	})
	return n, err == nil
}

// eachField calls fn with each field of a protobuf message (b is the
// field's bytes for length-delimited fields); fn returning false stops it
// with an error, as does malformed input.
func eachField(m []byte, fn func(protowire.Number, protowire.Type, []byte) bool) error {
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m = m[n:]
		var val []byte
		if typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(m)
			if n < 0 {
				return protowire.ParseError(n)
			}
			val, m = v, m[n:]
		} else {
			n := protowire.ConsumeFieldValue(num, typ, m)
			if n < 0 {
				return protowire.ParseError(n)
			}
			m = m[n:]
		}
		if !fn(num, typ, val) {
			return errStop
		}
	}
	return nil
}

type stopErr struct{}

func (stopErr) Error() string { return "not an OTLP logs or traces request" }

var errStop error = stopErr{}

// OTLPPoints counts the data points of an OTLP metrics request in protobuf
// (ExportMetricsServiceRequest): resource_metrics (1) → scope_metrics (2) →
// metrics (2) → gauge (5), sum (7), histogram (9), exponential_histogram
// (10) or summary (11) → data_points (1). A metric's item in Prometheus
// terms is a sample, so that is what a remote write row counts.
func OTLPPoints(v []byte) (n int64, ok bool) {
	err := eachField(v, func(num protowire.Number, typ protowire.Type, b []byte) bool {
		if num != 1 || typ != protowire.BytesType {
			return true
		}
		return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) bool {
			if num != 2 || typ != protowire.BytesType {
				return true
			}
			return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) bool {
				if num != 2 || typ != protowire.BytesType {
					return true
				}
				return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) bool {
					switch num {
					case 5, 7, 9, 10, 11:
					default:
						return true
					}
					if typ != protowire.BytesType {
						return false
					}
					return eachField(b, func(num protowire.Number, typ protowire.Type, _ []byte) bool {
						if num == 1 && typ == protowire.BytesType {
							n++
						}
						return true
					}) == nil
				}) == nil
			}) == nil
		}) == nil
	})
	return n, err == nil
}
