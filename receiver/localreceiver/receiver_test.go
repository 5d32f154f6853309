package localreceiver

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

func testConfig(t *testing.T) Config {
	dir, err := os.MkdirTemp("", "fl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return Config{Enabled: true, Socket: filepath.Join(dir, "f.sock"), SocketMode: "0660", Listen: "127.0.0.1:0",
		MaxFrameBytes: 64 << 10, MaxRecords: 100, MaxInflightBytes: 1 << 20, MaxConnections: 8, IdleTimeout: 10 * time.Second,
		AckTimeout: 5 * time.Second, BodyTimeout: 10 * time.Second, Topics: []string{"*"}, Auth: auth.ReceiverConfig{Mode: "none"}}
}

func start(t *testing.T, cfg Config, next consumer.Consumer, pre *receiver.Prechecks) *Receiver {
	t.Helper()
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: next, Pre: pre})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

// textSession sends lines and reads the answers.
func textSession(t *testing.T, r *Receiver, lines ...string) []string {
	t.Helper()
	c, err := net.Dial("unix", r.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, strings.Join(lines, "\n")+"\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var out []string
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return out
		}
		out = append(out, strings.TrimSpace(l))
		if len(out) == len(lines) {
			return out
		}
	}
}

// TestTextMode: "topic<TAB>value" lines are records, answered in order,
// with a bad line refused on its own.
func TestTextMode(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	got := textSession(t, r, "logs\tfirst", "no tab here", "bad topic!\tx", "logs\tsecond\twith a tab")
	want := []string{"OK", "ERR invalid_line", "ERR invalid_topic", "OK"}
	if len(got) != len(want) {
		t.Fatalf("answers %q", got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Fatalf("answer %d: %q, want %s…", i, got[i], want[i])
		}
	}
	recs := sink.Records()
	if len(recs) != 2 || string(recs[0].Value) != "first" || string(recs[1].Value) != "second\twith a tab" || recs[0].Topic != "logs" {
		t.Fatalf("records %+v", recs)
	}
}

// TestTextAuth: with tokens required, lines before a valid "#token" are
// refused and the connection closed; after one, they carry its tenant.
func TestTextAuth(t *testing.T) {
	sink := &consumertest.Sink{}
	cfg := testConfig(t)
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"hello"}}
	checker, _ := authtest.New(t)
	r := start(t, cfg, sink, &receiver.Prechecks{Checker: checker})
	if got := textSession(t, r, "logs\tx"); len(got) != 1 || !strings.HasPrefix(got[0], "ERR unauthenticated") {
		t.Fatalf("without a token: %q", got)
	}
	tok := authtest.IssueClaims(t, token.Claims{App: "shop"})
	got := textSession(t, r, "#token "+tok, "logs\ty")
	if len(got) != 2 || got[0] != "OK" || got[1] != "OK" {
		t.Fatalf("with a token: %q", got)
	}
	recs := sink.Records()
	if len(recs) != 1 || len(recs[0].Headers) == 0 || recs[0].Headers[0].Key != "ferry.tenant" || string(recs[0].Headers[0].Value) != "shop" {
		t.Fatalf("records %+v", recs)
	}
}

// binary opens a binary connection with hello.
func binary(t *testing.T, r *Receiver, hello protocol.Hello) (net.Conn, *bufio.Reader, protocol.FrameHeader, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	out := append([]byte(nil), protocol.Preamble[:]...)
	out = protocol.AppendHello(out, hello)
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	h, body := readFrame(t, c, br)
	return c, br, h, body
}

func readFrame(t *testing.T, c net.Conn, br *bufio.Reader) (protocol.FrameHeader, []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [10]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		t.Fatalf("no frame: %v", err)
	}
	h, err := protocol.ParseHeader(hdr, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, h.BodyLen())
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	return h, body
}

func produce(id uint32, recs ...protocol.Record) []byte {
	body := protocol.AppendProduceCount(nil, len(recs))
	prev := ""
	for i := range recs {
		body = protocol.AppendRecord(body, prev, &recs[i])
		prev = string(recs[i].Topic)
	}
	return protocol.AppendFrame(nil, protocol.TypeProduce, 0, id, body)
}

// TestHelloAndLimits: the hello is answered with the agent's limits; a
// second hello, a reused request id in flight and an unknown version each
// end the connection with an Error frame naming why.
func TestHelloAndLimits(t *testing.T) {
	h := &consumertest.Holder{}
	r := start(t, testConfig(t), h, nil)
	c, br, hh, body := binary(t, r, protocol.Hello{Version: 1, ClientName: "t", Features: protocol.FeatureZstd | 1<<7})
	ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits)
	if hh.Type != protocol.TypeHelloOK || err != nil || ok.MaxFrameBytes != 64<<10 || ok.MaxRecords != 100 || ok.Features != protocol.FeatureZstd {
		t.Fatalf("hello ok %+v %v", ok, err)
	}
	// The same request id twice while the first is in flight.
	rec := protocol.Record{Topic: []byte("t"), Value: []byte("v")}
	_, _ = c.Write(produce(5, rec))
	_, _ = c.Write(produce(5, rec))
	// What is in flight is answered first; the Error frame is the last:
	// once the first frame is held and the second refused, the first is
	// answered.
	waitFor(t, "the first frame held", func() bool { return h.Held() == 1 })
	waitFor(t, "the duplicate refused", func() bool { return testutil.ToFloat64(r.m.Errors("malformed_frame")) == 1 })
	h.Release(nil)
	fh, _ := readFrame(t, c, br)
	if fh.Type != protocol.TypeResult || fh.RequestID != 5 {
		t.Fatalf("the frame in flight was not answered before the error: type %d id %d", fh.Type, fh.RequestID)
	}
	fh, fb := readFrame(t, c, br)
	if reason, _, _ := protocol.DecodeError(fb, protocol.DefaultLimits); fh.Type != protocol.TypeError || reason != "malformed_frame" {
		t.Fatalf("a duplicate id: frame %d %q", fh.Type, fb)
	}

	c2, br2, h2, b2 := binary(t, r, protocol.Hello{Version: 9})
	if reason, _, _ := protocol.DecodeError(b2, protocol.DefaultLimits); h2.Type != protocol.TypeError || reason != "unsupported_version" {
		t.Fatalf("version 9: frame %d %q", h2.Type, b2)
	}
	_ = c2
	_ = br2
}

// TestAckTimeout: a frame Kafka does not answer is answered retryable
// ack_timeout, once, and the late completion sends nothing more.
func TestAckTimeout(t *testing.T) {
	h := &consumertest.Holder{}
	cfg := testConfig(t)
	cfg.AckTimeout = 200 * time.Millisecond
	r := start(t, cfg, h, nil)
	c, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	_, _ = c.Write(produce(1, protocol.Record{Topic: []byte("t"), Value: []byte("v")}))
	fh, fb := readFrame(t, c, br)
	rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits)
	if fh.Type != protocol.TypeResult || err != nil || len(rs) != 1 || rs[0].Reason != "ack_timeout" || rs[0].Status != protocol.StatusRetryable {
		t.Fatalf("answer %d %+v %v", fh.Type, rs, err)
	}
	h.Release(nil)
	_, _ = c.Write(produce(2, protocol.Record{Topic: []byte("t"), Value: []byte("w")}))
	waitFor(t, "the second frame held", func() bool { return h.Held() == 1 })
	h.Release(nil)
	fh, fb = readFrame(t, c, br)
	if fh.RequestID != 2 {
		t.Fatalf("a second answer for frame 1 came: %d %x", fh.RequestID, fb)
	}
	if v := testutil.ToFloat64(r.m.Errors("ack_timeout")); v != 1 {
		t.Fatalf("ack_timeout counted %v times", v)
	}
}

// waitFor waits until cond holds (5 s at most).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

// TestTextAnswersNeverRead: a text-mode client that sends lines and never
// reads their answers is disconnected once a write of its answers has
// waited textWriteTimeout, and what its lines held goes back to the
// budget. The answers' first write had no deadline: the connection, and
// the budget its long line reserved, were held forever.
func TestTextAnswersNeverRead(t *testing.T) {
	defer func(d time.Duration) { textWriteTimeout = d }(textWriteTimeout)
	textWriteTimeout = 300 * time.Millisecond
	bud := budget.New(64 << 20)
	cfg := testConfig(t)
	cfg.MaxRecords, cfg.MaxFrameBytes, cfg.MaxInflightBytes = 100_000, 8<<20, 8<<20 // one batch of lines: its answers are one write
	r := startEnv(t, cfg, receiver.Env{Next: &consumertest.Sink{}, Bodies: bud})
	c, err := net.Dial("unix", r.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A long line (its buffer grows, reserved), then bad lines whose
	// answers overflow the socket's buffers; more than 4 KiB left unread.
	long := "logs\t" + strings.Repeat("v", 600<<10) + "\n"
	bad := strings.Repeat("no tab here\n", 100_000)
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, long+bad+strings.Repeat("x", 8<<10))
	}()
	// The agent closes the connection: a read (of what it managed to
	// write) ends with EOF or a reset instead of the deadline.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	time.Sleep(time.Second) // the client does not read meanwhile
	_, err = io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the connection was still open 5 s after its answers stopped being read")
	}
	waitFor(t, "the budget given back", func() bool { return bud.Used() == 0 })
}

// TestTextFullBudget: with the budget full, a record line is refused
// queue_full on its own and the connection goes on; the #token line is not
// refused for room (that would read as a bad token).
func TestTextFullBudget(t *testing.T) {
	cfg := testConfig(t)
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"hello"}}
	checker, _ := authtest.New(t)
	bud := budget.New(1 << 20)
	r := startEnv(t, cfg, receiver.Env{Next: &consumertest.Sink{}, Bodies: bud, Pre: &receiver.Prechecks{Checker: checker}})
	bud.Reserve(bud.Limit(), bud.Limit())
	tok := authtest.IssueClaims(t, token.Claims{App: "shop"})
	got := textSession(t, r, "#token "+tok, "logs\ty")
	if len(got) != 2 || got[0] != "OK" || !strings.HasPrefix(got[1], "ERR queue_full") {
		t.Fatalf("budget full: %q", got)
	}
	bud.Release(bud.Limit())
	if got := textSession(t, r, "#token "+tok, "logs\tz"); len(got) != 2 || got[1] != "OK" {
		t.Fatalf("with room: %q", got)
	}
	waitFor(t, "the budget given back", func() bool { return bud.Used() == 0 })
}
