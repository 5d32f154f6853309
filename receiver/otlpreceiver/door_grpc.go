package otlpreceiver

// The Jaeger door's gRPC half: Jaeger's collector service,
// jaeger.api_v2.CollectorService/PostSpans, which Jaeger agents, the
// OpenTelemetry Collector's jaeger exporter and Jaeger's gRPC reporters send
// to a Jaeger collector's port 14250. With jaeger in receivers.otlp.doors it
// is served on the OTLP gRPC listener (grpc.listen) and, when
// jaeger_grpc_endpoint is set (127.0.0.1:14250 by default), on a listener of
// its own there: senders keep the address they had. Both are built by
// grpcServer.build, so they have the same TLS, message size bound,
// keepalive, stream and connection limits and memory reservations (the tap
// and the read's lease); the second serves this service alone.
//
// A request takes the OTLP gRPC request's steps: the token from its
// metadata, checked before the message is read; the read within
// max_request_bytes; then the walk (otlp/jaeger: every length and count
// bounded, nothing allocated), max_items_per_request on the spans it
// counted, and two reservations before the conversion starts, made out of
// the read's lease, whose bytes gRPC no longer holds: the converted
// request's buffer (ProtoAmplify × the message, at most max_request_bytes)
// and the conversion's transient Go heap (the walk's Peak: the largest
// chunk of spans decoded and translated at once). The OTLP request it
// becomes goes through export like any other (topic, encoding, sampling,
// span metrics, rate limit, delivery), and the answer's codes are OTLP
// gRPC's: INVALID_ARGUMENT for a malformed request, RESOURCE_EXHAUSTED
// without RetryInfo past a bound, with RetryInfo when ferry is busy,
// UNAVAILABLE while Kafka is, UNAUTHENTICATED without a valid token.
// PostSpansResponse is empty; records Kafka refused for good under
// flat_json are said in the trailer x-ferry-rejected.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/door"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/jaeger"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/server"
)

// jaegerGRPCName labels the service's receiver metrics, and its own
// listener's connection metrics and log lines.
const jaegerGRPCName = "jaeger_grpc"

// jaegerPostSpans is the method's full name, as gRPC's tap sees it.
const jaegerPostSpans = "/" + jaeger.ProtoService + "/" + jaeger.ProtoMethod

// jaegerGRPC is the service's state: its metrics, and its own listener
// (nil when jaeger_grpc_endpoint is empty).
type jaegerGRPC struct {
	m       *receivermetrics.Metrics
	dropped *prometheus.CounterVec // ferry_door_dropped_items_total, the HTTP doors' too
	own     *grpcServer
}

// newJaegerGRPC sets the service up when the jaeger door is open; nil
// otherwise.
func newJaegerGRPC(r *Receiver) *jaegerGRPC {
	if !slices.Contains(r.cfg.Doors, "jaeger") {
		return nil
	}
	j := &jaegerGRPC{m: receivermetrics.New(r.set.Registry, jaegerGRPCName), dropped: droppedItems(r.set.Registry)}
	r.doorSubs = append(r.doorSubs, doorSub{j.m, &submit.Submitter{Next: r.next, Bodies: r.body, AckTimeout: r.cfg.AckTimeout, M: j.m, Recycle: r.recycle}})
	if r.cfg.jaegerGRPCOwn() {
		g := &grpcServer{r: r, jaegerOnly: true, readWait: grpcReadWait}
		g.srv = server.NewGRPC(jaegerGRPCName, r.cfg.JaegerGRPCEndpoint, r.cfg.GRPC.MaxConnections, r.cfg.GRPC.TLS, g.build, r.set.Logger, r.set.Registry)
		j.own = g
	}
	return j
}

// JaegerGRPCAddr is the bound address of the Jaeger gRPC listener of its
// own; empty when there is none.
func (r *Receiver) JaegerGRPCAddr() string {
	if r.jaeger == nil || r.jaeger.own == nil {
		return ""
	}
	return r.jaeger.own.srv.Addr()
}

// registerJaeger adds the Jaeger collector service to a gRPC server built
// by g, when the door is open.
func (g *grpcServer) registerJaeger(gs *grpc.Server) {
	if g.r.jaeger == nil {
		return
	}
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: jaeger.ProtoService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: jaeger.ProtoMethod,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				return g.guarded(g.r.jaeger.m, func() (any, error) { return g.postSpans(ctx, dec) })
			},
		}},
	}, struct{}{})
}

// fromLease makes n bytes of b's reservation out of the read's lease (what
// it holds beyond gRPC's buffers, freed once the message was copied), and
// reserves what the lease lacks; false if that does not fit.
func (g *grpcServer) fromLease(ctx context.Context, b *httpbody.Buf, n int64) bool {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		return g.r.body.Move(l.buf, b, n)
	}
	return g.r.body.Reserve(b, n)
}

// getFromLease is a buffer of room for n bytes, its capacity reserved
// (from the request's lease first) before it is taken.
func (g *grpcServer) getFromLease(ctx context.Context, n int) (*httpbody.Buf, bool) {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		return g.r.body.GetMoved(l.buf, n)
	}
	return g.r.body.GetReserved(n)
}

func (g *grpcServer) postSpans(ctx context.Context, dec func(any) error) (any, error) {
	r := g.r
	m := r.jaeger.m
	defer endLease(ctx)
	in, claims, _, err := g.read(ctx, m, dec, false)
	if err != nil {
		return nil, err
	}
	refuse := func(a answer) (any, error) {
		m.Error(a.reason)
		m.RequestCode(a.code.String())
		return nil, retryStatus(a)
	}
	var c jaeger.ProtoCounts
	_, werr := guardConvert(r.set.Logger, jaegerGRPCName, func() ([]byte, error) {
		var err error
		c, err = jaeger.WalkProto(in.B)
		return nil, err
	})
	if werr != nil {
		r.body.Put(in)
		if errors.Is(werr, errConvertPanic) {
			return refuse(answer{code: codes.Internal, reason: "internal_error", msg: jaegerGRPCName + ": " + werr.Error()})
		}
		err := jaeger.ProtoWalkError(werr, ErrDoorTooLarge)
		if doorTooLarge(err) {
			return refuse(answer{code: codes.ResourceExhausted, reason: "request_too_large", msg: jaegerGRPCName + ": " + werr.Error()})
		}
		return refuse(answer{code: codes.InvalidArgument, reason: "invalid_payload", msg: jaegerGRPCName + ": " + err.Error()})
	}
	if c.Spans > r.cfg.MaxItems {
		r.body.Put(in)
		return refuse(classify(consumer.OverLimit("too_many_items", "the number of spans, log records or data points", int64(r.cfg.MaxItems), "receivers.otlp.max_items_per_request")))
	}
	limit := min(int(r.cfg.MaxRequestBytes), jaeger.ProtoAmplify*len(in.B)+4096)
	if need := int64(cap(in.B)+limit) + c.Peak; r.body.Budgeted() && need > r.body.Limit() {
		// It could never fit: refused for good, not to be retried.
		r.body.Put(in)
		return refuse(answer{code: codes.ResourceExhausted, reason: "request_too_large",
			msg: fmt.Sprintf("%s: converting this request takes %d bytes of memory (the message, its OTLP and %d spans decoded at once), more than queue.memory_limit (%d)",
				jaegerGRPCName, need, c.Spans, r.body.Limit())})
	}
	out, ok := g.getFromLease(ctx, limit)
	if !ok {
		r.body.Put(in)
		return refuse(classify(consumer.ErrFull))
	}
	heap := r.body.Get(0) // the conversion's transient Go heap: a reservation only
	if !g.fromLease(ctx, heap, c.Peak) {
		r.body.Put(in)
		r.body.Put(out)
		r.body.Put(heap)
		return refuse(classify(consumer.ErrFull))
	}
	endLease(ctx)
	var st door.Stats
	pb, err := guardConvert(r.set.Logger, jaegerGRPCName, func() ([]byte, error) {
		return jaeger.ConvertWalked(&c, out.B[:0], limit, &st, ErrDoorTooLarge)
	})
	r.body.Put(in)
	r.body.Put(heap)
	if err == nil && (len(pb) > limit || len(pb) > cap(out.B)) {
		err = fmt.Errorf("%w (%d bytes converted, %d allowed)", ErrDoorTooLarge, len(pb), limit)
	}
	if err != nil {
		r.body.Put(out)
		if doorTooLarge(err) {
			return refuse(answer{code: codes.ResourceExhausted, reason: "request_too_large",
				msg: fmt.Sprintf("%s: %v (%d× the message, at most receivers.otlp.max_request_bytes)", jaegerGRPCName, err, jaeger.ProtoAmplify)})
		}
		if errors.Is(err, errConvertPanic) {
			return refuse(answer{code: codes.Internal, reason: "internal_error", msg: jaegerGRPCName + ": " + err.Error()})
		}
		return refuse(answer{code: codes.InvalidArgument, reason: "invalid_payload", msg: jaegerGRPCName + ": " + err.Error()})
	}
	out.B = pb
	o := r.export(ctx, m, encoding.Traces, out, claims, &mdHeaders{ctx: ctx})
	if o.err != nil {
		a := classify(o.err)
		m.RequestCode(a.code.String())
		return nil, retryStatus(a)
	}
	m.RequestCode(codes.OK.String())
	if o.rejected > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ferry-rejected", strconv.Itoa(o.rejected)))
	}
	if n := st.Total(); n > 0 {
		for reason, k := range st.Dropped {
			if k > 0 {
				r.jaeger.dropped.WithLabelValues(jaegerGRPCName, door.Reason(reason).String()).Add(float64(k))
			}
		}
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ferry-dropped", strconv.Itoa(n)))
	}
	return &rawMsg{}, nil // an empty PostSpansResponse
}
