// Package flatjson owns ferry's flat_json encoding of OTLP: one JSON object
// per span, per log record and per metric data point, each carrying its
// resource and scope, so a consumer of the Kafka topic needs no OTLP
// knowledge (the flat per-span/per-log event shape collectors of this kind
// emit), written once, straight
// from the wire decoder's views into one output buffer: no intermediate maps,
// no double encoding.
//
// Conventions (documented in docs/otlp.md):
//   - ids are lower-case hex; empty ids are omitted;
//   - timestamps are unix nanoseconds as JSON numbers;
//   - kind and status code are the OTLP enum names (SPAN_KIND_SERVER, ...);
//   - attribute values keep their type: strings, numbers, booleans, arrays,
//     objects; bytes are base64; NaN and ±Inf are the strings "NaN",
//     "Infinity", "-Infinity" as in OTLP/JSON;
//   - int64 attribute values are JSON numbers (precise up to 2^53 in
//     JavaScript consumers).
//
// The resource and scope parts are encoded once per resource and scope and
// copied for each item.
package flatjson

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/ferryhq/ferry/otlp/wire"
)

// Encoder appends flat_json objects to a buffer. It caches the encoded
// resource and scope of the last item; reuse one Encoder per request.
type Encoder struct {
	// Extra is appended to every object after its resource and scope, e.g.
	// `,"tenant":"shop","data_id":1001` (the receiver builds it per request).
	Extra    []byte
	resRaw   []byte
	resJSON  []byte
	scRaw    []byte
	scJSON   []byte
	resValid bool
	scValid  bool
}

// Reset forgets the cached resource and scope (call between requests).
func (e *Encoder) Reset() { e.resValid, e.scValid = false, false }

func same(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// head appends `{"resource":{...},"scope":{...}` (no closing brace).
func (e *Encoder) head(dst []byte, res *wire.Resource, sc *wire.Scope) []byte {
	if !e.resValid || !same(e.resRaw, res.Raw) {
		e.resJSON = append(e.resJSON[:0], `{"resource":`...)
		e.resJSON = appendAttrs(e.resJSON, res.Attributes())
		if len(res.SchemaURL) > 0 {
			e.resJSON = append(e.resJSON, `,"resource_schema_url":`...)
			e.resJSON = appendString(e.resJSON, res.SchemaURL)
		}
		e.resRaw, e.resValid, e.scValid = res.Raw, true, false
	}
	if !e.scValid || !same(e.scRaw, sc.Raw) {
		e.scJSON = append(e.scJSON[:0], `,"scope":{"name":`...)
		e.scJSON = appendString(e.scJSON, sc.Name)
		e.scJSON = append(e.scJSON, `,"version":`...)
		e.scJSON = appendString(e.scJSON, sc.Version)
		e.scJSON = append(e.scJSON, `,"attributes":`...)
		e.scJSON = appendAttrs(e.scJSON, sc.Attributes())
		e.scJSON = append(e.scJSON, '}')
		e.scRaw, e.scValid = sc.Raw, true
	}
	dst = append(dst, e.resJSON...)
	dst = append(dst, e.scJSON...)
	return append(dst, e.Extra...)
}

// Span appends one span object.
func (e *Encoder) Span(dst []byte, res *wire.Resource, sc *wire.Scope, sp *wire.Span) []byte {
	dst = e.head(dst, res, sc)
	dst = appendHexField(dst, `,"trace_id":`, sp.TraceID)
	dst = appendHexField(dst, `,"span_id":`, sp.SpanID)
	dst = appendHexField(dst, `,"parent_span_id":`, sp.ParentSpanID)
	if len(sp.TraceState) > 0 {
		dst = append(dst, `,"trace_state":`...)
		dst = appendString(dst, sp.TraceState)
	}
	dst = append(dst, `,"name":`...)
	dst = appendString(dst, sp.Name)
	dst = append(dst, `,"kind":"`...)
	dst = append(dst, enumName(wire.SpanKindNames[:], sp.Kind, "SPAN_KIND_")...)
	dst = append(dst, `","start_time_unix_nano":`...)
	dst = strconv.AppendUint(dst, sp.Start, 10)
	dst = append(dst, `,"end_time_unix_nano":`...)
	dst = strconv.AppendUint(dst, sp.End, 10)
	dst = append(dst, `,"duration_nano":`...)
	if sp.End >= sp.Start {
		dst = strconv.AppendUint(dst, sp.End-sp.Start, 10)
	} else {
		dst = append(dst, '0')
	}
	if sp.Flags != 0 {
		dst = append(dst, `,"flags":`...)
		dst = strconv.AppendUint(dst, uint64(sp.Flags), 10)
	}
	dst = append(dst, `,"attributes":`...)
	dst = appendAttrs(dst, sp.Attributes())
	if sp.DroppedAttrs > 0 {
		dst = append(dst, `,"dropped_attributes_count":`...)
		dst = strconv.AppendUint(dst, uint64(sp.DroppedAttrs), 10)
	}
	dst = append(dst, `,"status":{"code":"`...)
	dst = append(dst, enumName(wire.StatusCodeNames[:], sp.StatusCode, "STATUS_CODE_")...)
	dst = append(dst, '"')
	if len(sp.StatusMsg) > 0 {
		dst = append(dst, `,"message":`...)
		dst = appendString(dst, sp.StatusMsg)
	}
	dst = append(dst, '}')
	if sp.NumEvents > 0 {
		dst = append(dst, `,"events":[`...)
		evs := sp.Events()
		for i := 0; ; i++ {
			b, ok := evs.Next()
			if !ok {
				break
			}
			ev, _ := wire.DecodeEvent(b) // validated by the walk
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"name":`...)
			dst = appendString(dst, ev.Name)
			dst = append(dst, `,"time_unix_nano":`...)
			dst = strconv.AppendUint(dst, ev.Time, 10)
			dst = append(dst, `,"attributes":`...)
			dst = appendAttrs(dst, ev.Attributes())
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if sp.NumLinks > 0 {
		dst = append(dst, `,"links":[`...)
		lks := sp.Links()
		for i := 0; ; i++ {
			b, ok := lks.Next()
			if !ok {
				break
			}
			l, _ := wire.DecodeLink(b)
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '{')
			dst = appendHexField(dst, `"trace_id":`, l.TraceID)
			if len(l.TraceID) == 0 {
				dst = append(dst, `"trace_id":""`...)
			}
			dst = appendHexField(dst, `,"span_id":`, l.SpanID)
			if len(l.TraceState) > 0 {
				dst = append(dst, `,"trace_state":`...)
				dst = appendString(dst, l.TraceState)
			}
			dst = append(dst, `,"attributes":`...)
			dst = appendAttrs(dst, l.Attributes())
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// Log appends one log record object.
func (e *Encoder) Log(dst []byte, res *wire.Resource, sc *wire.Scope, lr *wire.LogRecord) []byte {
	dst = e.head(dst, res, sc)
	dst = append(dst, `,"time_unix_nano":`...)
	dst = strconv.AppendUint(dst, lr.Time, 10)
	dst = append(dst, `,"observed_time_unix_nano":`...)
	dst = strconv.AppendUint(dst, lr.ObservedTime, 10)
	dst = append(dst, `,"severity_number":`...)
	dst = strconv.AppendInt(dst, int64(lr.SeverityNumber), 10)
	dst = append(dst, `,"severity_text":`...)
	dst = appendString(dst, lr.SeverityText)
	if len(lr.EventName) > 0 {
		dst = append(dst, `,"event_name":`...)
		dst = appendString(dst, lr.EventName)
	}
	dst = append(dst, `,"body":`...)
	if lr.HasBody {
		dst = appendValue(dst, lr.Body, 0)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"attributes":`...)
	dst = appendAttrs(dst, lr.Attributes())
	dst = appendHexField(dst, `,"trace_id":`, lr.TraceID)
	dst = appendHexField(dst, `,"span_id":`, lr.SpanID)
	if lr.Flags != 0 {
		dst = append(dst, `,"flags":`...)
		dst = strconv.AppendUint(dst, uint64(lr.Flags), 10)
	}
	return append(dst, '}')
}

var temporalityNames = [...]string{"unspecified", "delta", "cumulative"}

// Point appends one metric data point object.
func (e *Encoder) Point(dst []byte, res *wire.Resource, sc *wire.Scope, m *wire.Metric, dp *wire.DataPoint) []byte {
	dst = e.head(dst, res, sc)
	dst = append(dst, `,"name":`...)
	dst = appendString(dst, m.Name)
	if len(m.Description) > 0 {
		dst = append(dst, `,"description":`...)
		dst = appendString(dst, m.Description)
	}
	if len(m.Unit) > 0 {
		dst = append(dst, `,"unit":`...)
		dst = appendString(dst, m.Unit)
	}
	dst = append(dst, `,"type":"`...)
	dst = append(dst, wire.MetricTypeNames[m.Type]...)
	dst = append(dst, '"')
	switch m.Type {
	case wire.MetricSum, wire.MetricHistogram, wire.MetricExponentialHistogram:
		dst = append(dst, `,"temporality":"`...)
		t := "unspecified"
		if m.Temporality >= 0 && int(m.Temporality) < len(temporalityNames) {
			t = temporalityNames[m.Temporality]
		}
		dst = append(dst, t...)
		dst = append(dst, '"')
	}
	if m.Type == wire.MetricSum {
		dst = append(dst, `,"monotonic":`...)
		dst = strconv.AppendBool(dst, m.Monotonic)
	}
	if dp.Start != 0 {
		dst = append(dst, `,"start_time_unix_nano":`...)
		dst = strconv.AppendUint(dst, dp.Start, 10)
	}
	dst = append(dst, `,"time_unix_nano":`...)
	dst = strconv.AppendUint(dst, dp.Time, 10)
	dst = append(dst, `,"attributes":`...)
	dst = appendAttrs(dst, dp.Attributes())
	switch m.Type {
	case wire.MetricGauge, wire.MetricSum:
		dst = append(dst, `,"value":`...)
		if dp.IsInt {
			dst = strconv.AppendInt(dst, dp.Int, 10)
		} else {
			dst = appendFloat(dst, dp.Double)
		}
	case wire.MetricHistogram, wire.MetricExponentialHistogram, wire.MetricSummary:
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendUint(dst, dp.Count, 10)
		if dp.HasSum {
			dst = append(dst, `,"sum":`...)
			dst = appendFloat(dst, dp.Sum)
		}
		if dp.HasMin {
			dst = append(dst, `,"min":`...)
			dst = appendFloat(dst, dp.Min)
		}
		if dp.HasMax {
			dst = append(dst, `,"max":`...)
			dst = appendFloat(dst, dp.Max)
		}
		switch m.Type {
		case wire.MetricHistogram:
			dst = append(dst, `,"bucket_counts":`...)
			dst = appendPacked(dst, dp.BucketCounts(), false)
			dst = append(dst, `,"explicit_bounds":`...)
			dst = appendPacked(dst, dp.ExplicitBounds(), true)
		case wire.MetricExponentialHistogram:
			dst = append(dst, `,"scale":`...)
			dst = strconv.AppendInt(dst, int64(dp.Scale), 10)
			dst = append(dst, `,"zero_count":`...)
			dst = strconv.AppendUint(dst, dp.ZeroCount, 10)
			off, counts := dp.Positive()
			dst = append(dst, `,"positive":{"offset":`...)
			dst = strconv.AppendInt(dst, int64(off), 10)
			dst = append(dst, `,"bucket_counts":`...)
			dst = appendPacked(dst, counts, false)
			off, counts = dp.Negative()
			dst = append(dst, `},"negative":{"offset":`...)
			dst = strconv.AppendInt(dst, int64(off), 10)
			dst = append(dst, `,"bucket_counts":`...)
			dst = appendPacked(dst, counts, false)
			dst = append(dst, '}')
		case wire.MetricSummary:
			dst = append(dst, `,"quantile_values":[`...)
			qs := dp.Quantiles()
			for i := 0; ; i++ {
				b, ok := qs.Next()
				if !ok {
					break
				}
				q, v := wire.DecodeQuantile(b)
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = append(dst, `{"quantile":`...)
				dst = appendFloat(dst, q)
				dst = append(dst, `,"value":`...)
				dst = appendFloat(dst, v)
				dst = append(dst, '}')
			}
			dst = append(dst, ']')
		}
	}
	if dp.Flags != 0 {
		dst = append(dst, `,"flags":`...)
		dst = strconv.AppendUint(dst, uint64(dp.Flags), 10)
	}
	return append(dst, '}')
}

func enumName(names []string, v int32, prefix string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return prefix + strconv.Itoa(int(v))
}

func appendPacked(dst []byte, p wire.Packed, float bool) []byte {
	dst = append(dst, '[')
	for i := 0; ; i++ {
		v, ok := p.Next()
		if !ok {
			break
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		if float {
			dst = appendFloat(dst, math.Float64frombits(v))
		} else {
			dst = strconv.AppendUint(dst, v, 10)
		}
	}
	return append(dst, ']')
}

func appendHexField(dst []byte, name string, id []byte) []byte {
	if len(id) == 0 {
		return dst
	}
	dst = append(dst, name...)
	dst = append(dst, '"')
	dst = hex.AppendEncode(dst, id)
	return append(dst, '"')
}

func appendAttrs(dst []byte, a wire.Attrs) []byte {
	dst = append(dst, '{')
	first := true
	for {
		k, v, ok := a.Next()
		if !ok {
			break
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, k)
		dst = append(dst, ':')
		dst = appendValue(dst, v, 0)
	}
	return append(dst, '}')
}

func appendValue(dst []byte, v wire.Value, depth int) []byte {
	switch v.Kind {
	case wire.KindString:
		return appendString(dst, v.Str)
	case wire.KindBool:
		return strconv.AppendBool(dst, v.Bool)
	case wire.KindInt:
		return strconv.AppendInt(dst, v.Int, 10)
	case wire.KindDouble:
		return appendFloat(dst, v.Dbl)
	case wire.KindBytes:
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, v.Str)
		return append(dst, '"')
	case wire.KindArray:
		dst = append(dst, '[')
		it := v.Array()
		for i := 0; ; i++ {
			b, ok := it.Next()
			if !ok {
				break
			}
			ev, _ := wire.DecodeValue(b)
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, ev, depth+1)
		}
		return append(dst, ']')
	case wire.KindKVList:
		return appendAttrs(dst, wire.Attrs{Repeated: v.KVList()})
	}
	return append(dst, "null"...)
}

func appendFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}

const hexDigits = "0123456789abcdef"

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// needsEscape8 reports whether any byte of w is < 0x20, '"', '\\' or >= 0x80.
func needsEscape8(w uint64) bool {
	hasZero := func(x uint64) uint64 { return (x - lsb) &^ x & msb }
	return (w-lsb*0x20)&^w&msb|hasZero(w^(lsb*'"'))|hasZero(w^(lsb*'\\'))|w&msb != 0
}

// safe[c] is true for ASCII bytes that need no escaping in a JSON string.
var safe = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json does, so the output is always valid JSON.
func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	dst = AppendEscaped(dst, s)
	return append(dst, '"')
}

// AppendEscaped appends s as the inside of a JSON string (no quotes):
// '"', '\' and control bytes escaped, invalid UTF-8 as \ufffd, U+2028 and
// U+2029 escaped. It writes at most 6 bytes per byte of s. The syslog
// receiver's JSON uses it too, so ferry has one JSON string escaper.
func AppendEscaped(dst, s []byte) []byte {
	start := 0
	for i := 0; i < len(s); {
		// Eight bytes at a time while none of them needs attention (the
		// common case for log bodies): a control byte, '"', '\\' or non-ASCII.
		for i+8 <= len(s) && !needsEscape8(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		// U+2028 and U+2029 break JavaScript parsers of JSON; escape them.
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(dst, s[start:]...)
}
