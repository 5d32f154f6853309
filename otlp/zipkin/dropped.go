package zipkin

import (
	"bytes"
	"encoding/json"

	zipkinmodel "github.com/openzipkin/zipkin-go/model"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

// Repeated keys, which decoding folds without a word (the last value
// wins), counted for door.Stats (door.DuplicateKey): in v2 JSON, a tags
// object's members beyond the keys the decoded map holds (escapes and
// repeated "tags" objects included), and a known field given twice in a
// span, endpoint or annotation object (encoding/json matches field names
// regardless of case); in proto3, a span's tags map entries beyond its
// decoded keys; in v1 JSON, binary annotations whose key (lc is written
// as component) an earlier one of the span has. Only what the body
// repeats is counted: a tag the translator overwrites with an attribute
// of its own (an endpoint's address or port under the same key) is not.

var (
	spanFields       = []string{"traceId", "id", "parentId", "debug", "name", "kind", "timestamp", "duration", "shared", "localEndpoint", "remoteEndpoint", "annotations", "tags"}
	endpointFields   = []string{"serviceName", "ipv4", "ipv6", "port"}
	annotationFields = []string{"timestamp", "value"}
)

// field is the index of key among names, matched as encoding/json matches
// a member to a field (case-insensitively, after unescaping); -1: none.
func field(key []byte, names []string) int {
	if bytes.IndexByte(key, '\\') >= 0 {
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &s) == nil {
			key = []byte(s)
		}
	}
	for i, n := range names {
		if bytes.EqualFold(key, []byte(n)) {
			return i
		}
	}
	return -1
}

// jsonString returns the end of the string starting at b[i] == '"' and its
// content.
func jsonString(b []byte, i int) (int, []byte) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, b[i+1 : j]
		}
	}
	return len(b), nil
}

// skipValue returns the end of the value starting at b[i] (valid JSON).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		end, _ := jsonString(b, i)
		return end
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				end, _ := jsonString(b, i)
				i = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// members calls fn with each member's key and the offset of its value in
// the object starting at b[i] == '{'; fn returns the value's end.
func members(b []byte, i int, fn func(key []byte, v int) int) {
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return
		}
		end, key := jsonString(b, i)
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return
		}
		i = fn(key, skipWS(b, i+1))
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ',' {
			return
		}
		i++
	}
}

// structDups counts the known fields given twice in the object at b[i].
func structDups(b []byte, i int, names []string) int {
	n := 0
	var seen uint32
	members(b, i, func(key []byte, v int) int {
		if f := field(key, names); f >= 0 {
			if seen&(1<<f) != 0 {
				n++
			}
			seen |= 1 << f
		}
		return skipValue(b, v)
	})
	return n
}

// spanKeys reads a v2 JSON span (valid JSON: it decoded): the members of
// its tags objects, and the known fields given twice in it, its endpoints
// and its annotations.
func spanKeys(b []byte) (tags, dups int) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, 0
	}
	const tagsField, local, remote, annotations = 12, 9, 10, 11
	var seen uint32
	members(b, i, func(key []byte, v int) int {
		f := field(key, spanFields)
		if f < 0 || v >= len(b) {
			return skipValue(b, v)
		}
		switch {
		case f == tagsField && b[v] == '{':
			members(b, v, func(_ []byte, tv int) int { tags++; return skipValue(b, tv) })
		case (f == local || f == remote) && b[v] == '{':
			dups += structDups(b, v, endpointFields)
		case f == annotations && b[v] == '[':
			for j := skipWS(b, v+1); j < len(b) && b[j] == '{'; {
				dups += structDups(b, j, annotationFields)
				j = skipWS(b, skipValue(b, j))
				if j >= len(b) || b[j] != ',' {
					break
				}
				j = skipWS(b, j+1)
			}
		}
		if f != tagsField { // repeated tags objects merge: their members count
			if seen&(1<<f) != 0 {
				dups++
			}
			seen |= 1 << f
		}
		return skipValue(b, v)
	})
	return tags, dups
}

// countJSON counts the repeated keys of a chunk's decoded v2 spans, whose
// bytes in chunk start at starts (each span ends before the next start).
func countJSON(st *door.Stats, chunk []byte, starts []int, spans []*zipkinmodel.SpanModel) {
	for i, s := range spans {
		end := len(chunk)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		tags, dups := spanKeys(chunk[starts[i]:end])
		st.Drop(door.DuplicateKey, dups+max(0, tags-len(s.Tags)))
	}
}

// countProto counts the tags map entries of a chunk's proto3 spans (the
// ListOfSpans fields in chunk) beyond their decoded keys.
func countProto(st *door.Stats, chunk []byte, spans []*zipkinmodel.SpanModel) {
	i := 0
	for b := chunk; len(b) > 0 && i < len(spans); {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		if num == 1 && typ == protowire.BytesType {
			span, _ := protowire.ConsumeBytes(b)
			tags := 0
			for sb := span; len(sb) > 0; {
				sn, styp, k := protowire.ConsumeTag(sb)
				if k < 0 {
					break
				}
				l := protowire.ConsumeFieldValue(sn, styp, sb[k:])
				if l < 0 {
					break
				}
				if sn == 11 {
					tags++
				}
				sb = sb[k+l:]
			}
			st.Drop(door.DuplicateKey, max(0, tags-len(spans[i].Tags)))
			i++
		}
		b = b[m:]
	}
}

// v1Keys is what countV1 reads of a v1 span.
type v1Keys struct {
	BinaryAnnotations []struct {
		Key string `json:"key"`
	} `json:"binaryAnnotations"`
}

// countV1 counts a v1 chunk's binary annotations whose key an earlier one
// of their span has.
func countV1(st *door.Stats, chunk []byte) {
	var spans []v1Keys
	if json.Unmarshal(chunk, &spans) != nil {
		return
	}
	seen := map[string]struct{}{}
	for _, s := range spans {
		clear(seen)
		for _, a := range s.BinaryAnnotations {
			k := a.Key
			if k == "lc" {
				k = "component"
			}
			if _, ok := seen[k]; ok {
				st.Drop(door.DuplicateKey, 1)
			}
			seen[k] = struct{}{}
		}
	}
}
