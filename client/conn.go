package client

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/protocol"
)

// appendRecord encodes r as protocol.AppendRecord does, without turning
// the topic into a byte slice first.
func appendRecord(dst []byte, prevTopic string, r *Record) []byte {
	if r.Topic != "" && r.Topic == prevTopic {
		dst = append(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(r.Topic)))
		dst = append(dst, r.Topic...)
	}
	if r.Key == nil {
		dst = append(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(r.Key))+1)
		dst = append(dst, r.Key...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	dst = append(dst, r.Value...)
	var ts uint64
	if !r.Timestamp.IsZero() {
		ts = uint64(max(r.Timestamp.UnixMilli(), 0))
	}
	dst = binary.AppendUvarint(dst, ts)
	dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
	for i := range r.Headers {
		dst = binary.AppendUvarint(dst, uint64(len(r.Headers[i].Key)))
		dst = append(dst, r.Headers[i].Key...)
		dst = binary.AppendUvarint(dst, uint64(len(r.Headers[i].Value)))
		dst = append(dst, r.Headers[i].Value...)
	}
	return dst
}

// encodedLen is len(appendRecord(nil, prevTopic, r)), without writing it:
// the batch being filled is sealed at BatchBytes of what the sender will
// write.
func encodedLen(prevTopic string, r *Record) int {
	n := 0
	if r.Topic != "" && r.Topic == prevTopic {
		n++
	} else {
		n += uvarintLen(uint64(len(r.Topic))) + len(r.Topic)
	}
	if r.Key == nil {
		n++
	} else {
		n += uvarintLen(uint64(len(r.Key))+1) + len(r.Key)
	}
	n += uvarintLen(uint64(len(r.Value))) + len(r.Value)
	var ts uint64
	if !r.Timestamp.IsZero() {
		ts = uint64(max(r.Timestamp.UnixMilli(), 0))
	}
	n += uvarintLen(ts) + uvarintLen(uint64(len(r.Headers)))
	for i := range r.Headers {
		n += uvarintLen(uint64(len(r.Headers[i].Key))) + len(r.Headers[i].Key)
		n += uvarintLen(uint64(len(r.Headers[i].Value))) + len(r.Headers[i].Value)
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// session is one connection's state, owned by the sender goroutine except
// where noted.
type session struct {
	c     net.Conn
	w     *bufio.Writer
	hello protocol.HelloOK
	// idem: the agent granted idempotence: frames carry sequences.
	idem     bool
	nextID   uint32
	inflight map[uint32]*send // guarded by Client.mu
	// maxFrames bounds len(inflight): Options.MaxInFlight, or what the
	// agent's window holds (frameLimit).
	maxFrames int
	bytes     int64 // in flight, guarded by Client.mu
	broken    chan struct{}
	err       error // why it broke (set before broken is closed)
	// Scratch buffers of the sender goroutine: a frame is built, written
	// to w (which copies it) and the buffers reused.
	zbody, frame []byte
}

// sender connects, sends, and reconnects, until Close.
func (c *Client) sender() {
	defer c.wg.Done()
	defer close(c.senderDone)
	attempt := 0
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		s, err := c.dial()
		if err != nil {
			attempt++
			c.mu.Lock()
			c.dialErr = err
			var fe *Error
			if errors.As(err, &fe) && (fe.Reason == "unauthenticated" || fe.Reason == "unsupported_version") {
				// The agent refused this client, not the moment: what is
				// waiting fails with its reason instead of waiting forever.
				c.failWaiting(fe)
			}
			c.mu.Unlock()
			select {
			case <-c.stop:
				return
			case <-time.After(c.backoff(attempt)):
			}
			continue
		}
		attempt = 0
		c.serve(s)
	}
}

// dial connects to the first address that answers and says hello.
func (c *Client) dial() (*session, error) {
	var errs []error
	for _, a := range c.o.Addrs {
		network, addr, _ := strings.Cut(a, ":")
		var conn net.Conn
		var err error
		if network == "tcp" && c.o.TLS != nil {
			conn, err = tls.DialWithDialer(&net.Dialer{Timeout: c.o.DialTimeout}, network, addr, c.o.TLS)
		} else {
			conn, err = dialTuned(network, addr, c.o.DialTimeout)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s, err := c.handshake(conn)
		var fe *Error
		if err != nil && c.version() == protocol.Version3 && errors.As(err, &fe) && fe.Reason == "unsupported_version" {
			// An agent older than version 3: ask again, for what the
			// options need, without idempotence (and from now on).
			conn.Close()
			c.noV3 = true
			return c.dial()
		}
		if err != nil {
			conn.Close()
			errs = append(errs, err)
			continue
		}
		return s, nil
	}
	return nil, errors.Join(errs...)
}

func (c *Client) handshake(conn net.Conn) (*session, error) {
	_ = conn.SetDeadline(time.Now().Add(c.o.DialTimeout))
	defer conn.SetDeadline(time.Time{})
	var feats uint64
	switch c.compress {
	case protocol.CompressLZ4:
		feats = protocol.FeatureLZ4
	case protocol.CompressZstd:
		feats = protocol.FeatureZstd
	}
	v := c.version()
	hello := protocol.Hello{Version: v, ClientName: c.o.ClientName, Token: c.o.Token, Features: feats}
	if v >= protocol.Version3 {
		hello.Features |= protocol.FeatureIdempotence
		hello.ProducerID = c.pid[:]
	}
	pre := protocol.PreambleFor(byte(v))
	out := append([]byte(nil), pre[:]...)
	out = protocol.AppendHello(out, hello)
	if _, err := conn.Write(out); err != nil {
		return nil, err
	}
	h, body, err := readFrame(conn, 1<<16)
	if err != nil {
		return nil, err
	}
	switch h.Type {
	case protocol.TypeHelloOK:
		ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits)
		if err != nil {
			return nil, err
		}
		if ok.Version != v {
			return nil, fmt.Errorf("the agent answered protocol version %d to a hello of version %d", ok.Version, v)
		}
		if feats != 0 && ok.Features&feats == 0 {
			return nil, fmt.Errorf("the agent does not take %s compression", c.o.Compression)
		}
		return &session{c: conn, w: bufio.NewWriterSize(conn, 256<<10), hello: ok, inflight: map[uint32]*send{}, maxFrames: c.frameLimit(ok.MaxInflightBytes), broken: make(chan struct{}),
			idem: v >= protocol.Version3 && ok.Features&protocol.FeatureIdempotence != 0}, nil
	case protocol.TypeError:
		reason, msg, _ := protocol.DecodeError(body, protocol.DefaultLimits)
		return nil, &Error{Reason: reason, Message: msg}
	}
	return nil, fmt.Errorf("unexpected frame type %d in the handshake", h.Type)
}

// unixWriteBuffer is the send buffer asked for on a Unix socket: a few
// frames of the default BatchBytes.
const unixWriteBuffer = 1 << 20

const defaultBatchBytes = 256 << 10 // Options.BatchBytes

// dialTuned dials and sizes the connection's send buffer. A Unix socket holds what the
// sender's buffer allows, 208 KiB by default: less than one 256 KiB frame,
// so each frame stalled the sender until the agent had read part of it,
// and the agent, busy with the frame before, had not (issue 37: 32 B
// records from one goroutine, 2.0-2.6M records/s against 2.6-2.9M with
// 1 MiB). The kernel caps the request at net.core.wmem_max (doubled);
// best effort. TCP is left to the kernel's own sizing, which setting it
// would turn off.
func dialTuned(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if uc, ok := conn.(*net.UnixConn); ok && err == nil {
		_ = uc.SetWriteBuffer(unixWriteBuffer)
	}
	return conn, err
}

// Bounds of the frames in flight when Options.MaxInFlight is not set.
const (
	minAutoInFlight = 32
	maxAutoInFlight = 1024 // each costs the client and the agent a little state
)

// frameLimit is the frames a session may have unanswered. Unset, it is as
// many full frames as the agent's window (max_inflight_bytes) holds: the
// agent answers a frame only once Kafka acknowledged its records, so
// records/s through one connection is at most window ÷ that latency, and a
// fixed 32 frames of 256 KiB used a quarter of the default 32 MiB. With
// 1000 B records through one local Kafka, 32 MiB in flight gave 1.0-1.3×
// the records/s of 8 MiB in the same rounds (median 1.17; ferry-bench
// produce --target unix: --concurrency 1; issue 37). At 16 B, where the
// machine's CPU is the limit, it changes nothing measurable.
func (c *Client) frameLimit(agentWindow uint32) int {
	if c.o.MaxInFlight > 0 {
		return c.o.MaxInFlight
	}
	return min(maxAutoInFlight, max(minAutoInFlight, int(agentWindow)/c.o.BatchBytes))
}

func readFrame(r io.Reader, max int) (protocol.FrameHeader, []byte, error) {
	var hdr [10]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return protocol.FrameHeader{}, nil, err
	}
	h, err := protocol.ParseHeader(hdr, max)
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.BodyLen())
	_, err = io.ReadFull(r, body)
	return h, body, err
}

// serve sends on s until it breaks or the client stops; what was in flight
// on it is sent again on the next connection.
func (c *Client) serve(s *session) {
	go c.reader(s)
	// Close must not wait behind a write to an agent that stopped
	// reading: closing the connection ends it (and the reader, whose end
	// ends this watcher otherwise).
	go func() {
		select {
		case <-c.stop:
			s.c.Close()
		case <-s.broken:
		}
	}()
	defer func() {
		s.c.Close()
		c.mu.Lock()
		// Unanswered: their fate is unknown, so they are sent again (the
		// agent may have delivered them: at least once).
		// In the order they were first sent (frame ids ascend per
		// session), not the map's: up to 1,024 frames may be in flight,
		// and a random resend order would reorder a key's records more
		// than at least once requires.
		ids := slices.Sorted(maps.Keys(s.inflight))
		again := make([]send, 0, len(ids))
		for _, id := range ids {
			again = append(again, *s.inflight[id])
		}
		s.inflight = nil
		c.retry = append(again, c.retry...)
		c.mu.Unlock()
	}()
	maxFrame := int(s.hello.MaxFrameBytes)
	for {
		sd, wait := c.next(s)
		if sd == nil {
			var timer <-chan time.Time
			if wait > 0 {
				timer = time.After(wait)
			}
			select {
			case <-c.stop:
				return
			case <-s.broken:
				return
			case <-c.kick:
			case <-timer:
			}
			continue
		}
		frame, err := c.encode(s, sd, maxFrame)
		if err != nil {
			continue // the records were failed or split by encode
		}
		if _, err := s.w.Write(frame); err != nil {
			return
		}
		// Write more while more is ready; flush when nothing is.
		if c.hasReady(s) {
			continue
		}
		if err := s.w.Flush(); err != nil {
			return
		}
	}
}

func (c *Client) hasReady(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(s.inflight) < s.maxFrames && (len(c.ready) > 0 || len(c.retry) > 0 && !time.Now().Before(c.retry[0].b.deadline))
}

// next takes the next frame to send, if one may go now; else how long to
// wait for a retry's backoff (0: until kicked).
func (c *Client) next(s *session) (*send, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(s.inflight) >= s.maxFrames || s.bytes >= int64(s.hello.MaxInflightBytes) && len(s.inflight) > 0 {
		return nil, 0
	}
	if len(c.retry) > 0 {
		if d := time.Until(c.retry[0].b.deadline); d > 0 {
			if len(c.ready) == 0 {
				return nil, d
			}
		} else {
			sd := c.retry[0]
			c.retry = c.retry[1:]
			return &sd, 0
		}
	}
	if len(c.ready) == 0 && c.cur != nil && c.cur.urgent {
		c.seal() // a slot is free and someone waits for what is being filled
	}
	if len(c.ready) > 0 {
		b := c.ready[0]
		c.ready[0] = nil
		c.ready = c.ready[1:]
		return &send{b: b, n: len(b.entries)}, 0
	}
	return nil, 0
}

// encode builds sd's frame and registers it in flight. A send over the
// agent's frame or record limits is split; a single record over the frame
// limit is failed.
func (c *Client) encode(s *session, sd *send, maxFrame int) ([]byte, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	flags := byte(0)
	if c.o.Receipts {
		flags |= protocol.FlagReceipt
	}
	if sd.b.reqID != "" {
		flags |= protocol.FlagRequestID
	}
	if s.idem {
		if sd.seq == 0 {
			c.seq++
			sd.seq = c.seq
		}
		flags |= protocol.FlagSequence
	}
	// The records are copied into the frame with c.mu released: that copy
	// reads every value once, often from memory the application wrote
	// long ago, and Produce (which needs c.mu for every record) must not
	// wait behind it. A sealed batch's entries are not changed meanwhile
	// (Produce only appends to c.cur), and encoding keeps its callbacks,
	// and so its return to the pool, waiting until the copy is done.
	sd.b.encoding = true
	c.mu.Unlock()

	// The frame is encoded in place behind its header, straight from the
	// records: every record byte is copied once, here (a body built at
	// Produce and copied into the frame cost a second copy of every byte,
	// on the application's goroutine).
	id := s.nextID + 1
	frame, at := protocol.BeginFrame(s.frame[:0], protocol.TypeProduce, flags, id)
	start := len(frame)
	if sd.b.reqID != "" {
		frame = protocol.AppendRequestID(frame, sd.b.reqID)
	}
	if s.idem {
		frame = protocol.AppendSequence(frame, sd.seq)
	}
	frame = protocol.AppendProduceCount(frame, sd.n)
	prev := ""
	for k := 0; k < sd.n; k++ {
		rec := sd.b.entries[sd.at(k)].rec
		frame = appendRecord(frame, prev, rec)
		prev = rec.Topic
	}
	s.frame = frame
	bodyLen := len(frame) - start
	tooBig := bodyLen+protocol.HeaderLen > maxFrame || sd.n > int(s.hello.MaxRecords)
	if !tooBig {
		protocol.EndFrame(frame, at)
		if c.compress != protocol.CompressNone {
			zf, zat := protocol.BeginFrame(s.zbody[:0], protocol.TypeProduce, flags|c.compress, id)
			if z, err := protocol.Compress(zf, frame[start:], c.compress); err == nil {
				protocol.EndFrame(z, zat)
				s.zbody, frame = z, z
			}
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	sd.b.encoding = false
	if sd.b.open == 0 {
		kickCh(c.cbKick) // resolved meanwhile (Close): its callbacks may run now
	}
	if c.closed {
		return nil, ErrClosed // Close failed its records meanwhile
	}
	if tooBig {
		if sd.n == 1 {
			c.resolve(sd.b, sd.at(0), &Error{Reason: "record_too_large",
				Message: fmt.Sprintf("a record of %d bytes does not fit in the agent's frame limit (%d)", bodyLen, maxFrame)})
			return nil, errTooBig
		}
		half := sd.n / 2
		first, second := send{b: sd.b, n: half}, send{b: sd.b, n: sd.n - half}
		first.idx, second.idx = make([]int, half), make([]int, sd.n-half)
		for k := 0; k < sd.n; k++ {
			if k < half {
				first.idx[k] = sd.at(k)
			} else {
				second.idx[k-half] = sd.at(k)
			}
		}
		c.retry = append([]send{first, second}, c.retry...)
		return nil, errTooBig
	}
	s.nextID = id
	s.inflight[id] = sd
	s.bytes += int64(len(frame))
	sd.frameBytes = len(frame)
	return frame, nil
}

var errTooBig = errors.New("split")

// at is the batch index of the send's k-th record.
func (sd *send) at(k int) int {
	if sd.idx == nil {
		return k
	}
	return sd.idx[k]
}

// reader reads the answers on s.
func (c *Client) reader(s *session) {
	defer close(s.broken)
	br := bufio.NewReaderSize(s.c, 64<<10)
	var ranges []protocol.Range
	var rc protocol.Receipt
	for {
		h, body, err := readFrame(br, 64<<20)
		if err != nil {
			s.err = err
			return
		}
		switch h.Type {
		case protocol.TypeResult:
			flags := h.Flags
			if s.hello.Version < protocol.Version2 {
				flags = 0 // version 1 has no receipts
			}
			rc.SpoolID, rc.Placements = "", rc.Placements[:0]
			ranges, err = protocol.DecodeResultReceipt(ranges[:0], &rc, flags, body, protocol.DefaultLimits)
			if err != nil {
				s.err = err
				return
			}
			var got *protocol.Receipt
			if flags&protocol.FlagReceipt != 0 {
				got = &rc
			}
			c.answered(s, h.RequestID, ranges, got)
		case protocol.TypeError:
			reason, msg, _ := protocol.DecodeError(body, protocol.DefaultLimits)
			s.err = &Error{Reason: reason, Message: msg}
			return
		default:
			s.err = fmt.Errorf("unexpected frame type %d", h.Type)
			return
		}
	}
}

// answered applies a Result to the records of the frame it answers.
func (c *Client) answered(s *session, id uint32, ranges []protocol.Range, rc *protocol.Receipt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sd, ok := s.inflight[id]
	if !ok {
		return
	}
	delete(s.inflight, id)
	s.bytes -= int64(sd.frameBytes)
	if c.closed {
		// Close failed these records already; their batch may be back
		// in the pool.
		return
	}
	var again []int
	var after time.Duration
	k := 0
	// The receipt's placements cover the accepted records in record
	// order: pl is the placement being consumed, used how many of it.
	pl, used := 0, 0
	if rc != nil && len(sd.b.res) < len(sd.b.entries) {
		sd.b.res = append(sd.b.res[:0], make([]Result, len(sd.b.entries))...)
		for i := range sd.b.res {
			sd.b.res[i].Offset = -1
		}
	}
	for _, rg := range ranges {
		n := int(rg.Count)
		if n == 0 { // the whole frame
			n = sd.n
		}
		for j := 0; j < n && k < sd.n; j, k = j+1, k+1 {
			i := sd.at(k)
			switch rg.Status {
			case protocol.StatusOK:
				if rc != nil {
					res := Result{Offset: -1, ReceiptID: rc.SpoolID}
					if pl < len(rc.Placements) {
						p := rc.Placements[pl]
						res.Topic, res.Partition, res.Offset = p.Topic, p.Partition, p.Offset+int64(used)
						if used++; used >= int(p.Count) {
							pl, used = pl+1, 0
						}
					}
					sd.b.res[i] = res
				}
				c.resolve(sd.b, i, nil)
			case protocol.StatusPermanent:
				c.resolve(sd.b, i, &Error{Reason: rg.Reason, Message: rg.Message})
			default:
				if c.closing || c.o.MaxRetries > 0 && sd.b.tries >= c.o.MaxRetries {
					c.resolve(sd.b, i, &Error{Retryable: true, Reason: rg.Reason, Message: rg.Message, RetryAfter: rg.RetryAfter})
					continue
				}
				again = append(again, i)
				after = max(after, rg.RetryAfter)
			}
		}
	}
	for ; k < sd.n; k++ { // an answer that covers fewer records than sent
		c.resolve(sd.b, sd.at(k), &Error{Reason: "protocol_error", Message: "the agent's answer did not cover this record"})
	}
	if len(again) > 0 {
		sd.b.tries++
		sd.b.deadline = time.Now().Add(max(after/2, c.backoff(sd.b.tries)))
		next := send{b: sd.b, idx: again, n: len(again)}
		if len(again) == sd.n {
			// The whole frame again: the same records, so the same
			// sequence (an in_flight or ack_timeout answer: the first copy
			// may be stored, and the agent must know this for a retry).
			next.seq = sd.seq
		}
		c.retry = append(c.retry, next)
	}
	c.cond.Broadcast()
	kickCh(c.kick)
}

// failWaiting fails every record not on the wire with err; c.mu held.
func (c *Client) failWaiting(err error) {
	for _, b := range c.ready {
		for i := range b.entries {
			c.resolve(b, i, err)
		}
	}
	for _, sd := range c.retry {
		for k := 0; k < sd.n; k++ {
			c.resolve(sd.b, sd.at(k), err)
		}
	}
	c.ready, c.retry = nil, nil
	c.cond.Broadcast()
}
