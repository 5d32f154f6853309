// Package httpreceiver owns ferry's HTTP message ingest:
// POST /v1/messages/{topic} with one message (application/octet-stream,
// text/plain, application/json) or one record per line
// (application/x-ndjson), optionally gzip- or zstd-encoded.
//
// The request body is read into one pooled buffer (decompressed into a
// second); records are slices of it, so payload bytes are copied once, from
// the socket, and never again before the Kafka client. The buffer goes back
// to the pool when the batch completes.
//
// By default a request is answered 200 {"accepted":N} only after Kafka has
// acknowledged every record; ?wait=false (or wait_for_ack: false) answers
// 202 as soon as the records are queued. Every refusal is a JSON body
// {"error": ..., "reason": ...} and a count in
// ferry_receiver_errors_total{reason}.
//
// An Idempotency-Key header (delivery mode spool; refused with 400 in the
// others) makes a retry of an accepted request answer the original
// result instead of storing it again: the key, scoped to the token's
// application, and the request's fingerprint are looked up in the
// idempotency store before anything is appended (package idempotency;
// the spool keeps the keys durable with their records).
//
// Lifecycle: Start binds the listener (a taken port fails start-up). Shutdown
// stops accepting connections and waits, until ctx ends, for requests in
// progress — including those waiting for Kafka's acknowledgement.
package httpreceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/origin"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// Receiver serves HTTP ingest.
type Receiver struct {
	cfg    Config
	set    telemetry.Settings
	log    *telemetry.Limited
	next   consumer.Consumer
	srv    *server.HTTP
	topics *telemetry.Labels
	m      *receivermetrics.Metrics
	body   *httpbody.Reader
	gate   *auth.Gate
	allow  *routing.Allow
	sub    *submit.Submitter
	batchP sync.Pool
	// receipts answers GET /receipts/{id} (nil in delivery mode kafka).
	receipts *receipt.Store
	// noReceipts: why no receipt can be given (exporter.kafka.acks none);
	// empty when they can.
	noReceipts string
	// idem remembers Idempotency-Keys (nil unless delivery mode spool).
	idem *idempotency.Store
}

// New builds the receiver from a configuration and everything it needs:
// env.Next receives the batches, env.Bodies is the budget bodies reserve
// from before they are read.
// pre holds the token checker and rate limiter; nil (or nil fields) when
// none is configured.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	set, next := env.Set, env.Next
	r := &Receiver{cfg: cfg, set: set, next: next, topics: set.Topics, body: httpbody.NewReader(int64(cfg.MaxRequestBytes)),
		gate: env.Pre.Gate(cfg.Auth), receipts: env.Receipts, noReceipts: env.NoReceipts, idem: env.Idem}
	if env.Bodies != nil {
		r.body.SetBudget(env.Bodies)
	}
	r.log = telemetry.NewLimited(set.Logger.With("component", "receiver/http"), 10*time.Second)
	r.allow, _ = routing.NewAllow(cfg.Topics) // checked by Validate
	r.m = receivermetrics.New(set.Registry, "http")
	r.batchP.New = func() any { return new(record.Batch) }
	r.sub = &submit.Submitter{Next: next, Bodies: r.body, AckTimeout: cfg.AckTimeout, M: r.m,
		Recycle: func(b *record.Batch) { b.Reset(); r.batchP.Put(b) }}

	mux := http.NewServeMux()
	mux.HandleFunc("/v1/messages/{topic}", r.handleMessages)
	mux.HandleFunc("/receipts/{id}", r.handleReceipt)
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		r.fail(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint %s; send POST /v1/messages/{topic}", req.URL.Path), 0)
	})
	r.srv = server.NewHTTP("http", cfg.HTTPConfig, origin.New(cfg.AllowedOrigins).Wrap(mux, func(w http.ResponseWriter, _ *http.Request) {
		r.fail(w, http.StatusForbidden, "origin_not_allowed", origin.RefusalMessage, 0)
	}), set.Logger, set.Registry)
	return r, nil
}

// Start binds and serves in the background.
func (r *Receiver) Start(ctx context.Context) error { return r.srv.Start(ctx) }

// Addr is the bound address.
func (r *Receiver) Addr() string { return r.srv.Addr() }

// Shutdown stops accepting and waits for requests in progress until ctx ends.
func (r *Receiver) Shutdown(ctx context.Context) error { return r.srv.Shutdown(ctx) }

const headerPrefix = "X-Ferry-Header-"

func (r *Receiver) handleMessages(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		r.fail(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST", 0)
		return
	}
	topic := req.PathValue("topic")
	// A malformed name is refused before a token is looked at.
	if !routing.ValidTopic(topic) {
		r.fail(w, http.StatusBadRequest, "invalid_topic",
			fmt.Sprintf("invalid topic name %s: use 1 to 249 of a-z A-Z 0-9 . _ -", routing.QuoteTopic(topic)), 0)
		return
	}
	claims, aerr := r.gate.HTTP(req)
	if aerr != nil {
		// The reason class only: nothing of the token is echoed.
		w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
		r.fail(w, http.StatusUnauthorized, "unauthenticated", aerr.Error(), 0)
		return
	}
	// The same topic check as every receiver's whose client names its
	// topics: the token's one messages topic, the receiver's patterns.
	if err := receiver.CheckTopic(r.allow, claims, topic); err != nil {
		r.failErr(w, err, 0)
		return
	}
	ndjson, ok := r.mediaType(req.Header.Get("Content-Type"))
	if !ok {
		r.fail(w, http.StatusUnsupportedMediaType, "unsupported_content_type",
			fmt.Sprintf("unsupported Content-Type %q: use application/octet-stream, text/plain, application/json or application/x-ndjson", req.Header.Get("Content-Type")), 0)
		return
	}
	// The query is parsed only when there is one: most requests have none.
	var query url.Values
	if req.URL.RawQuery != "" {
		query = req.URL.Query()
	}
	wait := r.cfg.WaitForAck
	if v := query.Get("wait"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			r.fail(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("wait=%q is not true or false", v), 0)
			return
		}
		wait = b
	}
	wantReceipt := false
	if v := query.Get("receipt"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			r.fail(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("receipt=%q is not true or false", v), 0)
			return
		}
		wantReceipt = b
	}
	if wantReceipt && !wait {
		// A receipt is the answer's, and wait=false answers before there
		// is anything to say.
		r.fail(w, http.StatusBadRequest, "invalid_parameter", "receipt=true needs the answer to wait for the records (not wait=false)", 0)
		return
	}
	if wantReceipt && r.noReceipts != "" {
		// Refused rather than answered with places Kafka never named.
		r.fail(w, http.StatusBadRequest, "receipts_unavailable", "receipts are unavailable: "+r.noReceipts, 0)
		return
	}
	// A header sent empty is refused like any invalid id (1 to 128).
	ids, hasID := req.Header["X-Ferry-Request-Id"]
	reqID := ""
	if hasID {
		reqID = ids[0]
	}
	if hasID && !receipt.ValidRequestID(reqID) {
		r.fail(w, http.StatusBadRequest, "invalid_request_id",
			fmt.Sprintf("X-Ferry-Request-Id must be 1 to %d of A-Z a-z 0-9 . _ : -", receipt.MaxRequestIDBytes), 0)
		return
	}
	// Checked before the body is read: nothing is spent on a request
	// that is refused anyway.
	idemKey := ""
	if v, ok := req.Header["Idempotency-Key"]; ok {
		switch {
		case r.idem == nil:
			// Refused rather than ignored: the client would believe its
			// retries safe.
			r.fail(w, http.StatusBadRequest, "idempotency_unavailable",
				"Idempotency-Key needs delivery.mode spool (where accepted keys are kept with the records)", 0)
			return
		case len(v) != 1 || !idempotency.ValidKey(v[0]):
			r.fail(w, http.StatusBadRequest, "invalid_idempotency_key",
				fmt.Sprintf("Idempotency-Key must be one header of 1 to %d of A-Z a-z 0-9 . _ : - + / =", idempotency.MaxKeyBytes), 0)
			return
		}
		idemKey = v[0]
	}

	body, berr := r.body.Read(req)
	if berr != nil {
		if berr.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		r.fail(w, berr.Status, berr.Reason, berr.Msg, 0)
		return
	}
	if len(body.B) == 0 {
		r.body.Put(body)
		r.fail(w, http.StatusBadRequest, "empty_body", "empty body: nothing to send", 0)
		return
	}

	b := r.batchP.Get().(*record.Batch)
	var key []byte
	if k := req.Header.Get("X-Ferry-Key"); k != "" {
		key = []byte(k)
	} else if k := req.URL.Query().Get("key"); k != "" {
		key = []byte(k)
	}
	headers := r.headers(req.Header)
	if reqID != "" {
		// On every record of the request, in ferry's own namespace.
		headers = append(headers, record.Header{Key: receipt.HeaderKey, Value: []byte(reqID)})
	}
	if claims != nil {
		headers, _ = routing.TenantHeaders(headers, claims, token.Messages)
	}
	now := time.Now()
	if ndjson {
		// Count before building: a line costs a record's overhead however
		// short it is.
		if lines := bytes.Count(body.B, newline); lines >= r.cfg.MaxRecords && lines+1-trailingNewline(body.B) > r.cfg.MaxRecords {
			r.recycle(b, body)
			pe := consumer.OverLimit("too_many_records", "the number of NDJSON lines", int64(r.cfg.MaxRecords), "receivers.http.max_records_per_request")
			r.fail(w, http.StatusRequestEntityTooLarge, pe.Reason, pe.Msg, 0)
			return
		}
		if line, err := splitLines(body.B, b, topic, key, headers, now, r.cfg.ValidateJSON); err != nil {
			r.recycle(b, body)
			r.fail(w, http.StatusBadRequest, "invalid_ndjson", fmt.Sprintf("line %d: %v", line, err), 0)
			return
		}
		if len(b.Records) == 0 {
			r.recycle(b, body)
			r.fail(w, http.StatusBadRequest, "empty_body", "no records: every line is empty", 0)
			return
		}
	} else {
		b.Records = append(b.Records, record.Record{Topic: topic, Key: key, Value: body.B, Headers: headers, Timestamp: now})
	}
	n := len(b.Records)
	// The key and headers are shared in memory, but the Kafka client keeps
	// (and counts against its buffer) a copy per record: reserve them per
	// record, so the queue's bound is the Kafka client's too.
	perRecord := len(key) + record.HeaderBytes(headers)
	b.Charge(cap(body.B), n*perRecord)
	payload := len(body.B) + len(key)*n

	// Headers are charged to memory and sent to Kafka, once per record:
	// the rate limit counts them too.
	if err := r.gate.Limit(claims, n, len(body.B)+perRecord*n); err != nil {
		r.recycle(b, body)
		r.failErr(w, err, n)
		return
	}
	var idem *record.Idem
	if idemKey != "" {
		var done bool
		if idem, done = r.beginIdem(w, req, claims, idemKey, topic, key, ndjson, body.B, n, reqID); done {
			r.recycle(b, body)
			return
		}
		b.Idem = idem
	}
	var rc *record.Receipt
	if wantReceipt {
		// The batch goes back to its pool at completion: the answer reads
		// the receipt through this pointer, not through b.
		rc = record.NewReceipt(n)
		rc.Owner = receipt.Owner(r.gate.HTTPToken(req))
		b.Receipt = rc
	}
	tk, err := r.sub.Submit(req.Context(), b, wait, body, nil)
	if err != nil {
		if idem != nil {
			// Not stored: the retry is a new request (the spool aborts
			// what reached it; a refusal before it is resolved here).
			r.idem.Abort(idem)
		}
		r.failErr(w, err, n)
		return
	}
	t := r.topics.Get(topic)
	r.m.Received(t, n, payload)
	r.m.Items("messages", n)
	r.m.ReqBytes.Observe(float64(payload))

	if reqID != "" {
		w.Header().Set("X-Ferry-Request-Id", reqID)
	}
	if !wait {
		r.m.NoWait(n)
		r.answer(w, http.StatusAccepted, n, reqID, nil)
		return
	}
	failed, err := tk.Wait(req.Context())
	switch {
	case err == nil:
		r.answer(w, http.StatusOK, n, reqID, rc)
	case req.Context().Err() != nil:
		// The client left; the records stay queued and are delivered or
		// counted by the exporter. Nothing to answer.
		r.m.Error("client_gone")
	default:
		r.failErr(w, err, failed)
	}
}

// beginIdem looks the request's Idempotency-Key up, scoped to the door
// and the application the request authenticated as, with the request's
// fingerprint (topic, X-Ferry-Key, NDJSON or not, body). done: the
// request was answered — a retry of an accepted request with its original
// result (Idempotent-Replayed: true, nothing appended), or a refusal;
// else idem is the reservation the spool resolves.
func (r *Receiver) beginIdem(w http.ResponseWriter, req *http.Request, claims *token.Claims, key, topic string, recKey []byte,
	ndjson bool, body []byte, n int, reqID string) (idem *record.Idem, done bool) {
	app := ""
	if claims != nil {
		app = claims.App
	}
	kind := []byte{0}
	if ndjson {
		kind[0] = 1
	}
	sum := idempotency.Fingerprint([]byte(topic), recKey, kind, body)
	v, orig, id := r.idem.Begin(idempotency.Scope("http", app, key), sum, n)
	switch v {
	case idempotency.Fresh:
		return id, false
	case idempotency.Replay:
		w.Header().Set("Idempotent-Replayed", "true")
		if reqID != "" {
			w.Header().Set("X-Ferry-Request-Id", reqID)
		}
		r.answer(w, http.StatusOK, orig, reqID, nil)
	case idempotency.InFlight:
		w.Header().Set("Retry-After", "1")
		r.fail(w, http.StatusConflict, "idempotency_key_in_flight",
			"a request with this Idempotency-Key is still being stored; retry it shortly for its result", 0)
	case idempotency.Mismatch:
		r.fail(w, http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this Idempotency-Key was used for a different request (topic, X-Ferry-Key or body) within delivery.idempotency.window; use a new key", 0)
	default:
		w.Header().Set("Retry-After", "1")
		r.fail(w, http.StatusTooManyRequests, "idempotency_full",
			"too many requests with an Idempotency-Key are being stored at once (delivery.idempotency.max_bytes); retry later", 0)
	}
	return nil, true
}

// handleReceipt answers GET /receipts/{id}: where the records of a request
// answered from the spool are in Kafka, once Kafka has them. Only the
// token that sent the request may read it (with authentication off, the
// id's random part is what guards it); another token's receipt answers
// 404 like an unknown one, so ids tell nothing of other tenants.
func (r *Receiver) handleReceipt(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		r.fail(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET", 0)
		return
	}
	if _, aerr := r.gate.HTTP(req); aerr != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
		r.fail(w, http.StatusUnauthorized, "unauthenticated", aerr.Error(), 0)
		return
	}
	id := req.PathValue("id")
	if r.receipts == nil {
		r.fail(w, http.StatusNotFound, "unknown_receipt",
			"this agent keeps no receipts to look up: in delivery mode kafka the answer to ?receipt=true carries them", 0)
		return
	}
	// ?from=N continues an answer that stopped at receipt.MaxRangesPerAnswer
	// ranges (its "next_from").
	from := 0
	if req.URL.RawQuery != "" {
		if v := req.URL.Query().Get("from"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				r.fail(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("from=%.32q is not a record number", v), 0)
				return
			}
			from = n
		}
	}
	st, ok := r.receipts.LookupFrom(id, receipt.Owner(r.gate.HTTPToken(req)), from)
	if !ok {
		r.fail(w, http.StatusNotFound, "unknown_receipt", fmt.Sprintf("no receipt %.64q for this token: never issued, "+
			"forgotten (delivery.receipts.max_age or max_bytes), or the agent restarted since", id), 0)
		return
	}
	state := "done"
	if st.Pending > 0 {
		state = "pending"
	}
	out := append(make([]byte, 0, 256), `{"receipt_id":`...)
	out = strconv.AppendQuote(out, id)
	out = append(out, `,"state":"`...)
	out = append(out, state...)
	out = append(out, `","records":`...)
	out = strconv.AppendInt(out, int64(st.Records), 10)
	out = append(out, `,"pending":`...)
	out = strconv.AppendInt(out, int64(st.Pending), 10)
	out = append(out, `,"dead_lettered":`...)
	out = strconv.AppendInt(out, int64(st.DeadLettered), 10)
	out = append(out, `,"receipts":`...)
	out = receipt.AppendJSON(out, st.Ranges)
	if st.Next != 0 {
		// The answer stopped at receipt.MaxRangesPerAnswer ranges: ask
		// again with ?from= this for the rest.
		out = append(out, `,"truncated":true,"next_from":`...)
		out = strconv.AppendInt(out, int64(st.Next), 10)
	}
	out = append(out, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	r.m.Request(http.StatusOK)
}

var newline = []byte{'\n'}

// trailingNewline is 1 if b ends with a newline (no line follows it).
func trailingNewline(b []byte) int {
	if len(b) > 0 && b[len(b)-1] == '\n' {
		return 1
	}
	return 0
}

// splitLines appends one record per non-empty line of body (a trailing \r is
// dropped). It returns the 1-based line of a JSON error when validating.
func splitLines(body []byte, b *record.Batch, topic string, key []byte, headers []record.Header, ts time.Time, validate bool) (int, error) {
	line := 0
	for len(body) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			l, body = body[:i], body[i+1:]
		} else {
			l, body = body, nil
		}
		if n := len(l); n > 0 && l[n-1] == '\r' {
			l = l[:n-1]
		}
		if len(l) == 0 {
			continue
		}
		if validate && !json.Valid(l) {
			return line, errors.New("not valid JSON")
		}
		b.Records = append(b.Records, record.Record{Topic: topic, Key: key, Value: l, Headers: headers, Timestamp: ts})
	}
	return 0, nil
}

func (r *Receiver) recycle(b *record.Batch, body *httpbody.Buf) {
	b.Reset()
	r.batchP.Put(b)
	r.body.Put(body)
}

// mediaType reports whether the body is NDJSON, and whether the type is
// supported at all. A missing Content-Type is one raw message.
func (r *Receiver) mediaType(ct string) (ndjson, ok bool) {
	if ct == "" {
		return false, true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false, false
	}
	switch mt {
	case "application/octet-stream", "text/plain", "application/json":
		return false, true
	case "application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines":
		return true, true
	}
	return false, false
}

func (r *Receiver) headers(h http.Header) []record.Header {
	var out []record.Header
	for name, vals := range h {
		if len(name) <= len(headerPrefix) || !strings.EqualFold(name[:len(headerPrefix)], headerPrefix) {
			continue
		}
		// HTTP header names are case-insensitive; lower-case makes the Kafka
		// header name predictable whatever the client sent.
		k := strings.ToLower(name[len(headerPrefix):])
		if strings.HasPrefix(k, routing.ReservedHeaderPrefix) {
			// ferry's own namespace (ferry.tenant, ferry.app, ...): only
			// ferry writes it, so consumers can trust who sent a record.
			r.m.Error("reserved_header_dropped")
			continue
		}
		for _, v := range vals {
			out = append(out, record.Header{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// answer writes {"accepted":N}, with the request id the client gave and,
// when it asked, the receipt: the ranges where its records are in Kafka,
// or (the spool took them first) the id to look them up under.
func (r *Receiver) answer(w http.ResponseWriter, code, n int, reqID string, rc *record.Receipt) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	var b [48]byte
	out := append(b[:0], `{"accepted":`...)
	out = strconv.AppendInt(out, int64(n), 10)
	if reqID != "" {
		out = append(out, `,"request_id":`...)
		out = strconv.AppendQuote(out, reqID)
	}
	if rc != nil {
		if rc.SpoolID != "" {
			out = append(out, `,"receipt_id":`...)
			out = strconv.AppendQuote(out, rc.SpoolID)
		} else {
			out = append(out, `,"receipts":`...)
			out = receipt.AppendJSON(out, rc.Ranges(nil))
		}
	}
	out = append(out, "}\n"...)
	_, _ = w.Write(out)
	r.m.Request(code)
}

// httpStatus is the messages API's answer for each kind of error.
var httpStatus = [...]int{
	consumer.KindInternal:        http.StatusInternalServerError,
	consumer.KindInvalid:         http.StatusBadRequest,
	consumer.KindUnauthenticated: http.StatusUnauthorized,
	consumer.KindForbidden:       http.StatusForbidden,
	consumer.KindUnknownTopic:    http.StatusNotFound,
	consumer.KindTooLarge:        http.StatusRequestEntityTooLarge,
	consumer.KindBusy:            http.StatusTooManyRequests,
	consumer.KindUnavailable:     http.StatusServiceUnavailable,
	consumer.KindTimeout:         http.StatusGatewayTimeout,
	consumer.KindRefused:         http.StatusBadGateway,
}

// failErr answers a pipeline error with its status.
func (r *Receiver) failErr(w http.ResponseWriter, err error, records int) {
	code := httpStatus[consumer.KindOf(err)]
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(re.After.Seconds()))))
		r.fail(w, code, re.Reason, re.Msg, records)
		return
	}
	var pe *consumer.PermanentError
	if errors.As(err, &pe) {
		r.fail(w, code, pe.Reason, pe.Msg, records)
		return
	}
	r.fail(w, code, "internal", err.Error(), records)
}

func (r *Receiver) fail(w http.ResponseWriter, code int, reason, msg string, records int) {
	r.m.Error(reason)
	r.m.Request(code)
	if code >= 500 || reason == "ack_timeout" {
		r.log.Log(slog.LevelWarn, reason, "request failed", "status", code, "reason", reason, "err", msg)
	}
	body := map[string]any{"error": msg, "reason": reason}
	if records > 0 {
		body["records"] = records
	}
	out, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(out, '\n'))
}
