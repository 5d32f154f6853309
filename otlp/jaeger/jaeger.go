// Package jaeger is the Jaeger door: jaeger.thrift Batches in thrift's
// binary protocol, POSTed over HTTP as jaeger clients' HTTP senders (and
// bk-collector, and the Jaeger collector) take them, converted to an OTLP
// ExportTraceServiceRequest in protobuf by the OpenTelemetry Collector's
// Jaeger translator (docs/jaeger.md has the mapping).
//
// Every length the body declares is checked against the body before
// anything is allocated (Walk); the thrift decoder then runs with
// MaxMessageSize set to the body's length as a second bound, and the
// converted request's size is known before it is written.
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
func Converter(tooLarge error) func(q *http.Request, body, dst []byte, max int) ([]byte, error) {
	return func(q *http.Request, body, dst []byte, max int) ([]byte, error) {
		if q != nil {
			ct := q.Header.Get("Content-Type")
			mt, _, err := mime.ParseMediaType(ct)
			if err != nil || !contentTypes[mt] {
				return nil, fmt.Errorf("Content-Type %q: want application/x-thrift (a jaeger.thrift Batch in thrift's binary protocol)", ct)
			}
		}
		return Convert(body, dst, max, tooLarge)
	}
}

// Convert appends to dst the OTLP protobuf ExportTraceServiceRequest made
// of body, a thrift binary-encoded jaeger.thrift Batch, writing at most max
// bytes: a request that would convert to more is refused with an error
// wrapping tooLarge, before it is written.
func Convert(body, dst []byte, max int, tooLarge error) ([]byte, error) {
	if len(body) == 0 {
		return nil, errors.New("empty body: want a jaeger.thrift Batch")
	}
	if _, err := Walk(body); err != nil {
		var le *limitError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("%w: %v", tooLarge, err)
		}
		return nil, fmt.Errorf("not a jaeger.thrift Batch: %w", err)
	}
	td, err := Decode(body)
	if err != nil {
		return nil, err
	}
	var m ptrace.ProtoMarshaler
	if n := m.TracesSize(td); len(dst)+n > max {
		return nil, fmt.Errorf("%w: %d bytes of OTLP, %d allowed", tooLarge, len(dst)+n, max)
	}
	// TracesData and ExportTraceServiceRequest are the same message on
	// the wire (field 1: repeated ResourceSpans).
	pb, err := m.MarshalTraces(td)
	if err != nil {
		return nil, err
	}
	return append(dst, pb...), nil
}

// Decode turns a walked body into traces. The thrift reader's own bound,
// MaxMessageSize = the body's length, refuses any length beyond the body
// even if Walk did not run.
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
