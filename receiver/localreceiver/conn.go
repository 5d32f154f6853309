package localreceiver

import (
	"context"
	binenc "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// conn is one binary connection.
type conn struct {
	r      *Receiver
	ctx    context.Context
	c      net.Conn
	claims *token.Claims
	tok    string // the hello's token, checked again on every frame
	feats  uint64
	// version is the protocol version of the preamble (1 to 3); from 2 a
	// produce may ask for a receipt and carry a request id, from 3 a
	// sequence number.
	version uint16
	// pid is the hello's producer id when idempotence was granted
	// (version 3, delivery mode spool); nil otherwise.
	pid []byte

	// The answers' writer.
	w *server.Writer

	// Flow control and the frames not yet answered.
	fmu      sync.Mutex
	fcond    *sync.Cond
	inflight int64
	pending  map[uint32]*frame
}

func newConn(r *Receiver, ctx context.Context, c net.Conn) *conn {
	cn := &conn{r: r, ctx: ctx, c: c, pending: map[uint32]*frame{}}
	cn.fcond = sync.NewCond(&cn.fmu)
	return cn
}

func readFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

// A hello holds a client name and a token (4 KiB each at most): it is
// read in full before the client is authenticated, so it is kept small,
// and it must arrive within helloTimeout of connecting.
const (
	maxHello     = 16 << 10
	helloTimeout = 10 * time.Second
)

// run serves the connection until the client leaves, breaks the protocol,
// or the agent stops; frames in flight are answered before it returns.
func (cn *conn) run() {
	// A reader waiting for unread answers to drain is woken by the writer.
	wake := func() { cn.fmu.Lock(); cn.fcond.Broadcast(); cn.fmu.Unlock() }
	cn.w = server.NewWriter(cn.c, cn.r.answers, wake, func() { cn.r.m.Error("write_timeout") })
	stopTimer := cn.ackTimer()
	err := cn.read()
	// Nothing more is read: wait for the answers of what is in flight
	// (bounded by ack_timeout, after which they are answered anyway).
	cn.fmu.Lock()
	for len(cn.pending) > 0 {
		cn.fcond.Wait()
	}
	cn.fmu.Unlock()
	stopTimer()
	if err != nil {
		cn.send(func(b []byte) []byte { return protocol.AppendError(b, err.id, err.reason, err.msg) })
	}
	cn.w.Close()
}

// connErr ends a connection with an Error frame.
type connErr struct {
	id          uint32
	reason, msg string
}

func (cn *conn) fail(id uint32, reason, msg string) *connErr {
	cn.r.m.Error(reason)
	cn.r.logWarn(reason, "local connection closed: "+msg, "remote", cn.c.RemoteAddr().String())
	return &connErr{id: id, reason: reason, msg: msg}
}

// read reads frames until the connection ends; a non-nil result is the
// Error frame to send before closing.
func (cn *conn) read() *connErr {
	r := cn.r
	var hdr [10]byte
	// The hello: before the client is known it may hold little (a name and
	// a token) for little time.
	_ = cn.c.SetReadDeadline(time.Now().Add(min(r.cfg.IdleTimeout, helloTimeout)))
	if _, err := io.ReadFull(cn.c, hdr[:]); err != nil {
		return nil
	}
	h, err := protocol.ParseHeader(hdr, maxHello)
	if err != nil || h.Type != protocol.TypeHello {
		var tl *protocol.TooLargeError
		if errors.As(err, &tl) {
			return cn.fail(h.RequestID, "frame_too_large", fmt.Sprintf("a hello of %d bytes (at most %d: a name and a token)", h.Length, maxHello))
		}
		return cn.fail(h.RequestID, "malformed_frame", "the first frame must be a hello")
	}
	body := make([]byte, h.BodyLen())
	if _, err := io.ReadFull(cn.c, body); err != nil {
		return nil
	}
	hello, err := protocol.DecodeHello(body, r.limits)
	if err != nil {
		return cn.fail(h.RequestID, "malformed_frame", err.Error())
	}
	if hello.Version != cn.version {
		return cn.fail(h.RequestID, "unsupported_version", fmt.Sprintf("the hello's protocol version %d is not the preamble's (%d)", hello.Version, cn.version))
	}
	claims, aerr := r.gate.Check(hello.Token)
	if aerr != nil {
		return cn.fail(h.RequestID, "unauthenticated", aerr.Error())
	}
	cn.claims, cn.tok = claims, hello.Token
	cn.feats = hello.Features & (protocol.FeatureLZ4 | protocol.FeatureZstd)
	if cn.version >= protocol.Version3 && hello.Features&protocol.FeatureIdempotence != 0 && len(hello.ProducerID) == protocol.ProducerIDBytes && r.idem != nil {
		// Granted only where an accepted sequence is kept durably with its
		// records: elsewhere a client that believed its retries were
		// recognised would be misled.
		cn.feats |= protocol.FeatureIdempotence
		cn.pid = append([]byte(nil), hello.ProducerID...)
	}
	cn.send(func(b []byte) []byte {
		return protocol.AppendHelloOK(b, protocol.HelloOK{Version: cn.version, Features: cn.feats,
			MaxFrameBytes: uint32(r.cfg.MaxFrameBytes), MaxRecords: uint32(r.cfg.MaxRecords),
			MaxInflightBytes: uint32(min(r.cfg.MaxInflightBytes, 1<<32-1)), Server: ServerName})
	})
	maxInflight := int64(r.cfg.MaxInflightBytes)
	// Idle only counts while nothing is in flight: a client waiting for
	// answers is not idle, one that has them all is.
	busy := func() bool {
		cn.fmu.Lock()
		defer cn.fmu.Unlock()
		return cn.inflight > 0
	}
	for {
		if !cn.roomForAnswers() {
			return nil // the client stopped reading and the writer gave up, or the agent is stopping
		}
		if err := server.ReadHeader(cn.ctx, cn.c, hdr[:], r.cfg.IdleTimeout, busy); err != nil {
			return nil // the client left, idled out, or the agent is stopping
		}
		h, err := protocol.ParseHeader(hdr, r.limits.MaxFrameBytes)
		if err != nil {
			var tl *protocol.TooLargeError
			if errors.As(err, &tl) {
				return cn.fail(h.RequestID, "frame_too_large", err.Error()+" (receivers.local.max_frame_bytes)")
			}
			return cn.fail(h.RequestID, "malformed_frame", err.Error())
		}
		if h.Type != protocol.TypeProduce {
			return cn.fail(h.RequestID, "malformed_frame", fmt.Sprintf("frame type %d is not sent by clients after the hello", h.Type))
		}
		// The hello's token is checked again on every frame (a cache hit):
		// one that expired, or whose key a reload removed, stops writing
		// at once instead of for as long as the connection lives.
		if _, err := r.gate.Check(cn.tok); err != nil {
			return cn.fail(h.RequestID, "unauthenticated", "the connection's token no longer holds: "+err.Error())
		}
		if c := h.Compression(); c == 3 || c == protocol.CompressLZ4 && cn.feats&protocol.FeatureLZ4 == 0 || c == protocol.CompressZstd && cn.feats&protocol.FeatureZstd == 0 {
			return cn.fail(h.RequestID, "malformed_frame", fmt.Sprintf("compression %d was not agreed in the hello", c))
		}
		size := int64(h.Length)
		// Flow control: wait for answers before reading more.
		cn.fmu.Lock()
		for cn.inflight > 0 && cn.inflight+size > maxInflight && cn.ctx.Err() == nil {
			cn.fcond.Wait()
		}
		if _, dup := cn.pending[h.RequestID]; dup {
			cn.fmu.Unlock()
			return cn.fail(h.RequestID, "malformed_frame", fmt.Sprintf("request id %d is already in flight", h.RequestID))
		}
		cn.fmu.Unlock()
		if cerr := cn.produce(h); cerr != nil {
			return cerr
		}
	}
}

// roomForAnswers waits, before the next frame is read, while the
// connection holds more answers its client has not read than
// server.Writer allows; false: the connection is over.
func (cn *conn) roomForAnswers() bool {
	cn.fmu.Lock()
	defer cn.fmu.Unlock()
	return cn.w.WaitForRoom(cn.ctx, &cn.fmu, cn.fcond, nil)
}

// produce reads one produce frame's body and hands its records on.
func (cn *conn) produce(h protocol.FrameHeader) *connErr {
	r := cn.r
	n := h.BodyLen()
	raw, ok := r.body.GetReserved(n)
	if !ok {
		// No room to hold it: skip its bytes without keeping them, and
		// answer the whole frame.
		if err := server.DiscardBody(cn.c, int64(n), r.cfg.BodyTimeout); err != nil {
			return cn.slowBody(h, err)
		}
		cn.answerWhole(h.RequestID, consumer.ErrFull)
		return nil
	}
	raw.B = raw.B[:n]
	if err := server.ReadBody(cn.c, raw.B, r.cfg.BodyTimeout); err != nil {
		r.body.Put(raw)
		return cn.slowBody(h, err)
	}
	plain, out := raw.B, (*httpbody.Buf)(nil)
	if c := h.Compression(); c != protocol.CompressNone {
		// The output is reserved as it grows, from a few times the frame's
		// size up to max_frame_bytes: a frame costs what it inflates to,
		// and a bomb stops at the limit.
		var err error
		out, err = cn.decompress(raw.B, c)
		if err != nil {
			r.body.Put(raw)
			r.body.Put(out)
			var pe *consumer.PermanentError
			switch {
			case errors.Is(err, httpbody.ErrNoRoom):
				cn.answerWhole(h.RequestID, consumer.ErrFull)
				return nil
			case errors.As(err, &pe):
				cn.answerWhole(h.RequestID, pe)
				return nil
			}
			return cn.fail(h.RequestID, "malformed_frame", err.Error())
		}
		plain = out.B
	}
	// Version 2's flags; a version 1 connection ignores bits it does not
	// know, as version 1 says.
	var wantReceipt bool
	var reqID []byte
	// The body a sequence names: the request id, the sequence and the
	// records, decompressed (a retry may be compressed differently).
	whole := plain
	var seq uint64
	sequenced := false
	if cn.version >= protocol.Version2 {
		wantReceipt = h.Flags&protocol.FlagReceipt != 0
		if wantReceipt && r.noReceipts != "" {
			// Refused for good rather than answered with places Kafka
			// never named (exporter.kafka.acks none).
			r.body.Put(raw)
			r.body.Put(out)
			cn.answerWhole(h.RequestID, &consumer.PermanentError{Reason: "receipts_unavailable", Kind: consumer.KindInvalid,
				Msg: "receipts are unavailable: " + r.noReceipts})
			return nil
		}
		if h.Flags&protocol.FlagRequestID != 0 {
			id, rest, err := protocol.SplitRequestID(plain)
			switch {
			case errors.Is(err, protocol.ErrInvalidRequestID):
				// The frame reads; its id is the client's mistake about
				// this frame alone: refused for good, the connection goes
				// on (a framing error would have the client resend it).
				r.body.Put(raw)
				r.body.Put(out)
				cn.answerWhole(h.RequestID, errBadRequestID)
				return nil
			case err != nil:
				r.body.Put(raw)
				r.body.Put(out)
				return cn.fail(h.RequestID, "malformed_frame", err.Error())
			}
			reqID, plain = id, rest
		}
	}
	if cn.version >= protocol.Version3 && h.Flags&protocol.FlagSequence != 0 {
		if cn.pid == nil {
			r.body.Put(raw)
			r.body.Put(out)
			cn.answerWhole(h.RequestID, errNoIdempotence)
			return nil
		}
		s, rest, err := protocol.SplitSequence(plain)
		if err != nil {
			r.body.Put(raw)
			r.body.Put(out)
			return cn.fail(h.RequestID, "malformed_frame", err.Error())
		}
		seq, plain, sequenced = s, rest, true
	}
	rs := r.recordP.Get().(*protocol.Records)
	defer r.recordP.Put(rs)
	if err := rs.Reset(plain, r.limits); err != nil {
		r.body.Put(raw)
		r.body.Put(out)
		var tl *protocol.TooLargeError
		if errors.As(err, &tl) {
			cn.answerWhole(h.RequestID, consumer.OverLimit("too_many_records", "records in one frame", int64(r.limits.MaxRecords), "receivers.local.max_records_per_frame"))
			return nil
		}
		return cn.fail(h.RequestID, "malformed_frame", err.Error())
	}
	fr := &frame{id: h.RequestID, n: rs.Len(), size: int64(h.Length), fewWords: true}
	fr.finish = func(rs []protocol.Range, rc *protocol.Receipt) { cn.answer(rs, rc, fr) }
	b := r.batchP.Get().(*record.Batch)
	// The request id header: a view into the frame's buffer, which lives
	// until the batch completes, in one slice every record without headers
	// of its own shares (capacity 1: an append copies, never writes into
	// it). No allocation per record.
	var reqHdr []record.Header
	if len(reqID) > 0 {
		reqHdr = []record.Header{{Key: receipt.HeaderKey, Value: reqID}}
	}
	now := time.Now()
	var pr protocol.Record
	var topic string
	var headers int     // the records' own headers, charged record.HeaderOverhead each
	var headerBytes int // summed over the records: the Kafka client copies each record's
	payload := 0
	noRoom := false   // no room for the records' headers
	var hdrRoom int64 // reserved for headers, not used yet
	var rej error     // the verdict on topic: records of one topic come in runs
	runs := 0         // of records of one topic: the ranges their answer may need
	for i := 0; rs.Next(&pr); i++ {
		if string(pr.Topic) != topic || i == 0 {
			topic = string(pr.Topic)
			rej = cn.check(topic)
			runs++
		}
		if rej != nil {
			r.m.Error(consumer.Reason(rej))
			fr.reject(i, rej)
			continue
		}
		rec := record.Record{Topic: topic, Key: pr.Key, Value: pr.Value, Timestamp: now}
		if pr.Timestamp > 0 {
			rec.Timestamp = time.UnixMilli(pr.Timestamp)
		}
		if len(pr.Headers) > 0 {
			// A header takes two bytes on the wire and HeaderOverhead
			// here: reserved (with the frame's, which the queue's charge
			// replaces) before its structs are made.
			if !record.ReserveHeaders(&hdrRoom, int64(len(pr.Headers))*int64(record.HeaderOverhead), func(n int64) bool { return r.body.Reserve(raw, n) }) {
				noRoom = true
				break
			}
			rec.Headers = make([]record.Header, 0, len(pr.Headers)+len(reqHdr))
			headers += len(pr.Headers) // the slots made, dropped headers' too
			for _, hd := range pr.Headers {
				if strings.HasPrefix(string(hd.Key), routing.ReservedHeaderPrefix) {
					r.m.Error("reserved_header_dropped")
					continue
				}
				rec.Headers = append(rec.Headers, record.Header{Key: string(hd.Key), Value: hd.Value})
				headerBytes += len(hd.Key) + len(hd.Value)
			}
		}
		if reqHdr != nil {
			if rec.Headers == nil {
				rec.Headers = reqHdr
			} else {
				rec.Headers = append(rec.Headers, reqHdr[0])
			}
			headerBytes += len(reqHdr[0].Key) + len(reqHdr[0].Value)
		}
		if cn.claims != nil {
			rec.Headers, _ = routing.TenantHeaders(rec.Headers, cn.claims, token.Messages)
		}
		if fr.idx != nil {
			fr.idx = append(fr.idx, i)
		}
		b.Records = append(b.Records, rec)
		payload += len(rec.Key) + len(rec.Value)
	}
	if err := rs.Err(); err != nil || noRoom {
		b.Reset()
		r.batchP.Put(b)
		r.body.Put(raw)
		r.body.Put(out)
		if noRoom {
			cn.answerWhole(h.RequestID, consumer.ErrFull)
			return nil
		}
		return cn.fail(h.RequestID, "malformed_frame", err.Error())
	}
	if len(b.Records) == 0 {
		b.Reset()
		r.batchP.Put(b)
		r.body.Put(raw)
		r.body.Put(out)
		cn.answer(fr.ranges(nil), nil, fr)
		return nil
	}
	// Headers are charged to memory and sent to Kafka: they count too.
	if err := r.gate.Limit(cn.claims, len(b.Records), payload+headerBytes); err != nil {
		r.m.Error(consumer.Reason(err))
		b.Reset()
		r.batchP.Put(b)
		r.body.Put(raw)
		r.body.Put(out)
		fr.rejectAll(err)
		cn.answer(fr.ranges(nil), nil, fr)
		return nil
	}
	if sequenced {
		id, done := cn.beginSeq(fr, seq, whole, len(b.Records))
		if done {
			b.Reset()
			r.batchP.Put(b)
			r.body.Put(raw)
			r.body.Put(out)
			return nil
		}
		b.Idem = id
	}
	bufs := cap(raw.B)
	if out != nil {
		bufs += cap(out.B)
	}
	b.Charge(bufs, headerBytes+headers*record.HeaderOverhead)
	b.OnFailure = fr.onFailure
	if wantReceipt {
		// Sized by the frame: the batch holds at most its records, in
		// frame order. Read only by the completion (fr.done).
		fr.rc = record.NewReceipt(fr.n)
		fr.rc.Owner = receipt.Owner(cn.tok)
		b.Receipt = fr.rc
	}
	nrec := len(b.Records)
	cn.fmu.Lock()
	cn.inflight += fr.size
	fr.deadline = now.Add(r.cfg.AckTimeout)
	cn.pending[fr.id] = fr
	// Counted from now as the answer it may become, so that the reader
	// stops before the answers to frames already read exceed the
	// connection's bound (server.Writer.Park).
	fr.est = answerEstimate(runs, fr.n, wantReceipt)
	cn.w.Park(fr.est)
	cn.fmu.Unlock()
	idem := b.Idem
	if err := r.sub.SubmitAsync(cn.ctx, b, raw, out, fr.done); err != nil {
		if idem != nil {
			// Not stored: the retry is a new frame (the spool aborts what
			// reached it; a refusal before it is resolved here).
			r.idem.Abort(idem)
		}
		r.m.Error(consumer.Reason(err))
		fr.rejectAll(err)
		cn.answer(fr.ranges(nil), nil, fr)
		return nil
	}
	r.m.Received(r.set.Topics.Get(topic), nrec, payload)
	r.m.Items("records", nrec)
	r.m.ReqBytes.Observe(float64(h.Length))
	return nil
}

// beginSeq looks a sequenced frame up by (application, producer id,
// sequence) with the hash of its whole decompressed body. done: the frame
// was answered — a retry of an accepted frame with its original outcome
// (the records the agent refuses on their own refused again, the others
// accepted; nothing handed on, no receipt), or a refusal; else id is the
// reservation the spool resolves with the records.
func (cn *conn) beginSeq(fr *frame, seq uint64, whole []byte, handed int) (id *record.Idem, done bool) {
	r := cn.r
	app := ""
	if cn.claims != nil {
		app = cn.claims.App
	}
	var k [protocol.ProducerIDBytes + 8]byte
	copy(k[:], cn.pid)
	binenc.BigEndian.PutUint64(k[protocol.ProducerIDBytes:], seq)
	v, stored, id := r.idem.Begin(idempotency.Scope("local", app, string(k[:])), idempotency.FingerprintFrame(whole), handed)
	switch v {
	case idempotency.Fresh:
		return id, false
	case idempotency.Replay:
		// Counted by the store (ferry_idempotency_replayed_total). The
		// first copy's outcome is answered from today's checks of each
		// record (a topic not allowed), which match it unless a reload
		// changed them: then which records were stored is not known here,
		// and saying "accepted" of one that was not would lose it.
		if stored != handed {
			cn.answerWhole(fr.id, &consumer.PermanentError{Reason: "sequence_outcome_changed", Kind: consumer.KindInvalid,
				Msg: fmt.Sprintf("this frame was stored before with %d of its records (the others refused); the agent's topic rules changed since, so which ones is not known: check Kafka before sending them again", stored)})
			break
		}
		cn.answer(fr.ranges(nil), nil, fr)
	case idempotency.InFlight:
		cn.answerWhole(fr.id, errSeqInFlight)
	case idempotency.Mismatch:
		cn.answerWhole(fr.id, errSeqReused)
	default:
		cn.answerWhole(fr.id, errIdemFull)
	}
	return nil, true
}

// Answers to sequenced frames the agent does not store (version 3).
var (
	errNoIdempotence = &consumer.PermanentError{Reason: "idempotence_unavailable", Kind: consumer.KindInvalid,
		Msg: "a sequence number needs idempotence, which this connection was not granted (delivery.mode spool and a producer id in the hello)"}
	errSeqInFlight = &consumer.RetryableError{Reason: "in_flight", Busy: true, After: time.Second,
		Msg: "a frame with this sequence is still being stored; send it again shortly for its result"}
	errSeqReused = &consumer.PermanentError{Reason: "sequence_reused", Kind: consumer.KindInvalid,
		Msg: "this producer's sequence was used for different records within delivery.idempotency.window; a new set of records takes a new sequence"}
	errIdemFull = &consumer.RetryableError{Reason: "idempotency_full", Busy: true, After: time.Second,
		Msg: "too many sequenced frames are being stored at once (delivery.idempotency.max_bytes); send again later"}
)

// errBadRequestID refuses a frame whose request id has characters a
// header consumer would have to escape.
var errBadRequestID = &consumer.PermanentError{Reason: "invalid_request_id", Kind: consumer.KindInvalid,
	Msg: fmt.Sprintf("the request id must be 1 to %d of A-Z a-z 0-9 . _ : -", receipt.MaxRequestIDBytes)}

// decompress inflates a frame's body into a buffer reserved as it grows.
func (cn *conn) decompress(body []byte, c byte) (*httpbody.Buf, error) {
	r := cn.r
	src, done, err := protocol.Decompressor(body, c)
	if err != nil {
		return nil, err
	}
	defer done()
	max := int64(r.limits.MaxFrameBytes)
	out, err := r.body.ReadAll(src, min(max, 4*int64(len(body))+4<<10), max)
	if errors.Is(err, httpbody.ErrTooLarge) {
		return out, consumer.OverLimit("frame_too_large", "the decompressed frame", max, "receivers.local.max_frame_bytes")
	}
	return out, err
}

// slowBody ends a connection whose frame body did not arrive in time (or
// at all): its reservation is let go, and it is told why.
func (cn *conn) slowBody(h protocol.FrameHeader, err error) *connErr {
	if errors.Is(err, os.ErrDeadlineExceeded) && cn.ctx.Err() == nil {
		return cn.fail(h.RequestID, "body_timeout", fmt.Sprintf("a frame of %d bytes did not arrive within receivers.local.body_timeout (%s)", h.Length, cn.r.cfg.BodyTimeout))
	}
	return nil // the client left
}

// check refuses a record whose topic this connection may not write to.
func (cn *conn) check(topic string) error { return receiver.CheckTopic(cn.r.allow, cn.claims, topic) }

// answerWhole answers a frame refused before it was decoded.
func (cn *conn) answerWhole(id uint32, err error) {
	cn.r.m.Error(consumer.Reason(err))
	st, reason, msg, after := outcome(err)
	cn.send(func(b []byte) []byte {
		return protocol.AppendResult(b, id, []protocol.Range{{Count: 0, Status: st, Reason: reason, RetryAfter: after, Message: msg}})
	})
}

// answer sends fr's Result once (the completion and the ack timer may both
// try) and releases its place in flight. rc is the receipt the frame asked
// for; nil when there is none to give (no record was handed on, or Kafka
// did not answer in time).
func (cn *conn) answer(ranges []protocol.Range, rc *protocol.Receipt, fr *frame) {
	cn.fmu.Lock()
	if fr.answered {
		cn.fmu.Unlock()
		return
	}
	fr.answered = true
	if _, ok := cn.pending[fr.id]; ok {
		delete(cn.pending, fr.id)
		cn.inflight -= fr.size
	}
	// Queued before the lock is let go: run, woken by the Broadcast, queues
	// a connection's closing Error frame once nothing is pending, and that
	// frame must come after every answer (QueueParked only takes the
	// writer's own lock and never blocks).
	est := fr.est
	fr.est = 0
	cn.w.QueueParked(est, func(b []byte) []byte { return protocol.AppendResultReceipt(b, fr.id, ranges, rc) })
	cn.fcond.Broadcast()
	cn.fmu.Unlock()
}

// answerEstimate is what the answer to a frame of n records in runs runs
// of one topic may take, until it is made: a range a run (the first
// receiver.MaxMessages ranges with words), and with a receipt a placement a record
// at most. Records of one topic pass or fail together unless Kafka fails
// some of its partitions and not others (a broker down, or records over a
// topic's own size limit keyed to one partition): their ranges are then
// not counted before they are made, ~30 bytes a record at most, which
// takes Kafka's failing records the client chose the partitions of.
func answerEstimate(runs, n int, receipt bool) int {
	est := 32 + min(runs, receiver.MaxMessages)*rangeWithWords + max(runs-receiver.MaxMessages, 0)*rangeBytes
	if receipt {
		// A placement a record at most, and its topic's name again each
		// time the topic changes.
		est += n*placementBytes + runs*placementTopic
	}
	return est
}

// What a range of a result takes: an answer's ranges carry words (a
// Message) on the first receiver.MaxMessages only (a frame whose records
// alternate between outcomes would otherwise be answered with ~100 bytes
// a record).
const (
	rangeWithWords = 600 // count, status, reason, retry, message (receiver.MaxMessageBytes at most)
	rangeBytes     = 64  // the same without the message
	placementBytes = 16  // "same topic", partition, offset, count
	placementTopic = 256 // a topic name (249 bytes at most) and its length
)

// send queues a frame for the writer. It never blocks: completions call it
// from the Kafka client's goroutine.
func (cn *conn) send(enc func([]byte) []byte) { cn.w.Queue(enc) }

// ackTimer answers frames Kafka has not answered for within ack_timeout.
func (cn *conn) ackTimer() (stop func()) {
	every := max(cn.r.cfg.AckTimeout/4, 50*time.Millisecond)
	t := time.NewTicker(every)
	done := make(chan struct{})
	go func() {
		stopping := cn.ctx.Done()
		for {
			select {
			case <-done:
				return
			case <-stopping:
				// Stopping: wake a reader waiting for room (once).
				stopping = nil
				cn.fmu.Lock()
				cn.fcond.Broadcast()
				cn.fmu.Unlock()
			case now := <-t.C:
				var late []*frame
				cn.fmu.Lock()
				for _, fr := range cn.pending {
					if now.After(fr.deadline) {
						late = append(late, fr)
					}
				}
				cn.fmu.Unlock()
				// In the order the frames arrived (their deadlines), not the
				// map's: a client resends what times out in the order it is
				// answered, and a key's records must not be reordered by it.
				slices.SortFunc(late, func(a, b *frame) int { return a.deadline.Compare(b.deadline) })
				for _, fr := range late {
					cn.r.m.Error("ack_timeout")
					err := submit.AckTimeout(cn.r.cfg.AckTimeout, fr.n)
					st, reason, msg, after := outcome(err)
					cn.answer([]protocol.Range{{Count: uint32(fr.n), Status: st, Reason: reason, RetryAfter: after, Message: msg}}, nil, fr)
				}
			}
		}
	}()
	return func() { t.Stop(); close(done) }
}
