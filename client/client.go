// Package client is ferry's Go client: it sends records to the local agent
// over the local record protocol (docs/protocol.md), on a Unix socket or
// TCP, and reports each record's fate exactly once.
//
// Produce is asynchronous and cheap: the record joins the batch being
// filled by reference (no copy, no allocation per record once buffers are
// warm); the sender goroutine copies its bytes into a frame when the batch
// goes out, so the application's goroutine does not pay for reading every
// value (franz-go does the same). The batch is sent when it is full
// or Linger has passed, and up to MaxInFlight
// batches are on the wire at once. The agent answers every batch when its
// records are durable (Kafka's acknowledgement, or the agent's spool); a
// record refused for a passing reason (the agent's buffer full, Kafka
// unreachable, the connection lost) is sent again with exponential backoff
// and jitter, so only a refusal that cannot change, or Close, fails it.
//
// Retries are exactly once where the agent allows it: a client has a
// random producer id, and numbers each frame it sends (protocol version 3,
// docs/protocol.md); a frame sent again because its fate is unknown (the
// connection broke before its answer, ack_timeout) keeps its number, so
// an agent in delivery mode spool stores it once, across reconnects and
// its own restarts, and answers the retry with the first answer. Against
// an agent that does not keep sequences (other delivery modes, or an
// older agent) retries are at least once.
//
// Callbacks run on one goroutine, in the order the records were produced
// (so in order per topic and key too); a callback must not block for long,
// and must not Produce with a MaxBlock wait (room is freed by the very
// goroutine it would block).
// A record, its key, value and headers must not be changed until its
// callback has run. With MaxInFlight > 1 a record sent again after a
// refusal may land in Kafka after records produced later (as with Kafka's
// own producer without idempotence); MaxInFlight 1 keeps Kafka's order.
package client

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/protocol"
)

// Record is one record to send.
type Record struct {
	Topic   string
	Key     []byte // nil: no key
	Value   []byte
	Headers []Header
	// Timestamp; zero: the agent's time of receipt.
	Timestamp time.Time
	// RequestID, with Options.RequestIDs, is written by the agent on the
	// record as the Kafka header ferry.request_id (1-128 of A-Z a-z 0-9 .
	// _ : -; Produce fails a record with another one at once, with a
	// permanent *Error invalid_request_id, as the agent would).
	RequestID string
}

// Result is where a record went, for ProduceResult's callback.
type Result struct {
	// Topic, Partition and Offset in Kafka; Offset is -1 when not known:
	// receipts were not asked for (Options.Receipts), the record failed,
	// or the agent's spool took it first (then ReceiptID is set).
	Topic     string
	Partition int32
	Offset    int64
	// ReceiptID: the agent answered from its disk spool, before Kafka had
	// the record; GET /receipts/{ReceiptID} on the agent's HTTP listener
	// (with the same token) says where it is once Kafka has it.
	ReceiptID string
}

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Options configure a Client; zero values take the defaults.
type Options struct {
	// Addrs are tried in order at every connect: "unix:PATH" or
	// "tcp:HOST:PORT". Default: the agent's Unix socket
	// (unix:ferry-data/ferry.sock), then tcp:127.0.0.1:8090.
	Addrs []string
	// Token is the application token sent in the hello.
	Token string
	// ClientName identifies this program in the agent's logs.
	ClientName string
	// MaxBufferedBytes bounds the records produced and not yet called back
	// (default 64 MiB). When full, Produce waits up to MaxBlock for room,
	// then fails the record with ErrBufferFull (or, if its ctx ends first,
	// with an error wrapping ctx's).
	MaxBufferedBytes int64
	// MaxBufferedRecords bounds the same records by count (default
	// 100,000, the bound ferry-bench gives franz-go, its direct
	// reference): small records fill 64 MiB only at two million, whose
	// entries and frames no cache holds (16 B records, one goroutine, 10M
	// records: 4.9 s of the producer's CPU and ~1 s a record waiting for
	// its callback, against 3.6-3.9 s and 36-105 ms with the count bound;
	// records/s within the machine's noise; issue 37).
	MaxBufferedRecords int
	MaxBlock           time.Duration // default 10s; negative: fail at once
	// A batch is sent when it holds BatchBytes (default 256 KiB, encoded)
	// or BatchRecords (default 10,000), or Linger (default 2ms) after its
	// first record.
	BatchBytes   int
	BatchRecords int
	Linger       time.Duration
	// Compression of batches: "none" (default), "lz4" or "zstd".
	Compression string
	// MaxInFlight batches on the wire at once. Default (0): as many
	// BatchBytes frames as the agent lets one connection have unanswered
	// (its receivers.local.max_inflight_bytes, 32 MiB by default, told in
	// its hello), at least 32 and at most 1024: 128 with the defaults.
	MaxInFlight int
	// RetryBackoff and RetryBackoffMax bound the wait before a refused
	// record is sent again or a lost connection is redialled (defaults
	// 100ms and 5s; the wait doubles, with jitter). MaxRetries bounds the
	// times a record is sent again (default 0: until it succeeds, fails
	// for good, or Close).
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	MaxRetries      int
	DialTimeout     time.Duration // default 2s
	// TLS, if set, is used for "tcp:" addresses (the agent's
	// receivers.local.tls); a Unix socket is never wrapped.
	TLS *tls.Config
	// Receipts asks the agent, for every frame, where its records went
	// (see Result). It needs an agent that speaks protocol version 2.
	Receipts bool
	// RequestIDs sends records' RequestID. It needs an agent that speaks
	// protocol version 2.
	RequestIDs bool
	// DisableIdempotence stops numbering frames (protocol version 3's
	// producer id and sequences): retries are then at least once even
	// where the agent could recognise them. Idempotence costs a few bytes
	// a frame; an agent that does not speak version 3 is detected and
	// served without it.
	DisableIdempotence bool
}

// version is the protocol version the options need: 2 for receipts or
// request ids, else 1 (what every agent speaks).
func (o *Options) version() uint16 {
	if o.Receipts || o.RequestIDs {
		return protocol.Version2
	}
	return protocol.Version1
}

// version is the protocol version to ask for on a new connection: 3 for
// idempotence unless an agent refused it.
func (c *Client) version() uint16 {
	if !c.o.DisableIdempotence && !c.noV3 {
		return protocol.Version3
	}
	return c.o.version()
}

func (o *Options) defaults() error {
	if len(o.Addrs) == 0 {
		o.Addrs = []string{"unix:ferry-data/ferry.sock", "tcp:127.0.0.1:8090"}
	}
	for _, a := range o.Addrs {
		if !strings.HasPrefix(a, "unix:") && !strings.HasPrefix(a, "tcp:") {
			return fmt.Errorf("client: address %q: want unix:PATH or tcp:HOST:PORT", a)
		}
	}
	if o.ClientName == "" {
		o.ClientName = "ferry-go"
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = 64 << 20
	}
	if o.MaxBufferedRecords <= 0 {
		o.MaxBufferedRecords = 100_000
	}
	if o.MaxBlock == 0 {
		o.MaxBlock = 10 * time.Second
	}
	if o.BatchBytes <= 0 {
		// Smaller frames pipeline better: the agent answers a frame when
		// its last record is acknowledged, so one large frame holds many
		// records behind its slowest partition (1 MiB frames and 8 in
		// flight: 0.57-0.74x franz-go direct; 256 KiB and 32: 0.96x).
		o.BatchBytes = defaultBatchBytes
	}
	if o.BatchRecords <= 0 {
		o.BatchRecords = 10_000
	}
	if o.Linger <= 0 {
		o.Linger = 2 * time.Millisecond
	}
	switch o.Compression {
	case "", "none", "lz4", "zstd":
	default:
		return fmt.Errorf("client: compression %q: want none, lz4 or zstd", o.Compression)
	}
	if o.MaxInFlight < 0 {
		o.MaxInFlight = 0 // the agent's window decides (session.maxFrames)
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 100 * time.Millisecond
	}
	if o.RetryBackoffMax <= 0 {
		o.RetryBackoffMax = 5 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 2 * time.Second
	}
	return nil
}

// Errors a callback may get besides *Error.
var (
	ErrClosed     = errors.New("client: closed before the record was delivered")
	ErrBufferFull = errors.New("client: buffer full (MaxBufferedBytes) for longer than MaxBlock")
)

// errInvalidRequestID fails a record whose RequestID the agent would
// refuse (protocol.ValidRequestID), as the agent would.
var errInvalidRequestID = &Error{Reason: "invalid_request_id",
	Message: fmt.Sprintf("the request id must be 1 to %d of A-Z a-z 0-9 . _ : -", protocol.MaxRequestIDBytes)}

// Error is the agent's refusal of a record, with the reason the HTTP API
// uses too (queue_full, record_too_large, topic_not_allowed, ...).
type Error struct {
	Retryable  bool
	Reason     string
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string { return "ferry: " + e.Reason + ": " + e.Message }

// entry is one produced record until its callback.
type entry struct {
	rec  *Record
	cb   func(*Record, error)
	rcb  func(*Record, Result, error) // ProduceResult's, instead of cb
	err  error
	size int
	done bool
}

// batch is records produced together, called back together.
type batch struct {
	entries []entry
	open    int // entries not yet resolved
	// wire is the records' encoded size, as the sender will write them
	// (prev: the last record's topic, which the next one may repeat).
	wire int
	prev string
	// encoding: the sender is copying records of this batch into a frame
	// without c.mu; its callbacks (after which the application may change
	// the records) and its return to the pool wait for the copy.
	encoding bool
	bytes    int64
	tries    int
	urgent   bool // someone waits for it (ProduceSync, Flush): send at the first free slot
	firstAt  time.Time
	deadline time.Time // not sent before (backoff after a refusal)
	reqID    string    // the request id of every record (Options.RequestIDs)
	// res[i] is entry i's receipt, allocated when the first answer with
	// a receipt arrives (nil: no receipts asked for).
	res []Result
}

// send is a frame on the wire: the batch's records at idx (nil: all).
type send struct {
	b          *batch
	idx        []int
	n          int
	frameBytes int
	// seq is the frame's sequence number once it went out on a
	// connection granted idempotence (0: not yet). It names these exact
	// records: a resend of them keeps it, any other set takes a new one.
	seq uint64
}

// Client sends records to the agent. Safe for concurrent use.
type Client struct {
	o        Options
	compress byte

	mu        sync.Mutex
	cond      *sync.Cond // buffered bytes freed, a batch called back, state changed
	cur       *batch     // being filled
	ready     []*batch   // sealed, waiting to be sent (retries first)
	retry     []send     // parts of batches to send again
	order     []*batch   // every batch not yet called back, in produce order
	buffered  int64
	bufferedN int // records in buffered
	closing   bool
	closed    bool
	lingerT   *time.Timer

	kick   chan struct{}
	cbKick chan struct{}
	stop   chan struct{}
	// senderDone is closed when the sender goroutine has returned.
	senderDone chan struct{}
	wg         sync.WaitGroup
	batchP     sync.Pool
	dialErr    error

	// pid is this client's producer id (protocol version 3); seq the last
	// sequence number given out (c.mu).
	pid [protocol.ProducerIDBytes]byte
	seq uint64
	// noV3: an agent refused version 3; later connections ask for the
	// version the options need (sender goroutine only).
	noV3 bool
}

// New returns a client; it connects in the background (an agent that is
// not up yet is waited for, with backoff).
func New(o Options) (*Client, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &Client{o: o, kick: make(chan struct{}, 1), cbKick: make(chan struct{}, 1), stop: make(chan struct{}), senderDone: make(chan struct{})}
	c.compress = map[string]byte{"lz4": protocol.CompressLZ4, "zstd": protocol.CompressZstd}[o.Compression]
	c.cond = sync.NewCond(&c.mu)
	if _, err := crand.Read(c.pid[:]); err != nil {
		return nil, fmt.Errorf("client: producer id: %w", err)
	}
	c.batchP.New = func() any { return &batch{} }
	c.wg.Add(2)
	go c.sender()
	go c.callbacks()
	return c, nil
}

// Produce queues r; cb (may be nil) is called exactly once with nil when r
// is durable where the agent's delivery mode says, or with the error that
// failed it. Produce waits only while the buffer is full (up to MaxBlock,
// then ErrBufferFull; or until ctx ends, then an error wrapping ctx's).
func (c *Client) Produce(ctx context.Context, r *Record, cb func(*Record, error)) {
	c.produce(ctx, r, cb, nil)
}

// ProduceResult is Produce whose callback also gets the record's Result:
// where it is in Kafka (with Options.Receipts), or the receipt id to look
// it up under when the agent's spool took it first.
func (c *Client) ProduceResult(ctx context.Context, r *Record, cb func(*Record, Result, error)) {
	c.produce(ctx, r, nil, cb)
}

func (c *Client) produce(ctx context.Context, r *Record, cb func(*Record, error), rcb func(*Record, Result, error)) {
	if c.o.RequestIDs && r.RequestID != "" && !protocol.ValidRequestID(r.RequestID) {
		// The agent would refuse it for good: fail it here, at once,
		// rather than send a frame no retry can fix.
		c.fail(r, cb, rcb, errInvalidRequestID)
		return
	}
	size := recordSize(r)
	c.mu.Lock()
	if c.closed || c.closing {
		c.mu.Unlock()
		c.fail(r, cb, rcb, ErrClosed)
		return
	}
	if c.full(int64(size)) {
		if !c.waitRoom(ctx, int64(size)) {
			err := ErrBufferFull
			switch { // read under c.mu
			case c.closing || c.closed:
				err = ErrClosed
			case c.o.MaxBlock >= 0 && ctx.Err() != nil:
				// The caller stopped waiting: the buffer was not full for
				// MaxBlock, and a caller counting failures must tell them
				// apart (errors.Is with ctx.Err(), and with its cause).
				err = fmt.Errorf("client: gave up waiting for room in the buffer: %w", ctx.Err())
				if cause := context.Cause(ctx); cause != ctx.Err() {
					err = fmt.Errorf("%w (%w)", err, cause)
				}
			}
			c.mu.Unlock()
			c.fail(r, cb, rcb, err)
			return
		}
	}
	reqID := ""
	if c.o.RequestIDs {
		reqID = r.RequestID
	}
	if c.cur != nil && c.cur.reqID != reqID {
		// A frame carries one request id: another one starts a frame.
		c.seal()
	}
	b := c.cur
	if b == nil {
		b = c.batchP.Get().(*batch)
		b.firstAt = time.Now()
		b.reqID = reqID
		c.cur = b
		c.order = append(c.order, b)
		if c.lingerT == nil {
			c.lingerT = time.AfterFunc(c.o.Linger, c.lingerFired)
		} else {
			c.lingerT.Reset(c.o.Linger)
		}
	}
	b.entries = append(b.entries, entry{rec: r, cb: cb, rcb: rcb, size: size})
	b.wire += encodedLen(b.prev, r)
	b.prev = r.Topic
	b.open++
	b.bytes += int64(size)
	c.buffered += int64(size)
	c.bufferedN++
	if b.wire >= c.o.BatchBytes || len(b.entries) >= c.o.BatchRecords {
		c.seal()
	}
	c.mu.Unlock()
}

// full: a record of size bytes does not fit the buffer (either bound; an
// empty buffer takes any one record); c.mu held.
func (c *Client) full(size int64) bool {
	return c.buffered > 0 && (c.buffered+size > c.o.MaxBufferedBytes || c.bufferedN >= c.o.MaxBufferedRecords)
}

// waitRoom waits, with c.mu held, until size bytes fit; false on timeout,
// ctx end or close.
func (c *Client) waitRoom(ctx context.Context, size int64) bool {
	if c.o.MaxBlock < 0 {
		return false
	}
	deadline := time.Now().Add(c.o.MaxBlock)
	t := time.AfterFunc(c.o.MaxBlock, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer t.Stop()
	stopCtx := context.AfterFunc(ctx, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer stopCtx()
	// Sealing what is being filled lets it go out and free room.
	c.seal()
	for c.full(size) {
		if c.closing || c.closed || ctx.Err() != nil || !time.Now().Before(deadline) {
			return false
		}
		c.cond.Wait()
	}
	return true
}

func (c *Client) fail(r *Record, cb func(*Record, error), rcb func(*Record, Result, error), err error) {
	switch {
	case rcb != nil:
		rcb(r, Result{Offset: -1}, err)
	case cb != nil:
		cb(r, err)
	}
}

// seal moves the batch being filled to the send queue; c.mu held.
func (c *Client) seal() {
	if c.cur == nil {
		return
	}
	c.ready = append(c.ready, c.cur)
	c.cur = nil
	kickCh(c.kick)
}

// urge marks the batch being filled as awaited: it goes now if nothing is
// waiting to be sent, else at the sender's first free slot, with whatever
// else was produced meanwhile (many callers of ProduceSync share frames
// instead of queueing one frame each). c.mu held.
func (c *Client) urge() {
	if c.cur == nil {
		return
	}
	c.cur.urgent = true
	if len(c.ready) == 0 {
		c.seal()
	}
}

func (c *Client) lingerFired() {
	c.mu.Lock()
	if c.cur != nil && time.Since(c.cur.firstAt) >= c.o.Linger/2 {
		c.seal()
	}
	c.mu.Unlock()
}

// ProduceSync sends records and waits for all of them: nil when every one
// is durable, else the first record's error. If ctx ends first it returns
// ctx's error with the records still being sent: they are read when their
// batch goes out, so they must not be changed until Flush or Close has
// returned.
func (c *Client) ProduceSync(ctx context.Context, rs ...*Record) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	wg.Add(len(rs))
	for _, r := range rs {
		c.Produce(ctx, r, func(_ *Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	c.mu.Lock()
	c.urge()
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return first
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Flush sends what is buffered and waits until every record produced
// before it has been called back, or ctx ends.
func (c *Client) Flush(ctx context.Context) error {
	c.mu.Lock()
	c.seal()
	var last *batch
	if n := len(c.order); n > 0 {
		last = c.order[n-1]
	}
	stop := context.AfterFunc(ctx, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer stop()
	for last != nil && c.pending(last) {
		if ctx.Err() != nil {
			c.mu.Unlock()
			return ctx.Err()
		}
		c.cond.Wait()
	}
	c.mu.Unlock()
	return nil
}

// pending reports whether b is still waiting for its callbacks; c.mu held.
func (c *Client) pending(b *batch) bool {
	for _, o := range c.order {
		if o == b {
			return true
		}
	}
	return false
}

// Close flushes within ctx, then fails what is left with ErrClosed (every
// callback still runs exactly once) and stops. Produce after Close fails
// the record with ErrClosed.
func (c *Client) Close(ctx context.Context) error {
	err := c.Flush(ctx)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	c.seal()
	for _, b := range c.order {
		for i := range b.entries {
			if e := &b.entries[i]; !e.done {
				e.done, e.err = true, ErrClosed
				b.open--
			}
		}
	}
	c.ready, c.retry = nil, nil
	c.closed = true
	if c.lingerT != nil {
		c.lingerT.Stop()
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	kickCh(c.cbKick)
	close(c.stop)
	c.wg.Wait()
	return err
}

// resolve records the outcome of records of b; c.mu held.
func (c *Client) resolve(b *batch, i int, err error) {
	e := &b.entries[i]
	if e.done {
		return
	}
	e.done, e.err = true, err
	b.open--
	if b.open == 0 {
		kickCh(c.cbKick)
	}
}

// callbacks calls back finished batches in produce order.
func (c *Client) callbacks() {
	defer c.wg.Done()
	for {
		select {
		case <-c.cbKick:
		case <-c.stop:
			// After the sender has stopped: a batch it was still copying
			// into a frame is called back too.
			<-c.senderDone
			c.drainCallbacks()
			return
		}
		c.drainCallbacks()
	}
}

func (c *Client) drainCallbacks() {
	for {
		c.mu.Lock()
		if len(c.order) == 0 || c.order[0].open > 0 || c.order[0].encoding || c.order[0] == c.cur {
			c.mu.Unlock()
			return
		}
		// The batch stays first in order while its callbacks run, so Flush
		// returns only after they have.
		b := c.order[0]
		c.mu.Unlock()
		for i := range b.entries {
			e := &b.entries[i]
			switch {
			case e.rcb != nil:
				res := Result{Offset: -1}
				if i < len(b.res) && e.err == nil {
					res = b.res[i]
				}
				e.rcb(e.rec, res, e.err)
			case e.cb != nil:
				e.cb(e.rec, e.err)
			}
		}
		c.mu.Lock()
		c.order[0] = nil
		c.order = c.order[1:]
		c.buffered -= b.bytes
		c.bufferedN -= len(b.entries)
		c.cond.Broadcast()
		c.mu.Unlock()
		clear(b.entries)
		*b = batch{entries: b.entries[:0], res: b.res[:0]}
		c.batchP.Put(b)
	}
}

// backoff is the wait before attempt n (1-based), with jitter.
func (c *Client) backoff(n int) time.Duration {
	d := c.o.RetryBackoff << min(n-1, 20)
	d = min(d, c.o.RetryBackoffMax)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func recordSize(r *Record) int {
	n := len(r.Topic) + len(r.Key) + len(r.Value) + 16
	for i := range r.Headers {
		n += len(r.Headers[i].Key) + len(r.Headers[i].Value) + 4
	}
	return n
}

func kickCh(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
