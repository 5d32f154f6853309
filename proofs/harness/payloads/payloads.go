// Package payloads builds the requests a hostile local client would send
// to ferry: bodies that are small on the wire and large in memory (nesting,
// amplification, item and line bombs), forged spool frames, tokens hidden
// twice. The receivers' regression tests, the fuzz seeds and the hostile
// suite (proofs/hostile, make hostile) share them, so every bound is tested
// with the same attack in-process and over the network to the real binary.
package payloads

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"hash/crc32"

	"github.com/klauspost/compress/gzip"
	"google.golang.org/protobuf/encoding/protowire"
)

// appendLen appends a length-delimited field.
func appendLen(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// nestedValue is an AnyValue that is an array holding an array ... depth
// levels deep, a string at the bottom: about 8 bytes a level. Written top
// down from precomputed sizes, so building it is linear.
func nestedValue(depth int) []byte {
	leaf := appendLen(nil, 1, []byte("x")) // AnyValue.string_value
	// sizes[i]: size of the AnyValue at level i (0 = outermost).
	sizes := make([]int, depth+1)
	sizes[depth] = len(leaf)
	for i := depth - 1; i >= 0; i-- {
		arr := 1 + protowire.SizeVarint(uint64(sizes[i+1])) + sizes[i+1] // ArrayValue{values: v}
		sizes[i] = 1 + protowire.SizeVarint(uint64(arr)) + arr           // AnyValue{array_value: arr}
	}
	out := make([]byte, 0, sizes[0])
	for i := 0; i < depth; i++ {
		arr := 1 + protowire.SizeVarint(uint64(sizes[i+1])) + sizes[i+1]
		out = protowire.AppendTag(out, 5, protowire.BytesType) // AnyValue.array_value
		out = protowire.AppendVarint(out, uint64(arr))
		out = protowire.AppendTag(out, 1, protowire.BytesType) // ArrayValue.values
		out = protowire.AppendVarint(out, uint64(sizes[i+1]))
	}
	return append(out, leaf...)
}

func kv(key string, value []byte) []byte {
	return appendLen(appendLen(nil, 1, []byte(key)), 2, value)
}

func strValue(s string) []byte { return appendLen(nil, 1, []byte(s)) }

// span is a Span with a trace id, a span id, a name and extra attributes.
func span(traceID []byte, attrs ...[]byte) []byte {
	var s []byte
	s = appendLen(s, 1, traceID)
	s = appendLen(s, 2, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	s = appendLen(s, 5, []byte("op"))
	for _, a := range attrs {
		s = appendLen(s, 9, a)
	}
	return s
}

// traces is an ExportTraceServiceRequest: one resource with resAttrs and one
// scope holding spans.
func traces(resAttrs [][]byte, spans [][]byte) []byte {
	var res []byte
	for _, a := range resAttrs {
		res = appendLen(res, 1, a)
	}
	var scope []byte
	for _, s := range spans {
		scope = appendLen(scope, 2, s)
	}
	var rs []byte
	rs = appendLen(rs, 1, res)
	rs = appendLen(rs, 2, scope)
	return appendLen(nil, 1, rs)
}

// DeepAttribute is a traces request whose one span carries an attribute
// nested depth levels deep (about 8 bytes a level). With token, the
// resource carries it as ferry.token (the resource-token path).
func DeepAttribute(depth int, token string) []byte {
	var res [][]byte
	res = append(res, kv("service.name", strValue("deep")))
	if token != "" {
		res = append(res, kv("ferry.token", strValue(token)))
	}
	return traces(res, [][]byte{span(make16(1), kv("deep", nestedValue(depth)))})
}

// DeepJSON is an OTLP/JSON traces request with an attribute nested depth
// levels deep.
func DeepJSON(depth int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"op","attributes":[{"key":"deep","value":`)
	for i := 0; i < depth; i++ {
		b.WriteString(`{"arrayValue":{"values":[`)
	}
	b.WriteString(`{"stringValue":"x"}`)
	for i := 0; i < depth; i++ {
		b.WriteString(`]}}`)
	}
	b.WriteString(`}]}]}]}]}`)
	return b.Bytes()
}

func make16(i int) []byte {
	id := make([]byte, 16)
	binary.BigEndian.PutUint64(id[8:], uint64(i)+1)
	id[0] = 0xAB
	return id
}

// Amplifier is a traces request with one resource of a resAttrBytes
// attribute (random, so it does not compress) and spans spans, each of its
// own trace: partitioned by trace id, every trace's record carries a copy
// of the resource, so the records weigh about spans × resAttrBytes.
func Amplifier(resAttrBytes, spans int) []byte {
	big := make([]byte, resAttrBytes/2)
	_, _ = rand.Read(big)
	hexed := make([]byte, 0, resAttrBytes)
	for _, c := range big {
		hexed = append(hexed, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
	}
	ss := make([][]byte, spans)
	for i := range ss {
		ss[i] = span(make16(i))
	}
	return traces([][]byte{kv("big", strValue(string(hexed)))}, ss)
}

// EmptySpans is a traces request of n empty spans (2 bytes each).
func EmptySpans(n int) []byte {
	scope := make([]byte, 0, 2*n)
	for i := 0; i < n; i++ {
		scope = append(scope, 0x12, 0) // ScopeSpans.spans: an empty Span
	}
	var rs []byte
	rs = appendLen(rs, 2, scope)
	return appendLen(nil, 1, rs)
}

// Lines is n one-byte NDJSON lines ("1\n").
func Lines(n int) []byte { return bytes.Repeat([]byte("1\n"), n) }

// Gzip compresses b at the best ratio.
func Gzip(b []byte) []byte {
	var out bytes.Buffer
	w, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	_, _ = w.Write(b)
	_ = w.Close()
	return out.Bytes()
}

// Logs is a small valid logs request: one resource, one record "x".
func Logs() []byte {
	rec := appendLen(nil, 5, strValue("x")) // LogRecord.body
	scope := appendLen(nil, 2, rec)         // ScopeLogs.log_records
	rl := appendLen(nil, 2, scope)          // ResourceLogs.scope_logs
	return appendLen(nil, 1, rl)
}

// SpoolFrame is what a client who read ferry's documentation could put in
// a value to forge a spool record for topic: a frame in the current layout
// with a guessed tag and checksum seed, then one in the first layout.
func SpoolFrame(topic, value string) []byte {
	payload := binary.LittleEndian.AppendUint64(nil, 0)
	payload = binary.AppendUvarint(payload, uint64(len(topic)))
	payload = append(payload, topic...)
	payload = append(payload, 0) // nil key
	payload = binary.AppendUvarint(payload, uint64(len(value)))
	payload = append(payload, value...)
	payload = append(payload, 0) // no headers
	var out []byte
	out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
	out = binary.LittleEndian.AppendUint32(out, 0) // guessed tag
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	out = append(out, payload...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	return append(out, payload...)
}

// DeepGroup is a traces request whose one span carries an unknown field
// that is a protobuf group nested depth levels deep (2 bytes a level).
// Groups do not exist in proto3; a generic decoder skips them recursively,
// and a consumer's decoder with a lower nesting limit than the agent's
// (protobuf-java stops at 100) cannot read a record that carries one.
func DeepGroup(depth int) []byte {
	var g []byte
	for range depth {
		g = protowire.AppendTag(g, 99, protowire.StartGroupType)
	}
	for range depth {
		g = protowire.AppendTag(g, 99, protowire.EndGroupType)
	}
	s := append(span(make16(1)), g...)
	return traces([][]byte{kv("service.name", strValue("group"))}, [][]byte{s})
}

// TokenTwice is an ExportLogsServiceRequest of one log record whose
// resource carries ferry.token twice: an int, then tok. Removing the first
// attribute of that name (pdata's Remove) left the real token in the
// record sent to Kafka.
func TokenTwice(tok string) []byte {
	intValue := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 5) // AnyValue.int_value
	res := appendLen(nil, 1, kv("ferry.token", intValue))
	res = appendLen(res, 1, kv("ferry.token", strValue(tok)))
	res = appendLen(res, 1, kv("service.name", strValue("twice")))
	rec := appendLen(nil, 5, strValue("token twice")) // LogRecord.body
	scope := appendLen(nil, 2, rec)                   // ScopeLogs.log_records
	rl := appendLen(appendLen(nil, 1, res), 2, scope) // ResourceLogs.resource, scope_logs
	return appendLen(nil, 1, rl)                      // ExportLogsServiceRequest.resource_logs
}
