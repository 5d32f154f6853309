package syslogreceiver

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// scriptConn is a connection whose reads are scripted: each step's bytes
// (over as many reads as the reader's buffer needs), the last of them
// returned together with the step's error, as a TLS connection returns a
// record's bytes with the close_notify that follows it.
type scriptConn struct {
	net.Conn // not used: only the methods below are
	steps    []scriptStep
}

type scriptStep struct {
	data string
	err  error
}

func (c *scriptConn) Read(b []byte) (int, error) {
	if len(c.steps) == 0 {
		return 0, io.EOF
	}
	s := &c.steps[0]
	n := copy(b, s.data)
	s.data = s.data[n:]
	if len(s.data) > 0 {
		return n, nil
	}
	err := s.err
	c.steps = c.steps[1:]
	return n, err
}

func (c *scriptConn) SetReadDeadline(time.Time) error { return nil }
func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 514}
}
func (c *scriptConn) Close() error { return nil }

// serveScript runs one stream connection over steps to its end.
func serveScript(t *testing.T, cfg Config, steps ...scriptStep) (*Receiver, *consumertest.Sink) {
	t.Helper()
	sink := &consumertest.Sink{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cancel)
	r.streamHandler(tTCP)(context.Background(), &scriptConn{steps: steps})
	return r, sink
}

func (r *Receiver) droppedCount(reason string) float64 {
	return testutil.ToFloat64(r.sm.dropped.WithLabelValues("tcp", reason))
}

// A connection that fails (reset by the peer, a broken TLS record) after
// whole frames and a partial one: the whole frames are delivered, the
// partial one counted. Nothing read is lost silently.
func TestReadErrorKeepsWholeFramesCountsPartial(t *testing.T) {
	for _, c := range []struct {
		name  string
		steps []scriptStep
	}{
		{"error with the bytes", []scriptStep{{"<13>1 - h a - - - one\n<13>part", syscall.ECONNRESET}}},
		{"error after the bytes", []scriptStep{{"<13>1 - h a - - - one\n<13>part", nil}, {"", syscall.ECONNRESET}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, sink := serveScript(t, testConfig(t), c.steps...)
			if n := len(sink.Records()); n != 1 {
				t.Errorf("%d records delivered, want 1", n)
			}
			if got := r.droppedCount("read_error"); got != 1 {
				t.Errorf("read_error dropped %v, want 1 (the partial frame)", got)
			}
		})
	}
}

// Bytes that come with EOF are framed as any others: the whole frames go
// on, and a fatal frame after them is counted under its own reason.
func TestEOFWithBytesFatalReason(t *testing.T) {
	r, sink := serveScript(t, testConfig(t), scriptStep{"<13>one\n999999999999 x", io.EOF})
	if n := len(sink.Records()); n != 1 {
		t.Errorf("%d records delivered, want 1", n)
	}
	if got := r.droppedCount("frame_too_large"); got != 1 {
		t.Errorf("frame_too_large dropped %v, want 1 (truncated_frame: %v)", got, r.droppedCount("truncated_frame"))
	}
}

// A truncated line is delivered (truncated): when the rest of it, being
// skipped, stalls past frame_timeout, the connection is closed and the
// error counted, but no message is counted as dropped: none was.
func TestSkippedLineTimeoutNotDropped(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxMessageBytes = 480
	for _, end := range []struct {
		name string
		err  error
	}{{"frame_timeout", os.ErrDeadlineExceeded}, {"reset", syscall.ECONNRESET}} {
		t.Run(end.name, func(t *testing.T) {
			r, sink := serveScript(t, cfg, scriptStep{"<13>" + strings.Repeat("x", 1000), nil}, scriptStep{"", end.err})
			recs := sink.Records()
			if len(recs) != 1 || header(recs[0], HeaderTruncated) != "true" {
				t.Fatalf("%d records, want 1 truncated", len(recs))
			}
			for _, reason := range []string{"frame_timeout", "read_error"} {
				if got := r.droppedCount(reason); got != 0 {
					t.Errorf("%s dropped %v: the message was delivered (truncated)", reason, got)
				}
			}
			if end.name == "frame_timeout" {
				if got := testutil.ToFloat64(r.m.Errors("frame_timeout")); got != 1 {
					t.Errorf("frame_timeout errors %v, want 1", got)
				}
			}
		})
	}
}

// The smallest budget Check allows (4 of a message's largest record) must
// take every batch: a burst of tiny messages makes a batch whose bound
// (each message's JSON bound, its key, the fixed part) is far larger than
// its bytes. A batch larger than the budget could never be reserved: a
// connection would wait for it forever, a datagram batch be dropped whole.
func TestBatchesFitTheSmallestBudget(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxMessageBytes = 480
	limit := 4 * cfg.recordBound()
	if errs := cfg.Check(receiver.Bounds{MemoryLimit: limit}); len(errs) > 0 {
		t.Fatal(errs)
	}
	line := "<13>1 - h a - - - x\n"
	const n = 2000
	t.Run("tcp", func(t *testing.T) {
		bud := budget.New(limit)
		sink := &consumertest.Sink{}
		r := start(t, cfg, receiver.Env{Next: sink, Bodies: bud})
		c, err := net.Dial("tcp", r.TCPAddr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(strings.Repeat(line, n))); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitFor(t, sink, n)
	})
	t.Run("datagrams", func(t *testing.T) {
		bud := budget.New(limit)
		sink := &consumertest.Sink{}
		r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Bodies: bud})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.cancel)
		raws := make([][]byte, maxBatchMessages)
		for i := range raws {
			raws[i] = []byte(strings.TrimSuffix(line, "\n"))
		}
		r.handDatagrams(&builder{r: r, tr: tUDP}, raws, make([]bool, len(raws)))
		if got := len(sink.Records()); got != len(raws) {
			t.Fatalf("%d of %d records delivered (queue_full dropped %v)", got, len(raws),
				testutil.ToFloat64(r.sm.dropped.WithLabelValues("udp", "queue_full")))
		}
	})
}

// Connections whose buffers grew for long lines must not take the whole
// budget: each, holding its growth, would wait for its batch's room, which
// none could get, and every receiver sharing the budget with them would
// wait with them, for ever.
func TestGrowthLeavesRoomForBatches(t *testing.T) {
	cfg := testConfig(t)
	cfg.FrameTimeout = time.Minute
	cfg.MaxConnections = 64
	limit := 4 * cfg.recordBound()
	bud := budget.New(limit)
	sink := &consumertest.Sink{}
	r := start(t, cfg, receiver.Env{Next: sink, Bodies: bud})
	const line = 60000 // a buffer of 64 KiB: 60 KiB reserved
	n := int(limit/(64<<10-streamStart)) - 1
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", r.TCPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
		go func() { _, _ = c.Write([]byte("<13>" + strings.Repeat("x", line))) }()
	}
	// Every connection has grown as far as it may: the budget holds still.
	for last, still := int64(-1), 0; still < 5; time.Sleep(50 * time.Millisecond) {
		if u := bud.Used(); u == last && u > 0 {
			still++
		} else {
			last, still = u, 0
		}
	}
	for _, c := range conns {
		if _, err := c.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, sink, n)
}

// panicOnce panics on its first batch, as a bug reached by a sender's bytes
// would, then passes batches on.
type panicOnce struct {
	done atomic.Bool
	next *consumertest.Sink
}

func (p *panicOnce) Consume(ctx context.Context, b *record.Batch) error {
	if p.done.CompareAndSwap(false, true) {
		panic("a bug")
	}
	return p.next.Consume(ctx, b)
}

// A panic while a batch is handled costs that batch (counted), not the
// agent (a datagram listener had no recover: the process died) and not the
// budget (the batch's reservation is given back).
func TestPanicCostsTheBatchOnly(t *testing.T) {
	for _, tr := range []string{"udp", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			bud := budget.New(64 << 20)
			sink := &consumertest.Sink{}
			r := start(t, testConfig(t), receiver.Env{Next: &panicOnce{next: sink}, Bodies: bud})
			addr := r.UDPAddr()
			if tr == "tcp" {
				addr = r.TCPAddr()
			}
			c, err := net.Dial(tr, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprint(c, "<13>1 - h a - - - first\n")
			for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(r.sm.dropped.WithLabelValues(tr, "internal_error")) != 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the batch lost to the panic is not counted")
				}
			}
			fmt.Fprint(c, "<13>1 - h a - - - second\n")
			waitFor(t, sink, 1)
			if tr == "tcp" {
				c.Close()
			}
			for deadline := time.Now().Add(5 * time.Second); bud.Used() != 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d bytes of the budget still held", bud.Used())
				}
			}
		})
	}
}
