package syslogreceiver

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

func testConfig(t *testing.T) Config {
	return Config{Enabled: true, UDP: "127.0.0.1:0", TCP: "127.0.0.1:0", Socket: filepath.Join(shortDir(t), "s.sock"), SocketMode: "0660",
		Format: "json", Topic: "syslog", Key: "{hostname}", App: "syslog", MaxMessageBytes: 64 << 10, MaxConnections: 16,
		IdleTimeout: time.Minute, FrameTimeout: 10 * time.Second}
}

// shortDir: a Unix socket's path must stay under 108 bytes.
func shortDir(t *testing.T) string {
	d, err := filepathTemp()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(d) })
	return d
}

func start(t *testing.T, cfg Config, env receiver.Env) *Receiver {
	t.Helper()
	if env.Set.Logger == nil {
		env.Set = telemetry.TestSettings()
	}
	r, err := New(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return r
}

// waitFor polls until n records arrived.
func waitFor(t *testing.T, sink *consumertest.Sink, n int) []record.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := sink.Records()
		if len(recs) >= n || time.Now().After(deadline) {
			if len(recs) != n {
				t.Fatalf("%d records, want %d", len(recs), n)
			}
			return recs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func header(r record.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// The real util-linux logger over every transport and framing it speaks:
// each message arrives once, parsed, with its headers and key.
func TestLogger(t *testing.T) {
	if _, err := exec.LookPath("logger"); err != nil {
		t.Fatal("logger (util-linux) is required: apt-get install bsdutils")
	}
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), receiver.Env{Next: sink})
	_, udpPort, _ := net.SplitHostPort(r.UDPAddr())
	_, tcpPort, _ := net.SplitHostPort(r.TCPAddr())
	runs := []struct {
		name  string
		args  []string
		proto string
	}{
		{"udp rfc5424", []string{"--server", "127.0.0.1", "--port", udpPort, "--udp", "--rfc5424"}, "rfc5424"},
		{"udp rfc3164", []string{"--server", "127.0.0.1", "--port", udpPort, "--udp", "--rfc3164"}, "rfc3164"},
		{"tcp rfc5424 octet-counted", []string{"--server", "127.0.0.1", "--port", tcpPort, "--tcp", "--rfc5424", "--octet-count"}, "rfc5424"},
		{"tcp rfc3164 LF-framed", []string{"--server", "127.0.0.1", "--port", tcpPort, "--tcp", "--rfc3164"}, "rfc3164"},
		{"unix socket rfc5424", []string{"--socket", r.SocketPath(), "--rfc5424"}, "rfc5424"},
		{"unix socket rfc3164", []string{"--socket", r.SocketPath(), "--rfc3164"}, "rfc3164"},
	}
	for i, run := range runs {
		msg := fmt.Sprintf("hello %d from %s", i, run.name)
		args := append(append([]string{"-t", "myapp", "-p", "local3.warning", "--id=4242"}, run.args...), msg)
		if run.proto == "rfc5424" {
			args = append([]string{"--sd-id", "meta@32473", "--sd-param", `run="` + fmt.Sprint(i) + `"`}, args...)
		}
		if out, err := exec.Command("logger", args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: logger %v: %v\n%s", run.name, args, err, out)
		}
		recs := waitFor(t, sink, i+1)
		rec := recs[i]
		var got map[string]any
		if err := json.Unmarshal(rec.Value, &got); err != nil {
			t.Fatalf("%s: %v: %s", run.name, err, rec.Value)
		}
		want := map[string]any{"message": msg, "app_name": "myapp", "proc_id": "4242", "facility_name": "local3", "severity_name": "warning",
			"facility": 19.0, "severity": 4.0, "protocol": run.proto}
		if run.proto == "rfc5424" {
			want["sd.meta@32473.run"] = fmt.Sprint(i)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %#v, want %#v (%s)", run.name, k, got[k], v, rec.Value)
			}
		}
		if got["timestamp"] == nil || (got["hostname"] == nil && !strings.HasPrefix(run.name, "unix")) {
			t.Errorf("%s: no timestamp or hostname: %s", run.name, rec.Value)
		}
		if header(rec, HeaderFacility) != "local3" || header(rec, HeaderSeverity) != "warning" || header(rec, HeaderAppName) != "myapp" {
			t.Errorf("%s: headers %v", run.name, rec.Headers)
		}
		if h := header(rec, HeaderHostname); h != "" && string(rec.Key) != h {
			t.Errorf("%s: key %q, hostname header %q", run.name, rec.Key, h)
		}
		if rec.Topic != "syslog" {
			t.Errorf("%s: topic %q", run.name, rec.Topic)
		}
	}
}

// A connection carrying both framings, frame by frame, as rsyslog allows;
// raw format keeps the bytes as received (without the framing).
func TestMixedFramingRaw(t *testing.T) {
	sink := &consumertest.Sink{}
	cfg := testConfig(t)
	cfg.Format = "raw"
	r := start(t, cfg, receiver.Env{Next: sink})
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	m1 := "<13>1 - h a - - - one\nwith a newline"
	m2 := "<13>Oct 11 22:14:15 h b: two"
	fmt.Fprintf(c, "%d %s%s\n%d %s", len(m1), m1, m2, len(m1), m1)
	c.Close()
	recs := waitFor(t, sink, 3)
	for i, want := range []string{m1, m2, m1} {
		if string(recs[i].Value) != want {
			t.Errorf("record %d = %q, want %q", i, recs[i].Value, want)
		}
	}
}

// An octet count over max_message_bytes closes the connection from its
// digits: nothing of it is reserved or read, and it is counted.
func TestHugeOctetCount(t *testing.T) {
	bud := budget.New(1 << 20)
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), receiver.Env{Next: sink, Bodies: bud})
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "999999999999 <13>x")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection not closed")
	}
	if got := testutil.ToFloat64(r.sm.dropped.WithLabelValues("tcp", "frame_too_large")); got != 1 {
		t.Fatalf("frame_too_large dropped %v, want 1", got)
	}
	if bud.Used() != 0 {
		t.Fatalf("%d bytes of the budget still held", bud.Used())
	}
}

// A line longer than max_message_bytes is delivered truncated, marked and
// counted, and the rest of it skipped: the next line arrives whole.
func TestLongLineTruncated(t *testing.T) {
	sink := &consumertest.Sink{}
	cfg := testConfig(t)
	cfg.MaxMessageBytes = 1024
	cfg.Format = "raw"
	r := start(t, cfg, receiver.Env{Next: sink})
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "<13>%s\n<13>next\n", strings.Repeat("x", 100_000))
	c.Close()
	recs := waitFor(t, sink, 2)
	if len(recs[0].Value) != 1024 || header(recs[0], HeaderTruncated) != "true" || string(recs[1].Value) != "<13>next" {
		t.Fatalf("got %d bytes (truncated %q), then %q", len(recs[0].Value), header(recs[0], HeaderTruncated), recs[1].Value)
	}
	if got := testutil.ToFloat64(r.sm.truncated[tTCP]); got != 1 {
		t.Fatalf("truncated %v, want 1", got)
	}
}

// A frame that stalls past frame_timeout is cut, its reservation given
// back, and counted.
func TestSlowFrameCut(t *testing.T) {
	bud := budget.New(8 << 20)
	sink := &consumertest.Sink{}
	cfg := testConfig(t)
	cfg.FrameTimeout = 300 * time.Millisecond
	r := start(t, cfg, receiver.Env{Next: sink, Bodies: bud})
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "60000 <13>%s", strings.Repeat("x", 20000)) // grows the buffer past 4 KiB: reserved
	// Polled, not slept on: a loaded machine may take its time to read.
	for deadline := time.Now().Add(5 * time.Second); bud.Used() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the partial frame's growth is not reserved")
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection not closed")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("closed after %s", d)
	}
	// Counted and released before the handler returns, so before the close.
	if got := testutil.ToFloat64(r.sm.dropped.WithLabelValues("tcp", "frame_timeout")); got != 1 {
		t.Fatalf("frame_timeout %v, want 1", got)
	}
	if bud.Used() != 0 {
		t.Fatalf("%d bytes of the budget still held", bud.Used())
	}
}

// refuseFirst refuses the first n batches as the full queue does, then
// passes them on.
type refuseFirst struct {
	n    atomic.Int64
	next consumer.Consumer
}

func (f *refuseFirst) Consume(ctx context.Context, b *record.Batch) error {
	if f.n.Add(-1) >= 0 {
		return consumer.ErrFull
	}
	return f.next.Consume(ctx, b)
}

// TCP: a full queue stops reading and the batch is tried again: nothing is
// lost. UDP: a datagram that finds the queue full is dropped and counted.
func TestQueueFull(t *testing.T) {
	sink := &consumertest.Sink{}
	next := &refuseFirst{next: sink}
	next.n.Store(3)
	r := start(t, testConfig(t), receiver.Env{Next: next})
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "<13>1 - h a - - - tcp\n")
	c.Close()
	waitFor(t, sink, 1)
	next.n.Store(1)
	u, err := net.Dial("udp", r.UDPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	fmt.Fprint(u, "<13>1 - h a - - - udp")
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.sm.dropped.WithLabelValues("udp", "queue_full")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the UDP datagram refused by the queue is not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records", n)
	}
}

// Records that fail after the pipeline took them are counted: no one can
// send them again.
func TestFailureAfterAcceptanceCounted(t *testing.T) {
	sink := &consumertest.Sink{Err: &consumer.PermanentError{Reason: "record_too_large", Msg: "x"}}
	r := start(t, testConfig(t), receiver.Env{Next: sink})
	u, err := net.Dial("udp", r.UDPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	fmt.Fprint(u, "<13>1 - h a - - - x")
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.sm.dropped.WithLabelValues("udp", "record_too_large")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Past max_connections a new connection is closed at once.
func TestMaxConnections(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxConnections = 2
	r := start(t, cfg, receiver.Env{Next: &consumertest.Sink{}})
	var conns []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", r.TCPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	if closed != 2 {
		t.Fatalf("%d of 4 closed, want 2", closed)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// alwaysFull refuses every batch, as a queue whose Kafka is away.
type alwaysFull struct{ calls atomic.Int64 }

func (f *alwaysFull) Consume(context.Context, *record.Batch) error {
	f.calls.Add(1)
	return consumer.ErrFull
}

// Shutdown does not wait on a connection that waits for room, nor on the
// UDP reader: the batch waiting is counted (shutting_down), the budget
// given back.
func TestShutdownWhileWaitingForRoom(t *testing.T) {
	bud := budget.New(64 << 20)
	full := &alwaysFull{}
	r, err := New(testConfig(t), receiver.Env{Set: telemetry.TestSettings(), Next: full, Bodies: bud})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "<13>1 - h a - - - waits\n")
	for deadline := time.Now().Add(5 * time.Second); full.calls.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the batch was not tried")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.sm.dropped.WithLabelValues("tcp", "shutting_down")); got != 1 {
		t.Fatalf("shutting_down %v, want 1", got)
	}
	if bud.Used() != 0 {
		t.Fatalf("%d bytes of the budget still held", bud.Used())
	}
}
