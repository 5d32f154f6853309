// Package zipkin is the Zipkin door of the OTLP receiver
// (receivers.otlp.doors: [zipkin]): POST /api/v2/spans in JSON or proto3
// (ListOfSpans) and POST /api/v1/spans in JSON become an OTLP
// ExportTraceServiceRequest, through the OpenTelemetry Collector's own
// translator (pkg/translator/zipkin), so the spans read the same as the
// Collector's zipkin receiver makes them. docs/zipkin.md has the mapping.
//
// Memory: the body is bounded by max_request_bytes before it reaches
// Convert. Convert first walks it without allocating (scanJSON, scanProto)
// and refuses it whole when it holds more than MaxSpans spans (or the
// limit's MaxItems: door.ErrTooManyItems), a span with
// more than MaxEntriesPerSpan tags and annotations, JSON nested deeper
// than maxDepth, or a string the translator would parse as JSON
// attributes with more than maxAttrTokens of them. Only then does it
// convert, chunkSpans spans (or chunkBytes of body) at a time, appending
// each chunk's OTLP bytes to dst: an OTLP request's resource_spans may
// repeat, so the chunks' concatenation is one valid request, and the Go
// heap the translator takes is bounded by a chunk, not by the body. Keys
// the body repeats, which decoding folds, are counted (dropped.go).
package zipkin

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ferryhq/ferry/otlp/door"
	"mime"
	"net/http"
	"strings"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"github.com/openzipkin/zipkin-go/proto/zipkin_proto3"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/zipkin/zipkinv1"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/zipkin/zipkinv2"
)

const (
	// Amplify bounds the OTLP protobuf bytes per body byte (the door's
	// reservation). The worst case measured (TestAmplification, and
	// FuzzConvert holds every input to it) is 3.0×: JSON spans of only
	// their ids, `{"traceId":"1","id":"1"}`, whose missing timestamp the
	// translator marks with the attribute otel.zipkin.absentField.startTime
	// (~75 OTLP bytes from 25). proto3 spans reach 2.5× (IPv6 endpoints and
	// ports: 16 bytes become 39 characters under a 21-byte key). A request
	// that would convert to more than Amplify × its size is refused (413).
	Amplify = 4
	// MaxSpans bounds the spans of one request, counted before any is
	// decoded, as Limits.MaxItems (max_items_per_request) is.
	MaxSpans = 100000
	// MaxEntriesPerSpan bounds a span's tags and annotations (in JSON an
	// endpoint's fields count too; in v1 binary annotations).
	MaxEntriesPerSpan = 4096
	// maxDepth: a Zipkin v2 JSON body nests 4 levels (list, span,
	// annotations, annotation), v1 5 (binaryAnnotations' endpoints).
	maxDepth = 5
	// maxAttrTokens bounds the JSON the translator parses out of a string:
	// an annotation value "name|{attributes}|dropped" and an
	// otlp.link.N tag (the Collector's zipkin exporter writes events and
	// links so) each become a map[string]any; their commas, braces and
	// brackets are counted before.
	maxAttrTokens = 1024
	// A chunk: at most chunkSpans spans, and no more spans once chunkBytes
	// of body are taken.
	chunkSpans = 256
	chunkBytes = 64 << 10
)

// Paths are the door's paths on the OTLP/HTTP listener.
var Paths = []string{"/api/v2/spans", "/api/v1/spans"}

// ErrTooLarge: the converted request would pass Convert's max (the door's
// door.ErrTooLarge: the receiver answers 413).
var ErrTooLarge = door.ErrTooLarge

var errNotArray = errors.New("a Zipkin JSON body is an array of spans")

var (
	v2JSON = zipkinv2.ToTranslator{}
	v1JSON = zipkinv1.NewJSONTracesUnmarshaler(false)
	marsh  ptrace.ProtoMarshaler
)

// Convert is the door's conversion: body (a Zipkin request) to an OTLP
// ExportTraceServiceRequest appended to dst, within lim (otlp/door).
func Convert(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	max := lim.MaxBytes
	ct := q.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	v1 := strings.HasSuffix(q.URL.Path, "/api/v1/spans")
	switch mt {
	case "", "application/json", "text/plain":
		return convertJSON(body, dst, max, lim.MaxItems, st, v1)
	case "application/x-protobuf", "application/protobuf":
		if v1 {
			return nil, fmt.Errorf("/api/v1/spans takes JSON; protobuf is Zipkin v2 (/api/v2/spans)")
		}
		return convertProto(body, dst, max, lim.MaxItems, st, q.Header.Get("X-B3-Flags") == "1")
	case "application/x-thrift":
		return nil, fmt.Errorf("Zipkin v1 thrift is not served: send JSON to /api/v1/spans or v2 to /api/v2/spans")
	}
	return nil, fmt.Errorf("unsupported Content-Type %q: Zipkin takes application/json or application/x-protobuf", ct)
}

// out appends one chunk's traces to dst, within max bytes in all.
func out(td ptrace.Traces, dst []byte, start, max int) ([]byte, error) {
	n := marsh.TracesSize(td)
	if len(dst)-start+n > max {
		return dst, fmt.Errorf("%w (more than %d bytes)", ErrTooLarge, max)
	}
	b, err := marsh.MarshalTraces(td)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

func convertJSON(body, dst []byte, max, maxItems int, st *door.Stats, v1 bool) ([]byte, error) {
	if _, err := scanJSON(body, maxItems, nil); err != nil {
		return nil, err
	}
	start := len(dst)
	var scratch []byte
	var starts []int // of each span in scratch
	var spans []*zipkinmodel.SpanModel
	flush := func() error {
		if len(scratch) == 0 {
			return nil
		}
		scratch = append(scratch, ']')
		var td ptrace.Traces
		var err error
		if v1 {
			td, err = v1JSON.UnmarshalTraces(scratch)
			if err == nil && st != nil {
				countV1(st, scratch)
			}
		} else {
			spans = spans[:0]
			if err = json.Unmarshal(scratch, &spans); err == nil {
				for _, s := range spans {
					if err = checkModel(s); err != nil {
						break
					}
				}
			}
			if err == nil {
				if st != nil {
					countJSON(st, scratch, starts, spans)
				}
				td, err = v2JSON.ToTraces(spans)
			}
			clear(spans)
		}
		scratch, starts = scratch[:0], starts[:0]
		if err != nil {
			return err
		}
		dst, err = out(td, dst, start, max)
		return err
	}
	n := 0
	_, err := scanJSON(body, 0, func(s, e int) error {
		if len(scratch) == 0 {
			scratch = append(scratch, '[')
		} else {
			scratch = append(scratch, ',')
		}
		starts = append(starts, len(scratch))
		scratch = append(scratch, body[s:e]...)
		n++
		if n%chunkSpans == 0 || len(scratch) >= chunkBytes {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return nil, err
	}
	return dst, nil
}

func convertProto(body, dst []byte, max, maxItems int, st *door.Stats, debug bool) ([]byte, error) {
	if _, err := scanProto(body, maxItems, nil); err != nil {
		return nil, err
	}
	start := len(dst)
	cs, ce, n := -1, -1, 0
	flush := func() error {
		if cs < 0 {
			return nil
		}
		spans, err := zipkin_proto3.ParseSpans(body[cs:ce], debug)
		cs0, ce0 := cs, ce
		cs, ce = -1, -1
		if err != nil {
			return err
		}
		for _, s := range spans {
			if err := checkModel(s); err != nil {
				return err
			}
		}
		if st != nil {
			countProto(st, body[cs0:ce0], spans)
		}
		td, err := v2JSON.ToTraces(spans)
		if err != nil {
			return err
		}
		dst, err = out(td, dst, start, max)
		return err
	}
	_, err := scanProto(body, 0, func(s, e int) error {
		if cs >= 0 && ce != s { // an unknown field between spans ends a chunk
			if err := flush(); err != nil {
				return err
			}
		}
		if cs < 0 {
			cs = s
		}
		ce = e
		n++
		if n%chunkSpans == 0 || ce-cs >= chunkBytes {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return nil, err
	}
	return dst, nil
}

// checkModel refuses a span without a trace id and applies maxAttrTokens to the strings of a decoded span that
// the translator parses as JSON (after decoding: JSON escapes hide them
// from a scan).
func checkModel(s *zipkinmodel.SpanModel) error {
	if s.TraceID.Empty() {
		return errors.New("a span without a traceId") // the translator would make it all zeros, which OTLP forbids
	}
	for _, a := range s.Annotations {
		if err := attrTokens(a.Value); err != nil {
			return err
		}
	}
	for k, v := range s.Tags {
		if strings.HasPrefix(k, "otlp.link.") {
			if err := attrTokens(v); err != nil {
				return err
			}
		}
	}
	return nil
}

func attrTokens(v string) error {
	if strings.Count(v, "|") < 2 {
		return nil
	}
	n := 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case ',', '{', '[':
			n++
		}
	}
	if n > maxAttrTokens {
		return fmt.Errorf("%w: a string carrying attributes holds %d JSON members, at most %d", ErrTooLarge, n, maxAttrTokens)
	}
	return nil
}

// scanJSON walks a Zipkin JSON body (an array of span objects) once,
// without allocating, checking the bounds (and maxItems spans, when > 0);
// each span's bytes are handed to fn (nil: only check). It returns the
// number of spans.
func scanJSON(b []byte, maxItems int, fn func(s, e int) error) (int, error) {
	i := skipWS(b, 0)
	if i == len(b) {
		return 0, nil // an empty body: no spans
	}
	if b[i] != '[' {
		return 0, errNotArray
	}
	depth, spans, entries, elemStart := 0, 0, 0, -1
	inStr, esc := false, false
	for ; i < len(b); i++ {
		c := b[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		if depth == 1 && elemStart < 0 && c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != ',' && c != ']' {
			elemStart = i
			spans++
			entries = 0
			if maxItems > 0 && spans > maxItems {
				return spans, tooManySpans(maxItems)
			}
			if spans > MaxSpans {
				return spans, fmt.Errorf("%w: more than %d spans in one request", ErrTooLarge, MaxSpans)
			}
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
			if depth > maxDepth {
				return spans, fmt.Errorf("JSON nested deeper than %d levels: not a Zipkin span", maxDepth)
			}
			if depth == 4 { // an annotation (v1: or binary annotation)
				entries++
			}
		case ':':
			if depth == 3 { // a tag (or an endpoint's field)
				entries++
			}
		case '}', ']':
			depth--
			if depth < 0 {
				return spans, errors.New("unbalanced JSON")
			}
			if depth == 0 {
				if elemStart >= 0 {
					if err := emit(fn, elemStart, trimWS(b, elemStart, i)); err != nil {
						return spans, err
					}
				}
				if j := skipWS(b, i+1); j != len(b) {
					return spans, errors.New("data after the JSON array")
				}
				return spans, nil
			}
		}
		if entries > MaxEntriesPerSpan {
			return spans, fmt.Errorf("%w: span %d has more than %d tags and annotations", ErrTooLarge, spans, MaxEntriesPerSpan)
		}
		if depth == 1 && c == ',' {
			if elemStart < 0 {
				return spans, errors.New("invalid JSON: an empty element")
			}
			if err := emit(fn, elemStart, trimWS(b, elemStart, i)); err != nil {
				return spans, err
			}
			elemStart = -1
		}
	}
	return spans, errors.New("unterminated JSON")
}

func tooManySpans(max int) error {
	return fmt.Errorf("%w: more than %d spans in one request", door.ErrTooManyItems, max)
}

func emit(fn func(s, e int) error, s, e int) error {
	if fn == nil {
		return nil
	}
	return fn(s, e)
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func trimWS(b []byte, s, e int) int {
	for e > s && (b[e-1] == ' ' || b[e-1] == '\t' || b[e-1] == '\n' || b[e-1] == '\r') {
		e--
	}
	return e
}

// scanProto walks a proto3 ListOfSpans once, checking the bounds; each
// span field's bytes (tag and length included, so consecutive ones are a
// ListOfSpans themselves) are handed to fn (nil: only check); more than
// maxItems spans (when > 0) are refused.
func scanProto(b []byte, maxItems int, fn func(s, e int) error) (int, error) {
	spans := 0
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return spans, fmt.Errorf("invalid protobuf: %v", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return spans, fmt.Errorf("invalid protobuf: %v", protowire.ParseError(m))
		}
		if num == 1 && typ == protowire.BytesType {
			spans++
			if maxItems > 0 && spans > maxItems {
				return spans, tooManySpans(maxItems)
			}
			if spans > MaxSpans {
				return spans, fmt.Errorf("%w: more than %d spans in one request", ErrTooLarge, MaxSpans)
			}
			v, _ := protowire.ConsumeBytes(b[i+n:])
			if err := scanProtoSpan(v, spans); err != nil {
				return spans, err
			}
			if err := emit(fn, i, i+n+m); err != nil {
				return spans, err
			}
		}
		i += n + m
	}
	return spans, nil
}

// scanProtoSpan counts a span's annotations (field 10) and tags (11).
func scanProtoSpan(b []byte, span int) error {
	entries := 0
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return fmt.Errorf("invalid protobuf span: %v", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return fmt.Errorf("invalid protobuf span: %v", protowire.ParseError(m))
		}
		if num == 10 || num == 11 {
			entries++
			if entries > MaxEntriesPerSpan {
				return fmt.Errorf("%w: span %d has more than %d tags and annotations", ErrTooLarge, span, MaxEntriesPerSpan)
			}
		}
		i += n + m
	}
	return nil
}
