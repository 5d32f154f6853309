// Package otlpreceiver owns OTLP ingest: OTLP/HTTP (/v1/traces, /v1/metrics,
// /v1/logs; protobuf or JSON; gzip or zstd) and OTLP/gRPC (TraceService,
// MetricsService, LogsService; gzip), and the doors: other formats of the
// same signals converted to OTLP (door.go on the HTTP listener,
// door_grpc.go Jaeger's gRPC collector service).
//
// A request is validated and turned into Kafka records by otlp/encoding in
// one pass over its protobuf bytes (JSON is converted to protobuf first),
// handed to the pipeline as one batch, and answered per the OTLP
// specification so standard exporters retry correctly:
//   - success only after Kafka acknowledged every record (wait_for_ack);
//   - malformed payload: HTTP 400 / INVALID_ARGUMENT, with the decode error;
//   - too large: HTTP 413 / RESOURCE_EXHAUSTED without RetryInfo (do not retry);
//   - buffer full: HTTP 429 / RESOURCE_EXHAUSTED with RetryInfo;
//   - Kafka unreachable or stopping: HTTP 503 / UNAVAILABLE with a retry delay;
//   - Kafka refused a record for good (unknown topic, too large): HTTP 500 /
//     INTERNAL, not retried; with flat_json, where each record is one item,
//     the other items are accepted and partial_success says how many were not.
//
// Lifecycle: Start binds both listeners (a taken port fails start-up).
// Shutdown stops accepting and waits, until ctx ends, for requests in
// progress, including those waiting for Kafka.
package otlpreceiver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/telemetry"
)

// Receiver serves OTLP over HTTP and gRPC.
type Receiver struct {
	cfg     Config // with derived defaults
	given   Config // as configured, for Reload
	set     telemetry.Settings
	next    consumer.Consumer
	body    *httpbody.Reader
	topics  *telemetry.Labels
	httpM   *receivermetrics.Metrics
	grpcM   *receivermetrics.Metrics
	sigs    [3]signalOut
	http    *httpServer
	grpc    *grpcServer
	encP    sync.Pool // *encoding.Encoder: their scratch buffers are reused
	gate    *auth.Gate
	sampler *sampler.Sampler
	attrs   *attributes.Processor
	allow   *routing.Allow
	// spans: RED metrics from spans (nil: off); spanM counts its flushes.
	spans *spanmetrics.Processor
	spanM *receivermetrics.Metrics
	// maxRecordBytes: see New.
	maxRecordBytes int
	httpSub        *submit.Submitter
	grpcSub        *submit.Submitter
	// batchP: *record.Batch, taken back when Kafka (or the spool) is done
	// with one, so a request's records (100 per request of spans, with
	// pointers the collector scans) are not a new allocation each time.
	batchP  sync.Pool
	recycle func(*record.Batch)
	// doorSubs: the submitter of each door served (door.go).
	doorSubs []doorSub
	// jaeger: Jaeger's gRPC collector service (door_grpc.go); nil unless
	// the jaeger door is open.
	jaeger *jaegerGRPC
	// parts: the partition counts trace_partition groups by (nil: traces
	// are not written that way, or no cluster to ask).
	parts *partitionCounts
	// watchShrink is the exporter's notice of shrunk topics (nil: none);
	// unwatch ends it.
	watchShrink func(fn func(topic string, partition int32)) (stop func())
	unwatch     func()
}

// signalOut is a signal's fixed output: its encoding config and the Kafka
// headers every record of it carries (built once, shared by all records).
type signalOut struct {
	cfg     *encoding.Config
	headers []record.Header
	topic   string
	tmpl    *routing.Template
	keyTmpl *routing.Template // nil: the partition's key
}

// New builds the receiver from a configuration and everything it needs:
// env.Next receives the batches, env.Bodies is the budget requests reserve
// from before they are kept, and a trace's or resource's items are split
// over records under the exporter's record limit (env.Bounds).
// pre holds the token checker and rate limiter; nil (or nil fields) when
// none is configured.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	given := cfg
	cfg = cfg.resolved(env.Bounds)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	set, next, pre := env.Set, env.Next, env.Pre
	r := &Receiver{cfg: cfg, given: given, set: set, next: next, maxRecordBytes: maxRecordBytes(env.Bounds), body: httpbody.NewReader(int64(cfg.MaxRequestBytes)),
		topics: set.Topics, gate: pre.Gate(cfg.Auth)}
	if env.Bodies != nil {
		r.body.SetBudget(env.Bodies)
	}
	if pre != nil {
		r.sampler, r.attrs = pre.Sampler, pre.Attributes
	}
	r.attachSpanMetrics(pre)
	r.allow, _ = routing.NewAllow(cfg.Topics) // checked by Validate
	r.httpM = receivermetrics.New(set.Registry, "otlp_http")
	r.grpcM = receivermetrics.New(set.Registry, "otlp_grpc")
	r.batchP.New = func() any { return new(record.Batch) }
	r.recycle = func(b *record.Batch) { b.Reset(); r.batchP.Put(b) }
	r.httpSub = &submit.Submitter{Next: next, Bodies: r.body, AckTimeout: cfg.AckTimeout, M: r.httpM, Recycle: r.recycle}
	r.grpcSub = &submit.Submitter{Next: next, Bodies: r.body, AckTimeout: cfg.AckTimeout, M: r.grpcM, Recycle: r.recycle}
	for i, c := range []*encoding.Config{&r.cfg.Traces, &r.cfg.Metrics, &r.cfg.Logs} {
		tmpl, err := routing.Parse(c.Topic)
		if err != nil {
			return nil, fmt.Errorf("%s.topic: %w", encoding.Signal(i), err)
		}
		var keyTmpl *routing.Template
		if c.Key != "" {
			if keyTmpl, err = routing.Parse(c.Key); err != nil {
				return nil, fmt.Errorf("%s.key: %w", encoding.Signal(i), err)
			}
		}
		r.sigs[i] = signalOut{cfg: c, topic: c.Topic, tmpl: tmpl, keyTmpl: keyTmpl, headers: []record.Header{
			{Key: "ferry.signal", Value: []byte(encoding.Signal(i).String())},
			{Key: "ferry.encoding", Value: []byte(c.Encoding)},
		}}
	}
	if cfg.HTTP.Enabled {
		r.http = newHTTPServer(r)
	}
	if cfg.GRPC.Enabled {
		r.grpc = newGRPCServer(r)
	}
	r.jaeger = newJaegerGRPC(r)
	if t := &r.cfg.Traces; t.Partition == "trace_partition" && t.Encoding != "flat_json" && env.Topics != nil {
		r.parts = newPartitionCounts(env.Topics)
		r.watchShrink = env.WatchShrink
	}
	return r, nil
}

// Start binds the listeners and serves in the background.
func (r *Receiver) Start(ctx context.Context) error {
	if r.http != nil {
		if err := r.http.srv.Start(ctx); err != nil {
			return err
		}
	}
	if r.grpc != nil {
		if err := r.grpc.srv.Start(ctx); err != nil {
			if r.http != nil {
				_ = r.http.srv.Shutdown(ctx)
			}
			return err
		}
	}
	if r.jaeger != nil && r.jaeger.own != nil {
		if err := r.jaeger.own.srv.Start(ctx); err != nil {
			if r.grpc != nil {
				_ = r.grpc.srv.Shutdown(ctx)
			}
			if r.http != nil {
				_ = r.http.srv.Shutdown(ctx)
			}
			return err
		}
	}
	// Last: a listener that failed to bind leaves no goroutine behind.
	if r.parts != nil {
		r.parts.start()
		if r.watchShrink != nil {
			// A topic deleted and created again with fewer partitions:
			// its count is dropped, whatever the delivery mode, and its
			// requests are written per trace until it is asked again.
			r.unwatch = r.watchShrink(r.parts.forget)
		}
	}
	return nil
}

// Shutdown stops accepting and waits for requests in progress until ctx ends.
func (r *Receiver) Shutdown(ctx context.Context) error {
	var errs []error
	if r.jaeger != nil && r.jaeger.own != nil {
		errs = append(errs, r.jaeger.own.srv.Shutdown(ctx))
	}
	if r.grpc != nil {
		errs = append(errs, r.grpc.srv.Shutdown(ctx))
	}
	if r.http != nil {
		errs = append(errs, r.http.srv.Shutdown(ctx))
	}
	if r.unwatch != nil {
		r.unwatch()
		r.unwatch = nil
	}
	if r.parts != nil {
		r.parts.close()
	}
	return errors.Join(errs...)
}

// HTTPAddr and GRPCAddr are the bound addresses.
func (r *Receiver) HTTPAddr() string { return r.http.srv.Addr() }

// GRPCAddr is the bound gRPC address.
func (r *Receiver) GRPCAddr() string { return r.grpc.srv.Addr() }

// outcome is what export tells the transport to answer.
type outcome struct {
	items    int   // items in the request
	rejected int   // items not delivered (partial success)
	err      error // nil, or the reason the request failed as a whole
	msg      string
}

// decodeError is a malformed request (400 / INVALID_ARGUMENT).
type decodeError struct{ err error }

func (e *decodeError) Error() string { return e.err.Error() }

// headerSource is a request's headers (http.Header, or a gRPC call's
// metadata as mdHeaders).
type headerSource interface{ Get(string) string }

// mdHeaders reads a gRPC call's metadata as headers. The metadata is
// copied (metadata.FromIncomingContext: every entry, 13 allocations a
// request, an eighth of a request's allocations over gRPC) at the first
// Get, not for every request: the default configuration reads no header;
// a {header.…} template or a tenant header reads one, per record, from
// the one copy. One request's goroutine uses it (no lock).
type mdHeaders struct {
	ctx    context.Context
	md     metadata.MD
	copied bool
}

// Get returns the first value of name.
func (m *mdHeaders) Get(name string) string {
	if !m.copied {
		m.md, _ = metadata.FromIncomingContext(m.ctx)
		m.copied = true
	}
	if v := m.md.Get(name); len(v) > 0 {
		return v[0]
	}
	return ""
}

// forbidden answers a request routed to a topic it may not write to.
func (r *Receiver) forbidden(m *receivermetrics.Metrics, err error) outcome {
	pe := &consumer.PermanentError{Reason: "topic_not_allowed", Msg: err.Error(), Err: err, Kind: consumer.KindForbidden}
	m.Error(pe.Reason)
	return outcome{err: pe}
}

// encodeFailed answers a request that ferry's decoder refused: over a
// per-request limit (413 naming the key) or malformed (400).
func (r *Receiver) encodeFailed(m *receivermetrics.Metrics, err error) outcome {
	var le *encoding.LimitError
	if errors.As(err, &le) {
		var pe *consumer.PermanentError
		if le.Items {
			pe = consumer.OverLimit("too_many_items", "the number of spans, log records or data points", int64(le.Limit), "receivers.otlp.max_items_per_request")
		} else {
			pe = consumer.OverLimit("expanded_too_large", "the bytes of the records this request becomes", int64(le.Limit), "receivers.otlp.max_expanded_bytes")
		}
		m.Error(pe.Reason)
		return outcome{err: pe}
	}
	m.Error("invalid_payload")
	return outcome{err: &decodeError{err}}
}

// export turns one request (protobuf bytes in raw, owned by the caller
// until export returns; export takes over and frees it) into a batch, hands
// it on and, when waiting, waits for Kafka. Its steps are the ones every
// receiver takes, in the same order: route (the topic check), decode and
// build the records, the gate's rate limit, charge memory, submit, answer.
func (r *Receiver) export(ctx context.Context, m *receivermetrics.Metrics, sig encoding.Signal, raw *httpbody.Buf, claims *token.Claims, header headerSource) outcome {
	// The request's buffers go back to the pool here unless they were
	// handed on (then the batch's completion returns them).
	var out *httpbody.Buf
	defer func() {
		r.body.Put(raw)
		r.body.Put(out)
	}()
	so := &r.sigs[sig]
	rt, fail := r.route(m, so, sig, claims, header)
	if fail != nil {
		return *fail
	}
	if r.attrs != nil && r.attrs.Active(sig, rt.vars.Tenant) {
		nb, fail := r.rewrite(m, sig, rt.vars.Tenant, raw)
		if fail != nil {
			return *fail
		}
		r.body.Put(raw)
		raw = nb
	}
	// The records' buffer is reserved before it is taken: under a full
	// budget a request is refused without making one. It starts at 1.5
	// times the request (the encoder grows it if need be, up to
	// max_expanded_bytes, unreserved until the queue charges what it
	// holds), small when the request itself is likely the one
	// record (out holds its key at most), and small as well when the
	// budget could never hold that much beside the request: it is not
	// told to retry what cannot fit, the queue refuses it if it does not.
	want := len(raw.B) + len(raw.B)/2
	if so.cfg.Encoding == "otlp_proto" && so.cfg.Partition == "none" || !r.body.CouldReserve(want, raw) {
		want = 4 << 10
	}
	var ok bool
	if out, ok = r.body.GetReserved(want); !ok {
		m.Error(consumer.ErrFull.Reason)
		return outcome{err: consumer.ErrFull}
	}
	enc, _ := r.encP.Get().(*encoding.Encoder)
	if enc == nil {
		enc = new(encoding.Encoder)
	}
	defer r.encP.Put(enc)
	enc.MaxRecordBytes = r.maxRecordBytes
	enc.MaxItems, enc.MaxBytes, enc.RecordCost = r.cfg.MaxItems, int(r.cfg.MaxExpandedBytes), record.Overhead
	enc.FlatExtra = rt.extra
	enc.Sample = r.sampler.Decide(sig, rt.vars.Tenant)
	enc.RecordSpans = r.spans != nil
	enc.Partitions = 0
	if sig == encoding.Traces && r.parts != nil && !rt.perResource && so.keyTmpl == nil {
		// A key template decides the partition by its key; a topic per
		// record is not one topic's count.
		enc.Partitions = r.parts.get(rt.topic)
	}
	// otlp_json goes through pdata (appendJSON): what that takes is
	// reserved while the encoder runs, as for the attribute processor.
	var decoding httpbody.Buf
	if so.cfg.Encoding == "otlp_json" {
		if o := r.reservePdataOutcome(m, sig, raw, &decoding); o != nil {
			return *o
		}
		defer r.body.Release(&decoding)
	}
	parts, buf, items, err := enc.Encode(sig, so.cfg, raw.B, out.B)
	r.body.Release(&decoding)
	out.B = buf
	if err != nil {
		return r.encodeFailed(m, err)
	}
	r.spans.Add(enc.Spans) // every span the encoder decoded, the sampled-out ones too
	r.sampler.Dropped(sig, rt.vars.Tenant, enc.Dropped)
	if items == 0 {
		return outcome{}
	}
	// A request refused before Submit leaves its batch to the garbage
	// collector; from Submit on, the batch's completion takes it back.
	b := r.batchP.Get().(*record.Batch)
	payload, fail := r.fill(m, so, &rt, claims, b, parts, raw, out)
	if fail != nil {
		return *fail
	}
	// Every record carries the headers to Kafka: the rate limit counts
	// them, and the memory charge (they are copied per record).
	hb := record.HeaderBytes(rt.headers)
	if err := r.gate.Limit(claims, items, payload+hb*len(parts)); err != nil {
		m.Error("rate_limited")
		return outcome{items: items, err: err}
	}
	if len(parts) == 1 && parts[0].Whole {
		// The request itself is the record's value: out holds at most its
		// key, so it goes back to the pool now instead of being held, and
		// counted against the queue, until Kafka's ack.
		if rec := &b.Records[0]; parts[0].KeyEnd > parts[0].KeyStart && so.keyTmpl == nil {
			rec.Key = bytes.Clone(rec.Key)
		}
		r.body.Put(out)
		out = nil
	}
	bufs := cap(raw.B)
	if out != nil {
		bufs += cap(out.B)
	}
	b.Charge(bufs, len(parts)*hb)
	reqBytes := len(raw.B)
	wait := r.cfg.WaitForAck
	// Once handed on, the batch may be complete and taken back for another
	// request before Submit returns: what the metrics need of it is read
	// first.
	var perTopic []topicRecord
	if rt.perResource {
		perTopic = make([]topicRecord, len(b.Records))
		for i := range b.Records {
			perTopic[i] = topicRecord{b.Records[i].Topic, b.Records[i].Size()}
		}
	}
	tk, err := r.submitter(m).Submit(ctx, b, wait, raw, out)
	raw, out, b = nil, nil, nil // the batch's now, whatever Submit answered
	if err != nil {
		m.Error(consumer.Reason(err))
		return outcome{items: items, err: err}
	}
	if rt.perResource {
		for _, t := range perTopic {
			m.Received(r.topics.Get(t.topic), 1, t.size)
		}
	} else {
		m.Received(r.topics.Get(rt.topic), len(parts), payload)
	}
	m.Items(sig.String(), items)
	m.ReqBytes.Observe(float64(reqBytes))
	if !wait {
		m.NoWait(len(parts))
		return outcome{items: items}
	}
	return r.answer(ctx, m, tk, items, len(parts), so.cfg.Encoding == "flat_json")
}

// route is where one request's records go and what they carry.
type route struct {
	topic       string // every record's, unless perResource
	perResource bool   // the topic template reads resource attributes: expanded per record
	headers     []record.Header
	extra       []byte // flat_json: the tenant's fields every event carries
	vars        routing.Vars
}

// route decides the request's topic before anything is decoded — the
// token's topic for this signal wins, then the template — and checks it
// against the receiver's and the token's topic patterns.
func (r *Receiver) route(m *receivermetrics.Metrics, so *signalOut, sig encoding.Signal, claims *token.Claims, header headerSource) (route, *outcome) {
	rt := route{topic: so.topic, headers: so.headers, vars: routing.Vars{Signal: sig.String()}}
	if !so.tmpl.Static() || so.keyTmpl != nil {
		rt.vars.Header = header.Get // only templates read headers
	}
	if claims != nil {
		rt.vars.Tenant, rt.vars.BusinessID, rt.vars.DataID = claims.App, claims.BusinessID, claims.DataIDs[sig]
		rt.headers, rt.extra = routing.TenantHeaders(so.headers, claims, int(sig))
	}
	switch {
	case claims != nil && claims.Topics[sig] != "":
		rt.topic = routing.Sanitize(claims.Topics[sig])
	case so.tmpl.PerResource():
		rt.perResource = true // decided per record, in fill
		return rt, nil
	case !so.tmpl.Static():
		t, err := so.tmpl.Expand(rt.vars)
		if err != nil {
			m.Error("no_route")
			return rt, &outcome{err: &decodeError{err}}
		}
		rt.topic = t
	}
	if err := r.allow.Check(rt.topic, claims); err != nil {
		o := r.forbidden(m, err)
		return rt, &o
	}
	return rt, nil
}

// rewrite applies the attribute processor to the request, into a new
// buffer. pdata decodes recursively with no depth bound: the request must
// pass ferry's own decoder (nesting and item count bounded) first.
func (r *Receiver) rewrite(m *receivermetrics.Metrics, sig encoding.Signal, tenant string, raw *httpbody.Buf) (*httpbody.Buf, *outcome) {
	if _, err := encoding.CountItems(sig, raw.B, r.cfg.MaxItems); err != nil {
		o := r.encodeFailed(m, err)
		return nil, &o
	}
	var decoding httpbody.Buf
	if o := r.reservePdataOutcome(m, sig, raw, &decoding); o != nil {
		return nil, o
	}
	defer r.body.Release(&decoding) // a panic in pdata too
	rewritten, _, err := r.attrs.Apply(sig, tenant, raw.B)
	r.body.Release(&decoding)
	if err != nil {
		m.Error("invalid_payload")
		return nil, &outcome{err: &decodeError{err}}
	}
	// Its room comes out of the request's own (raw is dropped after).
	nb, ok := r.body.GetMoved(raw, len(rewritten))
	if !ok {
		m.Error(consumer.ErrFull.Reason)
		return nil, &outcome{err: consumer.ErrFull}
	}
	nb.B = append(nb.B, rewritten...)
	return nb, nil
}

// reservePdata reserves into res what pdata takes decoding raw
// (encoding.DecodeCost: an empty attribute is 2 bytes on the wire and 226
// in pdata), for the time the caller hands raw to pdata. Errors: the
// request's walk failed (nested too deeply, malformed), a request that
// could never fit beside raw (413, not retryable), or consumer.ErrFull.
func (r *Receiver) reservePdata(sig encoding.Signal, raw, res *httpbody.Buf) error {
	cost, err := encoding.DecodeCost(sig, raw.B)
	if err != nil {
		return err
	}
	if lim := r.body.Limit(); lim > 0 && cost+raw.Reserved() > lim {
		return consumer.OverLimit("request_too_large", "bytes pdata would take decoding this request", lim, "queue.memory_limit; or smaller requests")
	}
	if !r.body.Reserve(res, cost) {
		return consumer.ErrFull
	}
	return nil
}

// reservePdataOutcome is reservePdata with its refusal as the request's
// outcome, counted: nil when the room is reserved.
func (r *Receiver) reservePdataOutcome(m *receivermetrics.Metrics, sig encoding.Signal, raw, res *httpbody.Buf) *outcome {
	err := r.reservePdata(sig, raw, res)
	var pe *consumer.PermanentError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, consumer.ErrFull):
		m.Error(consumer.ErrFull.Reason)
		return &outcome{err: err}
	case errors.As(err, &pe):
		m.Error(pe.Reason)
		return &outcome{err: err}
	}
	o := r.encodeFailed(m, err)
	return &o
}

// fill builds b's records from the encoder's parts (values and keys in out,
// or the request itself in raw), expanding per-record topics and keys, and
// returns the payload bytes (keys and values).
func (r *Receiver) fill(m *receivermetrics.Metrics, so *signalOut, rt *route, claims *token.Claims, b *record.Batch, parts []encoding.Part, raw, out *httpbody.Buf) (int, *outcome) {
	b.Records = slices.Grow(b.Records[:0], len(parts))[:len(parts)]
	now := time.Now()
	payload := 0
	for i, p := range parts {
		rec := &b.Records[i]
		rec.Topic, rec.Headers, rec.Timestamp = rt.topic, rt.headers, now
		if p.Whole {
			rec.Value = raw.B
		} else {
			rec.Value = out.B[p.ValStart:p.ValEnd:p.ValEnd]
		}
		if p.KeyEnd > p.KeyStart {
			rec.Key = out.B[p.KeyStart:p.KeyEnd:p.KeyEnd]
		}
		if p.Chosen {
			rec.SetPartition(p.Partition)
		}
		if rt.perResource || so.keyTmpl != nil {
			res := p.ResRaw
			rt.vars.Resource = func(k string) (string, bool) { return wire.LookupAttr(res, k) }
			if rt.perResource {
				t, err := so.tmpl.Expand(rt.vars)
				if err == nil {
					err = r.allow.Check(t, claims)
				}
				if err != nil {
					var na *routing.ErrTopicNotAllowed
					if errors.As(err, &na) {
						o := r.forbidden(m, err)
						return 0, &o
					}
					m.Error("no_route")
					return 0, &outcome{err: &decodeError{err}}
				}
				rec.Topic = t
			}
			if so.keyTmpl != nil {
				k, err := so.keyTmpl.ExpandRaw(rt.vars)
				if err != nil {
					m.Error("no_route")
					return 0, &outcome{err: &decodeError{err}}
				}
				rec.Key = []byte(k)
			}
		}
		payload += len(rec.Key) + len(rec.Value)
	}
	return payload, nil
}

// answer waits for Kafka's answer to a submitted request of items in n
// records. flat: one record is one item, so a record Kafka refused for
// good is a partial success, the others being in Kafka.
func (r *Receiver) answer(ctx context.Context, m *receivermetrics.Metrics, tk *submit.Ticket, items, n int, flat bool) outcome {
	failed, err := tk.Wait(ctx)
	if err == nil {
		return outcome{items: items}
	}
	if ctx.Err() != nil {
		m.Error("client_gone")
		return outcome{items: items, err: ctx.Err()}
	}
	m.Error(consumer.Reason(err))
	var pe *consumer.PermanentError
	if flat && errors.As(err, &pe) && failed < n {
		return outcome{items: items, rejected: failed, msg: err.Error()}
	}
	return outcome{items: items, err: err}
}

// topicRecord is a record's topic and size, for the metrics of a request
// routed per resource.
type topicRecord struct {
	topic string
	size  int
}

// submitter is the transport's hand-off (their metrics differ).
func (r *Receiver) submitter(m *receivermetrics.Metrics) *submit.Submitter {
	if m == r.grpcM {
		return r.grpcSub
	}
	for _, d := range r.doorSubs {
		if d.m == m {
			return d.sub
		}
	}
	return r.httpSub
}
