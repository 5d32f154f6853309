// Package encoding owns how an OTLP export request becomes Kafka records:
// the topic per signal, the encoding of the value and the key.
//
// Encodings:
//   - otlp_proto: TracesData / MetricsData / LogsData in protobuf, which is
//     byte for byte what the OpenTelemetry Collector's kafka exporter writes
//     and its kafka receiver reads (the export request has the same wire
//     form, so a request that makes one record, always with partition none
//     and usually with the others, is forwarded untouched);
//   - otlp_json: the same in OTLP/JSON;
//   - flat_json: one JSON object per span, log record or data point.
//
// Partitioning decides both how a request is split and the key:
//   - trace_partition (traces, the default): every span of a trace on the
//     partition a record keyed by its hex trace id would go to (Kafka's
//     murmur2 partitioner, Encoder.Partitions), one record per partition a
//     request reaches, without a key (flat_json, or the topic's partitions
//     unknown: as trace_id);
//   - trace_id (traces): one record per trace (flat_json: per span) keyed by
//     the hex trace id, so a trace stays on one partition;
//   - resource: one record per resource (flat_json: per item) keyed by a
//     hash of the resource attributes that does not depend on their order;
//   - none: one record per request (flat_json: per item), no key.
package encoding

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/flatjson"
	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/sampling"
	"github.com/ferryhq/ferry/signal"
)

// Signal is an OTLP signal: the one signal type (package signal).
type Signal = signal.Signal

// The OTLP signals.
const (
	Traces  = signal.Traces
	Metrics = signal.Metrics
	Logs    = signal.Logs
)

// Config is one signal's output (YAML receivers.otlp.<signal>).
type Config struct {
	Topic     string `yaml:"topic"`
	Encoding  string `yaml:"encoding"`  // otlp_proto, otlp_json, flat_json
	Partition string `yaml:"partition"` // trace_partition, trace_id (traces only), resource, none
	// Key, when set, is a template (routing placeholders) that replaces the
	// key the partition would give.
	Key string `yaml:"key"`
}

// Validate names the first invalid field.
func (c *Config) Validate(s Signal) error {
	if c.Topic == "" {
		return fmt.Errorf("topic: required")
	}
	switch c.Encoding {
	case "otlp_proto", "otlp_json", "flat_json":
	default:
		return fmt.Errorf("encoding: %q is not one of otlp_proto, otlp_json, flat_json", c.Encoding)
	}
	switch c.Partition {
	case "resource", "none":
	case "trace_partition", "trace_id":
		if s != Traces {
			return fmt.Errorf("partition: %s applies to traces only (use resource or none)", c.Partition)
		}
	default:
		return fmt.Errorf("partition: %q is not one of trace_partition, trace_id, resource, none", c.Partition)
	}
	return nil
}

// Part is one record to be: its key and value are ranges of the output
// buffer (or, for Whole, the input itself), resolved by the caller once the
// buffer is complete, so growing the buffer never leaves a record pointing
// at stale memory.
type Part struct {
	KeyStart, KeyEnd int
	ValStart, ValEnd int
	Items            int
	Whole            bool   // value is the whole input, unchanged (the key, if any, in the buffer)
	ResRaw           []byte // the (first) resource of the record's items, for routing
	// Partition is the record's partition, chosen by the encoder
	// (trace_partition), when Chosen; otherwise the exporter's partitioner
	// places it by its key.
	Partition int32
	Chosen    bool
}

// Encoder turns requests into parts; reuse one per goroutine.
type Encoder struct {
	// MaxRecordBytes, when > 0, splits a trace's or resource's items over
	// several records (same key) so that none exceeds it.
	MaxRecordBytes int
	// MaxItems and MaxBytes, when > 0, bound one request: its items, and
	// what its records take (values, keys and RecordCost per record).
	// Encode stops as soon as either is passed and returns a *LimitError,
	// so a small request that would expand (a large resource copied into
	// every trace's record, millions of empty spans) never gets built.
	MaxItems   int
	MaxBytes   int
	RecordCost int
	// Partitions is the partition count of the topic the request's records
	// go to, for partition trace_partition; 0 (unknown, or the topic is
	// decided per record) writes a record per trace keyed by its id, as
	// trace_id does: the exporter's murmur2 partitioner (the default) then
	// puts each trace on the same partition the grouping would have chosen.
	Partitions int
	// FlatExtra is appended to every flat_json object (tenant, data id).
	FlatExtra []byte
	// Sample drops spans and log records by trace id (zero: keep all);
	// Dropped is how many the last Encode dropped.
	Sample  sampling.Decision
	Dropped int
	// RecordSpans: Encode of traces keeps in Spans what span metrics need
	// of every span it decodes, sampled out or not, so that they read the
	// request in the same pass (views into raw, valid while raw is).
	RecordSpans bool
	Spans       []wire.SpanFacts

	fj    flatjson.Encoder
	parts []Part
	hash  resourceHasher
	group grouper
}

// LimitError is a request refused for exceeding MaxItems or MaxBytes.
type LimitError struct {
	Items bool // MaxItems, else MaxBytes
	Limit int
}

func (e *LimitError) Error() string {
	if e.Items {
		return fmt.Sprintf("more than %d items in one request", e.Limit)
	}
	return fmt.Sprintf("the request's records take more than %d bytes", e.Limit)
}

// over reports whether n items and out (built from start) with parts
// records exceed the limits.
func (e *Encoder) over(n, start, end, parts int) error {
	if e.MaxItems > 0 && n > e.MaxItems {
		return &LimitError{Items: true, Limit: e.MaxItems}
	}
	if e.MaxBytes > 0 && end-start+parts*e.RecordCost > e.MaxBytes {
		return &LimitError{Limit: e.MaxBytes}
	}
	return nil
}

// Encode appends to out the records of one request raw (protobuf) and
// returns the parts and the number of items. out may grow; parts index into
// the returned buffer.
func (e *Encoder) Encode(sig Signal, c *Config, raw []byte, out []byte) ([]Part, []byte, int, error) {
	e.parts = e.parts[:0]
	e.Dropped = 0
	if cap(e.Spans) > 1<<16 { // a pooled encoder does not keep a huge one
		e.Spans = nil
	}
	e.Spans = e.Spans[:0]
	e.fj.Reset()
	e.fj.Extra = e.FlatExtra
	e.hash.reset()
	switch {
	case c.Encoding == "flat_json":
		return e.flat(sig, c, raw, out)
	case c.Partition == "none" && !e.Sample.All() && sig != Metrics:
		// Some items may go: re-frame what is kept as one record.
		return e.split(sig, c, raw, out)
	case c.Partition == "none":
		n, err := e.count(sig, raw)
		if err != nil || n == 0 {
			return nil, out, 0, err
		}
		if c.Encoding == "otlp_json" {
			start := len(out)
			out, err = appendJSON(sig, raw, out)
			if err == nil {
				err = e.over(n, start, len(out), 1)
			}
			if err != nil {
				return nil, out, 0, err
			}
			e.parts = append(e.parts, Part{ValStart: start, ValEnd: len(out), Items: n, ResRaw: wire.FirstResource(raw)})
			return e.parts, out, n, nil
		}
		e.parts = append(e.parts, Part{Whole: true, Items: n, ResRaw: wire.FirstResource(raw)})
		return e.parts, out, n, nil
	default:
		return e.split(sig, c, raw, out)
	}
}

func (e *Encoder) flat(sig Signal, c *Config, raw []byte, out []byte) ([]Part, []byte, int, error) {
	n := 0
	base := len(out)
	add := func(res *wire.Resource, key []byte, start int) error {
		p := Part{ValStart: start, ValEnd: len(out), Items: 1, ResRaw: res.Raw}
		switch {
		case key != nil:
			p.KeyStart = len(out)
			out = hex.AppendEncode(out, key)
			p.KeyEnd = len(out)
		case c.Partition == "resource":
			p.KeyStart = len(out)
			out = e.hash.appendKey(out, res)
			p.KeyEnd = len(out)
		}
		e.parts = append(e.parts, p)
		n++
		return e.over(n, base, len(out), len(e.parts))
	}
	switch sig {
	case Traces:
		it := wire.NewTraces(raw)
		for it.Next() {
			e.record(&it)
			if !e.Sample.Keep(it.Span().TraceID) {
				e.Dropped++
				continue
			}
			start := len(out)
			out = e.fj.Span(out, it.Resource(), it.Scope(), it.Span())
			var key []byte
			if (c.Partition == "trace_id" || c.Partition == "trace_partition") && len(it.Span().TraceID) > 0 {
				key = it.Span().TraceID
			}
			if err := add(it.Resource(), key, start); err != nil {
				return nil, out, 0, err
			}
		}
		return e.parts, out, n, it.Err()
	case Logs:
		it := wire.NewLogs(raw)
		for it.Next() {
			if !e.Sample.Keep(it.Record().TraceID) {
				e.Dropped++
				continue
			}
			start := len(out)
			out = e.fj.Log(out, it.Resource(), it.Scope(), it.Record())
			if err := add(it.Resource(), nil, start); err != nil {
				return nil, out, 0, err
			}
		}
		return e.parts, out, n, it.Err()
	default:
		it := wire.NewMetrics(raw)
		for it.Next() {
			start := len(out)
			out = e.fj.Point(out, it.Resource(), it.Scope(), it.Metric(), it.Point())
			if err := add(it.Resource(), nil, start); err != nil {
				return nil, out, 0, err
			}
		}
		return e.parts, out, n, it.Err()
	}
}

// CountItems validates raw in full with ferry's own decoder (every field,
// attribute nesting bounded) and counts its items, stopping with a
// *LimitError past maxItems (0: no limit). Anything that hands a request to
// pdata, whose decoder recurses without bound, must call it first.
func CountItems(sig Signal, raw []byte, maxItems int) (int, error) {
	n := 0
	var err error
	switch sig {
	case Traces:
		it := wire.NewTraces(raw)
		for it.Next() {
			if n++; maxItems > 0 && n > maxItems {
				return n, &LimitError{Items: true, Limit: maxItems}
			}
		}
		err = it.Err()
	case Logs:
		it := wire.NewLogs(raw)
		for it.Next() {
			if n++; maxItems > 0 && n > maxItems {
				return n, &LimitError{Items: true, Limit: maxItems}
			}
		}
		err = it.Err()
	default:
		it := wire.NewMetrics(raw)
		for it.Next() {
			if n++; maxItems > 0 && n > maxItems {
				return n, &LimitError{Items: true, Limit: maxItems}
			}
		}
		err = it.Err()
	}
	return n, err
}

// record keeps the current span's facts when RecordSpans.
func (e *Encoder) record(it *wire.Traces) {
	if e.RecordSpans {
		sp := it.Span()
		e.Spans = append(e.Spans, wire.SpanFacts{Res: it.Resource().Raw, Name: sp.Name, Kind: sp.Kind,
			Status: sp.StatusCode, Start: sp.Start, End: sp.End})
	}
}

// count is CountItems, keeping the spans' facts when RecordSpans.
func (e *Encoder) count(sig Signal, raw []byte) (int, error) {
	if !e.RecordSpans || sig != Traces {
		return CountItems(sig, raw, e.MaxItems)
	}
	n := 0
	it := wire.NewTraces(raw)
	for it.Next() {
		if n++; e.MaxItems > 0 && n > e.MaxItems {
			return n, &LimitError{Items: true, Limit: e.MaxItems}
		}
		e.record(&it)
	}
	return n, it.Err()
}

// appendJSON appends raw (protobuf) re-encoded as OTLP/JSON.
func appendJSON(sig Signal, raw []byte, out []byte) ([]byte, error) {
	var j []byte
	var err error
	switch sig {
	case Traces:
		var td ptrace.Traces
		if td, err = (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(raw); err == nil {
			j, err = (&ptrace.JSONMarshaler{}).MarshalTraces(td)
		}
	case Logs:
		var ld plog.Logs
		if ld, err = (&plog.ProtoUnmarshaler{}).UnmarshalLogs(raw); err == nil {
			j, err = (&plog.JSONMarshaler{}).MarshalLogs(ld)
		}
	default:
		var md pmetric.Metrics
		if md, err = (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(raw); err == nil {
			j, err = (&pmetric.JSONMarshaler{}).MarshalMetrics(md)
		}
	}
	return append(out, j...), err
}

// resourceHasher computes, once per resource, a key that does not depend on
// the order of the resource's attributes: FNV-1a 64 over the sorted
// (key, wire-encoded value) pairs, in hex.
type resourceHasher struct {
	lastRaw []byte
	lastKey [16]byte
	valid   bool
	kvs     []kv
}

type kv struct{ k, v []byte }

func (h *resourceHasher) reset() { h.valid = false }

func (h *resourceHasher) appendKey(out []byte, res *wire.Resource) []byte {
	if h.valid && len(h.lastRaw) == len(res.Raw) && (len(res.Raw) == 0 || &h.lastRaw[0] == &res.Raw[0]) {
		return append(out, h.lastKey[:]...)
	}
	h.kvs = h.kvs[:0]
	attrs := res.Attributes()
	for {
		raw, ok := attrs.Repeated.Next()
		if !ok {
			break
		}
		k, v := splitKV(raw)
		h.kvs = append(h.kvs, kv{k, v})
	}
	slices.SortFunc(h.kvs, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	// FNV-1a 64 written out: hash/fnv's would cost three allocations per
	// request for 16 bytes of key.
	const prime = 1099511628211
	f := uint64(14695981039346656037)
	for _, p := range h.kvs {
		for _, c := range p.k {
			f = (f ^ uint64(c)) * prime
		}
		f *= prime // the 0 after the key
		for _, c := range p.v {
			f = (f ^ uint64(c)) * prime
		}
		f *= prime
	}
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], f)
	hex.Encode(h.lastKey[:], sum[:])
	h.lastRaw, h.valid = res.Raw, true
	return append(out, h.lastKey[:]...)
}

// splitKV returns a KeyValue's key and its value's wire bytes.
func splitKV(b []byte) (k, v []byte) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return k, v
		}
		val, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return k, v
		}
		switch num {
		case 1:
			k = val
		case 2:
			v = val
		}
		b = b[n+m:]
	}
	return k, v
}
