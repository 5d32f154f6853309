package otlpreceiver

// Doors: other wire formats of OTLP's signals — Zipkin, Prometheus remote
// write and push, Jaeger — served on the OTLP/HTTP listener, as
// bk-collector serves them on its one HTTP port. A door is a package of its
// own (under otlp/) that turns a request body into an OTLP
// Export<Signal>ServiceRequest in protobuf, plus one line in doorList.
// From there the request takes every step an OTLP request takes (export):
// the token, the topic, the signal's encoding (otlp_proto, otlp_json,
// flat_json), sampling and span metrics, rate limits, memory, delivery and
// the answer's status, so consumers read one format whatever the sender
// spoke. receivers.otlp.doors lists the doors served (none by default: each
// is a surface an operator chooses to open).
//
// Memory: the body is read within max_request_bytes and decoded per its
// Content-Encoding (gzip, zstd, snappy) by httpbody, reserving from the
// budget as it grows; the converted request is written into a buffer
// reserved before the conversion starts, of the door's Amplify times the
// body's length (at most max_request_bytes): a conversion that would write
// more is refused (413), so no sender makes ferry hold more than a bounded
// multiple of what it sent.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/otlp/door"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/otlp/jaeger"
	"github.com/ferryhq/ferry/otlp/prom"
	"github.com/ferryhq/ferry/otlp/zipkin"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/telemetry"
)

// Door is one foreign wire format of a signal.
type Door struct {
	// Name is its entry in receivers.otlp.doors and its metrics' receiver
	// label ("zipkin").
	Name   string
	Signal encoding.Signal
	// Patterns are the net/http ServeMux patterns it answers on the
	// OTLP/HTTP listener ("/api/v2/spans"); each must be a path of its own.
	Patterns []string
	// Convert appends to dst the OTLP protobuf request made of body (read
	// within max_request_bytes and decoded per its Content-Encoding),
	// within lim, counting in st what its mapping drops (otlp/door's
	// rules): past lim.MaxBytes it returns an error wrapping
	// ErrDoorTooLarge (413 request_too_large), past lim.MaxItems
	// (max_items_per_request) one wrapping door.ErrTooManyItems (413
	// too_many_items). Any other error is the sender's (400, its message
	// in the answer).
	Convert func(q *http.Request, body []byte, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error)
	// Amplify bounds the OTLP bytes per body byte the conversion may
	// write (the reservation made before it starts).
	Amplify int
	// OK is the status its senders expect of a success (Zipkin 202,
	// Prometheus 204).
	OK int
	// Methods it accepts (nil: POST); the pushgateway's clients PUT and
	// POST.
	Methods []string
	// Busy, when set, is the status of every refusal that may be retried
	// (the queue full, Kafka unreachable): Prometheus retries a 5xx but
	// drops a 429 unless retry_on_http_429 is set, so its door says 503.
	Busy int
	// Written, when set, adds headers to the success answer from the
	// converted request (remote write 2.0's senders read how many samples
	// and histograms were written, and take a success without them for a
	// failure).
	Written func(q *http.Request, otlp []byte, h http.Header)
}

// doorTooLarge: a door's package, which cannot import this one, says its
// error is ErrDoorTooLarge with a TooLarge method.
func doorTooLarge(err error) bool {
	var t interface{ TooLarge() bool }
	return errors.Is(err, ErrDoorTooLarge) || errors.As(err, &t) && t.TooLarge()
}

// ErrDoorTooLarge: the converted request would pass its reservation
// (door.ErrTooLarge, which the doors' packages can name).
var ErrDoorTooLarge = door.ErrTooLarge

// errConvertPanic: a door's conversion panicked (guardConvert).
var errConvertPanic = errors.New("ferry could not convert this request (a ferry bug, logged with its stack); resending it cannot help")

// guardConvert runs a door's conversion, turning a panic (a bug reached by
// a sender's bytes) into errConvertPanic, logged with its stack: the
// request is refused and its reservations given back by the caller's
// error path, instead of the panic leaking them from the memory budget on
// every resend (net/http recovers a handler, but not what it reserved) or,
// on a gRPC door, ending the agent.
func guardConvert(log *slog.Logger, name string, convert func() ([]byte, error)) (pb []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			pb, err = nil, errConvertPanic
			log.Error("a door's conversion panicked; the request is refused", "door", name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	return convert()
}

// doorList holds every door ferry has; receivers.otlp.doors picks. A new
// door is its package and one line here.
var doorList = []Door{
	{Name: "zipkin", Signal: encoding.Traces, Patterns: zipkin.Paths, Convert: zipkin.Convert, Amplify: zipkin.Amplify, OK: http.StatusAccepted},
	{Name: "jaeger", Signal: encoding.Traces, Patterns: jaeger.Patterns, Convert: jaeger.Converter(ErrDoorTooLarge), Amplify: jaeger.Amplify, OK: jaeger.OK},
	{Name: "prometheus_remote_write", Signal: encoding.Metrics, Patterns: []string{"/api/v1/write"}, Convert: prom.RemoteWrite, Amplify: prom.RemoteWriteAmplify, OK: http.StatusNoContent, Busy: http.StatusServiceUnavailable, Written: prom.Written},
	{Name: "prometheus_push", Signal: encoding.Metrics, Patterns: prom.PushPatterns, Convert: prom.Push, Amplify: prom.PushAmplify, OK: http.StatusOK, Methods: []string{http.MethodPut, http.MethodPost}},
}

// DoorNames lists the doors ferry has, for validation and docs.
func DoorNames() []string {
	var out []string
	for _, d := range doorList {
		out = append(out, d.Name)
	}
	return out
}

func findDoor(name string) *Door {
	for i := range doorList {
		if doorList[i].Name == name {
			return &doorList[i]
		}
	}
	return nil
}

// checkDoors names a door that does not exist.
func checkDoors(names []string) error {
	for i, n := range names {
		if findDoor(n) == nil {
			return fmt.Errorf("doors[%d]: %q is not a door ferry has (%s)", i, n, strings.Join(DoorNames(), ", "))
		}
		if slices.Index(names, n) != i {
			return fmt.Errorf("doors[%d]: %q is listed twice", i, n)
		}
	}
	return nil
}

// openDoors mounts the configured doors on mux, each with its metrics and
// submitter.
func (h *httpServer) openDoors(mux *http.ServeMux) {
	r := h.r
	dropped := droppedItems(r.set.Registry)
	for _, name := range r.cfg.Doors {
		d := findDoor(name)
		m := receivermetrics.New(r.set.Registry, d.Name)
		r.doorSubs = append(r.doorSubs, doorSub{m, &submit.Submitter{Next: r.next, Bodies: r.body, AckTimeout: r.cfg.AckTimeout, M: m, Recycle: r.recycle}})
		for _, p := range d.Patterns {
			mux.HandleFunc(p, func(w http.ResponseWriter, q *http.Request) { h.door(w, q, d, m, dropped) })
		}
	}
}

// droppedItems is the counter of what the doors' mappings drop, by door
// and door.Reason: items that were in a request ferry accepted and are not
// in what it delivers (door.Stats).
func droppedItems(reg prometheus.Registerer) *prometheus.CounterVec {
	return telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_door_dropped_items_total",
		Help: "Items of accepted door requests that the conversion to OTLP dropped or folded (repeated keys, gauge histograms, exemplars ...), by door and reason."},
		[]string{"receiver", "reason"}))
}

type doorSub struct {
	m   *receivermetrics.Metrics
	sub *submit.Submitter
}

// door serves one request of d: the OTLP request's steps, answered in
// plain text (what Zipkin, Prometheus and Jaeger senders log). What the
// conversion dropped (door.Stats) is counted in dropped and answered in
// X-Ferry-Dropped once the request is accepted.
func (h *httpServer) door(w http.ResponseWriter, q *http.Request, d *Door, m *receivermetrics.Metrics, dropped *prometheus.CounterVec) {
	r := h.r
	fail := func(a answer) {
		m.Error(a.reason)
		doorWrite(w, m, a)
	}
	if methods := d.Methods; q.Method != http.MethodPost && methods == nil || methods != nil && !slices.Contains(methods, q.Method) {
		if methods == nil {
			methods = []string{http.MethodPost}
		}
		allow := strings.Join(methods, ", ")
		w.Header().Set("Allow", allow)
		fail(answer{httpStatus: http.StatusMethodNotAllowed, code: codes.Unimplemented, reason: "method_not_allowed", msg: "use " + allow})
		return
	}
	busy := func(a answer) answer {
		if d.Busy != 0 && a.httpStatus == http.StatusTooManyRequests {
			a.httpStatus = d.Busy
		}
		return a
	}
	var claims *token.Claims
	if r.gate.Enabled() {
		var err error
		if claims, err = r.gate.Check(r.gate.HTTPToken(q)); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
			fail(answer{httpStatus: http.StatusUnauthorized, code: codes.Unauthenticated, reason: "unauthenticated", msg: err.Error()})
			return
		}
	}
	body, berr := r.body.Read(q)
	if berr != nil {
		if berr.Status == http.StatusTooManyRequests {
			a := busy(classify(consumer.ErrFull))
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(a.retryAfter.Seconds()))))
			fail(a)
			return
		}
		fail(answer{httpStatus: berr.Status, code: codes.InvalidArgument, reason: berr.Reason, msg: berr.Msg})
		return
	}
	limit := min(int(r.cfg.MaxRequestBytes), d.Amplify*len(body.B)+4096)
	out, ok := r.body.GetReserved(limit)
	if !ok {
		r.body.Put(body)
		a := busy(classify(consumer.ErrFull))
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(a.retryAfter.Seconds()))))
		fail(a)
		return
	}
	var st door.Stats
	pb, err := guardConvert(r.set.Logger, d.Name, func() ([]byte, error) {
		return d.Convert(q, body.B, out.B[:0], door.Limits{MaxBytes: limit, MaxItems: r.cfg.MaxItems}, &st)
	})
	r.body.Put(body)
	if err == nil && (len(pb) > limit || len(pb) > cap(out.B)) {
		err = fmt.Errorf("%w (%d bytes converted, %d allowed)", ErrDoorTooLarge, len(pb), limit)
	}
	if err != nil {
		r.body.Put(out)
		if errors.Is(err, door.ErrTooManyItems) {
			// the OTLP request's own answer (encodeFailed), from the
			// door's count
			a := classify(consumer.OverLimit("too_many_items", "the number of spans, log records or data points", int64(r.cfg.MaxItems), "receivers.otlp.max_items_per_request"))
			a.msg = d.Name + ": " + a.msg
			fail(a)
			return
		}
		if doorTooLarge(err) {
			fail(answer{httpStatus: http.StatusRequestEntityTooLarge, code: codes.ResourceExhausted, reason: "request_too_large",
				msg: fmt.Sprintf("%s: %v (%d× the body, at most receivers.otlp.max_request_bytes)", d.Name, err, d.Amplify)})
			return
		}
		if errors.Is(err, errConvertPanic) {
			// 500, unless the door's senders resend every 5xx (d.Busy: the
			// Prometheus senders): this request would fail the same way
			// each time, and a resent one blocks its sender's queue.
			code := http.StatusInternalServerError
			if d.Busy != 0 {
				code = http.StatusBadRequest
			}
			fail(answer{httpStatus: code, code: codes.Internal, reason: "internal_error", msg: d.Name + ": " + err.Error()})
			return
		}
		fail(answer{httpStatus: http.StatusBadRequest, code: codes.InvalidArgument, reason: "invalid_payload", msg: d.Name + ": " + err.Error()})
		return
	}
	out.B = pb
	var written http.Header
	if d.Written != nil {
		written = http.Header{}
		d.Written(q, pb, written)
	}
	o := r.export(q.Context(), m, d.Signal, out, claims, q.Header)
	if o.err != nil {
		a := busy(classify(o.err))
		if a.reason == "client_gone" {
			return
		}
		if a.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(a.retryAfter.Seconds()))))
		}
		doorWrite(w, m, a) // export counted the error
		return
	}
	m.Request(d.OK)
	for k, v := range written {
		w.Header()[k] = v
	}
	if o.rejected > 0 {
		w.Header().Set("X-Ferry-Rejected", strconv.Itoa(o.rejected))
	}
	if n := st.Total(); n > 0 {
		for reason, k := range st.Dropped {
			if k > 0 {
				dropped.WithLabelValues(d.Name, door.Reason(reason).String()).Add(float64(k))
			}
		}
		w.Header().Set("X-Ferry-Dropped", strconv.Itoa(n))
	}
	w.WriteHeader(d.OK)
}

// doorWrite answers a refusal in plain text.
func doorWrite(w http.ResponseWriter, m *receivermetrics.Metrics, a answer) {
	m.Request(a.httpStatus)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Ferry-Reason", a.reason)
	w.WriteHeader(a.httpStatus)
	_, _ = w.Write([]byte(a.msg + "\n"))
}
