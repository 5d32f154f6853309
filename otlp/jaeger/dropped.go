package jaeger

import (
	"reflect"

	"github.com/jaegertracing/jaeger-idl/model/v1"
	jthrift "github.com/jaegertracing/jaeger-idl/thrift-gen/jaeger"

	"github.com/ferryhq/ferry/otlp/door"
)

// What the translator (pkg/translator/jaeger, ThriftToTraces) drops or
// folds without a word, counted before each chunk is translated so that
// the door reports it (door.Stats): a tag whose key an earlier tag of the
// same list has (OTLP attributes keep one value a key: the last), a tag of
// a value type thrift does not define (a placeholder string instead of its
// value), a span.kind tag of no kind OTLP has (removed, the kind left
// unspecified), a span whose every field is zero (skipped).

// tagKey is the attribute key the translator writes a tag under: with its
// default feature gates, http.response.status_code is written as
// http.status_code.
func tagKey(k string) string {
	if k == "http.response.status_code" {
		return "http.status_code"
	}
	return k
}

// keySet finds repeated keys: by comparison in a short list, by a map
// (kept for the next list) in a long one.
type keySet struct{ m map[string]struct{} }

// dups counts the tags whose key is seed's (when not empty) or an earlier
// tag's.
func (k *keySet) dups(tags []*jthrift.Tag, seed string) int {
	return dupsOf(k, tags, thriftKey, seed)
}

func thriftKey(t *jthrift.Tag) string  { return tagKey(t.Key) }
func modelKey(t model.KeyValue) string { return tagKey(t.Key) }

// dupsOf counts the elements of tags whose key (by key) is seed's (when
// not empty) or an earlier one's: the thrift door's tags and the gRPC
// door's KeyValues alike.
func dupsOf[T any](k *keySet, tags []T, key func(T) string, seed string) int {
	n := 0
	if len(tags) <= 16 {
		for i, t := range tags {
			kt := key(t)
			if kt == seed && seed != "" {
				n++
				continue
			}
			for _, u := range tags[:i] {
				if key(u) == kt {
					n++
					break
				}
			}
		}
		return n
	}
	if k.m == nil {
		k.m = make(map[string]struct{}, len(tags))
	}
	clear(k.m)
	if seed != "" {
		k.m[seed] = struct{}{}
	}
	for _, t := range tags {
		kt := key(t)
		if _, ok := k.m[kt]; ok {
			n++
			continue
		}
		k.m[kt] = struct{}{}
	}
	return n
}

// countModelSpan counts what a gRPC (api_v2) span loses to repeated keys:
// its tags, its own process's tags (after service.name), its logs' fields.
func (k *keySet) countModelSpan(st *door.Stats, s *model.Span) {
	st.Drop(door.DuplicateKey, dupsOf(k, s.Tags, modelKey, ""))
	if s.Process != nil {
		seed := ""
		if s.Process.ServiceName != "" {
			seed = "service.name"
		}
		st.Drop(door.DuplicateKey, dupsOf(k, s.Process.Tags, modelKey, seed))
	}
	for _, l := range s.Logs {
		st.Drop(door.DuplicateKey, dupsOf(k, l.Fields, modelKey, ""))
	}
}

func unknownTypes(tags []*jthrift.Tag) int {
	n := 0
	for _, t := range tags {
		if t.VType < jthrift.TagType_STRING || t.VType > jthrift.TagType_BINARY {
			n++
		}
	}
	return n
}

// countProcess counts what the process's resource loses (once a Batch,
// though every chunk repeats it): serviceName is written as service.name
// first, then the tags.
func (k *keySet) countProcess(st *door.Stats, p *jthrift.Process) {
	seed := ""
	if p.ServiceName != "" {
		seed = "service.name"
	}
	st.Drop(door.DuplicateKey, k.dups(p.Tags, seed))
	st.Drop(door.UnknownTagType, unknownTypes(p.Tags))
}

var blankSpan = new(jthrift.Span)

// countSpan counts what a span loses.
func (k *keySet) countSpan(st *door.Stats, s *jthrift.Span) {
	if s.TraceIdLow == 0 && s.TraceIdHigh == 0 && s.SpanId == 0 && reflect.DeepEqual(s, blankSpan) {
		st.Drop(door.EmptySpan, 1)
		return
	}
	st.Drop(door.DuplicateKey, k.dups(s.Tags, ""))
	st.Drop(door.UnknownTagType, unknownTypes(s.Tags))
	var kind *jthrift.Tag
	for _, t := range s.Tags {
		if t.Key == "span.kind" {
			kind = t
		}
	}
	if kind != nil {
		switch kind.GetVStr() {
		case "client", "server", "producer", "consumer", "internal":
			if kind.VType != jthrift.TagType_STRING {
				st.Drop(door.UnknownSpanKind, 1)
			}
		default:
			st.Drop(door.UnknownSpanKind, 1)
		}
	}
	for _, l := range s.Logs {
		st.Drop(door.DuplicateKey, k.dups(l.Fields, ""))
		st.Drop(door.UnknownTagType, unknownTypes(l.Fields))
	}
}
