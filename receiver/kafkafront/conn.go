package kafkafront

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/server"
)

// The APIs served and their versions. Produce stops at 12: v13 names
// topics by id only. InitProducerId stops at 5: v6 is two-phase commit.
var served = map[int16][2]int16{
	0: {3, 12}, // Produce
	// Fetch v4 is listed, never served: librdkafka sends v2 record batches
	// (headers, idempotence) only to a broker listing Produce v3 and Fetch
	// v4. A Fetch closes the connection (see handle).
	1:  {4, 4},
	3:  {1, 12}, // Metadata
	17: {1, 1},  // SaslHandshake: v1, so clients follow with SaslAuthenticate
	18: {0, 4},  // ApiVersions
	22: {0, 5},  // InitProducerId
	36: {0, 2},  // SaslAuthenticate
}

// A client that pipelines requests and never reads the answers must not
// make ferry hold answers without bound: past maxOwed answers owed, or
// past what server.Writer lets a connection hold (server.MaxHeld), the
// reader stops reading the connection until the client reads.
const maxOwed = 1000 // answers owed on one connection (Kafka's queued.max.requests is 500)

// conn is one client connection: a reader handles requests in order, a
// writer sends the answers, in the same order, as they become ready.
type conn struct {
	r       *Receiver
	ctx     context.Context
	c       net.Conn
	claims  *token.Claims
	authed  bool   // SASL done, or the gate let the client in without it
	tok     string // the SASL password, checked again on every request
	mech    string
	user    string
	scratch []byte
	// scope is the idempotency scope of this connection's application
	// (scopeOwner), for its idempotent batches' keys (durable.go).
	scope      []byte
	scopeOwner string
	// bodyBy is when the request being read must have arrived whole
	// (body_timeout after its size): a body read holds memory (a produce
	// request's reservation) that a client trickling bytes must not pin.
	bodyBy time.Time

	mu       sync.Mutex
	cond     *sync.Cond
	owed     []*slot // answers owed, in request order
	inflight int64   // produce request bytes not yet answered
	w        *server.Writer
}

// slot is one answer owed.
type slot struct {
	ready    bool
	out      []byte
	size     int64
	est      int // what the answer is counted as until it is made (server.Writer.Park)
	deadline time.Time
	// timeout answers the request when Kafka is too slow (produce only).
	timeout func()
}

func newConn(r *Receiver, ctx context.Context, c net.Conn) *conn {
	cn := &conn{r: r, ctx: ctx, c: c}
	cn.cond = sync.NewCond(&cn.mu)
	// A reader waiting for unread answers to drain is woken by the writer.
	wake := func() { cn.mu.Lock(); cn.cond.Broadcast(); cn.mu.Unlock() }
	cn.w = server.NewWriter(c, r.answers, wake, func() { r.m.Error("write_timeout") })
	return cn
}

// connErr closes the connection (after the answers already owed).
type connErr struct{ reason, msg string }

func (cn *conn) fail(reason, format string, args ...any) *connErr {
	msg := fmt.Sprintf(format, args...)
	cn.r.m.Error(reason)
	cn.r.logWarn(reason, "kafka connection closed: "+msg, "remote", cn.c.RemoteAddr().String(), "user", cn.user)
	return &connErr{reason: reason, msg: msg}
}

// run serves the connection until the client leaves, breaks the protocol,
// or the agent stops; answers owed are sent before it returns.
func (cn *conn) run() {
	stop := cn.ackTimer()
	cn.read()
	cn.mu.Lock()
	for len(cn.owed) > 0 {
		cn.cond.Wait()
	}
	cn.mu.Unlock()
	stop()
	cn.w.Close()
}

// read handles requests until the connection ends.
func (cn *conn) read() *connErr {
	r := cn.r
	var fixed [12]byte // size, api key, version, correlation id
	for {
		cn.mu.Lock()
		room := cn.w.WaitForRoom(cn.ctx, &cn.mu, cn.cond, func() bool { return len(cn.owed) >= maxOwed })
		cn.mu.Unlock()
		if !room {
			return nil
		}
		// Idle only while no answer is owed: a client waiting for its
		// answers is not idle, one that has them all is.
		if err := server.ReadHeader(cn.ctx, cn.c, fixed[:4], r.cfg.IdleTimeout, cn.owes); err != nil {
			return nil
		}
		size := int64(int32(binary.BigEndian.Uint32(fixed[:4])))
		if size > int64(r.cfg.MaxRequestBytes) {
			return cn.fail("request_too_large", "a request of %d bytes is over receivers.kafka.max_request_bytes (%s)", size, r.cfg.MaxRequestBytes)
		}
		if size < 8 {
			return cn.fail("malformed_request", "request size %d is below a request header", size)
		}
		// The whole request must arrive within body_timeout of its size.
		cn.bodyBy = time.Now().Add(r.cfg.BodyTimeout)
		_ = cn.c.SetReadDeadline(cn.bodyBy)
		if _, err := io.ReadFull(cn.c, fixed[4:]); err != nil {
			return cn.slow(err)
		}
		key := int16(binary.BigEndian.Uint16(fixed[4:]))
		ver := int16(binary.BigEndian.Uint16(fixed[6:]))
		corr := int32(binary.BigEndian.Uint32(fixed[8:]))
		rest := int(size - 8)
		cn.r.m.RequestCode(apiLabel(key))
		if cn.authed && key != 18 && key != 17 && key != 36 {
			// The token is checked again on every request (a cache hit),
			// so one that expired or whose key a reload removed stops
			// writing at once; a broker closes such a connection too
			// (KIP-368), and the client's new SASL exchange then fails
			// with the reason.
			if _, err := cn.r.gate.Check(cn.tok); err != nil {
				return cn.fail("unauthenticated", "user %q: the connection's token no longer holds: %v", cn.user, err)
			}
		}
		var cerr *connErr
		if key == 0 {
			cerr = cn.produce(ver, corr, rest)
		} else {
			if rest > maxOtherRequest {
				return cn.fail("request_too_large", "a request of %d bytes with API key %d; only Produce may exceed %d", size, key, maxOtherRequest)
			}
			if cap(cn.scratch) < rest {
				cn.scratch = make([]byte, rest)
			}
			body := cn.scratch[:rest]
			if _, err := io.ReadFull(cn.c, body); err != nil {
				return cn.slow(err)
			}
			// Decoding is where kmsg spends memory (a struct per array
			// entry): a few requests at a time across all connections.
			select {
			case r.decoding <- struct{}{}:
			case <-cn.ctx.Done():
				return nil
			}
			cerr = cn.handle(key, ver, corr, body)
			<-r.decoding
			// A connection keeps a small buffer, not its largest request.
			if cap(cn.scratch) > 4<<10 {
				cn.scratch = nil
			}
		}
		if cerr != nil {
			return cerr
		}
	}
}

// owes says whether an answer is still owed (the connection is busy).
func (cn *conn) owes() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return len(cn.owed) > 0
}

// slow ends a connection whose request did not arrive in time (or at
// all: the client left, which needs no words).
func (cn *conn) slow(err error) *connErr {
	if errors.Is(err, os.ErrDeadlineExceeded) && cn.ctx.Err() == nil {
		return cn.fail("body_timeout", "a request did not arrive whole within receivers.kafka.body_timeout (%s)", cn.r.cfg.BodyTimeout)
	}
	return nil
}

// apiLabel names a request's API for ferry_receiver_requests_total: the
// APIs ferry knows by name, any other as "other" (a client's key must not
// create a label).
func apiLabel(key int16) string {
	_, s := served[key]
	_, t := topLevelError[key]
	if s || t {
		return kmsg.NameForKey(key)
	}
	return "other"
}

// skipHeader returns the request body after the header's client id and,
// for flexible requests, its tagged fields.
func skipHeader(b []byte, flexible bool) ([]byte, bool) {
	w := walker{b: b}
	n := w.int16()
	if n > 0 {
		w.skip(n)
	}
	if flexible {
		w.flexible = true
		w.tags()
	}
	return w.b, w.err == nil
}

// handle answers every request but Produce.
func (cn *conn) handle(key, ver int16, corr int32, body []byte) *connErr {
	if key == 18 {
		return cn.apiVersions(ver, corr, body)
	}
	v, ok := served[key]
	if !ok || ver < v[0] || ver > v[1] || key == 1 {
		return cn.unsupported(key, ver, corr, body)
	}
	req := kmsg.RequestForKey(key)
	req.SetVersion(ver)
	body, ok = skipHeader(body, req.IsFlexible())
	if !ok {
		return cn.fail("malformed_request", "request header")
	}
	if key == 3 {
		// The topic count, before kmsg makes a struct for each.
		w := walker{b: body, flexible: req.IsFlexible()}
		if n := w.arrayLen(); n > maxMetadataTopics {
			return cn.fail("too_many_topics", "a Metadata request for %d topics (at most %d)", n, maxMetadataTopics)
		}
	}
	if err := checkBody(key, ver, body); err != nil {
		return cn.fail("malformed_request", "API key %d v%d: %v", key, ver, err)
	}
	if err := req.ReadFrom(body); err != nil {
		return cn.fail("malformed_request", "API key %d v%d: %v", key, ver, err)
	}
	if !cn.authed && key != 17 && key != 36 {
		if cerr := cn.anonymous(); cerr != nil {
			return cerr
		}
	}
	switch req := req.(type) {
	case *kmsg.MetadataRequest:
		return cn.metadata(req, corr)
	case *kmsg.InitProducerIDRequest:
		resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.SetVersion(ver)
		if req.TransactionalID != nil {
			cn.r.m.Error("transactions_unsupported")
			resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
			resp.ProducerID, resp.ProducerEpoch = -1, -1
		} else {
			resp.ProducerID, resp.ProducerEpoch = cn.r.seqs.issue(cn.owner(), time.Now()), 0
		}
		cn.answerNow(corr, resp)
	case *kmsg.SASLHandshakeRequest:
		resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
		resp.SetVersion(ver)
		resp.SupportedMechanisms = []string{"PLAIN"}
		if req.Mechanism != "PLAIN" {
			resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
			cn.answerNow(corr, resp)
			return cn.fail("unauthenticated", "SASL mechanism %q; ferry's Kafka front takes PLAIN (the password is the application token)", req.Mechanism)
		}
		cn.mech = "PLAIN"
		cn.answerNow(corr, resp)
	case *kmsg.SASLAuthenticateRequest:
		return cn.saslAuthenticate(req, ver, corr)
	}
	return nil
}

// anonymous lets a client that did not authenticate in when the gate
// needs no token; a Kafka broker closes such a connection too.
func (cn *conn) anonymous() *connErr {
	claims, err := cn.r.gate.Check("")
	if err != nil {
		return cn.fail("unauthenticated", "this listener needs an application token: configure the client with SASL PLAIN, the token as password")
	}
	cn.claims, cn.authed = claims, true
	return nil
}

func (cn *conn) saslAuthenticate(req *kmsg.SASLAuthenticateRequest, ver int16, corr int32) *connErr {
	resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
	resp.SetVersion(ver)
	if cn.mech != "PLAIN" || cn.authed {
		resp.ErrorCode = kerr.IllegalSaslState.Code
		cn.answerNow(corr, resp)
		return cn.fail("unauthenticated", "SaslAuthenticate without a PLAIN handshake, or twice")
	}
	// authzid NUL authcid NUL password (RFC 4616).
	parts := splitNUL(req.SASLAuthBytes)
	if len(parts) != 3 {
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		resp.ErrorMessage = ptr("malformed SASL PLAIN message")
		cn.answerNow(corr, resp)
		return cn.fail("unauthenticated", "malformed SASL PLAIN message")
	}
	cn.user = string(parts[1])
	claims, err := cn.r.gate.Check(string(parts[2]))
	if err != nil {
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		resp.ErrorMessage = ptr("the password is not a valid application token: " + err.Error())
		cn.answerNow(corr, resp)
		return cn.fail("unauthenticated", "user %q: %v", cn.user, err)
	}
	cn.claims, cn.authed, cn.tok = claims, true, string(parts[2])
	cn.answerNow(corr, resp)
	return nil
}

func splitNUL(b []byte) [][]byte {
	var out [][]byte
	for len(out) < 3 {
		i := indexByte(b, 0)
		if i < 0 {
			return append(out, b)
		}
		out, b = append(out, b[:i]), b[i+1:]
	}
	return append(out, b) // a fourth part: malformed
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func ptr(s string) *string { return &s }

// owner is the application this connection writes as: its token's app,
// "" without one. Producer ids are deduplicated per owner.
func (cn *conn) owner() string {
	if cn.claims == nil {
		return ""
	}
	return cn.claims.App
}

// apiVersions answers with the served table. A version newer than ferry
// knows is answered in v0 with UNSUPPORTED_VERSION and the table, so the
// client retries with one both speak (KIP-511).
func (cn *conn) apiVersions(ver int16, corr int32, body []byte) *connErr {
	resp := kmsg.NewPtrApiVersionsResponse()
	v := served[18]
	if ver > v[1] || ver < v[0] {
		resp.SetVersion(0)
		resp.ErrorCode = kerr.UnsupportedVersion.Code
	} else {
		req := kmsg.NewPtrApiVersionsRequest()
		req.SetVersion(ver)
		b, ok := skipHeader(body, req.IsFlexible())
		if !ok || checkBody(18, ver, b) != nil || req.ReadFrom(b) != nil {
			return cn.fail("malformed_request", "ApiVersions v%d", ver)
		}
		resp.SetVersion(ver)
	}
	for _, k := range []int16{0, 1, 3, 17, 18, 22, 36} {
		resp.ApiKeys = append(resp.ApiKeys, kmsg.ApiVersionsResponseApiKey{ApiKey: k, MinVersion: served[k][0], MaxVersion: served[k][1]})
	}
	cn.answerNow(corr, resp)
	return nil
}

// topLevelError: the APIs whose response carries a top-level error code,
// from the version given, so that a request ferry does not serve can be
// answered UNSUPPORTED_VERSION instead of a dropped connection: the
// consumer-group and coordinator calls a client pointed at the wrong
// address sends first, and the cluster and telemetry calls of newer clients.
var topLevelError = map[int16]int16{
	1:  7, // Fetch
	10: 0, // FindCoordinator (v4 and later: per key, below)
	11: 0, // JoinGroup
	12: 0, // Heartbeat
	13: 0, // LeaveGroup
	14: 0, // SyncGroup
	16: 0, // ListGroups
	25: 0, // AddOffsetsToTxn
	26: 0, // EndTxn
	60: 0, // DescribeCluster
	71: 0, // GetTelemetrySubscriptions
}

// unsupported answers a request ferry does not serve with
// UNSUPPORTED_VERSION where its response has an error code to carry it,
// and otherwise closes the connection (as a broker does with what it
// cannot parse).
func (cn *conn) unsupported(key, ver int16, corr int32, body []byte) *connErr {
	name := kmsg.NameForKey(key)
	if name == "" {
		name = fmt.Sprintf("API key %d", key)
	}
	from, ok := topLevelError[key]
	req := kmsg.RequestForKey(key)
	if !ok || req == nil || ver < from || ver > req.MaxVersion() {
		return cn.fail("unsupported_api", "%s v%d is not served (ferry's front serves producers: ApiVersions, Metadata, InitProducerId, Produce, SASL PLAIN)", name, ver)
	}
	resp := req.ResponseKind()
	resp.SetVersion(ver)
	code := kerr.UnsupportedVersion.Code
	if fc, isFC := resp.(*kmsg.FindCoordinatorResponse); isFC && ver >= 4 {
		r := kmsg.NewPtrFindCoordinatorRequest()
		r.SetVersion(ver)
		b, ok := skipHeader(body, r.IsFlexible())
		if !ok || checkBody(10, ver, b) != nil || r.ReadFrom(b) != nil {
			return cn.fail("malformed_request", "FindCoordinator v%d", ver)
		}
		for _, k := range r.CoordinatorKeys {
			c := kmsg.NewFindCoordinatorResponseCoordinator()
			c.Key, c.ErrorCode, c.NodeID = k, code, -1
			fc.Coordinators = append(fc.Coordinators, c)
		}
	} else {
		reflect.ValueOf(resp).Elem().FieldByName("ErrorCode").SetInt(int64(code))
	}
	cn.r.m.Error("unsupported_api")
	cn.r.logWarn("unsupported_api", "kafka request answered UNSUPPORTED_VERSION: ferry's front serves producers only",
		"api", name, "version", ver, "remote", cn.c.RemoteAddr().String())
	cn.answerNow(corr, resp)
	return nil
}

// owe reserves the next answer's place in order: one to a request of size
// bytes (counted in flight), est bytes until it is made.
func (cn *conn) owe(size int64, est int) *slot {
	s := &slot{size: size, est: est}
	cn.mu.Lock()
	cn.owed = append(cn.owed, s)
	cn.inflight += size
	if est != 0 {
		cn.w.Park(est)
	}
	cn.mu.Unlock()
	return s
}

// answerNow queues the answer to a request handled at once.
func (cn *conn) answerNow(corr int32, resp kmsg.Response) {
	cn.complete(cn.owe(0, 0), encode(nil, corr, resp))
}

// encode frames a response: size, correlation id, the header's empty tag
// section for flexible responses (never for ApiVersions), the body.
func encode(dst []byte, corr int32, resp kmsg.Response) []byte {
	if pr, ok := resp.(*kmsg.ProduceResponse); ok {
		fewMessages(pr)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	if resp.IsFlexible() && resp.Key() != 18 {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// fewMessages keeps the error messages of the first receiver.MaxMessages
// partitions that have one, each cut to receiver.MaxMessageBytes.
func fewMessages(resp *kmsg.ProduceResponse) {
	n := 0
	for t := range resp.Topics {
		for p := range resp.Topics[t].Partitions {
			rp := &resp.Topics[t].Partitions[p]
			if rp.ErrorMessage == nil {
				continue
			}
			if n++; n > receiver.MaxMessages {
				rp.ErrorMessage = nil
			} else if len(*rp.ErrorMessage) > receiver.MaxMessageBytes {
				msg := receiver.ClipMessage(*rp.ErrorMessage)
				rp.ErrorMessage = &msg
			}
		}
	}
}

// complete fills a slot and queues every answer now ready, in order (under
// cn.mu, so two completions cannot interleave their answers). It never
// blocks: completions call it from the Kafka client's goroutines.
func (cn *conn) complete(s *slot, out []byte) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	s.ready, s.out = true, out
	// Held until the answers before it are ready: counted meanwhile, so
	// the reader stops when they pile up (server.Writer.Park), as the
	// estimate it replaces was.
	cn.w.Park(len(out) - s.est)
	if len(out) < s.est {
		cn.cond.Broadcast() // a reader waiting for room may have it now
	}
	s.est = 0
	n := 0
	for n < len(cn.owed) && cn.owed[n].ready {
		o := cn.owed[n]
		cn.w.AppendParked(o.out)
		cn.inflight -= o.size
		n++
	}
	if n > 0 {
		copy(cn.owed, cn.owed[n:])
		clear(cn.owed[len(cn.owed)-n:])
		cn.owed = cn.owed[:len(cn.owed)-n]
		cn.cond.Broadcast()
	}
}

// ackTimer answers produce requests Kafka has not answered for within
// ack_timeout, and wakes a reader waiting for room when the agent stops.
func (cn *conn) ackTimer() (stop func()) {
	t := time.NewTicker(max(cn.r.cfg.AckTimeout/4, 50*time.Millisecond))
	done := make(chan struct{})
	go func() {
		stopping := cn.ctx.Done()
		for {
			select {
			case <-done:
				return
			case <-stopping:
				stopping = nil
				cn.mu.Lock()
				cn.cond.Broadcast()
				cn.mu.Unlock()
			case now := <-t.C:
				var late []func()
				cn.mu.Lock()
				for _, s := range cn.owed {
					if !s.ready && s.timeout != nil && now.After(s.deadline) {
						late = append(late, s.timeout)
						s.timeout = nil
					}
				}
				cn.mu.Unlock()
				for _, f := range late {
					f()
				}
			}
		}
	}()
	return func() { t.Stop(); close(done) }
}
