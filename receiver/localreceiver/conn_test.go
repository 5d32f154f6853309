package localreceiver

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// startEnv starts a receiver of cfg with env (its Set filled in if empty).
func startEnv(t *testing.T, cfg Config, env receiver.Env) *Receiver {
	t.Helper()
	if env.Set.Registry == nil {
		env.Set = telemetry.TestSettings()
	}
	r, err := New(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

// recs is n records of topic with values "<topic>-<i>".
func recs(topic string, n int) []protocol.Record {
	out := make([]protocol.Record, n)
	for i := range out {
		out[i] = protocol.Record{Topic: []byte(topic), Value: []byte(fmt.Sprintf("%s-%d", topic, i))}
	}
	return out
}

// produceFlags is produce with the frame's flags (its compression) and
// body compressed with c.
func produceFlags(t *testing.T, id uint32, flags, c byte, recs ...protocol.Record) []byte {
	t.Helper()
	body := protocol.AppendProduceCount(nil, len(recs))
	prev := ""
	for i := range recs {
		body = protocol.AppendRecord(body, prev, &recs[i])
		prev = string(recs[i].Topic)
	}
	zb, err := protocol.Compress(nil, body, c)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.AppendFrame(nil, protocol.TypeProduce, flags, id, zb)
}

// result reads the next frame, which must be the Result of request id.
func result(t *testing.T, c net.Conn, br *bufio.Reader, id uint32) []protocol.Range {
	t.Helper()
	fh, fb := readFrame(t, c, br)
	if fh.Type != protocol.TypeResult || fh.RequestID != id {
		t.Fatalf("frame type %d id %d (%q), want the Result of %d", fh.Type, fh.RequestID, fb, id)
	}
	rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// closedWith reads the next frame, which must be an Error frame for
// request id naming reason (and msg containing want), then the end of
// the connection.
func closedWith(t *testing.T, c net.Conn, br *bufio.Reader, id uint32, reason, want string) {
	t.Helper()
	fh, fb := readFrame(t, c, br)
	got, msg, err := protocol.DecodeError(fb, protocol.DefaultLimits)
	if fh.Type != protocol.TypeError || fh.RequestID != id || err != nil || got != reason || !strings.Contains(msg, want) {
		t.Fatalf("frame type %d id %d: %q %q %v, want an Error frame for %d: %s (%q)", fh.Type, fh.RequestID, got, msg, err, id, reason, want)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.ReadByte(); err == nil {
		t.Fatalf("the connection goes on after the Error frame: %#x", n)
	}
}

// counted requires ferry_receiver_errors_total{receiver="local",reason} to be n.
func counted(t *testing.T, r *Receiver, reason string, n float64) {
	t.Helper()
	if v := testutil.ToFloat64(r.m.Errors(reason)); v != n {
		t.Fatalf("%s counted %v times, want %v", reason, v, n)
	}
}

// TestCompressionNotAgreed: a produce frame compressed with a codec the
// hello did not agree on (or the reserved value 3) ends the connection
// with malformed_frame, before its body is read; one that was agreed is
// read as any other.
func TestCompressionNotAgreed(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	for i, c := range []struct {
		feats uint64
		flags byte
	}{
		{0, protocol.CompressLZ4},
		{0, protocol.CompressZstd},
		{protocol.FeatureZstd, protocol.CompressLZ4},
		{protocol.FeatureLZ4, protocol.CompressZstd},
		{protocol.FeatureLZ4 | protocol.FeatureZstd, 3},
	} {
		conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1, Features: c.feats})
		codec := c.flags
		if codec == 3 {
			codec = protocol.CompressNone
		}
		_, _ = conn.Write(produceFlags(t, 9, c.flags, codec, recs("logs", 3)...))
		closedWith(t, conn, br, 9, "malformed_frame", fmt.Sprintf("compression %d was not agreed in the hello", c.flags))
		counted(t, r, "malformed_frame", float64(i+1))
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records passed on from frames compressed without agreement", n)
	}
	for _, c := range []struct {
		feat  uint64
		codec byte
	}{{protocol.FeatureLZ4, protocol.CompressLZ4}, {protocol.FeatureZstd, protocol.CompressZstd}} {
		sink.Reset()
		conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1, Features: c.feat})
		_, _ = conn.Write(produceFlags(t, 1, c.codec, c.codec, recs("logs", 3)...))
		if rs := result(t, conn, br, 1); len(rs) != 1 || rs[0].Status != protocol.StatusOK || rs[0].Count != 3 {
			t.Fatalf("codec %d agreed: %+v", c.codec, rs)
		}
		if got := sink.Records(); len(got) != 3 || string(got[2].Value) != "logs-2" {
			t.Fatalf("codec %d agreed: records %+v", c.codec, got)
		}
	}
}

// TestDecompressionBomb: a compressed frame that inflates past
// max_frame_bytes is answered permanent frame_too_large, and the
// connection goes on.
func TestDecompressionBomb(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1, Features: protocol.FeatureZstd})
	big := protocol.Record{Topic: []byte("logs"), Value: make([]byte, 1<<20)} // 16 times max_frame_bytes, in a few hundred bytes
	_, _ = conn.Write(produceFlags(t, 1, protocol.CompressZstd, protocol.CompressZstd, big))
	if rs := result(t, conn, br, 1); len(rs) != 1 || rs[0].Status != protocol.StatusPermanent || rs[0].Reason != "frame_too_large" {
		t.Fatalf("bomb: %+v", rs)
	}
	counted(t, r, "frame_too_large", 1)
	_, _ = conn.Write(produce(2, recs("logs", 1)...))
	if rs := result(t, conn, br, 2); len(rs) != 1 || rs[0].Status != protocol.StatusOK {
		t.Fatalf("after the bomb: %+v", rs)
	}
	if got := sink.Records(); len(got) != 1 {
		t.Fatalf("%d records, want the one after the bomb", len(got))
	}
}

// TestFrameAfterHello: after the hello a client sends only produce frames;
// any other type (a second hello, an agent's own frame type) ends the
// connection with malformed_frame naming the type.
func TestFrameAfterHello(t *testing.T) {
	r := start(t, testConfig(t), &consumertest.Sink{}, nil)
	for i, c := range []struct {
		frame []byte
		id    uint32
		want  string
	}{
		{protocol.AppendHello(nil, protocol.Hello{Version: 1}), 0, "frame type 1 is not sent by clients after the hello"},
		{protocol.AppendResult(nil, 4, []protocol.Range{{Count: 1}}), 4, "frame type 4 is not sent by clients after the hello"},
		{protocol.AppendError(nil, 5, "x", "y"), 5, "frame type 5 is not sent by clients after the hello"},
		{protocol.AppendFrame(nil, 77, 0, 6, nil), 6, "unknown frame type 77"},
	} {
		conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
		_, _ = conn.Write(c.frame)
		closedWith(t, conn, br, c.id, "malformed_frame", c.want)
		counted(t, r, "malformed_frame", float64(i+1))
	}
}

// TestBudgetFull: a frame whose body the memory budget has no room for is
// answered retryable queue_full without being read into memory, the rest
// of it skipped; the connection goes on and a frame that fits is served.
func TestBudgetFull(t *testing.T) {
	sink := &consumertest.Sink{}
	bud := budget.New(16 << 10)
	r := startEnv(t, testConfig(t), receiver.Env{Next: sink, Bodies: bud})
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	big := recs("logs", 40)
	for i := range big {
		big[i].Value = bytes.Repeat([]byte{'v'}, 1000) // 40 KB: more than the budget
	}
	_, _ = conn.Write(produce(1, big...))
	rs := result(t, conn, br, 1)
	if len(rs) != 1 || rs[0].Count != 0 || rs[0].Status != protocol.StatusRetryable || rs[0].Reason != "queue_full" || rs[0].RetryAfter < time.Second {
		t.Fatalf("over the budget: %+v", rs)
	}
	counted(t, r, "queue_full", 1)
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records passed on from a frame with no room", n)
	}
	// The refused frame's bytes were skipped: the next frame is read from
	// its own header.
	_, _ = conn.Write(produce(2, recs("logs", 2)...))
	if rs := result(t, conn, br, 2); len(rs) != 1 || rs[0].Status != protocol.StatusOK || rs[0].Count != 2 {
		t.Fatalf("a frame that fits: %+v", rs)
	}
	waitFor(t, "the budget given back", func() bool { return bud.Used() == 0 })
}

// TestRateLimited: a frame over its application's rate is answered
// retryable rate_limited with the time until it would fit, counted, and
// nothing of it is passed on.
func TestRateLimited(t *testing.T) {
	set := telemetry.TestSettings()
	lim, err := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{"slow": {RecordsPerSec: 0.1, BurstRecords: 2}},
		DefaultClass: "slow"}, set)
	if err != nil {
		t.Fatal(err)
	}
	sink := &consumertest.Sink{}
	r := startEnv(t, testConfig(t), receiver.Env{Set: set, Next: sink, Pre: &receiver.Prechecks{Limiter: lim}})
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	_, _ = conn.Write(produce(1, recs("logs", 2)...))
	if rs := result(t, conn, br, 1); len(rs) != 1 || rs[0].Status != protocol.StatusOK {
		t.Fatalf("within the burst: %+v", rs)
	}
	_, _ = conn.Write(produce(2, recs("logs", 3)...))
	rs := result(t, conn, br, 2)
	if len(rs) != 1 || rs[0].Count != 3 || rs[0].Status != protocol.StatusRetryable || rs[0].Reason != "rate_limited" || rs[0].RetryAfter < time.Second {
		t.Fatalf("over the rate: %+v", rs)
	}
	counted(t, r, "rate_limited", 1)
	if n := len(sink.Records()); n != 2 {
		t.Fatalf("%d records passed on, want the burst's 2", n)
	}
}

// TestSubmitRefused: a frame the next stage refuses (the queue full, the
// agent stopping) is answered with that stage's reason for every record,
// counted, and the connection goes on.
func TestSubmitRefused(t *testing.T) {
	for _, c := range []struct {
		err    error
		status byte
		reason string
	}{
		{consumer.ErrFull, protocol.StatusRetryable, "queue_full"},
		{consumer.ErrShuttingDown, protocol.StatusRetryable, "shutting_down"},
		{consumer.TooLarge("record", 10, 5, nil), protocol.StatusPermanent, "record_too_large"},
	} {
		t.Run(c.reason, func(t *testing.T) {
			r := start(t, testConfig(t), consumertest.Refuse{Err: c.err}, nil)
			conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
			for id := uint32(1); id <= 2; id++ {
				_, _ = conn.Write(produce(id, recs("logs", 4)...))
				rs := result(t, conn, br, id)
				if len(rs) != 1 || rs[0].Count != 4 || rs[0].Status != c.status || rs[0].Reason != consumer.Reason(c.err) {
					t.Fatalf("frame %d refused with %v: %+v", id, c.err, rs)
				}
				counted(t, r, consumer.Reason(c.err), float64(id))
			}
		})
	}
}

// TestRecordOutcomes: records refused before the hand-off (a topic the
// receiver does not allow, a name Kafka does not take) and records Kafka
// refuses are answered per record, in runs, and counted; the others are
// delivered.
func TestRecordOutcomes(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topics = []string{"logs*"}
	sink := &consumertest.Sink{FailFirst: consumer.TooLarge("record", 10, 5, nil)}
	r := start(t, cfg, sink, nil)
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	in := append(recs("logs", 2), recs("other", 2)...)
	in = append(in, recs("bad topic!", 1)...)
	in = append(in, recs("logs2", 1)...)
	_, _ = conn.Write(produce(1, in...))
	rs := result(t, conn, br, 1)
	want := []struct {
		count  uint32
		status byte
		reason string
	}{
		{1, protocol.StatusPermanent, "record_too_large"}, // the batch's first: Kafka refused it
		{1, protocol.StatusOK, ""},
		{2, protocol.StatusPermanent, "topic_not_allowed"},
		{1, protocol.StatusPermanent, "invalid_topic"},
		{1, protocol.StatusOK, ""},
	}
	if len(rs) != len(want) {
		t.Fatalf("ranges %+v", rs)
	}
	for i, w := range want {
		if rs[i].Count != w.count || rs[i].Status != w.status || rs[i].Reason != w.reason {
			t.Fatalf("range %d: %+v, want %+v (all: %+v)", i, rs[i], w, rs)
		}
	}
	counted(t, r, "topic_not_allowed", 2)
	counted(t, r, "invalid_topic", 1)
	got := sink.Records()
	if len(got) != 3 || string(got[0].Value) != "logs-0" || string(got[1].Value) != "logs-1" || string(got[2].Value) != "logs2-0" {
		t.Fatalf("records passed on: %+v", got)
	}
}

// TestTooManyRecords: a frame of more records than max_records_per_frame
// is answered permanent too_many_records as a whole, before one of them is
// decoded; the connection goes on.
func TestTooManyRecords(t *testing.T) {
	sink := &consumertest.Sink{}
	cfg := testConfig(t)
	cfg.MaxRecords = 5
	r := start(t, cfg, sink, nil)
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	_, _ = conn.Write(produce(1, recs("logs", 6)...))
	if rs := result(t, conn, br, 1); len(rs) != 1 || rs[0].Count != 0 || rs[0].Status != protocol.StatusPermanent || rs[0].Reason != "too_many_records" {
		t.Fatalf("6 records of at most 5: %+v", rs)
	}
	counted(t, r, "too_many_records", 1)
	_, _ = conn.Write(produce(2, recs("logs", 5)...))
	if rs := result(t, conn, br, 2); len(rs) != 1 || rs[0].Status != protocol.StatusOK || rs[0].Count != 5 {
		t.Fatalf("5 records: %+v", rs)
	}
	if n := len(sink.Records()); n != 5 {
		t.Fatalf("%d records passed on, want 5", n)
	}
}

// TestFrameTooLarge: a frame whose header declares more than
// max_frame_bytes ends the connection with frame_too_large, its body never
// read.
func TestFrameTooLarge(t *testing.T) {
	r := start(t, testConfig(t), &consumertest.Sink{}, nil)
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	hdr := protocol.AppendFrame(nil, protocol.TypeProduce, 0, 3, nil)
	hdr[0], hdr[1], hdr[2], hdr[3] = 0, 2, 0, 0 // 128 KiB declared (max_frame_bytes is 64), nothing sent
	_, _ = conn.Write(hdr)
	closedWith(t, conn, br, 3, "frame_too_large", "receivers.local.max_frame_bytes")
	counted(t, r, "frame_too_large", 1)
}

// TestBodyTimeout: a frame whose body does not arrive within body_timeout
// ends the connection with body_timeout, and its reservation is given
// back.
func TestBodyTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.BodyTimeout = 100 * time.Millisecond
	bud := budget.New(1 << 20)
	r := startEnv(t, cfg, receiver.Env{Next: &consumertest.Sink{}, Bodies: bud})
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	f := produce(4, recs("logs", 3)...)
	_, _ = conn.Write(f[:len(f)-1])
	closedWith(t, conn, br, 4, "body_timeout", "receivers.local.body_timeout")
	counted(t, r, "body_timeout", 1)
	waitFor(t, "the budget given back", func() bool { return bud.Used() == 0 })
}

// TestConfigValidate: each invalid field is named; the factory's Check
// adds the bounds the agent's other settings put on it.
func TestConfigValidate(t *testing.T) {
	ok := testConfig(t)
	if err := ok.Validate(); err != nil {
		t.Fatalf("the test config: %v", err)
	}
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Socket, c.Listen = "", "" }, "nothing to listen on"},
		{func(c *Config) { c.SocketMode = "rw" }, "socket_mode"},
		{func(c *Config) { c.MaxFrameBytes = 100 }, "max_frame_bytes"},
		{func(c *Config) { c.MaxFrameBytes = 2 << 30 }, "max_frame_bytes"},
		{func(c *Config) { c.MaxRecords = 0 }, "max_records_per_frame"},
		{func(c *Config) { c.MaxInflightBytes = c.MaxFrameBytes - 1 }, "max_inflight_bytes"},
		{func(c *Config) { c.TLS.CertFile = "cert.pem" }, "tls.cert_file"},
		{func(c *Config) { c.MaxConnections = -1 }, "max_connections"},
		{func(c *Config) { c.IdleTimeout = 0 }, "idle_timeout"},
		{func(c *Config) { c.BodyTimeout = 10 * time.Millisecond }, "body_timeout"},
		{func(c *Config) { c.AckTimeout = 10 * time.Millisecond }, "ack_timeout"},
		{func(c *Config) { c.Topics = []string{"a[b"} }, ""},
		{func(c *Config) { c.Auth.Mode = "sometimes" }, "auth.mode"},
	} {
		cfg := testConfig(t)
		c.set(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%+v: %v, want an error naming %q", cfg, err, c.want)
		}
		if _, nerr := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}}); nerr == nil {
			t.Fatalf("New took a config Validate refuses (%v)", err)
		}
	}
	off := Config{}
	if err := off.Validate(); err != nil {
		t.Fatalf("disabled: %v", err)
	}

	bounds := receiver.Bounds{MemoryLimit: 64 << 20}
	if errs := ok.Check(bounds); len(errs) != 0 {
		t.Fatalf("Check of the test config: %v", errs)
	}
	for _, c := range []struct {
		set    func(*Config)
		bounds receiver.Bounds
		want   string
	}{
		{func(c *Config) { c.MaxFrameBytes, c.MaxInflightBytes = 8<<20, 8<<20 }, receiver.Bounds{MemoryLimit: 8 << 20}, "exceeds half of queue.memory_limit"},
		{func(*Config) {}, receiver.Bounds{MemoryLimit: 64 << 20, SpoolBytes: 100 << 10}, "delivery.spool.max_bytes"},
		{func(c *Config) { c.Auth.Mode, c.Auth.Sources = "required", []string{"hello"} }, bounds, "auth.keys is empty"},
		{func(c *Config) { c.MaxRecords = 0 }, bounds, "max_records_per_frame"},
	} {
		cfg := testConfig(t)
		c.set(&cfg)
		errs := cfg.Check(c.bounds)
		if len(errs) == 0 || !strings.Contains(fmt.Sprint(errs), c.want) {
			t.Fatalf("Check: %v, want an error naming %q", errs, c.want)
		}
	}
	// max_frame_bytes 0 is derived from the memory limit: a quarter, at
	// most 8 MiB.
	for _, c := range []struct {
		limit int64
		want  int64
	}{{0, 8 << 20}, {16 << 20, 4 << 20}, {1 << 30, 8 << 20}} {
		cfg := testConfig(t)
		cfg.MaxFrameBytes = 0
		if got := int64(cfg.resolved(receiver.Bounds{MemoryLimit: c.limit}).MaxFrameBytes); got != c.want {
			t.Fatalf("max_frame_bytes 0 with memory_limit %d: %d, want %d", c.limit, got, c.want)
		}
	}
}

// TestFactoryAndReload: the factory builds the receiver from its default
// YAML's type; a reload applies new token settings in place and asks for
// a restart for anything else.
func TestFactoryAndReload(t *testing.T) {
	f := NewFactory()
	if f.Type() != "local" || !bytes.Contains(f.DefaultYAML(), []byte("max_records_per_frame")) {
		t.Fatalf("factory %q", f.Type())
	}
	cfg := f.NewConfig().(*Config)
	*cfg = testConfig(t)
	if !cfg.On() {
		t.Fatal("an enabled config is off")
	}
	if err := cfg.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	rr, err := f.Create(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}})
	if err != nil {
		t.Fatal(err)
	}
	r := rr.(*Receiver)
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	if l := fmt.Sprint(r.Listening()); !strings.Contains(l, r.SocketPath()) || !strings.Contains(l, r.TCPAddr()) {
		t.Fatalf("listening %s", l)
	}
	same := *cfg
	same.Auth.Mode = "optional"
	same.Auth.Sources = []string{"hello"}
	if r.Reload(&same) {
		t.Fatal("a change of auth alone asks for a restart")
	}
	other := same
	other.MaxRecords++
	if !r.Reload(&other) {
		t.Fatal("a change of max_records_per_frame does not ask for a restart")
	}
}

// TestUnreadAnswersStopTheReader: a client that pipelines frames and
// never reads their answers (here each answer ten times its frame: every
// other record to a topic it may not write, each refusal with its reason)
// has its connection stopped once it holds server.MaxHeld of answers, so
// ferry holds a bounded amount for it instead of ten times what it sent,
// until the write timeout.
func TestUnreadAnswersStopTheReader(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topics = []string{"ok"}
	var read atomic.Int64 // frames handed on: one batch each
	sink := consumer.Func(func(_ context.Context, b *record.Batch) error {
		read.Add(1)
		b.Arm()
		for i := range b.Records {
			b.AckAt(i, nil)
		}
		return nil
	})
	r := startEnv(t, cfg, receiver.Env{Next: sink})
	conn, _, _, _ := binary(t, r, protocol.Hello{Version: 1})
	const n = 4000
	frames := sendAlternating(conn, n)
	// Until the agent stops reading (or has read every frame).
	for last, since := int64(-1), time.Now(); time.Since(since) < 500*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if v := read.Load(); v != last {
			last, since = v, time.Now()
		}
	}
	if held := r.answers.Held(); read.Load() == n || held > 2<<20 {
		t.Fatalf("%d KiB in %d frames whose answers are never read: %d read, %d KiB of answers held", len(frames)>>10, n, read.Load(), held>>10)
	}
}

// TestOwedAnswersStopTheReader: frames not yet answered count as the
// answers they may become (a range per run of one topic), so a client
// whose frames alternate between a topic it may write and one it may not
// cannot have the agent read 1 MiB of them (max_inflight_bytes) and then
// hold answers nine times that size when Kafka answers.
func TestOwedAnswersStopTheReader(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topics = []string{"ok"}
	held := make(chan *record.Batch, 10000)
	sink := consumer.Func(func(_ context.Context, b *record.Batch) error { held <- b; return nil })
	r := startEnv(t, cfg, receiver.Env{Next: sink})
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	const n = 1000
	sendAlternating(conn, n)
	// Until the agent stops reading.
	for last, since := -1, time.Now(); time.Since(since) < 500*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if v := len(held); v != last {
			last, since = v, time.Now()
		}
	}
	read := len(held)
	if read > 40 {
		t.Fatalf("%d of %d frames read while their answers (~9 KiB each) are owed", read, n)
	}
	// Answered, the rest are read and answered too.
	go func() {
		for b := range held {
			b.Arm()
			for i := range b.Records {
				b.AckAt(i, nil)
			}
		}
	}()
	defer close(held)
	for id := uint32(1); id <= n; id++ {
		rs := result(t, conn, br, id)
		if len(rs) != 100 || rs[0].Status != protocol.StatusOK || rs[99].Reason != "topic_not_allowed" {
			t.Fatalf("frame %d answered %+v", id, rs)
		}
		words := 0
		for _, rg := range rs {
			if rg.Message != "" {
				words++
			}
		}
		if words != 50 {
			t.Fatalf("frame %d: %d refusals with words, want the 50 of the first %d ranges", id, words, 100)
		}
	}
	waitFor(t, "nothing held", func() bool { return r.answers.Held() == 0 })
}

// TestHeadersReservedBeforeMade: a record header costs two bytes on the
// wire and record.HeaderOverhead in memory. A frame of records with 255
// empty headers each is refused queue_full when the budget has room for
// the frame but not for its headers, and otherwise charged for them: such
// frames held twenty times what they reserved.
func TestHeadersReservedBeforeMade(t *testing.T) {
	var got atomic.Int64
	sink := consumer.Func(func(_ context.Context, b *record.Batch) error {
		got.Store(b.MemBytes)
		b.Arm()
		for i := range b.Records {
			b.AckAt(i, nil)
		}
		return nil
	})
	hs := make([]protocol.Header, 255)
	for i := range hs {
		hs[i] = protocol.Header{Key: []byte{}, Value: nil}
		if i%2 == 1 {
			hs[i].Key = []byte("ferry.x") // dropped (reserved), its slot made all the same
		}
	}
	recs := make([]protocol.Record, 40)
	for i := range recs {
		recs[i] = protocol.Record{Topic: []byte("logs"), Value: []byte("v"), Headers: hs}
	}
	frame := produce(1, recs...)
	structs := int64(40 * 255 * record.HeaderOverhead)

	bud := budget.New(256 << 10) // the frame (~56 KB) fits, its headers' structs (816 KB) do not
	r := startEnv(t, testConfig(t), receiver.Env{Next: sink, Bodies: bud})
	conn, br, _, _ := binary(t, r, protocol.Hello{Version: 1})
	_, _ = conn.Write(frame)
	if rs := result(t, conn, br, 1); len(rs) != 1 || rs[0].Status != protocol.StatusRetryable || rs[0].Reason != "queue_full" {
		t.Fatalf("no room for the headers: %+v", rs)
	}
	waitFor(t, "the budget given back", func() bool { return bud.Used() == 0 })

	r2 := startEnv(t, testConfig(t), receiver.Env{Next: sink, Bodies: budget.New(64 << 20)})
	conn2, br2, _, _ := binary(t, r2, protocol.Hello{Version: 1})
	_, _ = conn2.Write(frame)
	if rs := result(t, conn2, br2, 1); len(rs) != 1 || rs[0].Status != protocol.StatusOK {
		t.Fatalf("with room: %+v", rs)
	}
	if got.Load() < structs {
		t.Fatalf("the batch was charged %d bytes for %d bytes of header structs", got.Load(), structs)
	}
}

// sendAlternating writes n frames (ids 1…n) of 100 records alternating
// between topic "ok" and topic "no", in the background, never reading;
// it returns what it writes.
func sendAlternating(conn net.Conn, n int) []byte {
	var rs []protocol.Record
	for i := range 100 {
		rs = append(rs, protocol.Record{Topic: []byte([]string{"ok", "no"}[i%2]), Value: []byte("v")})
	}
	var frames []byte
	for id := range uint32(n) {
		frames = append(frames, produce(id+1, rs...)...)
	}
	go func() {
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, _ = conn.Write(frames)
	}()
	return frames
}
