package otlpreceiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/origin"
	"github.com/ferryhq/ferry/server"
)

type httpServer struct {
	r   *Receiver
	srv *server.HTTP
}

func newHTTPServer(r *Receiver) *httpServer {
	h := &httpServer{r: r}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/traces", func(w http.ResponseWriter, q *http.Request) { h.handle(w, q, encoding.Traces) })
	mux.HandleFunc("/v1/metrics", func(w http.ResponseWriter, q *http.Request) { h.handle(w, q, encoding.Metrics) })
	mux.HandleFunc("/v1/logs", func(w http.ResponseWriter, q *http.Request) { h.handle(w, q, encoding.Logs) })
	h.openDoors(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, q *http.Request) {
		h.fail(w, false, answer{httpStatus: http.StatusNotFound, code: codes.NotFound, reason: "not_found",
			msg: fmt.Sprintf("no such endpoint %s; OTLP/HTTP serves /v1/traces, /v1/metrics and /v1/logs", q.URL.Path)})
	})
	guarded := origin.New(r.cfg.HTTP.AllowedOrigins).Wrap(mux, func(w http.ResponseWriter, q *http.Request) {
		h.fail(w, strings.HasPrefix(q.Header.Get("Content-Type"), "application/json"),
			answer{httpStatus: http.StatusForbidden, code: codes.PermissionDenied, reason: "origin_not_allowed", msg: origin.RefusalMessage})
	})
	h.srv = server.NewHTTP("otlp_http", r.cfg.HTTP.HTTPConfig, guarded, r.set.Logger, r.set.Registry)
	return h
}

func (h *httpServer) handle(w http.ResponseWriter, q *http.Request, sig encoding.Signal) {
	m := h.r.httpM
	if q.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		h.fail(w, false, answer{httpStatus: http.StatusMethodNotAllowed, code: codes.Unimplemented, reason: "method_not_allowed", msg: "use POST"})
		return
	}
	unauthorized := func(err error) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
		isJSON := strings.HasPrefix(q.Header.Get("Content-Type"), "application/json")
		h.fail(w, isJSON, answer{httpStatus: http.StatusUnauthorized, code: codes.Unauthenticated, reason: "unauthenticated", msg: err.Error()})
	}
	var claims *token.Claims
	var headerTok string
	if h.r.gate.Enabled() {
		headerTok = h.r.gate.HTTPToken(q)
		if !h.r.gate.WantsResource() { // refuse before reading the body
			var aerr error
			if claims, aerr = h.r.gate.Check(headerTok); aerr != nil {
				unauthorized(aerr)
				return
			}
		}
	}
	mt, _, _ := mime.ParseMediaType(q.Header.Get("Content-Type"))
	var isJSON bool
	switch mt {
	case "application/x-protobuf", "application/protobuf":
	case "application/json":
		isJSON = true
	default:
		h.fail(w, false, answer{httpStatus: http.StatusUnsupportedMediaType, code: codes.InvalidArgument, reason: "unsupported_content_type",
			msg: fmt.Sprintf("unsupported Content-Type %q: OTLP/HTTP takes application/x-protobuf or application/json", q.Header.Get("Content-Type"))})
		return
	}
	body, berr := h.r.body.Read(q)
	if berr != nil {
		if berr.Status == http.StatusTooManyRequests {
			h.full(w, isJSON)
			return
		}
		code := codes.InvalidArgument
		if berr.Status == http.StatusRequestEntityTooLarge {
			code = codes.ResourceExhausted
		}
		h.fail(w, isJSON, answer{httpStatus: berr.Status, code: code, reason: berr.Reason, msg: berr.Msg})
		return
	}
	if isJSON {
		cost, err := checkJSONShape(body.B, jsonContainersPerItem*h.r.cfg.MaxItems)
		if err != nil {
			h.r.body.Put(body)
			var ce *containersError
			if errors.As(err, &ce) {
				h.fail(w, true, classify(consumer.OverLimit("too_many_items", "the JSON objects and arrays of the request",
					int64(ce.limit), fmt.Sprintf("%d per receivers.otlp.max_items_per_request", jsonContainersPerItem))))
				return
			}
			h.fail(w, true, answer{httpStatus: http.StatusBadRequest, code: codes.InvalidArgument, reason: "invalid_payload", msg: "invalid OTLP/JSON: " + err.Error()})
			return
		}
		// pdata's decoding takes up to cost (25 times a body of numbers):
		// reserved for the time it runs. One that could never fit is too
		// large, not retryable.
		var decoding httpbody.Buf
		if lim := h.r.body.Limit(); lim > 0 && cost+body.Reserved() > lim {
			h.r.body.Put(body)
			h.fail(w, true, classify(consumer.OverLimit("request_too_large", "bytes pdata would take decoding this OTLP/JSON request",
				h.r.body.Limit(), "queue.memory_limit; send protobuf, or smaller requests")))
			return
		}
		if !h.r.body.Reserve(&decoding, cost) {
			h.r.body.Put(body)
			h.full(w, true)
			return
		}
		pb, err := jsonToProto(sig, body.B)
		h.r.body.Release(&decoding)
		if err != nil {
			h.r.body.Put(body)
			m.Error("invalid_payload")
			h.fail(w, true, answer{httpStatus: http.StatusBadRequest, code: codes.InvalidArgument, reason: "invalid_payload", msg: "invalid OTLP/JSON: " + err.Error()})
			return
		}
		// The protobuf's buffer takes its room from the JSON body's before
		// that is given back: reserved before it is taken.
		nb, ok := h.r.body.GetMoved(body, len(pb))
		h.r.body.Put(body)
		if !ok {
			h.full(w, true)
			return
		}
		nb.B = append(nb.B, pb...)
		body = nb
	}
	if h.r.gate.WantsResource() {
		var aerr error
		if claims, body, aerr = h.r.resourceAuth(headerTok, sig, body); aerr != nil {
			h.r.body.Put(body)
			switch {
			case errors.Is(aerr, consumer.ErrFull):
				h.full(w, isJSON)
				return
			case refusedPayload(aerr):
				h.fail(w, isJSON, classify(aerr))
				return
			}
			unauthorized(aerr)
			return
		}
	}
	o := h.r.export(q.Context(), m, sig, body, claims, q.Header)
	if o.err != nil {
		a := classify(o.err)
		if a.reason == "client_gone" {
			return
		}
		if a.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(a.retryAfter.Seconds()))))
		}
		h.write(w, isJSON, a) // export counted the error
		return
	}
	m.Request(http.StatusOK)
	if isJSON {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if o.rejected == 0 {
			_, _ = w.Write([]byte("{}"))
			return
		}
		field := [...]string{"rejectedSpans", "rejectedDataPoints", "rejectedLogRecords"}[sig]
		out, _ := json.Marshal(map[string]any{"partialSuccess": map[string]any{field: strconv.Itoa(o.rejected), "errorMessage": o.msg}})
		_, _ = w.Write(out)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(exportResponse(o))
}

// exportResponse encodes Export<X>ServiceResponse: empty on full success,
// else partial_success(1){rejected(1), error_message(2)} — the same field
// numbers for all three signals.
func exportResponse(o outcome) []byte {
	if o.rejected == 0 {
		return nil
	}
	var ps []byte
	ps = protowire.AppendTag(ps, 1, protowire.VarintType)
	ps = protowire.AppendVarint(ps, uint64(o.rejected))
	ps = protowire.AppendTag(ps, 2, protowire.BytesType)
	ps = protowire.AppendString(ps, o.msg)
	var out []byte
	out = protowire.AppendTag(out, 1, protowire.BytesType)
	return protowire.AppendBytes(out, ps)
}

// fail answers with a google.rpc.Status in the request's encoding, as the
// OTLP/HTTP specification asks.
// full answers a request there is no room to hold: 429, retried after
// Retry-After.
func (h *httpServer) full(w http.ResponseWriter, isJSON bool) {
	a := classify(consumer.ErrFull)
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(a.retryAfter.Seconds()))))
	h.fail(w, isJSON, a)
}

func (h *httpServer) fail(w http.ResponseWriter, isJSON bool, a answer) {
	h.r.httpM.Error(a.reason)
	h.write(w, isJSON, a)
}

// write answers a refusal already counted in ferry_receiver_errors_total.
func (h *httpServer) write(w http.ResponseWriter, isJSON bool, a answer) {
	h.r.httpM.Request(a.httpStatus)
	if a.httpStatus >= 500 {
		h.r.set.Logger.Debug("otlp http request failed", "status", a.httpStatus, "reason", a.reason, "err", a.msg)
	}
	if isJSON {
		out, _ := json.Marshal(map[string]any{"code": int(a.code), "message": a.msg})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.httpStatus)
		_, _ = w.Write(out)
		return
	}
	var st []byte
	st = protowire.AppendTag(st, 1, protowire.VarintType)
	st = protowire.AppendVarint(st, uint64(a.code))
	st = protowire.AppendTag(st, 2, protowire.BytesType)
	st = protowire.AppendString(st, a.msg)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(a.httpStatus)
	_, _ = w.Write(st)
}

// jsonToProto converts an OTLP/JSON request to protobuf with pdata.
func jsonToProto(sig encoding.Signal, b []byte) ([]byte, error) {
	switch sig {
	case encoding.Traces:
		req := ptraceotlp.NewExportRequest()
		if err := req.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		return req.MarshalProto()
	case encoding.Metrics:
		req := pmetricotlp.NewExportRequest()
		if err := req.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		return req.MarshalProto()
	default:
		req := plogotlp.NewExportRequest()
		if err := req.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		return req.MarshalProto()
	}
}
