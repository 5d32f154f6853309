package jaeger

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The bounded walk of a jaeger.api_v2.PostSpansRequest (Jaeger's gRPC
// collector service), before anything is decoded. protobuf's lengths cannot
// lie past the message (every length is checked against the bytes left, as
// gogo-protobuf's generated Unmarshal does too), but its elements can be
// tiny: an empty KeyValue is 2 bytes on the wire and a 120-byte Go struct
// once gogo-protobuf's Unmarshal has appended it to a span's tags (more
// with the slice's growth), so 8 MiB of empty tags would become about a
// gigabyte of Go heap. The walk reads the whole request without
// allocating, checks every field the decoder would refuse (wire types, id
// lengths, timestamp and duration ranges), bounds each span's tags, logs,
// log fields, references and warnings, and counts; ConvertProto then
// decodes and translates a chunk of spans at a time, and the walk's Peak is
// what the largest chunk may cost, reserved before converting.

// Limits of the walk beyond MaxPerList (the thrift walk's bound on each
// list, the same here: tags of a span or process, logs and references of a
// span, fields of a log, warnings of a span).
const (
	// MaxItemsPerSpan bounds a span's tags, logs, log fields, references,
	// warnings and own process's tags together. The OpenTelemetry SDKs'
	// default span limits (128 attributes, events, links, and attributes
	// per event) make at most 16,768; a span of 20,000 empty items is
	// 40 KB on the wire and at most 11 MB of Go heap decoded and
	// translated (Peak counts 640 bytes a log field).
	MaxItemsPerSpan = 20000
)

// ProtoCounts is what a walked PostSpansRequest holds.
type ProtoCounts struct {
	// Spans in the batch, and those among them that carry their own
	// process (each becomes a resource of its own).
	Spans, OwnProcess int
	// Tags (of spans and processes), Logs, Fields (of logs), Refs.
	Tags, Logs, Fields, Refs int
	// Peak is the most Go heap, in bytes, that converting one chunk of
	// spans (or the batch's process) is estimated to allocate: ConvertProto
	// never holds more than one chunk's decoded spans and their
	// translation at once, so this is its transient memory, which the
	// caller reserves before converting.
	Peak int64

	batch     []byte // the Batch message; nil when absent
	process   []byte // the Batch's process; nil when absent
	processOK bool
}

// protoLimitError: a span over one of the walk's limits (too large, not
// malformed).
type protoLimitError struct{ msg string }

func (e *protoLimitError) Error() string { return e.msg }

// protoItemCost is the estimated decode-and-translate cost of one tag, log,
// reference, warning or process tag, protoFieldCost of a log's field (the
// decoder grows a log's fields, whose number it cannot be told), and
// protoSpanCost of a span itself, in bytes of Go heap; protoByteCost per
// byte of the span (strings are copied by the decoder, and the translation
// is marshalled). Measured in TestProtoPeakCoversAllocation (an item 60 to
// 180 bytes, a field 535, a span 650, a byte 2.1), with room.
const (
	protoSpanCost  = 1536
	protoItemCost  = 320
	protoFieldCost = 640
	protoByteCost  = 3
)

// protoChunk: a chunk of spans is converted at once: at most
// protoChunkSpans spans, and no more spans once protoChunkBytes of them or
// protoChunkItems of their items are taken.
const (
	protoChunkSpans = 256
	protoChunkBytes = 64 << 10
	protoChunkItems = 4096
)

type protoChunker struct {
	spans, bytes, items int
	cost                int64
}

// add takes a span of n bytes and items items into the chunk, and says
// whether the chunk is now full (it is converted then).
func (c *protoChunker) add(n, items, fields int) bool {
	c.spans++
	c.bytes += n
	c.items += items
	c.cost += protoCost(n, items, fields)
	return c.spans >= protoChunkSpans || c.bytes >= protoChunkBytes || c.items >= protoChunkItems
}

func (c *protoChunker) reset() { *c = protoChunker{} }

// protoCost is the estimated Go heap of decoding and translating a span of
// n bytes, items items of which fields are log fields.
func protoCost(n, items, fields int) int64 {
	return protoSpanCost + int64(protoByteCost*n) + int64(protoItemCost*items) + int64((protoFieldCost-protoItemCost)*fields)
}

// pbSpan is one walked span.
type pbSpan struct {
	items, fields int
	process       bool
}

type pbWalker struct {
	c ProtoCounts
	// the span being walked: its items, and its position for errors.
	span  pbSpan
	spanN int
}

// field reads one field's tag; groups (wire types 3 and 4) are refused:
// proto3 has none, and Jaeger's messages are proto3.
func pbTag(b []byte, where string) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, 0, fmt.Errorf("%s: %v", where, protowire.ParseError(n))
	}
	if typ == protowire.StartGroupType || typ == protowire.EndGroupType {
		return 0, 0, 0, fmt.Errorf("%s: field %d is a group, which proto3 has not", where, num)
	}
	return num, typ, n, nil
}

// pbValue reads the value of a field of type typ, and returns its bytes
// when it is length-delimited.
func pbValue(b []byte, num protowire.Number, typ protowire.Type, where string) ([]byte, int, error) {
	var n int
	var v []byte
	switch typ {
	case protowire.VarintType:
		_, n = protowire.ConsumeVarint(b)
	case protowire.Fixed32Type:
		_, n = protowire.ConsumeFixed32(b)
	case protowire.Fixed64Type:
		_, n = protowire.ConsumeFixed64(b)
	case protowire.BytesType:
		v, n = protowire.ConsumeBytes(b)
	default:
		return nil, 0, fmt.Errorf("%s: field %d of unknown wire type %d", where, num, typ)
	}
	if n < 0 {
		return nil, 0, fmt.Errorf("%s: field %d: %v", where, num, protowire.ParseError(n))
	}
	return v, n, nil
}

// pbFields walks the fields of one message, calling each for every known
// field (with its value's bytes when length-delimited, its varint
// otherwise); want holds the wire type of each known field, by number from
// 1 (the decoder refuses another).
func pbFields(b []byte, where string, want []protowire.Type, each func(num protowire.Number, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n, err := pbTag(b, where)
		if err != nil {
			return err
		}
		b = b[n:]
		known := num >= 1 && int(num) <= len(want)
		if known && typ != want[num-1] {
			return fmt.Errorf("%s: field %d has wire type %d, not %d", where, num, typ, want[num-1])
		}
		var x uint64
		if typ == protowire.VarintType {
			x, _ = protowire.ConsumeVarint(b)
		}
		v, n, err := pbValue(b, num, typ, where)
		if err != nil {
			return err
		}
		b = b[n:]
		if known {
			if err := each(num, v, x); err != nil {
				return err
			}
		}
	}
	return nil
}

const (
	pbLenT    = protowire.BytesType
	pbVarintT = protowire.VarintType
)

// The wire types of each message's fields, by field number from 1.
var (
	requestTypes   = []protowire.Type{pbLenT}
	batchTypes     = []protowire.Type{pbLenT, pbLenT}
	processTypes   = []protowire.Type{pbLenT, pbLenT}
	spanTypes      = []protowire.Type{pbLenT, pbLenT, pbLenT, pbLenT, pbVarintT, pbLenT, pbLenT, pbLenT, pbLenT, pbLenT, pbLenT, pbLenT}
	keyValueTypes  = []protowire.Type{pbLenT, pbVarintT, pbLenT, pbVarintT, pbVarintT, protowire.Fixed64Type, pbLenT}
	logTypes       = []protowire.Type{pbLenT, pbLenT}
	refTypes       = []protowire.Type{pbLenT, pbLenT, pbVarintT}
	timestampTypes = []protowire.Type{pbVarintT, pbVarintT}
)

// Timestamps and durations as gogo-protobuf's types check them.
const (
	minTimestampSeconds = -62135596800 // 0001-01-01
	maxTimestampSeconds = 253402300800 // 10000-01-01
	maxDurationSeconds  = 315576000000 // 10,000 years
)

func (w *pbWalker) list(what string, n *int) error {
	*n++
	if *n > MaxPerList {
		return &protoLimitError{fmt.Sprintf("span %d: more than %d %s", w.spanN, MaxPerList, what)}
	}
	w.span.items++
	if w.span.items > MaxItemsPerSpan {
		return &protoLimitError{fmt.Sprintf("span %d: more than %d tags, logs, log fields, references and warnings", w.spanN, MaxItemsPerSpan)}
	}
	return nil
}

func (w *pbWalker) request(b []byte) error {
	seen := false
	return pbFields(b, "PostSpansRequest", requestTypes, func(_ protowire.Number, v []byte, _ uint64) error {
		if seen {
			return errors.New("PostSpansRequest: more than one batch")
		}
		seen = true
		w.c.batch = v
		return w.batch(v)
	})
}

func (w *pbWalker) batch(b []byte) error {
	var ch [2]protoChunker
	err := pbFields(b, "Batch", batchTypes, func(num protowire.Number, v []byte, _ uint64) error {
		if num == 2 {
			if w.c.processOK {
				return errors.New("Batch: more than one process")
			}
			w.c.process, w.c.processOK = v, true
			w.span = pbSpan{}
			var tags int
			if err := w.process(v, "Batch process", &tags); err != nil {
				return err
			}
			w.peak(protoCost(len(v), w.span.items, 0))
			return nil
		}
		w.spanN = w.c.Spans
		w.c.Spans++
		s, err := w.walkSpan(v)
		if err != nil {
			var le *protoLimitError
			if errors.As(err, &le) {
				return err
			}
			return fmt.Errorf("span %d: %w", w.spanN, err)
		}
		pass := 0
		if s.process {
			pass = 1
			w.c.OwnProcess++
		}
		if ch[pass].add(len(v), s.items, s.fields) {
			w.peak(ch[pass].cost)
			ch[pass].reset()
		}
		return nil
	})
	w.peak(ch[0].cost)
	w.peak(ch[1].cost)
	return err
}

func (w *pbWalker) peak(c int64) { w.c.Peak = max(w.c.Peak, c) }

// walkSpan walks one span and returns what chunking needs of it.
func (w *pbWalker) walkSpan(b []byte) (pbSpan, error) {
	w.span = pbSpan{}
	var tags, logs, refs, warnings, ptags int
	err := pbFields(b, "Span", spanTypes, func(num protowire.Number, v []byte, _ uint64) error {
		switch num {
		case 1:
			return pbTraceID(v, "trace_id")
		case 2:
			return pbSpanID(v, "span_id")
		case 4:
			if err := w.list("references", &refs); err != nil {
				return err
			}
			w.c.Refs++
			return pbFields(v, "SpanRef", refTypes, func(num protowire.Number, v []byte, _ uint64) error {
				switch num {
				case 1:
					return pbTraceID(v, "reference trace_id")
				case 2:
					return pbSpanID(v, "reference span_id")
				}
				return nil
			})
		case 6:
			return pbTimestamp(v, "start_time")
		case 7:
			return pbDuration(v, "duration")
		case 8:
			if err := w.list("tags", &tags); err != nil {
				return err
			}
			w.c.Tags++
			return pbKeyValue(v, "tag")
		case 9:
			if err := w.list("logs", &logs); err != nil {
				return err
			}
			w.c.Logs++
			var fields int
			return pbFields(v, "Log", logTypes, func(num protowire.Number, v []byte, _ uint64) error {
				if num == 1 {
					return pbTimestamp(v, "log timestamp")
				}
				if err := w.list("fields in a log", &fields); err != nil {
					return err
				}
				w.span.fields++
				w.c.Fields++
				return pbKeyValue(v, "log field")
			})
		case 10:
			w.span.process = true
			return w.process(v, "process", &ptags)
		case 12:
			return w.list("warnings", &warnings)
		}
		return nil // 3 operation_name, 5 flags, 11 process_id: any value
	})
	return w.span, err
}

// process walks a Process; its tags count as the span's items (the
// batch's process is walked as a span of its own).
func (w *pbWalker) process(b []byte, where string, tags *int) error {
	return pbFields(b, where, processTypes, func(num protowire.Number, v []byte, _ uint64) error {
		if num == 2 {
			if err := w.list("process tags", tags); err != nil {
				return err
			}
			w.c.Tags++
			return pbKeyValue(v, "process tag")
		}
		return nil
	})
}

func pbKeyValue(b []byte, where string) error {
	return pbFields(b, where, keyValueTypes, func(protowire.Number, []byte, uint64) error { return nil })
}

// pbTraceID: the decoder takes 16 bytes (high, low) or 8 (low).
func pbTraceID(v []byte, where string) error {
	if len(v) != 16 && len(v) != 8 {
		return fmt.Errorf("%s of %d bytes, not 16 or 8", where, len(v))
	}
	return nil
}

func pbSpanID(v []byte, where string) error {
	if len(v) != 8 {
		return fmt.Errorf("%s of %d bytes, not 8", where, len(v))
	}
	return nil
}

// pbTimestamp: a google.protobuf.Timestamp within 0001-01-01 .. 9999-12-31,
// nanos within [0, 1e9) (the decoder refuses others).
func pbTimestamp(b []byte, where string) error {
	var s int64
	var ns int32
	if err := pbFields(b, where, timestampTypes, func(num protowire.Number, _ []byte, x uint64) error {
		if num == 1 {
			s = int64(x)
		} else {
			ns = int32(x)
		}
		return nil
	}); err != nil {
		return err
	}
	if s < minTimestampSeconds || s >= maxTimestampSeconds || ns < 0 || ns >= 1e9 {
		return fmt.Errorf("%s: %d s %d ns is not a valid timestamp", where, s, ns)
	}
	return nil
}

// pbDuration: a google.protobuf.Duration that a Go time.Duration holds, its
// seconds and nanos of one sign.
func pbDuration(b []byte, where string) error {
	var s int64
	var ns int32
	if err := pbFields(b, where, timestampTypes, func(num protowire.Number, _ []byte, x uint64) error {
		if num == 1 {
			s = int64(x)
		} else {
			ns = int32(x)
		}
		return nil
	}); err != nil {
		return err
	}
	bad := s < -maxDurationSeconds || s > maxDurationSeconds || ns <= -1e9 || ns >= 1e9 || s < 0 && ns > 0 || s > 0 && ns < 0
	if d := time.Duration(s) * time.Second; int64(d/time.Second) != s {
		bad = true
	} else if d += time.Duration(ns); ns != 0 && (d < 0) != (ns < 0) {
		bad = true
	}
	if bad {
		return fmt.Errorf("%s: %d s %d ns is not a valid duration", where, s, ns)
	}
	return nil
}

// WalkProto checks that b is a jaeger.api_v2.PostSpansRequest that the
// decoder takes, within the walk's limits, allocating nothing (but for
// an error's message), and counts what it holds.
func WalkProto(b []byte) (ProtoCounts, error) {
	var w pbWalker
	err := w.request(b)
	return w.c, err
}

// pbSpanShape is what converting a walked span needs of it: its lists'
// lengths (the decoder's slices are made that size, not grown), its items
// as the walk counts them (for the chunks), and whether it carries its own
// process.
type pbSpanShape struct {
	tags, logs, refs, ptags, fields, items int
	process                                bool
}

// pbShape reads a walked span's shape from its top-level fields, its logs'
// and its process's (cheaper than walking it again).
func pbShape(b []byte) pbSpanShape {
	var s pbSpanShape
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			continue
		}
		switch num {
		case 4:
			s.refs++
		case 8:
			s.tags++
		case 9:
			s.logs++
			s.fields += pbCount(v, 2)
		case 10:
			s.process = true
			s.ptags += pbCount(v, 2)
		case 12:
			s.items++
		}
	}
	s.items += s.tags + s.logs + s.refs + s.ptags + s.fields
	return s
}

// pbCount is how many length-delimited fields num a walked message holds.
func pbCount(b []byte, num protowire.Number) int {
	c := 0
	for len(b) > 0 {
		fn, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		n = protowire.ConsumeFieldValue(fn, typ, b)
		b = b[n:]
		if fn == num && typ == protowire.BytesType {
			c++
		}
	}
	return c
}
