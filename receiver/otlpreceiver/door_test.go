package otlpreceiver

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/door"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// linesDoor is a door for the tests: each line of the body is a log record.
var linesDoor = Door{Name: "lines", Signal: encoding.Logs, Patterns: []string{"/lines"}, Amplify: 8, OK: http.StatusAccepted,
	Convert: func(_ *http.Request, body, dst []byte, lim door.Limits, _ *door.Stats) ([]byte, error) {
		if bytes.HasPrefix(body, []byte("bad")) {
			return nil, errors.New("a line says bad")
		}
		if bytes.HasPrefix(body, []byte("panic")) {
			var lines []int
			_ = lines[len(body)] // a converter's bug, reached by a sender's bytes
		}
		ld := plog.NewLogs()
		lr := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
		for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
			lr.AppendEmpty().Body().SetStr(l)
		}
		pb, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
		if err != nil {
			return nil, err
		}
		if len(pb) > lim.MaxBytes {
			return nil, ErrDoorTooLarge
		}
		return append(dst, pb...), nil
	}}

func withLinesDoor(t *testing.T) {
	doorList = append(doorList, linesDoor)
	t.Cleanup(func() { doorList = doorList[:len(doorList)-1] })
}

// TestDoor: a door's request becomes OTLP records on the signal's topic,
// through every step of an OTLP request, answered as its senders expect;
// bad input is a 400 with the reason, a conversion past its bound a 413,
// and each is counted under the door's name.
func TestDoor(t *testing.T) {
	withLinesDoor(t)
	cfg := testConfig()
	cfg.Doors = []string{"lines"}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	url := "http://" + r.HTTPAddr() + "/lines"

	code, hdr, _ := postOTLP(t, url, "text/plain", "", []byte("one\ntwo\nthree\n"))
	if code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	recs := sink.Records()
	if len(recs) != 3 || recs[0].Topic != "logs" || !strings.Contains(string(recs[1].Value), `"two"`) {
		t.Fatalf("records %d %v", len(recs), recs)
	}
	_ = hdr
	m := r.doorSubs[0].m
	if v := testutil.ToFloat64(m.Records("logs")); v != 3 {
		t.Fatalf("the door's received counter: %v", v)
	}

	// snappy, as Prometheus remote write sends it.
	sink.Reset()
	if code, _, _ := postOTLP(t, url, "text/plain", "snappy", s2.EncodeSnappy(nil, []byte("a\nb\n"))); code != http.StatusAccepted || len(sink.Records()) != 2 {
		t.Fatalf("snappy: %d, %d records", code, len(sink.Records()))
	}

	code, hdr, body := postOTLP(t, url, "text/plain", "", []byte("bad input"))
	if code != 400 || hdr.Get("X-Ferry-Reason") != "invalid_payload" || !strings.Contains(string(body), "lines: a line says bad") {
		t.Fatalf("bad input: %d %q %s", code, hdr.Get("X-Ferry-Reason"), body)
	}
	if v := testutil.ToFloat64(m.Errors("invalid_payload")); v != 1 {
		t.Fatalf("invalid_payload counted %v", v)
	}
	// A request whose OTLP form passes Amplify × its size (one-byte lines
	// become ~10 bytes each... many empty-ish lines) is refused whole.
	big := bytes.Repeat([]byte("x\n"), 20000)
	if code, _, body := postOTLP(t, url, "text/plain", "", big); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("amplified: %d %s", code, body)
	}
	if code, _, _ := postOTLP(t, "http://"+r.HTTPAddr()+"/lines?x", "text/plain", "", nil); code != http.StatusAccepted {
		t.Fatalf("an empty request: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", res.StatusCode)
	}
}

// TestDoorConversionPanic: a door whose conversion panics on a request
// answers it 500 internal_error (counted, logged), gives back every byte it
// reserved, and serves the next request: before, net/http recovered the
// handler but the body's and the converted buffer's reservations stayed
// taken, so resending the request drained the memory budget until every
// door answered 503.
func TestDoorConversionPanic(t *testing.T) {
	withLinesDoor(t)
	cfg := testConfig()
	cfg.Doors = []string{"lines"}
	b := budget.New(4 << 20)
	sink := &consumertest.Sink{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Bodies: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	url := "http://" + r.HTTPAddr() + "/lines"
	// 60 KB a request, reserving ~0.5 MB (Amplify 8): 20 of them would
	// hold 10 MB of a 4 MB budget had they leaked.
	bad := append([]byte("panic"), bytes.Repeat([]byte("x"), 60<<10)...)
	for i := range 20 {
		code, hdr, body := postOTLP(t, url, "text/plain", "", bad)
		if code != http.StatusInternalServerError || hdr.Get("X-Ferry-Reason") != "internal_error" || !strings.Contains(string(body), "a ferry bug") {
			t.Fatalf("request %d: %d %q %s", i, code, hdr.Get("X-Ferry-Reason"), body)
		}
	}
	if u := b.Used(); u != 0 {
		t.Fatalf("%d bytes still reserved after the panics", u)
	}
	if v := testutil.ToFloat64(r.doorSubs[0].m.Errors("internal_error")); v != 20 {
		t.Fatalf("internal_error counted %v", v)
	}
	if code, _, body := postOTLP(t, url, "text/plain", "", []byte("one\ntwo\n")); code != http.StatusAccepted || len(sink.Records()) != 2 {
		t.Fatalf("after the panics: %d %s, %d records", code, body, len(sink.Records()))
	}
}

// TestDoorRefusals: the pipeline's refusal is the door's answer, with
// Retry-After when it may be retried; a door not configured is a 404.
func TestDoorRefusals(t *testing.T) {
	withLinesDoor(t)
	cfg := testConfig()
	cfg.Doors = []string{"lines"}
	r := start(t, cfg, consumer.Func(func(context.Context, *record.Batch) error { return consumer.ErrFull }))
	code, hdr, _ := postOTLP(t, "http://"+r.HTTPAddr()+"/lines", "text/plain", "", []byte("x\n"))
	if code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("queue full: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	r2 := start(t, testConfig(), &consumertest.Sink{})
	if code, _, _ := postOTLP(t, "http://"+r2.HTTPAddr()+"/lines", "text/plain", "", []byte("x\n")); code != http.StatusNotFound {
		t.Fatalf("a door not configured: %d", code)
	}
	bad := testConfig()
	bad.Doors = []string{"lines", "nope"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `doors[1]: "nope"`) {
		t.Fatalf("Validate: %v", err)
	}
}
