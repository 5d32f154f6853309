package wire

import (
	"google.golang.org/protobuf/encoding/protowire"
)

// Span is a view of one OTLP span.
type Span struct {
	Raw          []byte
	TraceID      []byte // 16 bytes or empty
	SpanID       []byte // 8 bytes or empty
	ParentSpanID []byte
	TraceState   []byte
	Name         []byte
	Kind         int32
	Start, End   uint64
	Flags        uint32
	StatusCode   int32
	StatusMsg    []byte
	DroppedAttrs uint32
	NumEvents    int
	NumLinks     int
}

// Attributes iterates the span's attributes.
func (s *Span) Attributes() Attrs { return Attrs{Repeated{msg: s.Raw, num: 9}} }

// Events iterates the span's events; decode each with DecodeEvent.
func (s *Span) Events() Repeated { return Repeated{msg: s.Raw, num: 11} }

// Links iterates the span's links; decode each with DecodeLink.
func (s *Span) Links() Repeated { return Repeated{msg: s.Raw, num: 13} }

// SpanKindNames are the OTLP kind names, indexed by kind.
var SpanKindNames = [...]string{"SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT", "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER"}

// StatusCodeNames are the OTLP status code names, indexed by code.
var StatusCodeNames = [...]string{"STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"}

// Traces iterates the spans of a TracesData / ExportTraceServiceRequest
// (the two are the same on the wire):
//
//	it := wire.NewTraces(raw)
//	for it.Next() { use it.Span(), it.Resource(), it.Scope() }
//	if err := it.Err(); err != nil { ... }
//
// The views are valid until the next call to Next.
type Traces struct {
	w  walker
	sp Span
}

// NewTraces starts iterating data.
func NewTraces(data []byte) Traces { return Traces{w: newWalker(data, &spansPaths)} }

// Next decodes the next span; false at the end or on error (see Err).
func (t *Traces) Next() bool {
	item, ok := t.w.nextItem()
	if !ok {
		return false
	}
	if err := decodeSpan(item, &t.sp); err != nil {
		t.w.err = err
		return false
	}
	return true
}

// Span is the current span.
func (t *Traces) Span() *Span { return &t.sp }

// Resource is the current span's resource.
func (t *Traces) Resource() *Resource { return &t.w.res }

// Scope is the current span's scope.
func (t *Traces) Scope() *Scope { return &t.w.sc }

// Err is the decode error that ended the iteration, if any.
func (t *Traces) Err() error { return t.w.err }

// WalkTraces decodes data and calls fn for every span. It is Traces as a
// callback, for code where an allocation per call does not matter.
func WalkTraces(data []byte, fn func(res *Resource, sc *Scope, sp *Span) error) error {
	it := NewTraces(data)
	for it.Next() {
		if err := fn(it.Resource(), it.Scope(), it.Span()); err != nil {
			return err
		}
	}
	return it.Err()
}

func decodeSpan(b []byte, s *Span) error {
	*s = Span{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt("span", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1, 2, 3, 4, 5:
			if err := wantType("span", f, protowire.BytesType); err != nil {
				return err
			}
			switch f.num {
			case 1:
				s.TraceID = f.b
			case 2:
				s.SpanID = f.b
			case 3:
				s.TraceState = f.b
			case 4:
				s.ParentSpanID = f.b
			case 5:
				s.Name = f.b
			}
		case 6:
			if err := wantType("span.kind", f, protowire.VarintType); err != nil {
				return err
			}
			s.Kind = int32(f.u)
		case 7, 8:
			if err := wantType("span.time", f, protowire.Fixed64Type); err != nil {
				return err
			}
			if f.num == 7 {
				s.Start = f.u
			} else {
				s.End = f.u
			}
		case 9:
			if err := wantType("span.attributes", f, protowire.BytesType); err != nil {
				return err
			}
			if err := validKV(f.b); err != nil {
				return errAt("span.attributes", err.Error())
			}
		case 10:
			if err := wantType("span.dropped_attributes_count", f, protowire.VarintType); err != nil {
				return err
			}
			s.DroppedAttrs = uint32(f.u)
		case 11:
			if err := wantType("span.events", f, protowire.BytesType); err != nil {
				return err
			}
			if _, err := DecodeEvent(f.b); err != nil {
				return err
			}
			s.NumEvents++
		case 13:
			if err := wantType("span.links", f, protowire.BytesType); err != nil {
				return err
			}
			if _, err := DecodeLink(f.b); err != nil {
				return err
			}
			s.NumLinks++
		case 15:
			if err := wantType("span.status", f, protowire.BytesType); err != nil {
				return err
			}
			cg := cursor{rest: f.b}
			for len(cg.rest) > 0 {
				if !cg.next() {
					return errAt("span.status", errTruncated.Error())
				}
				g := &cg
				switch {
				case g.num == 2 && g.typ == protowire.BytesType:
					s.StatusMsg = g.b
				case g.num == 3 && g.typ == protowire.VarintType:
					s.StatusCode = int32(g.u)
				}
			}
		case 16:
			if err := wantType("span.flags", f, protowire.Fixed32Type); err != nil {
				return err
			}
			s.Flags = uint32(f.u)
		}
	}
	if err := checkID("span.trace_id", s.TraceID, 16); err != nil {
		return err
	}
	if err := checkID("span.span_id", s.SpanID, 8); err != nil {
		return err
	}
	return checkID("span.parent_span_id", s.ParentSpanID, 8)
}

// Event is a view of a span event.
type Event struct {
	Raw  []byte
	Time uint64
	Name []byte
}

// Attributes iterates the event's attributes.
func (e *Event) Attributes() Attrs { return Attrs{Repeated{msg: e.Raw, num: 3}} }

// DecodeEvent decodes and validates a Span.Event.
func DecodeEvent(b []byte) (Event, error) {
	e := Event{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return e, errAt("span.events", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType("span.events.time_unix_nano", f, protowire.Fixed64Type); err != nil {
				return e, err
			}
			e.Time = f.u
		case 2:
			if err := wantType("span.events.name", f, protowire.BytesType); err != nil {
				return e, err
			}
			e.Name = f.b
		case 3:
			if err := wantType("span.events.attributes", f, protowire.BytesType); err != nil {
				return e, err
			}
			if err := validKV(f.b); err != nil {
				return e, errAt("span.events.attributes", err.Error())
			}
		}
	}
	return e, nil
}

// Link is a view of a span link.
type Link struct {
	Raw        []byte
	TraceID    []byte
	SpanID     []byte
	TraceState []byte
	Flags      uint32
}

// Attributes iterates the link's attributes.
func (l *Link) Attributes() Attrs { return Attrs{Repeated{msg: l.Raw, num: 4}} }

// DecodeLink decodes and validates a Span.Link.
func DecodeLink(b []byte) (Link, error) {
	l := Link{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return l, errAt("span.links", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1, 2, 3:
			if err := wantType("span.links", f, protowire.BytesType); err != nil {
				return l, err
			}
			switch f.num {
			case 1:
				l.TraceID = f.b
			case 2:
				l.SpanID = f.b
			case 3:
				l.TraceState = f.b
			}
		case 4:
			if err := wantType("span.links.attributes", f, protowire.BytesType); err != nil {
				return l, err
			}
			if err := validKV(f.b); err != nil {
				return l, errAt("span.links.attributes", err.Error())
			}
		case 6:
			if err := wantType("span.links.flags", f, protowire.Fixed32Type); err != nil {
				return l, err
			}
			l.Flags = uint32(f.u)
		}
	}
	if err := checkID("span.links.trace_id", l.TraceID, 16); err != nil {
		return l, err
	}
	return l, checkID("span.links.span_id", l.SpanID, 8)
}
