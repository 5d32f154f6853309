package jaeger

import (
	"encoding/binary"
	"fmt"
)

// The bounded walk: before anything is decoded, the body is checked as a
// thrift binary-encoded jaeger.thrift Batch without allocating. Apache
// Thrift's generated readers allocate a list's declared length before they
// read its elements (make([]*Span, 0, size)); its TConfiguration bounds that
// length by MaxMessageSize only, so a body of n bytes may still make it
// allocate 8n bytes of pointers for a list it does not hold. The walk reads
// every declared length and checks it against the bytes that are left (each
// element takes at least its type's smallest encoding), then walks the
// elements themselves, so after it every length the decoder will read is
// one the body really holds. It also bounds nesting (unknown fields of
// struct type may nest), the tags, logs and references of each span, and
// counts the structures.

// thrift binary protocol types.
const (
	tStop   = 0
	tVoid   = 1
	tBool   = 2
	tByte   = 3
	tDouble = 4
	tI16    = 6
	tI32    = 8
	tI64    = 10
	tString = 11
	tStruct = 12
	tMap    = 13
	tSet    = 14
	tList   = 15
	tUUID   = 16
)

// Limits of the walk. A real sender stays far below each: jaeger clients
// send a few dozen tags and logs a span.
const (
	// MaxDepth bounds nested structs and containers: Batch > Span > Log >
	// Tag is 4; unknown fields may nest a little deeper.
	MaxDepth = 16
	// MaxPerList bounds the tags of a span or process, the logs and
	// references of a span and the fields of a log.
	MaxPerList = 10000
)

type kind uint8

const (
	kOther kind = iota
	kBatch
	kProcess
	kSpan
	kTag
	kLog
	kRef
)

var kindName = [...]string{kOther: "struct", kBatch: "Batch", kProcess: "Process", kSpan: "Span", kTag: "Tag", kLog: "Log", kRef: "SpanRef"}

// listField: the known list fields, whose elements the generated reader
// reads as the schema's struct whatever element type the body declares.
func listField(k kind, id int16) (kind, string, bool) {
	switch {
	case k == kBatch && id == 2:
		return kSpan, "spans", true
	case k == kProcess && id == 2:
		return kTag, "process tags", true
	case k == kSpan && id == 6:
		return kRef, "references", true
	case k == kSpan && id == 10:
		return kTag, "tags", true
	case k == kSpan && id == 11:
		return kLog, "logs", true
	case k == kLog && id == 2:
		return kTag, "log fields", true
	}
	return 0, "", false
}

// required: the fields each struct must hold, with their types (the
// generated reader counts a field only if its type is the schema's, and
// refuses a struct missing one). Checking them in the walk makes every
// element of a known list cost its real smallest size in the body (a span
// 81 bytes, a tag 15), not the one byte of an empty struct.
var required = [...][]struct {
	id int16
	t  byte
}{
	kBatch:   {{1, tStruct}, {2, tList}},
	kProcess: {{1, tString}},
	kSpan:    {{1, tI64}, {2, tI64}, {3, tI64}, {4, tI64}, {5, tString}, {7, tI32}, {8, tI64}, {9, tI64}},
	kTag:     {{1, tString}, {2, tI32}},
	kLog:     {{1, tI64}, {2, tList}},
	kRef:     {{1, tI32}, {2, tI64}, {3, tI64}, {4, tI64}},
}

var fieldName = map[[2]int]string{
	{int(kBatch), 1}: "process", {int(kBatch), 2}: "spans", {int(kProcess), 1}: "serviceName",
	{int(kSpan), 1}: "traceIdLow", {int(kSpan), 2}: "traceIdHigh", {int(kSpan), 3}: "spanId", {int(kSpan), 4}: "parentSpanId",
	{int(kSpan), 5}: "operationName", {int(kSpan), 7}: "flags", {int(kSpan), 8}: "startTime", {int(kSpan), 9}: "duration",
	{int(kTag), 1}: "key", {int(kTag), 2}: "vType", {int(kLog), 1}: "timestamp", {int(kLog), 2}: "fields",
	{int(kRef), 1}: "refType", {int(kRef), 2}: "traceIdLow", {int(kRef), 3}: "traceIdHigh", {int(kRef), 4}: "spanId",
}

// seen marks a required field read with its schema type.
func seen(k kind, id int16, t byte, set *uint16) {
	for i, r := range required[k] {
		if r.id == id && r.t == t {
			*set |= 1 << i
		}
	}
}

// Counts are the structures a walked body holds.
type Counts struct {
	Spans, Tags, Logs, Refs int
}

type walker struct {
	b   []byte
	off int
	c   Counts
	// Where the Batch's process struct and the elements of its spans list
	// are (0: not seen; each is after its field's header, so never at 0),
	// and how many spans the list declares: Convert decodes the process
	// once and then the spans a chunk at a time from there.
	procAt, procEnd, spansAt, spansN int
	// maxItems, when > 0, refuses a spans list declaring more (and
	// holding the bytes for them) from its header.
	maxItems int
}

// minSpanBytes: a span's required fields (six i64 of 11 bytes with their
// headers, a string and an i32 of 7) and its stop byte.
const minSpanBytes = 6*11 + 7 + 7 + 1

// errWalk is a malformed body, at the offset it was found.
func (w *walker) errf(format string, a ...any) error {
	return fmt.Errorf("thrift at byte %d: "+format, append([]any{w.off}, a...)...)
}

func (w *walker) left() int { return len(w.b) - w.off }

func (w *walker) need(n int) error {
	if n > w.left() {
		return w.errf("%d bytes needed, %d left", n, w.left())
	}
	return nil
}

func (w *walker) i32() (int32, error) {
	if err := w.need(4); err != nil {
		return 0, err
	}
	v := int32(binary.BigEndian.Uint32(w.b[w.off:]))
	w.off += 4
	return v, nil
}

// minSize is the smallest encoding of a value of type t; 0 for a type no
// container may hold.
func minSize(t byte) int {
	switch t {
	case tBool, tByte, tStruct: // a struct is at least its stop byte
		return 1
	case tI16:
		return 2
	case tI32, tString: // a string is at least its length
		return 4
	case tI64, tDouble:
		return 8
	case tMap:
		return 6
	case tSet, tList:
		return 5
	case tUUID:
		return 16
	}
	return 0
}

// count reads a container's declared length and refuses one the body
// cannot hold before anything is done with it.
func (w *walker) count(what string, minElem int) (int, error) {
	n, err := w.i32()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, w.errf("%s: negative length %d", what, n)
	}
	if int64(n)*int64(minElem) > int64(w.left()) {
		return 0, w.errf("%s declares %d elements of at least %d bytes, %d bytes are left", what, n, minElem, w.left())
	}
	return int(n), nil
}

// walkStruct walks one struct of kind k at depth d.
func (w *walker) walkStruct(k kind, d int) error {
	if d > MaxDepth {
		return w.errf("nested deeper than %d", MaxDepth)
	}
	var set uint16
	for {
		if err := w.need(1); err != nil {
			return err
		}
		t := w.b[w.off]
		w.off++
		if t == tStop {
			for i, r := range required[k] {
				if set&(1<<i) == 0 {
					return w.errf("%s: required field %s missing", kindName[k], fieldName[[2]int{int(k), int(r.id)}])
				}
			}
			return nil
		}
		if err := w.need(2); err != nil {
			return err
		}
		id := int16(binary.BigEndian.Uint16(w.b[w.off:]))
		w.off += 2
		if k != kOther {
			seen(k, id, t, &set)
		}
		if ek, name, ok := listField(k, id); ok && t == tList {
			if err := w.need(1); err != nil {
				return err
			}
			et := w.b[w.off]
			w.off++
			if et != tStruct {
				return w.errf("%s.%s: a list of type %d, not of %s structs", kindName[k], name, et, kindName[ek])
			}
			n, err := w.count(name, 1)
			if err != nil {
				return err
			}
			switch ek {
			case kSpan:
				if w.spansAt != 0 {
					return w.errf("Batch.spans given twice")
				}
				w.spansAt, w.spansN = w.off, n
				w.c.Spans += n
				if w.maxItems > 0 && n > w.maxItems && int64(n)*minSpanBytes <= int64(w.left()) {
					return &itemsError{n}
				}
			case kTag:
				w.c.Tags += n
			case kLog:
				w.c.Logs += n
			case kRef:
				w.c.Refs += n
			}
			if ek != kSpan && n > MaxPerList {
				return &limitError{fmt.Sprintf("%s.%s: %d elements, more than %d", kindName[k], name, n, MaxPerList)}
			}
			for range n {
				if err := w.walkStruct(ek, d+1); err != nil {
					return err
				}
			}
			continue
		}
		if k == kBatch && id == 1 && t == tStruct {
			if w.procAt != 0 {
				return w.errf("Batch.process given twice")
			}
			w.procAt = w.off
			if err := w.walkStruct(kProcess, d+1); err != nil {
				return err
			}
			w.procEnd = w.off
			continue
		}
		if err := w.skip(t, d+1); err != nil {
			return err
		}
	}
}

// skip walks a value of type t that the schema does not name (or names
// with another type: the generated reader skips those too).
func (w *walker) skip(t byte, d int) error {
	if d > MaxDepth {
		return w.errf("nested deeper than %d", MaxDepth)
	}
	switch t {
	case tBool, tByte, tI16, tI32, tI64, tDouble, tUUID:
		return w.advance(minSize(t))
	case tString:
		n, err := w.count("string", 1)
		if err != nil {
			return err
		}
		return w.advance(n)
	case tStruct:
		return w.walkStruct(kOther, d)
	case tMap:
		if err := w.need(2); err != nil {
			return err
		}
		kt, vt := w.b[w.off], w.b[w.off+1]
		w.off += 2
		if minSize(kt) == 0 || minSize(vt) == 0 {
			return w.errf("a map of types %d, %d", kt, vt)
		}
		n, err := w.count("map", minSize(kt)+minSize(vt))
		if err != nil {
			return err
		}
		for range n {
			if err := w.skip(kt, d+1); err != nil {
				return err
			}
			if err := w.skip(vt, d+1); err != nil {
				return err
			}
		}
		return nil
	case tSet, tList:
		if err := w.need(1); err != nil {
			return err
		}
		et := w.b[w.off]
		w.off++
		if minSize(et) == 0 {
			return w.errf("a list of type %d", et)
		}
		n, err := w.count("list", minSize(et))
		if err != nil {
			return err
		}
		for range n {
			if err := w.skip(et, d+1); err != nil {
				return err
			}
		}
		return nil
	}
	return w.errf("unknown field type %d", t)
}

func (w *walker) advance(n int) error {
	if err := w.need(n); err != nil {
		return err
	}
	w.off += n
	return nil
}

// Walk checks that b is one thrift binary Batch whose every declared length
// it holds, within the limits, allocating nothing, and counts its
// structures. A Batch giving its process or its spans twice is refused
// (thrift's reader would keep the last; no sender writes either twice).
func Walk(b []byte) (Counts, error) {
	w := walker{b: b}
	err := w.walk()
	return w.c, err
}

func (w *walker) walk() error {
	if err := w.walkStruct(kBatch, 1); err != nil {
		return err
	}
	if w.off != len(w.b) {
		return w.errf("%d bytes after the batch", len(w.b)-w.off)
	}
	return nil
}

// itemsError: more spans than maxItems.
type itemsError struct{ n int }

func (e *itemsError) Error() string { return fmt.Sprintf("%d spans", e.n) }

// limitError: a structure over a limit of the walk (413, not 400).
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }
