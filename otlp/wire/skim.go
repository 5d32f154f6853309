package wire

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"
)

// SpanSkim iterates the spans of a TracesData / ExportTraceServiceRequest
// reading only what RED metrics need: each resource's service.name, and
// each span's name, kind, start and end times and status code. It is for
// data the full walk (Traces, or otlp/encoding) has already accepted: it
// checks framing, so malformed input ends the iteration early (Err) and
// never panics, but it does not validate what it skips (attributes,
// events, links, ids), which is what makes it several times cheaper than
// decoding every span again.
//
//	it := wire.NewSpanSkim(raw)
//	for it.Next() { use it.Service, it.Name, it.Kind, ... }
//
// Nothing is allocated; the byte slices point into the input and are valid
// until the next call to Next.
type SpanSkim struct {
	top    cursor
	scopes Repeated
	items  Repeated
	bad    bool

	// Service is the current resource's service.name (nil: absent or not
	// a string).
	Service []byte
	// Name is the span's name.
	Name []byte
	// Kind and StatusCode are the span's enum values as sent.
	Kind, StatusCode int32
	// Start and End are the span's times in Unix nanoseconds.
	Start, End uint64
}

// NewSpanSkim starts iterating data.
func NewSpanSkim(data []byte) SpanSkim { return SpanSkim{top: cursor{rest: data}} }

// Err reports whether the iteration ended on malformed framing.
func (s *SpanSkim) Err() bool { return s.bad }

// Next reads the next span; false at the end or on malformed input.
func (s *SpanSkim) Next() bool {
	for !s.bad {
		if item, ok := s.items.Next(); ok {
			if s.span(item) {
				return true
			}
			s.bad = true
			return false
		}
		if sb, ok := s.scopes.Next(); ok {
			s.items = Repeated{msg: sb, num: 2}
			continue
		}
		if len(s.top.rest) == 0 {
			return false
		}
		if !s.top.next() {
			s.bad = true
			return false
		}
		if s.top.num != 1 || s.top.typ != protowire.BytesType {
			continue
		}
		s.enterResource(s.top.b)
	}
	return false
}

// enterResource finds the resource's service.name (the resource may come
// after its scopes on the wire) and starts on its scopes.
func (s *SpanSkim) enterResource(rb []byte) {
	s.Service = nil
	c := cursor{rest: rb}
	for len(c.rest) > 0 {
		if !c.next() {
			s.bad = true
			return
		}
		if c.num == 1 && c.typ == protowire.BytesType {
			s.Service = serviceName(c.b)
		}
	}
	s.scopes = Repeated{msg: rb, num: 2}
	s.items = Repeated{}
}

// SpanFacts is what RED metrics need of one span: views into the request
// (its Resource message, its name) and its scalars.
type SpanFacts struct {
	Res          []byte // the span's Resource message
	Name         []byte
	Kind, Status int32
	Start, End   uint64
}

// ServiceName is the string value of the service.name attribute of a
// Resource message, or nil.
func ServiceName(res []byte) []byte { return serviceName(res) }

// serviceName is the string value of the service.name attribute of a
// Resource message, or nil.
func serviceName(res []byte) []byte {
	c := cursor{rest: res}
	for len(c.rest) > 0 {
		if !c.next() {
			return nil
		}
		if c.num != 1 || c.typ != protowire.BytesType {
			continue
		}
		// KeyValue{key(1), value(2)}; AnyValue{string_value(1), ...}
		kv := cursor{rest: c.b}
		var key, val []byte
		isStr := false
		for len(kv.rest) > 0 {
			if !kv.next() {
				return nil
			}
			switch {
			case kv.num == 1 && kv.typ == protowire.BytesType:
				key = kv.b
			case kv.num == 2 && kv.typ == protowire.BytesType:
				val, isStr = nil, false
				av := cursor{rest: kv.b}
				for len(av.rest) > 0 {
					if !av.next() {
						return nil
					}
					// A oneof: the last field wins.
					val, isStr = av.b, av.num == 1 && av.typ == protowire.BytesType
				}
			}
		}
		if string(key) == "service.name" {
			if isStr {
				return val
			}
			return nil
		}
	}
	return nil
}

// span reads the fields of one Span message; false on malformed framing.
// The field loop is written out here rather than using cursor.next, which
// does not inline: the call per field was half of the skim's time.
func (s *SpanSkim) span(b []byte) bool {
	s.Name, s.Kind, s.StatusCode, s.Start, s.End = nil, 0, 0, 0, 0
	i := 0
	for i < len(b) {
		t := uint64(b[i])
		i++
		if t >= 0x80 {
			v, n := protowire.ConsumeVarint(b[i-1:])
			if n < 0 {
				return false
			}
			t, i = v, i-1+n
		}
		num := t >> 3
		if num == 0 || num > uint64(protowire.MaxValidNumber) {
			return false
		}
		switch protowire.Type(t & 7) {
		case protowire.BytesType:
			if i >= len(b) {
				return false
			}
			l := uint64(b[i])
			i++
			if l >= 0x80 {
				v, n := protowire.ConsumeVarint(b[i-1:])
				if n < 0 {
					return false
				}
				l, i = v, i-1+n
			}
			if l > uint64(len(b)-i) {
				return false
			}
			v := b[i : i+int(l)]
			i += int(l)
			switch num {
			case 5:
				s.Name = v
			case 15:
				st := cursor{rest: v}
				for len(st.rest) > 0 {
					if !st.next() {
						return false
					}
					if st.num == 3 && st.typ == protowire.VarintType {
						s.StatusCode = int32(st.u)
					}
				}
			}
		case protowire.VarintType:
			var u uint64
			if i < len(b) && b[i] < 0x80 {
				u = uint64(b[i])
				i++
			} else {
				v, n := protowire.ConsumeVarint(b[i:])
				if n < 0 {
					return false
				}
				u, i = v, i+n
			}
			if num == 6 {
				s.Kind = int32(u)
			}
		case protowire.Fixed64Type:
			if len(b)-i < 8 {
				return false
			}
			switch num {
			case 7:
				s.Start = binary.LittleEndian.Uint64(b[i:])
			case 8:
				s.End = binary.LittleEndian.Uint64(b[i:])
			}
			i += 8
		case protowire.Fixed32Type:
			if len(b)-i < 4 {
				return false
			}
			i += 4
		default:
			return false
		}
	}
	return true
}
