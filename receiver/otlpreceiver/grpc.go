package otlpreceiver

import (
	"context"
	"fmt"
	"math/bits"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // OTLP/gRPC clients may gzip
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/server"
)

// The gRPC services are registered with hand-written descriptors and a codec
// that hands ferry the raw request bytes: decoding into generated structs or
// pdata would cost what the wire decoder exists to avoid.

type grpcServer struct {
	r   *Receiver
	srv *server.GRPC
	// jaegerOnly: the Jaeger door's own listener (door_grpc.go), which
	// serves its service alone.
	jaegerOnly bool
	// readWait is grpcReadWait (a test whose claim is room, not speed,
	// lengthens it on its own server).
	readWait time.Duration
}

// rawMsg carries a request's bytes in (copied once out of gRPC's buffers into
// a pooled buffer) and a response's bytes out.
type rawMsg struct {
	reader *httpbody.Reader
	// lease: the reservation the request took before its message was
	// read; the message's buffer takes its reservation from it.
	lease *lease
	buf   *httpbody.Buf
	out   []byte
	// noRoom: the message did not fit in the memory budget. It is not an
	// Unmarshal error because gRPC would turn that into INTERNAL, which
	// OTLP exporters do not retry: the handler answers RESOURCE_EXHAUSTED
	// with RetryInfo instead.
	noRoom bool
}

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMsg)
	if !ok {
		return nil, fmt.Errorf("otlp grpc: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.out)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMsg)
	if !ok {
		return fmt.Errorf("otlp grpc: cannot unmarshal into %T", v)
	}
	n := data.Len()
	// Room first, then the buffer: a message refused for room takes none.
	var fits bool
	if m.lease != nil {
		m.buf, fits = m.reader.GetMoved(m.lease.buf, n)
	} else {
		m.buf, fits = m.reader.GetReserved(n)
	}
	if !fits {
		m.buf, m.noRoom = nil, true
		return nil
	}
	m.buf.B = m.buf.B[:n]
	data.CopyTo(m.buf.B)
	return nil
}

// framePool is the pool gRPC reads request frames (and decompresses gzip
// bodies) into. gRPC's own clears every buffer it hands out, though each one
// is then filled by a read before anything looks at it, and only the bytes
// read are ever used: at 500 requests/s of 100 KB that clearing was 1% of
// the agent's CPU (an eighth of what gRPC costs ferry beyond OTLP/HTTP).
// Buffers come in powers of two from 256 B to 1 MiB, as in gRPC's pool;
// larger ones are not pooled.
type framePool struct {
	tiers [framePoolMaxExp - framePoolMinExp + 1]sync.Pool
}

const framePoolMinExp, framePoolMaxExp = 8, 20

var _ mem.BufferPool = (*framePool)(nil)

func (p *framePool) Get(n int) *[]byte {
	e := max(bits.Len(uint(max(n, 1)-1)), framePoolMinExp)
	if e > framePoolMaxExp {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[e-framePoolMinExp].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<e)
	return &b
}

func (p *framePool) Put(b *[]byte) {
	// Only this pool's sizes go back: a buffer of any other capacity came
	// from elsewhere and could be too small for its tier.
	c := cap(*b)
	if c < 1<<framePoolMinExp || c > 1<<framePoolMaxExp || c&(c-1) != 0 {
		return
	}
	p.tiers[bits.Len(uint(c))-1-framePoolMinExp].Put(b)
}

// grpcStreamWorkers is how many requests are served on reused goroutines:
// enough for the answers that wait on Kafka at a few thousand requests/s.
const grpcStreamWorkers = 32

func newGRPCServer(r *Receiver) *grpcServer {
	g := &grpcServer{r: r, readWait: grpcReadWait}
	g.srv = server.NewGRPC("otlp_grpc", r.cfg.GRPC.Listen, r.cfg.GRPC.MaxConnections, r.cfg.GRPC.TLS, g.build, r.set.Logger, r.set.Registry)
	return g
}

// build is the gRPC server, built when the listener starts (its stream
// workers are goroutines that must not outlive an agent that failed to
// start).
func (g *grpcServer) build() *grpc.Server {
	r := g.r
	gs := grpc.NewServer(
		grpc.ForceServerCodecV2(rawCodec{}),
		// Enforced on the decompressed size too, so a gzip bomb stops here.
		grpc.MaxRecvMsgSize(int(r.cfg.MaxRequestBytes)),
		grpc.MaxConcurrentStreams(max(1, r.cfg.GRPC.MaxConcurrentStreams)),
		// gRPC's own bound is 16 MiB of metadata per stream, outside the
		// memory budget: 256 admitted streams could hold 4 GiB.
		grpc.MaxHeaderListSize(uint32(r.cfg.GRPC.MaxHeaderBytes)),
		// Requests run on long-lived goroutines whose stacks have already
		// grown to what the export path needs, instead of a new goroutine per
		// request growing its stack again each time (5% of the CPU at 500
		// requests/s). A request that finds every worker busy (they wait for
		// Kafka's ack) still gets a goroutine of its own.
		grpc.NumStreamWorkers(grpcStreamWorkers),
		experimental.BufferPool(&framePool{}),
		// Flow-control windows of a whole request: at the default 64 KiB
		// (grown by ping-measured estimates) a 100 KiB request costs the
		// server two or three extra writes of window updates and pings. The
		// memory is unchanged: a stream's unread bytes are within the
		// window its tap reserved, and a refused stream's are dropped as
		// they arrive.
		grpc.InitialWindowSize(grpcStreamWindow),
		grpc.InitialConnWindowSize(4<<20),
		// The memory bound (lease below): a request reserves what gRPC may
		// buffer for it unread when its headers arrive, and the largest
		// message before it is read; the connections × streams a client
		// opens cannot hold more than the budget.
		grpc.InTapHandle(g.tap),
		grpc.StatsHandler(leaseEnder{}),
		// A client may not ping more often than every 10 s (a ping flood
		// costs CPU and writes); idle connections are closed after 2 min.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 2 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second}),
	)
	g.registerJaeger(gs)
	if g.jaegerOnly {
		return gs
	}
	for _, s := range []struct {
		service string
		sig     encoding.Signal
	}{
		{"opentelemetry.proto.collector.trace.v1.TraceService", encoding.Traces},
		{"opentelemetry.proto.collector.metrics.v1.MetricsService", encoding.Metrics},
		{"opentelemetry.proto.collector.logs.v1.LogsService", encoding.Logs},
	} {
		sig := s.sig
		gs.RegisterService(&grpc.ServiceDesc{
			ServiceName: s.service,
			HandlerType: (*any)(nil),
			Methods: []grpc.MethodDesc{{
				MethodName: "Export",
				Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
					return g.guarded(g.r.grpcM, func() (any, error) { return g.export(ctx, sig, dec) })
				},
			}},
		}, struct{}{})
	}
	return gs
}

// A request's memory is reserved in two steps, because gRPC reads a
// message's 5-byte length and the whole message in one call (the handler's
// dec), so its size is unknown until its memory is spent:
//
//   - when its headers arrive (the tap), the stream window: until the
//     handler reads, flow control lets the client send gRPC no more than
//     that for the stream. Refused at once (RESOURCE_EXHAUSTED with
//     RetryInfo) when it does not fit below the limit less the second
//     step, so that arrivals never take the room reads need.
//   - in the handler, after the token check and before dec reads the
//     message, the rest of readBytes (twice max_request_bytes), waiting up
//     to grpcReadWait for room before refusing the same way. Once read,
//     the message's buffer takes its real size out of it, and the rest
//     goes back when dec returns (gRPC has freed its buffers by then).
//
// Reserving max_request_bytes at the tap, as ferry once did, refused a
// burst of small requests past memory_limit / max_request_bytes arriving
// at once (32 with the defaults), though its bytes fitted many times over:
// 23% of requests retried under a closed loop of 64 in flight.
const (
	grpcStreamWindow = 1 << 20
	// grpcReadWait is how long a request waits for room to read its
	// message: enough for the reads ahead of it to finish (each holds its
	// readBytes only while its message arrives), short enough
	// that a budget taken by data waiting for Kafka answers quickly.
	grpcReadWait = 100 * time.Millisecond
)

// readBytes is what reading one message may hold at its peak: gRPC's own
// buffers of it (the compressed bytes and what they decompress to, each
// at most max_request_bytes, or the message as sent) until they are freed
// after the copy into ferry's buffer, and that copy. Counting the copy
// alone let 48 clients sending 31 MiB messages at once hold 150 MiB with a
// memory_limit of 64 MiB (hostile/).
func (g *grpcServer) readBytes() int64 { return 2 * int64(g.r.cfg.MaxRequestBytes) }

// lease is a request's reservation taken before its message was read.
type lease struct {
	reader *httpbody.Reader
	buf    *httpbody.Buf
	once   sync.Once
}

func (l *lease) end() { l.once.Do(func() { l.reader.Put(l.buf) }) }

type leaseKey struct{}

func (g *grpcServer) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	rd := g.r.body
	if !rd.Budgeted() {
		return ctx, nil
	}
	// A refusal is counted under the service's receiver: Jaeger's
	// (door_grpc.go) on either listener, OTLP's otherwise.
	m := g.r.grpcM
	if j := g.r.jaeger; j != nil && info != nil && info.FullMethodName == jaegerPostSpans {
		m = j.m
	}
	// The first step stays below the room one request's second step needs:
	// streams that arrived cannot take the budget their own reads wait for.
	first := min(int64(g.r.cfg.MaxRequestBytes), grpcStreamWindow)
	l := &lease{reader: rd, buf: rd.Get(0)}
	if !rd.ReserveBelow(l.buf, first, rd.Limit()-(g.readBytes()-first)) {
		rd.Put(l.buf)
		m.Error(consumer.ErrFull.Reason)
		m.RequestCode(codes.ResourceExhausted.String())
		return nil, retryStatus(classify(consumer.ErrFull))
	}
	return context.WithValue(ctx, leaseKey{}, l), nil
}

// endLease gives back a request's read reservation (its message now holds
// its own); also called at the end of every RPC, for those that never
// reached the handler.
func endLease(ctx context.Context) {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		l.end()
	}
}

// leaseEnder ends leases when an RPC ends, however it ends.
type leaseEnder struct{}

func (leaseEnder) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (leaseEnder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); ok {
		endLease(ctx)
	}
}
func (leaseEnder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (leaseEnder) HandleConn(context.Context, stats.ConnStats)                       {}

// retryStatus is a's gRPC status, with RetryInfo when it may be retried.
func retryStatus(a answer) error {
	st := status.New(a.code, a.msg)
	if a.retryAfter > 0 {
		if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.retryAfter)}); err == nil {
			st = d
		}
	}
	return st.Err()
}

// unauthenticated answers a request without a valid token.
func unauthenticated(m *receivermetrics.Metrics, err error) error {
	m.Error("unauthenticated")
	m.RequestCode(codes.Unauthenticated.String())
	return status.Error(codes.Unauthenticated, err.Error())
}

// read is what a request does before its message is looked at, whatever
// the service: the token in its metadata (unless laterToken: OTLP may find
// it in the resource), the memory to read the message, the message. It
// returns the message (the caller's to Put), or the answer to give,
// counted. The read's lease is not ended here: the caller ends it when it
// no longer needs it (endLease).
func (g *grpcServer) read(ctx context.Context, m *receivermetrics.Metrics, dec func(any) error, laterToken bool) (*httpbody.Buf, *token.Claims, string, error) {
	var claims *token.Claims
	var headerTok string
	if g.r.gate.Enabled() {
		headerTok = g.r.gate.GRPCToken(ctx)
		if !laterToken {
			var aerr error
			if claims, aerr = g.r.gate.Check(headerTok); aerr != nil {
				return nil, nil, "", unauthenticated(m, aerr)
			}
		}
	}
	in := &rawMsg{reader: g.r.body}
	in.lease, _ = ctx.Value(leaseKey{}).(*lease)
	if l := in.lease; l != nil {
		rest := g.readBytes() - l.buf.Reserved()
		if rest > 0 && !g.r.body.ReserveWait(ctx, l.buf, rest, time.Now().Add(g.readWait)) {
			in.noRoom = true
		}
	}
	var err error
	if !in.noRoom {
		err = dec(in)
	}
	if err == nil && in.noRoom {
		a := classify(consumer.ErrFull)
		m.Error(a.reason)
		m.RequestCode(a.code.String())
		return nil, nil, "", retryStatus(a)
	}
	if err != nil {
		if in.buf != nil {
			g.r.body.Put(in.buf)
		}
		m.Error("invalid_payload")
		m.RequestCode(codes.InvalidArgument.String())
		return nil, nil, "", status.Error(codes.InvalidArgument, err.Error())
	}
	return in.buf, claims, headerTok, nil
}

// guarded runs a gRPC handler, ending a panic (a bug reached by a client's
// bytes) as its request's INTERNAL status, counted (internal_error) and
// logged with its stack. gRPC recovers no handler: unguarded, one request
// would end the agent, and with it every client's requests in flight.
// What the request had reserved may stay reserved; the door conversions,
// where a sender's bytes drive the most code, give theirs back
// (guardConvert).
func (g *grpcServer) guarded(m *receivermetrics.Metrics, h func() (any, error)) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			m.Error("internal_error")
			m.RequestCode(codes.Internal.String())
			g.r.set.Logger.Error("a gRPC request's handling panicked; the request is refused", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "ferry could not handle this request (a ferry bug, logged with its stack)")
		}
	}()
	return h()
}

// onExport, set by a test, runs first in every OTLP gRPC export: a panic
// from it reaches the handler's guard the way a bug's would.
var onExport atomic.Pointer[func()]

func (g *grpcServer) export(ctx context.Context, sig encoding.Signal, dec func(any) error) (any, error) {
	if f := onExport.Load(); f != nil {
		(*f)()
	}
	m := g.r.grpcM
	buf, claims, headerTok, err := g.read(ctx, m, dec, g.r.gate.WantsResource())
	endLease(ctx)
	if err != nil {
		return nil, err
	}
	if g.r.gate.WantsResource() {
		var aerr error
		if claims, buf, aerr = g.r.resourceAuth(headerTok, sig, buf); aerr != nil {
			g.r.body.Put(buf)
			if refusedPayload(aerr) {
				a := classify(aerr)
				m.Error(a.reason)
				m.RequestCode(a.code.String())
				return nil, retryStatus(a) // RetryInfo when retryable (no room): else exporters drop it
			}
			return nil, unauthenticated(m, aerr)
		}
	}
	o := g.r.export(ctx, m, sig, buf, claims, &mdHeaders{ctx: ctx})
	if o.err != nil {
		a := classify(o.err)
		m.RequestCode(a.code.String())
		return nil, retryStatus(a)
	}
	m.RequestCode(codes.OK.String())
	return &rawMsg{out: exportResponse(o)}, nil
}
