package otlpreceiver

import (
	"errors"
	"fmt"
	"runtime/debug"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/receiver/httpbody"
)

// tokenAttribute is the resource attribute a token may come in.
const tokenAttribute = "ferry.token"

// ReasonConflicting: the request's resources carry different tokens.
const ReasonConflicting = "conflicting"

// resourceAuth completes authentication for a receiver whose sources include
// "resource": the token from headers/metadata if any, else the one every
// token-carrying resource agrees on. Whatever the token's source, the
// attribute is removed before export, so it never reaches Kafka.
//
// A panic in the walk or in pdata (a bug a sender's bytes reached) refuses
// the request (500 / INTERNAL, internal_error) and hands back the body the
// caller still owns, so its reservation is given back as for any refusal.
func (r *Receiver) resourceAuth(headerTok string, sig encoding.Signal, body *httpbody.Buf) (_ *token.Claims, held *httpbody.Buf, err error) {
	defer func() {
		if v := recover(); v != nil {
			r.set.Logger.Error("a request's resource token check panicked; the request is refused", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			held, err = body, &consumer.PermanentError{Reason: "internal_error", Msg: errConvertPanic.Error(), Err: errConvertPanic}
		}
	}()
	vals, present, err := wire.ResourceAttribute(body.B, tokenAttribute)
	if err != nil {
		return nil, body, &decodeError{err}
	}
	tok := headerTok
	if tok == "" && len(vals) > 0 {
		tok = vals[0]
		for _, v := range vals[1:] {
			if v != tok {
				r.gate.Refused(ReasonConflicting)
				return nil, body, &token.Error{Reason: ReasonConflicting}
			}
		}
	}
	claims, err := r.gate.Check(tok)
	if err != nil {
		return nil, body, err
	}
	if present > 0 {
		// Through pdata, which recurses without bound: ferry's decoder
		// checks the whole request (nesting, item count) first.
		if _, err := encoding.CountItems(sig, body.B, r.cfg.MaxItems); err != nil {
			var le *encoding.LimitError
			if errors.As(err, &le) {
				return nil, body, consumer.OverLimit("too_many_items", "the number of spans, log records or data points", int64(le.Limit), "receivers.otlp.max_items_per_request")
			}
			return nil, body, &decodeError{err}
		}
		// pdata's decoding reserved while it runs, as the rewrite's.
		var decoding httpbody.Buf
		if err := r.reservePdata(sig, body, &decoding); err != nil {
			var pe *consumer.PermanentError
			if errors.Is(err, consumer.ErrFull) || errors.As(err, &pe) {
				return nil, body, err
			}
			return nil, body, &decodeError{err}
		}
		defer r.body.Release(&decoding) // a panic in pdata too (recovered above)
		stripped, err := stripResourceAttribute(sig, body.B, tokenAttribute)
		r.body.Release(&decoding)
		if err != nil {
			return nil, body, &decodeError{err}
		}
		// Room from the request's own reservation first (the stripped
		// copy is smaller), before the buffer is taken.
		nb, ok := r.body.GetMoved(body, len(stripped))
		if !ok {
			return nil, body, consumer.ErrFull
		}
		nb.B = append(nb.B, stripped...)
		r.body.Put(body)
		body = nb
	}
	return claims, body, nil
}

// stripResourceAttribute removes every attribute named key from every
// resource, whatever its type and however often it is repeated (pdata's
// Remove takes only the first: a resource carrying the key twice kept the
// second, the real token, all the way to Kafka). Through pdata: only
// requests that carry the attribute pay for it.
func stripResourceAttribute(sig encoding.Signal, raw []byte, key string) ([]byte, error) {
	drop := func(m pcommon.Map) { m.RemoveIf(func(k string, _ pcommon.Value) bool { return k == key }) }
	switch sig {
	case encoding.Traces:
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(raw)
		if err != nil {
			return nil, err
		}
		for i := 0; i < td.ResourceSpans().Len(); i++ {
			drop(td.ResourceSpans().At(i).Resource().Attributes())
		}
		return (&ptrace.ProtoMarshaler{}).MarshalTraces(td)
	case encoding.Logs:
		ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(raw)
		if err != nil {
			return nil, err
		}
		for i := 0; i < ld.ResourceLogs().Len(); i++ {
			drop(ld.ResourceLogs().At(i).Resource().Attributes())
		}
		return (&plog.ProtoMarshaler{}).MarshalLogs(ld)
	default:
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(raw)
		if err != nil {
			return nil, err
		}
		for i := 0; i < md.ResourceMetrics().Len(); i++ {
			drop(md.ResourceMetrics().At(i).Resource().Attributes())
		}
		return (&pmetric.ProtoMarshaler{}).MarshalMetrics(md)
	}
}
