package jaeger

// Jaeger's gRPC collector service, jaeger.api_v2.CollectorService/PostSpans
// (port 14250 on a Jaeger collector: what Jaeger agents, the OpenTelemetry
// Collector's jaeger exporter and jaeger's own gRPC reporters send to): a
// PostSpansRequest in protobuf, converted by the OpenTelemetry Collector's
// translator (ProtoToTraces) to an OTLP ExportTraceServiceRequest. The
// receiver serves it (receiver/otlpreceiver); this is the conversion.
//
// Memory: WalkProto first reads the whole request without allocating and
// bounds it (proto_walk.go). Then the batch's process is translated once
// into the resource, and the spans a chunk at a time (protoChunk*): each
// chunk is decoded by gogo-protobuf's generated code into model.Spans,
// translated, marshalled, and its scope spans are appended to the one
// resource_spans written into dst, whose length is filled in at the end.
// The Go heap a conversion takes at once is one chunk's (ProtoCounts.Peak
// estimates it), and the output is bounded by max before each chunk is
// written.

import (
	"errors"
	"fmt"

	"github.com/jaegertracing/jaeger-idl/model/v1"
	translator "github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/jaeger"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

// ProtoAmplify bounds the OTLP bytes a PostSpansRequest byte converts to
// (the reservation made before converting; a request that would convert
// to more is refused whole). protobuf is denser than thrift: the worst a
// sender makes, measured in TestProtoAmplify, are tags of an unknown value
// type (6 bytes and a key become the string "<Unknown Jaeger TagType "9">"
// under it: 4.2×) and references with both ids (32 bytes, a 70-byte link
// with its opentracing.ref_type attribute: 2.2×). Degenerate messages
// beyond it are refused: references of a type and no ids (4 bytes, a
// 46-byte link: 11.5×), spans of a flag only (8.5×).
const ProtoAmplify = 6

// ProtoService and ProtoMethod name the gRPC method.
const (
	ProtoService = "jaeger.api_v2.CollectorService"
	ProtoMethod  = "PostSpans"
)

var protoMarsh ptrace.ProtoMarshaler

// ConvertProto appends to dst the OTLP protobuf ExportTraceServiceRequest
// made of req, a jaeger.api_v2.PostSpansRequest in protobuf, writing at
// most max bytes: a request over the walk's limits, or that would convert
// to more, is refused with an error wrapping tooLarge before more is
// written. Any other error is the sender's (a malformed request).
func ConvertProto(req, dst []byte, max int, tooLarge error) ([]byte, error) {
	c, err := WalkProto(req)
	if err != nil {
		return nil, ProtoWalkError(err, tooLarge)
	}
	return ConvertWalked(&c, dst, max, nil, tooLarge)
}

// ProtoWalkError is WalkProto's error as ConvertProto returns it: over a
// limit wraps tooLarge, anything else says the request is malformed.
func ProtoWalkError(err, tooLarge error) error {
	var le *protoLimitError
	if errors.As(err, &le) {
		return fmt.Errorf("%w: %v", tooLarge, err)
	}
	return fmt.Errorf("not a jaeger.api_v2.PostSpansRequest: %w", err)
}

// ConvertWalked is ConvertProto for a request WalkProto has walked into c
// (the receiver walks first, to count spans and reserve c.Peak); c refers
// to the request's bytes, which must not change in between.
//
// The translator groups a batch's spans by process, one
// resource_spans each: the batch's process for spans without their own,
// and each span's own process otherwise. Spans without (every Jaeger
// client's and agent's) are written first, into one resource_spans; spans
// with their own process then, a chunk at a time, each chunk's
// resource_spans as the translator makes them.
//
// st, when not nil, counts what the translator folds without a word
// (door.Stats): a tag or log field whose key an earlier one of the same
// list has (OTLP keeps the last), as the thrift door counts it.
func ConvertWalked(c *ProtoCounts, dst []byte, max int, st *door.Stats, tooLarge error) ([]byte, error) {
	var keys keySet
	if st != nil && c.processOK {
		var p model.Process
		if err := p.Unmarshal(c.process); err == nil {
			seed := ""
			if p.ServiceName != "" {
				seed = "service.name"
			}
			st.Drop(door.DuplicateKey, dupsOf(&keys, p.Tags, modelKey, seed))
		}
	}
	// over refuses to make dst, the output so far, n bytes longer past max.
	end := len(dst) + max
	over := func(dst []byte, n int) error {
		if len(dst)+n > end {
			return fmt.Errorf("%w: more than %d bytes of OTLP", tooLarge, max)
		}
		return nil
	}
	var err error
	// The batch's resource_spans, as the translator makes it: when the
	// batch has a process or a span without its own.
	if c.processOK || c.Spans > c.OwnProcess {
		if err := over(dst, 1+pbMaxLenBytes); err != nil {
			return nil, err
		}
		dst = protowire.AppendTag(dst, 1, protowire.BytesType)
		at := len(dst)
		dst = append(dst, make([]byte, pbMaxLenBytes)...)
		if c.processOK {
			if dst, err = pbAppendResource(dst, c.process, over); err != nil {
				return nil, err
			}
		}
		if c.Spans > c.OwnProcess {
			if dst, err = protoEachChunk(c.batch, false, dst, over, pbAppendScopes, st, &keys); err != nil {
				return nil, err
			}
		}
		dst = pbCloseLen(dst, at)
	}
	if c.OwnProcess > 0 {
		if dst, err = protoEachChunk(c.batch, true, dst, over, func(dst, pb []byte) []byte { return append(dst, pb...) }, st, &keys); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

// pbMaxLenBytes: a resource_spans' length is written in 5 bytes' room (a
// request is at most 1 GiB), and moved down once it is known.
const pbMaxLenBytes = 5

// pbCloseLen writes the length of dst[at+pbMaxLenBytes:] as a varint at at and
// moves the message down to follow it.
func pbCloseLen(dst []byte, at int) []byte {
	body := len(dst) - at - pbMaxLenBytes
	n := protowire.SizeVarint(uint64(body))
	protowire.AppendVarint(dst[at:at], uint64(body))
	copy(dst[at+n:], dst[at+pbMaxLenBytes:])
	return dst[:len(dst)-(pbMaxLenBytes-n)]
}

// pbAppendResource translates the batch's process and appends its resource
// (field 1 of a ResourceSpans).
func pbAppendResource(dst, process []byte, over func([]byte, int) error) ([]byte, error) {
	p := &model.Process{Tags: make([]model.KeyValue, 0, pbCount(process, 2))}
	if err := p.Unmarshal(process); err != nil {
		return nil, fmt.Errorf("not a jaeger.api_v2.PostSpansRequest: batch process: %w", err)
	}
	if len(p.Tags) == 0 {
		p.Tags = nil // the translator tells a process without tags by nil
	}
	td, err := translator.ProtoToTraces([]*model.Batch{{Process: p}})
	if err != nil {
		return nil, err
	}
	if err := over(dst, protoMarsh.TracesSize(td)); err != nil {
		return nil, err
	}
	pb, err := protoMarsh.MarshalTraces(td)
	if err != nil {
		return nil, err
	}
	return pbAppendFields(dst, pb, 1), nil
}

// pbAppendScopes appends the scope_spans (field 2) of the resource_spans of
// pb, a marshalled TracesData.
func pbAppendScopes(dst, pb []byte) []byte { return pbAppendFields(dst, pb, 2) }

// pbAppendFields appends, whole (tag, length and value), every field num of
// every resource_spans in pb, a marshalled TracesData that the marshaller
// has just written.
func pbAppendFields(dst, pb []byte, num protowire.Number) []byte {
	for len(pb) > 0 {
		_, _, n := protowire.ConsumeTag(pb)
		rs, m := protowire.ConsumeBytes(pb[n:])
		pb = pb[n+m:]
		for len(rs) > 0 {
			fn, typ, n := protowire.ConsumeTag(rs)
			m := protowire.ConsumeFieldValue(fn, typ, rs[n:])
			if fn == num {
				dst = append(dst, rs[:n+m]...)
			}
			rs = rs[n+m:]
		}
	}
	return dst
}

// protoEachChunk decodes and translates the batch's spans with (own) or
// without their own process, a chunk at a time, and appends each chunk's
// marshalled TracesData to dst with add, within over's bound.
func protoEachChunk(batch []byte, own bool, dst []byte, over func([]byte, int) error, add func(dst, pb []byte) []byte, st *door.Stats, keys *keySet) ([]byte, error) {
	var ch protoChunker
	idx := -1 // the span's index in the batch
	var spans []*model.Span
	flush := func() error {
		if len(spans) == 0 {
			return nil
		}
		td, err := translator.ProtoToTraces([]*model.Batch{{Spans: spans}})
		clear(spans)
		spans = spans[:0]
		ch.reset()
		if err != nil {
			return err
		}
		if err := over(dst, protoMarsh.TracesSize(td)); err != nil {
			return err
		}
		pb, err := protoMarsh.MarshalTraces(td)
		if err != nil {
			return err
		}
		dst = add(dst, pb)
		return nil
	}
	for b := batch; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		v := b[n : n+m]
		b = b[n+m:]
		if num != 1 || typ != protowire.BytesType {
			continue
		}
		v, _ = protowire.ConsumeBytes(v)
		idx++
		s := pbShape(v)
		if s.process != own {
			continue
		}
		// The lists are made their size: gogo-protobuf's decoder appends
		// to them, and growing them would double what they allocate.
		sp := &model.Span{Tags: make([]model.KeyValue, 0, s.tags), Logs: make([]model.Log, 0, s.logs), References: make([]model.SpanRef, 0, s.refs)}
		if s.process {
			sp.Process = &model.Process{Tags: make([]model.KeyValue, 0, s.ptags)}
		}
		if err := sp.Unmarshal(v); err != nil {
			return nil, fmt.Errorf("not a jaeger.api_v2.PostSpansRequest: span %d: %w", idx, err)
		}
		// The translator tells a span it skips by comparing it with an
		// empty one, nil lists and all.
		if len(sp.Tags) == 0 {
			sp.Tags = nil
		}
		if len(sp.Logs) == 0 {
			sp.Logs = nil
		}
		if len(sp.References) == 0 {
			sp.References = nil
		}
		if sp.Process != nil && len(sp.Process.Tags) == 0 {
			sp.Process.Tags = nil
		}
		if st != nil {
			keys.countModelSpan(st, sp)
		}
		spans = append(spans, sp)
		if ch.add(len(v), s.items, s.fields) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return dst, nil
}
