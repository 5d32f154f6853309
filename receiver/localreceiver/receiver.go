// Package localreceiver owns the local record protocol's agent side
// (docs/protocol.md): a Unix socket and a TCP listener on which programs on
// this host send batches of records, each with its own topic, key, value,
// headers and timestamp, in pipelined frames answered one by one when the
// records are durable (Kafka's acknowledgement, or the spool's fsync).
//
// A connection is read by one goroutine and written by another. A produce
// frame's size is checked from its header before anything is read, its
// memory reserved from the shared budget before its body is read (no room:
// the frame is answered retryable without being decoded), and its records
// are slices of that one buffer up to the Kafka client. Frames not yet
// answered count against max_inflight_bytes; past it the reader stops
// reading the connection, so a fast client is slowed by TCP, not refused.
// A frame that breaks the protocol is answered with an Error frame and the
// connection is closed: after a framing error nothing later on it can be
// trusted.
//
// A connection whose first bytes are not the preamble is in text mode: one
// "topic<TAB>value" line per record, answered "OK" or "ERR reason message"
// per line, or not at all after a "#noreply" line.
package localreceiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// ServerName is what the agent calls itself in HelloOK.
var ServerName = "ferry"

// Receiver serves the local record protocol.
type Receiver struct {
	cfg     Config // with derived defaults
	given   Config // as configured, for Reload
	set     telemetry.Settings
	log     *telemetry.Limited
	m       *receivermetrics.Metrics
	body    *httpbody.Reader
	gate    *auth.Gate
	allow   *routing.Allow
	sub     *submit.Submitter
	limits  protocol.Limits
	socket  *server.Stream
	tcp     *server.Stream
	batchP  sync.Pool
	recordP sync.Pool // *protocol.Records
	// noReceipts: why no receipt can be given (exporter.kafka.acks
	// none); empty when they can.
	noReceipts string
	// idem remembers the sequences of version 3 producers accepted into
	// the spool (nil unless delivery mode spool: idempotence is not
	// granted).
	idem *idempotency.Store
	// answers is what connections hold of answers not yet read.
	answers *server.Answers
}

// New builds the receiver from a configuration and everything it needs:
// env.Next receives the batches, env.Bodies is the budget frames reserve
// from before they are read.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	given := cfg
	cfg = cfg.resolved(env.Bounds)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	set := env.Set
	r := &Receiver{cfg: cfg, given: given, set: set, body: httpbody.NewReader(int64(cfg.MaxFrameBytes)), gate: env.Pre.Gate(cfg.Auth),
		noReceipts: env.NoReceipts, idem: env.Idem}
	if env.Bodies != nil {
		r.body.SetBudget(env.Bodies)
	}
	r.log = telemetry.NewLimited(set.Logger.With("component", "receiver/local"), 10*time.Second)
	r.m = receivermetrics.New(set.Registry, "local")
	r.answers = server.NewAnswers(server.AnswersRoom(env.Bounds.MemoryLimit), r.m.UnreadAnswers())
	r.allow, _ = routing.NewAllow(cfg.Topics) // checked by Validate
	r.limits = protocol.DefaultLimits
	r.limits.MaxFrameBytes, r.limits.MaxRecords = int(cfg.MaxFrameBytes), cfg.MaxRecords
	r.batchP.New = func() any { return new(record.Batch) }
	r.recordP.New = func() any { return new(protocol.Records) }
	r.sub = &submit.Submitter{Next: env.Next, Bodies: r.body, AckTimeout: cfg.AckTimeout, M: r.m,
		Recycle: func(b *record.Batch) { b.Reset(); r.batchP.Put(b) }}
	if cfg.Socket != "" {
		mode, _ := server.ParseMode(cfg.SocketMode)
		r.socket = server.NewStream("local_socket", server.StreamConfig{Network: "unix", Addr: cfg.Socket, SocketMode: mode,
			MaxConnections: cfg.MaxConnections}, r.serve, set.Logger, set.Registry)
	}
	if cfg.Listen != "" {
		r.tcp = server.NewStream("local_tcp", server.StreamConfig{Network: "tcp", Addr: cfg.Listen,
			MaxConnections: cfg.MaxConnections, TLS: cfg.TLS}, r.serve, set.Logger, set.Registry)
	}
	return r, nil
}

// Start binds the listeners.
func (r *Receiver) Start(ctx context.Context) error {
	if r.socket != nil {
		if err := r.socket.Start(ctx); err != nil {
			return err
		}
	}
	if r.tcp != nil {
		if err := r.tcp.Start(ctx); err != nil {
			if r.socket != nil {
				_ = r.socket.Shutdown(ctx)
			}
			return err
		}
	}
	return nil
}

// Shutdown stops accepting; connections stop reading, answer what they
// have in flight and close, within ctx.
func (r *Receiver) Shutdown(ctx context.Context) error {
	var errs []error
	if r.tcp != nil {
		errs = append(errs, r.tcp.Shutdown(ctx))
	}
	if r.socket != nil {
		errs = append(errs, r.socket.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// SocketPath is the Unix socket ("" if none).
func (r *Receiver) SocketPath() string {
	if r.socket == nil {
		return ""
	}
	return r.cfg.Socket
}

// TCPAddr is the bound TCP address ("" if none).
func (r *Receiver) TCPAddr() string {
	if r.tcp == nil {
		return ""
	}
	return r.tcp.Addr()
}

// serve runs one connection.
func (r *Receiver) serve(ctx context.Context, c net.Conn) {
	var pre [4]byte
	// With a token required, nothing may be sent before it for long: a
	// hello or a #token line comes at once.
	first := r.cfg.IdleTimeout
	if r.gate.Enabled() {
		first = min(first, helloTimeout)
	}
	_ = c.SetReadDeadline(time.Now().Add(first))
	n, err := readFull(c, pre[:])
	if err != nil {
		if n > 0 {
			// A text client that sent less than 4 bytes and stopped.
			r.text(ctx, c, pre[:n])
		}
		return
	}
	if pre[0] == 'F' && pre[1] == 'R' && pre[2] == 'Y' && protocol.Spoken(pre[3]) {
		// Each connection is served in the version its preamble names: a
		// version 1 client gets exactly version 1.
		cn := newConn(r, ctx, c)
		cn.version = uint16(pre[3])
		cn.run()
		return
	}
	if pre[0] == 'F' && pre[1] == 'R' && pre[2] == 'Y' {
		r.m.Error("unsupported_version")
		_, _ = c.Write(protocol.AppendError(nil, 0, "unsupported_version",
			fmt.Sprintf("protocol version %d is not supported; this agent speaks versions 1 to %d", pre[3], protocol.Version)))
		return
	}
	r.text(ctx, c, pre[:])
}

// outcome turns a pipeline error into a protocol status.
func outcome(err error) (status byte, reason, msg string, after time.Duration) {
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		return protocol.StatusRetryable, re.Reason, re.Msg, max(re.After, time.Second)
	}
	var pe *consumer.PermanentError
	if errors.As(err, &pe) {
		return protocol.StatusPermanent, pe.Reason, pe.Msg, 0
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return protocol.StatusRetryable, "shutting_down", "ferry is stopping; send again", time.Second
	}
	return protocol.StatusRetryable, "internal", err.Error(), time.Second
}

func (r *Receiver) logWarn(reason, msg string, args ...any) {
	r.log.Log(slog.LevelWarn, reason, msg, args...)
}
