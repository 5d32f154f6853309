// Package jaeger is the Jaeger door: jaeger.thrift Batches in thrift's
// binary protocol, POSTed over HTTP as jaeger clients' HTTP senders (and
// bk-collector, and the Jaeger collector) take them, converted to an OTLP
// ExportTraceServiceRequest in protobuf by the OpenTelemetry Collector's
// Jaeger translator (docs/jaeger.md has the mapping).
//
// Every length the body declares is checked against the body before
// anything is allocated (Walk); the thrift decoder then runs with
// MaxMessageSize set to the body's length as a second bound. The Batch is
// converted a chunk at a time, as otlp/zipkin does: its process decoded
// once, then chunkSpans spans (or chunkBytes of body) decoded and
// translated, and the chunk's OTLP appended to dst (an OTLP request's
// resource_spans may repeat, so the chunks' concatenation is one valid
// request, the process's resource once a chunk). The heap a conversion
// holds is thus a chunk's, not the body's; each chunk's size is known
// before it is written. The walk refuses a Batch of more spans than
// Limits.MaxItems from its list's header (door.ErrTooManyItems), and what
// the translator drops or folds is counted in door.Stats (dropped.go).
package jaeger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"

	"github.com/apache/thrift/lib/go/thrift"
	jthrift "github.com/jaegertracing/jaeger-idl/thrift-gen/jaeger"

	"github.com/ferryhq/ferry/otlp/door"
	translator "github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/jaeger"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// Patterns: the Jaeger collector's path (what jaeger clients' HTTP senders
// are pointed at) and bk-collector's.
var Patterns = []string{"/api/traces", "/jaeger/v1/traces"}

// OK: the Jaeger collector answers 202 (jaeger clients take any status
// below 400 as success).
const OK = http.StatusAccepted

// Amplify bounds the OTLP bytes per body byte. The worst cases, measured
// in amplify_test.go: a tag of an unknown value type (15 bytes and its key
// become a 33-byte placeholder string: about 2.6×), a span reference (41
// bytes become a link with its opentracing.ref_type attribute: about 1.7×),
// an error span's status message copied from its http.status_message tag
// (about 2×); 4 leaves room.
const Amplify = 4

// contentTypes the Jaeger collector accepts for thrift.
var contentTypes = map[string]bool{"application/x-thrift": true, "application/vnd.apache.thrift.binary": true}

// Converter returns the door's Convert, refusing a request that would
// convert to more than max bytes with an error wrapping tooLarge (the door
// framework's sentinel, which this package cannot import).
func Converter(tooLarge error) func(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	return func(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
		if q != nil {
			ct := q.Header.Get("Content-Type")
			mt, _, err := mime.ParseMediaType(ct)
			if err != nil || !contentTypes[mt] {
				return nil, fmt.Errorf("Content-Type %q: want application/x-thrift (a jaeger.thrift Batch in thrift's binary protocol)", ct)
			}
		}
		return Convert(body, dst, lim, st, tooLarge)
	}
}

// A chunk: at most chunkSpans spans, and no more once chunkBytes of body
// are taken; but at least procChunks times the process's bytes, so that
// the process's resource, repeated in every chunk, adds at most a quarter
// of a chunk's bytes however many tags the process has.
const (
	chunkSpans = 256
	chunkBytes = 64 << 10
	procChunks = 4
)

// Convert appends to dst the OTLP protobuf ExportTraceServiceRequest made
// of body, a thrift binary-encoded jaeger.thrift Batch, within lim (the
// rules of otlp/door): a request that would convert to more than
// lim.MaxBytes is refused with an error wrapping tooLarge, before the chunk
// that would pass it is written.
func Convert(body, dst []byte, lim door.Limits, st *door.Stats, tooLarge error) ([]byte, error) {
	max := lim.MaxBytes
	if len(body) == 0 {
		return nil, errors.New("empty body: want a jaeger.thrift Batch")
	}
	w := walker{b: body, maxItems: lim.MaxItems}
	if err := w.walk(); err != nil {
		var le *limitError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("%w: %v", tooLarge, err)
		}
		var ie *itemsError
		if errors.As(err, &ie) {
			return nil, fmt.Errorf("%w: the Batch declares %d spans, at most %d", door.ErrTooManyItems, ie.n, lim.MaxItems)
		}
		return nil, fmt.Errorf("not a jaeger.thrift Batch: %w", err)
	}
	ctx := context.Background()
	cfg := &thrift.TConfiguration{MaxMessageSize: int32(min(len(body), 1<<30)), MaxFrameSize: int32(min(len(body), 1<<30))}
	buf := &thrift.TMemoryBuffer{Buffer: bytes.NewBuffer(body[w.procAt:w.procEnd])}
	p := thrift.NewTBinaryProtocolConf(buf, cfg)
	b := jthrift.Batch{Process: jthrift.NewProcess()}
	if err := b.Process.Read(ctx, p); err != nil {
		return nil, fmt.Errorf("not a jaeger.thrift Batch: %w", err)
	}
	var keys keySet
	if st != nil {
		keys.countProcess(st, b.Process)
	}
	start := len(dst)
	flush := func() error {
		td, err := translator.ThriftToTraces(&b)
		clear(b.Spans)
		b.Spans = b.Spans[:0]
		if err != nil {
			return err
		}
		var m ptrace.ProtoMarshaler
		if n := m.TracesSize(td); len(dst)-start+n > max {
			return fmt.Errorf("%w: more than %d bytes of OTLP", tooLarge, max)
		}
		// TracesData and ExportTraceServiceRequest are the same message on
		// the wire (field 1: repeated ResourceSpans).
		pb, err := m.MarshalTraces(td)
		if err != nil {
			return err
		}
		dst = append(dst, pb...)
		return nil
	}
	if w.spansN == 0 {
		if err := flush(); err != nil {
			return nil, err
		}
		return dst, nil
	}
	// The spans, one after another from the list's first element: the
	// buffer's unread length tells each span's size.
	buf.Buffer = bytes.NewBuffer(body[w.spansAt:])
	b.Spans = make([]*jthrift.Span, 0, min(w.spansN, chunkSpans))
	procBytes, size := w.procEnd-w.procAt, 0
	for i := range w.spansN {
		left := buf.Len()
		s := jthrift.NewSpan()
		if err := s.Read(ctx, p); err != nil {
			return nil, fmt.Errorf("not a jaeger.thrift Batch: span %d: %w", i, err)
		}
		if st != nil {
			keys.countSpan(st, s)
		}
		b.Spans = append(b.Spans, s)
		size += left - buf.Len()
		if (len(b.Spans) >= chunkSpans || size >= chunkBytes) && size >= procChunks*procBytes || i == w.spansN-1 {
			if err := flush(); err != nil {
				return nil, err
			}
			size = 0
		}
	}
	return dst, nil
}

// Decode turns a walked body into traces whole, as Convert did before it
// converted by chunks (the tests compare the two). The thrift reader's own
// bound, MaxMessageSize = the body's length, refuses any length beyond the
// body even if Walk did not run.
func Decode(body []byte) (ptrace.Traces, error) {
	cfg := &thrift.TConfiguration{MaxMessageSize: int32(min(len(body), 1<<30)), MaxFrameSize: int32(min(len(body), 1<<30))}
	p := thrift.NewTBinaryProtocolConf(&thrift.TMemoryBuffer{Buffer: bytes.NewBuffer(body)}, cfg)
	var b jthrift.Batch
	if err := b.Read(context.Background(), p); err != nil {
		return ptrace.Traces{}, fmt.Errorf("not a jaeger.thrift Batch: %w", err)
	}
	td, err := translator.ThriftToTraces(&b)
	if err != nil {
		return ptrace.Traces{}, err
	}
	return td, nil
}
