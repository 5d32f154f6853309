package client_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/localreceiver"
	"github.com/ferryhq/ferry/telemetry"
)

// spoolAgent is the agent's local receiver on a real spool with an
// idempotency store (delivery mode spool), delivering to sink.
func spoolAgent(t *testing.T, sink *consumertest.Sink) *localreceiver.Receiver {
	t.Helper()
	st, err := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 1 << 20}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), SegmentBytes: 1 << 20, MaxBytes: 64 << 20, Fsync: "always", WriteBuffer: 8 << 20,
		ReadAhead: 4 << 20}, telemetry.TestSettings(), spool.Links{Next: sink, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	_ = sp.Start(context.Background())
	cfg := localreceiver.Config{Enabled: true, Listen: "127.0.0.1:0", MaxFrameBytes: 1 << 20, MaxRecords: 10_000, MaxInflightBytes: 4 << 20,
		MaxConnections: 16, IdleTimeout: time.Minute, AckTimeout: 5 * time.Second, BodyTimeout: 10 * time.Second, Topics: []string{"*"}}
	r, err := localreceiver.New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sp, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Shutdown(context.Background())
		_ = sp.Shutdown(context.Background())
		_ = sp.Close()
	})
	return r
}

// proxy forwards connections to the agent. While cut is set, the first
// Result frame the agent sends on a connection is dropped and the
// connection closed (the records were stored, the client never hears it);
// while old is set, a version 3 preamble is answered as an agent older
// than version 3 answers it.
type proxy struct {
	ln       net.Listener
	target   string
	cut      atomic.Bool
	old      atomic.Bool
	cuts     atomic.Int32
	versions sync.Map // preamble version → connections
	wg       sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *proxy) addr() string { return "tcp:" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serve(c) }()
	}
}

func (p *proxy) serve(c net.Conn) {
	defer c.Close()
	var pre [4]byte
	if _, err := io.ReadFull(c, pre[:]); err != nil {
		return
	}
	n, _ := p.versions.LoadOrStore(pre[3], new(atomic.Int32))
	n.(*atomic.Int32).Add(1)
	if pre[3] == protocol.Version3 && p.old.Load() {
		_, _ = c.Write(protocol.AppendError(nil, 0, "unsupported_version", "protocol version 3 is not supported; this agent speaks versions 1 and 2"))
		return
	}
	a, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer a.Close()
	_, _ = a.Write(pre[:])
	go func() { _, _ = io.Copy(a, c); a.Close() }()
	for {
		var hdr [10]byte
		if _, err := io.ReadFull(a, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:4])-protocol.HeaderLen)
		if _, err := io.ReadFull(a, body); err != nil {
			return
		}
		if hdr[4] == protocol.TypeResult && p.cut.CompareAndSwap(true, false) {
			p.cuts.Add(1)
			return // dropped: both ends close
		}
		if _, err := c.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

func (p *proxy) connections(v byte) int32 {
	n, ok := p.versions.Load(v)
	if !ok {
		return 0
	}
	return n.(*atomic.Int32).Load()
}

// settleSink waits for want records and a little longer for extras.
func settleSink(t *testing.T, sink *consumertest.Sink, want int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(sink.Records()) < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	return len(sink.Records())
}

// TestRetryAfterLostAnswerStoredOnce: the agent stores a frame but the
// connection breaks before its answer reaches the client, which sends it
// again on its next connection. With the client's defaults (protocol
// version 3, idempotence) the agent recognises the retry: every record
// is stored once and called back once, successfully. With idempotence
// disabled the same fault stores the frame twice (at least once): the
// proof that the fault happened.
func TestRetryAfterLostAnswerStoredOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		disable bool
		want    int
	}{{"idempotent", false, 50}, {"disabled", true, 100}} {
		t.Run(tc.name, func(t *testing.T) {
			sink := &consumertest.Sink{}
			r := spoolAgent(t, sink)
			p := newProxy(t, r.TCPAddr())
			p.cut.Store(true)
			c := newClient(t, client.Options{Addrs: []string{p.addr()}, DisableIdempotence: tc.disable, RetryBackoff: 10 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := c.ProduceSync(ctx, recs(50, "t")...); err != nil {
				t.Fatal(err)
			}
			if p.cuts.Load() != 1 {
				t.Fatalf("the proxy cut %d answers, want 1", p.cuts.Load())
			}
			if got := settleSink(t, sink, tc.want); got != tc.want {
				t.Fatalf("stored %d records, want %d", got, tc.want)
			}
			if v := byte(3); tc.disable {
				if p.connections(v) != 0 {
					t.Fatal("a version 3 connection with idempotence disabled")
				}
			} else if p.connections(v) < 2 {
				t.Fatalf("%d version 3 connections, want 2", p.connections(v))
			}
		})
	}
}

// TestFallsBackFromVersion3: an agent that answers version 3's preamble
// with unsupported_version (one older than version 3) is asked again in
// the version the options need, and records are delivered.
func TestFallsBackFromVersion3(t *testing.T) {
	sink := &consumertest.Sink{}
	r := spoolAgent(t, sink)
	p := newProxy(t, r.TCPAddr())
	p.old.Store(true)
	c := newClient(t, client.Options{Addrs: []string{p.addr()}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ProduceSync(ctx, recs(10, "t")...); err != nil {
		t.Fatal(err)
	}
	if p.connections(3) != 1 || p.connections(1) != 1 {
		t.Fatalf("connections by version: v3 %d, v1 %d; want one each", p.connections(3), p.connections(1))
	}
	if got := settleSink(t, sink, 10); got != 10 {
		t.Fatalf("stored %d records, want 10", got)
	}
}
