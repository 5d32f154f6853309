// Package syslogreceiver receives syslog (receivers.syslog): RFC 5424 and
// RFC 3164 (BSD) messages over UDP (RFC 5426), TCP (RFC 6587: octet
// counting or LF framing, decided per frame as rsyslog does), TLS (RFC
// 5425) and a Unix datagram socket, one Kafka record per message, as a
// flat JSON object (format json) or the message as received (raw), with
// its facility, severity, hostname and app name as headers.
//
// # What it promises
//
// Syslog has no acknowledgement and no position to commit: a sender never
// learns whether a message arrived, and cannot be asked to send it again.
// So ferry promises what it can: every message it read is either handed to
// the pipeline (and then delivered as any record is) or counted in
// ferry_syslog_dropped_records_total{transport,reason} and logged (at a
// bounded rate). Nothing read is lost silently. What the kernel drops
// before ferry reads it (a full UDP receive buffer) ferry cannot see.
//
// # Backpressure and memory
//
// A stream connection (TCP, TLS) is read by one goroutine into a buffer of
// 4 KiB that grows, each step reserved from the shared memory budget
// (queue.memory_limit), only as far as one frame needs: at most
// max_message_bytes and an octet count's 11 bytes. An octet count over
// max_message_bytes is refused from its digits, before any of its message
// is read, and closes the connection (it cannot be resynchronised); a
// longer LF-framed line is truncated at max_message_bytes and the rest of
// it skipped unread into memory. A frame must arrive whole within
// frame_timeout of its first byte, so a slow sender cannot hold its
// reservation. The frames already read are parsed and written (JSON or
// raw) into one pooled buffer per batch, sized from the messages before a
// byte is written and reserved first; when the budget, the queue or the
// app's rate limit has no room, the goroutine waits and stops reading: TCP
// slows the sender down. Nothing read is refused for want of room.
//
// A datagram (UDP, the Unix socket) cannot be slowed: the listener's one
// goroutine reads datagrams into a fixed staging buffer for up to 2 ms (or
// 256 messages), then reserves, writes and hands them on as one batch; a
// batch that finds no room in the budget, the queue or the rate limit is
// dropped and counted (queue_full, rate_limited).
//
// # Parsing
//
// parse reads RFC 5424 when the PRI is followed by a version, RFC 3164
// otherwise (leniently, as rsyslog: Cisco sequence numbers and
// milliseconds, no timestamp, no hostname). A message that does not parse
// (no valid PRI, a broken RFC 5424 header) is delivered anyway, whole, with
// parse_error (rsyslog and the OpenTelemetry Collector deliver such
// messages too; silent loss is worse), and counted
// (ferry_receiver_errors_total{reason="parse_error"}). Parsing and writing
// JSON allocate nothing per message; a batch costs a few allocations.
package syslogreceiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// The headers every record carries (when the message has them): ferry's
// own namespace (routing.ReservedHeaderPrefix), which clients cannot forge.
const (
	HeaderFacility   = "ferry.syslog.facility"
	HeaderSeverity   = "ferry.syslog.severity"
	HeaderHostname   = "ferry.syslog.hostname"
	HeaderAppName    = "ferry.syslog.app_name"
	HeaderParseError = "ferry.syslog.parse_error"
	HeaderTruncated  = "ferry.syslog.truncated"
)

var (
	trueValue      = []byte("true")
	facilityValues [24][]byte
	severityValues [8][]byte
)

func init() {
	for i, n := range facilityNames {
		facilityValues[i] = []byte(n)
	}
	for i, n := range severityNames {
		severityValues[i] = []byte(n)
	}
}

// Batching: most messages, and most bytes of messages, in one batch.
const (
	maxBatchMessages = 256
	maxBatchBytes    = 256 << 10
)

// Receiver serves syslog.
type Receiver struct {
	cfg    Config
	set    telemetry.Settings
	log    *telemetry.Limited
	m      *receivermetrics.Metrics
	sm     *syslogMetrics
	next   consumer.Consumer
	body   *httpbody.Reader
	gate   *auth.Gate
	claims *token.Claims // the configured app, for rate limits
	topic  *template
	key    *template // nil: no key
	host   string
	max    int
	json   bool
	// batchBound: the most one batch's records may take (prepare).
	batchBound int
	// bud is the memory budget (nil: none); growCeiling the most of it
	// stream buffers' growth may hold (growReserve).
	bud         httpbody.Budget
	growCeiling int64
	batchP      sync.Pool

	tcp, tls *server.Stream
	udp      net.PacketConn
	unix     net.PacketConn
	wg       sync.WaitGroup
	ctx      context.Context // ends at Shutdown: waits for room end
	cancel   context.CancelFunc
}

// New builds the receiver; it listens only at Start.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	if errs := cfg.Check(env.Bounds); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r := &Receiver{cfg: cfg, set: env.Set, next: env.Next, max: int(cfg.MaxMessageBytes), json: cfg.Format == "json",
		body: httpbody.NewReader(int64(cfg.MaxMessageBytes)), gate: env.Pre.Gate(auth.ReceiverConfig{Mode: "none"}),
		claims: &token.Claims{App: cfg.App}}
	if env.Bodies != nil {
		r.body.SetBudget(env.Bodies)
		r.bud = env.Bodies
	}
	r.topic, _ = parseTemplate(cfg.Topic) // checked by Check
	if cfg.Key != "" {
		r.key, _ = parseTemplate(cfg.Key)
	}
	r.host, _ = os.Hostname()
	r.batchBound = int(cfg.recordBound())
	if r.bud != nil {
		// A batch's pooled buffer is at most twice its bound; Check keeps
		// the bound within a quarter of the budget.
		r.growCeiling = max(r.bud.Limit()-2*int64(r.batchBound), r.bud.Limit()/2)
	}
	r.log = telemetry.NewLimited(env.Set.Logger.With("component", "receiver/syslog"), 10*time.Second)
	r.m = receivermetrics.New(env.Set.Registry, "syslog")
	r.sm = newSyslogMetrics(env.Set.Registry)
	r.batchP.New = func() any { return new(record.Batch) }
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if cfg.TCP != "" {
		r.tcp = server.NewStream("syslog_tcp", server.StreamConfig{Network: "tcp", Addr: cfg.TCP, MaxConnections: cfg.MaxConnections},
			r.streamHandler(tTCP), env.Set.Logger, env.Set.Registry)
	}
	if cfg.tlsOn() {
		r.tls = server.NewStream("syslog_tls", server.StreamConfig{Network: "tcp", Addr: cfg.TLSListen, MaxConnections: cfg.MaxConnections, TLS: cfg.TLS},
			r.streamHandler(tTLS), env.Set.Logger, env.Set.Registry)
	}
	return r, nil
}

// Start binds every listener that is on; if one cannot bind, those bound
// are let go.
func (r *Receiver) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			_ = r.Shutdown(ctx)
		}
	}()
	if r.cfg.UDP != "" {
		if r.udp, err = net.ListenPacket("udp", r.cfg.UDP); err != nil {
			return fmt.Errorf("syslog_udp: %w", err)
		}
		r.goServe(r.udp, tUDP)
	}
	if r.cfg.Socket != "" {
		if r.unix, err = listenUnixgram(r.cfg.Socket, r.cfg.SocketMode); err != nil {
			return fmt.Errorf("syslog_socket: %w", err)
		}
		r.goServe(r.unix, tUnix)
	}
	if r.tcp != nil {
		if err = r.tcp.Start(ctx); err != nil {
			r.tcp = nil
			return err
		}
	}
	if r.tls != nil {
		if err = r.tls.Start(ctx); err != nil {
			r.tls = nil
			return err
		}
	}
	return nil
}

func (r *Receiver) goServe(pc net.PacketConn, tr int) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.servePackets(pc, tr)
	}()
}

// listenUnixgram binds a Unix datagram socket at path, replacing a stale
// file (left by a crash: nobody answers on it) but not a live one.
func listenUnixgram(path, mode string) (net.PacketConn, error) {
	m, err := server.ParseMode(mode)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.Dial("unixgram", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by another process", path)
		}
		_ = os.Remove(path)
	}
	pc, err := net.ListenPacket("unixgram", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, m); err != nil {
		pc.Close()
		return nil, err
	}
	return pc, nil
}

// Shutdown stops reading. Batches already handed on are the pipeline's to
// deliver; a batch still waiting for room gets one last try, and a frame
// not yet read whole is counted (shutting_down).
func (r *Receiver) Shutdown(ctx context.Context) error {
	r.cancel()
	var errs []error
	for _, s := range []*server.Stream{r.tcp, r.tls} {
		if s != nil {
			errs = append(errs, s.Shutdown(ctx))
		}
	}
	if r.udp != nil {
		r.udp.Close()
	}
	if r.unix != nil {
		r.unix.Close()
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	if r.unix != nil {
		_ = os.Remove(r.cfg.Socket)
	}
	return errors.Join(errs...)
}

// UDPAddr, TCPAddr, TLSAddr and SocketPath are where it listens ("" when
// that listener is off).
func (r *Receiver) UDPAddr() string {
	if r.udp == nil {
		return ""
	}
	return r.udp.LocalAddr().String()
}

func (r *Receiver) TCPAddr() string {
	if r.tcp == nil {
		return ""
	}
	return r.tcp.Addr()
}

func (r *Receiver) TLSAddr() string {
	if r.tls == nil {
		return ""
	}
	return r.tls.Addr()
}

func (r *Receiver) SocketPath() string {
	if r.unix == nil {
		return ""
	}
	return r.cfg.Socket
}

// drop counts and logs n messages read that will not reach Kafka.
func (r *Receiver) drop(tr int, reason string, n int, args ...any) {
	if n <= 0 {
		return
	}
	r.sm.dropped.WithLabelValues(transportNames[tr], reason).Add(float64(n))
	r.log.Log(slog.LevelWarn, "drop:"+transportNames[tr]+":"+reason, "syslog: messages dropped", append([]any{"transport", transportNames[tr], "reason", reason, "messages", n}, args...)...)
}

// builder turns messages read into a batch. One per connection or packet
// listener: its scratch is reused batch after batch.
type builder struct {
	r       *Receiver
	tr      int
	msgs    []Message
	spans   []recSpan
	scratch []byte
}

type recSpan struct {
	v0, v1, k0, k1, h0, h1, a0, a1 int
	topic                          string
	trunc                          bool
}

// prepare parses the first of raws, as many as one batch may hold (at
// least one), and returns how many it took and the most their records can
// take, to be reserved before a byte of them is written. A batch's bound is
// at most a message's largest record (Check keeps that within a quarter of
// the memory budget): tiny messages bound far more than their bytes, and a
// batch whose reservation exceeded the budget could never be made.
func (b *builder) prepare(raws [][]byte) (k, need int) {
	b.msgs = b.msgs[:0]
	r := b.r
	for i, raw := range raws {
		b.msgs = append(b.msgs, Message{})
		m := &b.msgs[len(b.msgs)-1]
		parse(raw, m)
		n := len(raw)
		if r.json {
			n = jsonBound(m, raw)
		}
		n += len(m.Hostname) + len(m.AppName) // their headers' values
		if r.key != nil {
			n += r.key.bound(len(raw), r.host)
		}
		if i > 0 && need+n > r.batchBound {
			b.msgs = b.msgs[:i]
			return i, need
		}
		need += n
	}
	return len(raws), need
}

// handBatch makes one batch of the first of raws and hands it on; it
// returns how many it took (all of them when the receiver stops while a
// stream waits for room: counted). wait: a stream, which waits for room; a
// datagram batch that finds none is dropped and counted.
//
// A panic (a bug reached by a sender's bytes) costs the batch, counted
// (internal_error), and its reservation, given back: not the agent (a
// datagram listener has no one else to recover it) nor the budget.
func (b *builder) handBatch(raws [][]byte, trun []bool, wait bool) (k int) {
	r := b.r
	var buf *httpbody.Buf
	defer func() {
		if v := recover(); v != nil {
			if buf != nil {
				r.body.Release(buf) // not Put: a batch may still point into it
			}
			k = max(k, 1)
			r.m.Error("internal_error")
			r.drop(b.tr, "internal_error", k)
			r.set.Logger.Error("syslog: a batch's handling panicked; its messages are dropped", "transport", transportNames[b.tr],
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	k, need := b.prepare(raws)
	// The buffer is taken once its room is reserved: a batch waiting here
	// for room holds no buffer outside the budget (handOn's retries still
	// hold their filled buffer while they wait).
	var ok bool
	if wait {
		for buf == nil {
			if buf, ok = r.body.GetReservedWait(r.ctx, need, time.Now().Add(time.Second)); !ok && r.ctx.Err() != nil {
				r.drop(b.tr, "shutting_down", len(raws))
				return len(raws)
			}
		}
	} else if buf, ok = r.body.GetReserved(need); !ok {
		// fill counted nothing: these are counted as read here.
		for i := range k {
			r.sm.messages[b.tr][b.msgs[i].Proto].Inc()
		}
		r.m.Error("queue_full")
		r.drop(b.tr, "queue_full", k)
		return k
	}
	bt, nb, n := b.fill(buf, raws[:k], trun[:k], time.Now())
	buf = nb
	b.handOn(bt, buf, n, wait)
	return k
}

// fill writes the prepared messages into buf (reserved for prepare's
// size) and makes their batch; it returns the buffer the records point
// into (a smaller one when buf turned out far too large: the queue charges
// a batch by its buffer's capacity) and the records' key and value bytes.
func (b *builder) fill(buf *httpbody.Buf, raws [][]byte, trunc []bool, now time.Time) (*record.Batch, *httpbody.Buf, int) {
	r := b.r
	b.spans = b.spans[:0]
	dst := buf.B[:0]
	var counts [len(protoNames)]int
	nhdr := 0
	for i, raw := range raws {
		m := &b.msgs[i]
		counts[m.Proto]++
		var s recSpan
		s.trunc = trunc != nil && trunc[i]
		s.v0 = len(dst)
		if r.json {
			dst = appendJSON(dst, m, raw, now)
		} else {
			dst = append(dst, raw...)
		}
		s.v1 = len(dst)
		if r.key != nil {
			s.k0 = len(dst)
			dst = r.key.expand(dst, m, r.host)
			s.k1 = len(dst)
		}
		s.h0 = len(dst)
		dst = append(dst, m.Hostname...)
		s.h1 = len(dst)
		s.a0 = len(dst)
		dst = append(dst, m.AppName...)
		s.a1 = len(dst)
		s.topic = r.topic.topic(m, r.host, b.scratch)
		b.spans = append(b.spans, s)
		nhdr += 4
		if m.Proto == protoUnknown || s.trunc {
			nhdr++
		}
	}
	for p, n := range counts {
		if n > 0 {
			r.sm.messages[b.tr][p].Add(float64(n))
		}
	}
	if n := counts[protoUnknown]; n > 0 {
		r.m.Errors("parse_error").Add(float64(n))
	}
	if len(dst) > cap(buf.B) {
		panic("syslogreceiver: a batch outgrew its reserved bound") // a bug in jsonBound: tests and fuzzing check it
	}
	buf.B = dst
	// A buffer far larger than what was written (JSON's bound assumes every
	// byte escaped) is traded for one that fits.
	if used := len(dst); cap(dst) >= 16<<10 && used <= cap(dst)/2 {
		nb := r.body.Get(used)
		if r.body.Move(buf, nb, int64(cap(nb.B))) {
			nb.B = append(nb.B[:0], dst...)
			r.body.Put(buf)
			buf = nb
		} else {
			r.body.Put(nb)
		}
	}
	data := buf.B
	bt := r.batchP.Get().(*record.Batch)
	recs := bt.Records[:0]
	hdrs := make([]record.Header, 0, nhdr)
	payload, copied := 0, 0
	for i, s := range b.spans {
		m := &b.msgs[i]
		h := len(hdrs)
		if m.HasPri {
			hdrs = append(hdrs, record.Header{Key: HeaderFacility, Value: facilityValues[m.Facility]}, record.Header{Key: HeaderSeverity, Value: severityValues[m.Severity]})
		}
		if s.h1 > s.h0 {
			hdrs = append(hdrs, record.Header{Key: HeaderHostname, Value: data[s.h0:s.h1:s.h1]})
		}
		if s.a1 > s.a0 {
			hdrs = append(hdrs, record.Header{Key: HeaderAppName, Value: data[s.a0:s.a1:s.a1]})
		}
		if m.Proto == protoUnknown {
			hdrs = append(hdrs, record.Header{Key: HeaderParseError, Value: errValue(m.Err)})
		}
		if s.trunc {
			hdrs = append(hdrs, record.Header{Key: HeaderTruncated, Value: trueValue})
		}
		rec := record.Record{Topic: s.topic, Value: data[s.v0:s.v1:s.v1], Headers: hdrs[h:len(hdrs):len(hdrs)], Timestamp: now}
		if s.k1 > s.k0 {
			rec.Key = data[s.k0:s.k1:s.k1]
		}
		recs = append(recs, rec)
		payload += len(rec.Key) + len(rec.Value)
		copied += record.HeaderBytes(rec.Headers)
	}
	bt.Records = recs
	bt.Charge(cap(data), copied)
	return bt, buf, payload + copied
}

// errValue is a parse error's header value, from a fixed set.
var errValues = map[string][]byte{}

func init() {
	for _, e := range []string{"invalid_pri", "unsupported_version", "invalid_header", "invalid_timestamp", "invalid_structured_data"} {
		errValues[e] = []byte(e)
	}
}

func errValue(e string) []byte {
	if v, ok := errValues[e]; ok {
		return v
	}
	return []byte(e)
}

// recycle gives a batch back once every stage is done with it.
func (r *Receiver) recycle(b *record.Batch) {
	clear(b.Records)
	recs := b.Records[:0]
	b.Reset()
	b.Records = recs
	r.batchP.Put(b)
}

// handOn gives bt (its records in buf) to the pipeline. wait: a stream,
// which waits for room (budget, rate limit, queue) instead of dropping, as
// long as the receiver runs; a datagram listener drops and counts at once.
// It reports whether the batch was taken.
func (b *builder) handOn(bt *record.Batch, buf *httpbody.Buf, bytes int, wait bool) bool {
	r := b.r
	n := len(bt.Records)
	topic := bt.Records[0].Topic
	giveUp := func(reason string) bool {
		r.m.Error(reason)
		r.drop(b.tr, reason, n)
		r.body.Put(buf)
		r.recycle(bt)
		return false
	}
	// The configured app's rate limit: a stream waits it out (its sender is
	// slowed), a datagram cannot wait.
	for {
		err := r.gate.Limit(r.claims, n, bytes)
		if err == nil {
			break
		}
		if !wait {
			return giveUp("rate_limited")
		}
		var re *consumer.RetryableError
		delay := time.Second
		if errors.As(err, &re) {
			delay = min(max(re.After, 10*time.Millisecond), time.Second)
		}
		if !sleep(r.ctx, delay) {
			return giveUp("shutting_down")
		}
	}
	counted := false
	for {
		bt.OnDone(func(err error) { b.r.done(b.tr, bt, buf, err) })
		// The queue reserves the whole batch (its buffer included) from here.
		r.body.Release(buf)
		err := r.next.Consume(context.Background(), bt)
		if err == nil {
			r.m.Received(r.set.Topics.Get(topic), n, bytes)
			r.m.Items("logs", n)
			return true
		}
		bt.PopDone()
		reason := consumer.Reason(err)
		var pe *consumer.PermanentError
		if errors.As(err, &pe) || !wait {
			return giveUp(reason)
		}
		if !counted {
			r.m.Error(reason) // once per batch, however long it waits
			counted = true
		}
		// Retryable: keep the batch, stop reading (TCP slows the sender),
		// try again; the buffer is reserved again meanwhile.
		var re *consumer.RetryableError
		delay := 100 * time.Millisecond
		if errors.As(err, &re) && re.Busy {
			delay = 20 * time.Millisecond
		}
		if !sleep(r.ctx, delay) || !r.reserveWait(buf, int64(cap(buf.B))) {
			return giveUp("shutting_down")
		}
	}
}

// reserveWait reserves n bytes for buf, waiting for room while the
// receiver runs.
func (r *Receiver) reserveWait(buf *httpbody.Buf, n int64) bool {
	for !r.body.ReserveWait(r.ctx, buf, n, time.Now().Add(time.Second)) {
		if r.ctx.Err() != nil {
			return false
		}
	}
	return true
}

// growReserve reserves n bytes of a stream buffer's growth for res while
// all the growth stays below growCeiling, waiting for room until until or
// ctx ends. A connection that grew holds its growth while it waits for its
// batch's room: were growth allowed the whole budget, connections holding
// it could all wait for batches none could get, for ever, and with them
// every receiver sharing the budget.
func (r *Receiver) growReserve(ctx context.Context, res *httpbody.Buf, n int64, until time.Time) bool {
	if r.bud == nil {
		return true
	}
	for !r.body.ReserveBelow(res, n, r.growCeiling) {
		if ctx.Err() != nil || !time.Now().Before(until) {
			return false
		}
		r.bud.Wait(ctx, until)
	}
	return true
}

// done is a batch's completion: records that failed after the pipeline
// took them (Kafka refused them for good, the exporter's shutdown timeout)
// cannot be sent again by anyone, so they are counted.
func (r *Receiver) done(tr int, bt *record.Batch, buf *httpbody.Buf, err error) {
	if err != nil && !bt.Spooled {
		r.drop(tr, consumer.Reason(err), max(bt.Failed(), 1), "err", err)
	}
	r.body.Put(buf)
	r.recycle(bt)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
