// Package wire owns ferry's zero-copy decoder of OTLP protobuf payloads.
//
// Why not pdata: decoding into pdata builds a tree of objects, about 20
// allocations per span, which would be most of the cost of a request. ferry
// instead walks the wire bytes once, checks every field's framing and types,
// and hands each item (span, log record, metric data point) to a callback as
// a view: a small struct of scalars and sub-slices of the input. Nothing is
// copied and nothing is allocated per item. Repeated fields (attributes,
// events, links, buckets) are exposed as iterators over the raw message, so
// a consumer that needs them reads them lazily, and one that does not pays
// nothing.
//
// A view is valid only during its callback: it points into the input buffer.
//
// The walk rejects malformed input (truncated fields, wrong wire types for
// known fields, ids of the wrong length, invalid nested messages, groups,
// which proto3 has not) with an error naming the path; other unknown
// fields are skipped, as protobuf requires.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Error is a decode error with the path of the offending field.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string { return "otlp: " + e.Path + ": " + e.Msg }

func errAt(path, msg string) error { return &Error{Path: path, Msg: msg} }

var errTruncated = errors.New("truncated or malformed field")

// cursor decodes the fields of a message in place: one field per next(),
// its number, wire type and value in the cursor's own fields. Decoding in
// place is about twice as fast as returning a field struct per call.
// A cursor is declared before its loop, never in the for statement: Go
// gives a variable declared there a fresh copy every iteration, and as the
// loop takes its address that is a 64-byte copy per field, which cost
// about a fifth of decoding a span (BenchmarkTracesUnmarshal).
type cursor struct {
	rest []byte
	num  protowire.Number
	typ  protowire.Type
	u    uint64 // varint, fixed32 or fixed64 value
	b    []byte // length-delimited value
}

// next decodes the next field; false means malformed input. The one-byte
// tag and length cases (nearly every OTLP field) are decoded inline here:
// the helper calls cost more than the work on this machine's hot path.
func (c *cursor) next() bool {
	r := c.rest
	if len(r) == 0 {
		return false
	}
	t, n := uint64(r[0]), 1
	if t >= 0x80 {
		if t, n = protowire.ConsumeVarint(r); n < 0 {
			return false
		}
	}
	if t>>3 == 0 || t>>3 > uint64(protowire.MaxValidNumber) {
		return false
	}
	c.num, c.typ = protowire.Number(t>>3), protowire.Type(t&7)
	r = r[n:]
	var m int
	switch c.typ {
	case protowire.BytesType:
		if len(r) == 0 {
			return false
		}
		l, k := uint64(r[0]), 1
		if l >= 0x80 {
			if l, k = protowire.ConsumeVarint(r); k < 0 {
				return false
			}
		}
		if l > uint64(len(r)-k) {
			return false
		}
		m = k + int(l)
		c.b = r[k:m]
	case protowire.VarintType:
		if len(r) > 0 && r[0] < 0x80 {
			c.u, m = uint64(r[0]), 1
		} else {
			c.u, m = protowire.ConsumeVarint(r)
		}
	case protowire.Fixed64Type:
		if len(r) < 8 {
			return false
		}
		c.u, m = binary.LittleEndian.Uint64(r), 8
	case protowire.Fixed32Type:
		if len(r) < 4 {
			return false
		}
		c.u, m = uint64(binary.LittleEndian.Uint32(r)), 4
	default:
		// Groups (wire types 3 and 4) do not exist in proto3, which OTLP
		// is: only a broken or hostile client sends one. Skipped, a group
		// nested thousands deep would be forwarded inside a record that a
		// consumer with a lower nesting limit (protobuf-java's is 100)
		// cannot read, poisoning its partition. 6 and 7 are no wire type.
		return false
	}
	if m < 0 {
		return false
	}
	c.rest = r[m:]
	return true
}

// Repeated iterates the occurrences of one length-delimited field in a
// message already validated by the walk.
type Repeated struct {
	msg []byte
	num protowire.Number
}

// Next returns the next occurrence's bytes.
func (r *Repeated) Next() ([]byte, bool) {
	c := cursor{rest: r.msg}
	for len(c.rest) > 0 {
		if !c.next() {
			r.msg = nil
			return nil, false
		}
		if c.num == r.num && c.typ == protowire.BytesType {
			r.msg = c.rest
			return c.b, true
		}
	}
	r.msg = nil
	return nil, false
}

// Empty reports whether no occurrence is left.
func (r Repeated) Empty() bool {
	_, ok := r.Next()
	return !ok
}

func wantType(path string, f *cursor, t protowire.Type) error {
	if f.typ != t {
		return typeErr(path, f, t)
	}
	return nil
}

func typeErr(path string, f *cursor, t protowire.Type) error {
	return errAt(path, fmt.Sprintf("field %d has wire type %d, want %d", f.num, f.typ, t))
}

func f64(u uint64) float64 { return math.Float64frombits(u) }

// checkID accepts an empty id or exactly n bytes.
func checkID(path string, b []byte, n int) error {
	if len(b) != 0 && len(b) != n {
		return errAt(path, fmt.Sprintf("id of %d bytes, want %d", len(b), n))
	}
	return nil
}

// uvarint reads a varint with an inlineable one-byte fast path (OTLP tags
// and most lengths are one byte). n < 0 means malformed.
func uvarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	return protowire.ConsumeVarint(b)
}

// lenField reads the length-delimited payload at b (after its tag).
func lenField(b []byte) (v []byte, n int) {
	l, m := uvarint(b)
	if m < 0 || l > uint64(len(b)-m) {
		return nil, -1
	}
	return b[m : m+int(l)], m + int(l)
}
