package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ferryhq/ferry/receiver"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver/localreceiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// agent runs the agent's local receiver in this process in front of next.
func agent(t testing.TB, next consumer.Consumer, mod func(*localreceiver.Config)) (*localreceiver.Receiver, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "f.sock")
	cfg := localreceiver.Config{Enabled: true, Socket: sock, SocketMode: "0660", Listen: "127.0.0.1:0", MaxFrameBytes: 1 << 20,
		MaxRecords: 10_000, MaxInflightBytes: 4 << 20, MaxConnections: 16, IdleTimeout: time.Minute, AckTimeout: 5 * time.Second, BodyTimeout: 10 * time.Second,
		Topics: []string{"*"}}
	if mod != nil {
		mod(&cfg)
	}
	r, err := localreceiver.New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: next})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r, sock
}

func newClient(t testing.TB, o client.Options) *client.Client {
	t.Helper()
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// calls records every callback, checking each record is called back once.
type calls struct {
	mu   sync.Mutex
	seen map[*client.Record]int
	errs map[string]int
	seq  []int // the value's number, in callback order
}

func newCalls() *calls { return &calls{seen: map[*client.Record]int{}, errs: map[string]int{}} }

func (c *calls) cb(r *client.Record, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[r]++
	if err != nil {
		c.errs[err.Error()]++
	}
	n, _ := strconv.Atoi(string(bytes.TrimPrefix(r.Value, []byte("v"))))
	c.seq = append(c.seq, n)
}

func (c *calls) check(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) != n {
		t.Fatalf("%d records called back, want %d", len(c.seen), n)
	}
	for r, k := range c.seen {
		if k != 1 {
			t.Fatalf("record %s called back %d times", r.Value, k)
		}
	}
	for i := 1; i < len(c.seq); i++ {
		if c.seq[i] < c.seq[i-1] {
			t.Fatalf("callbacks out of produce order: %d after %d", c.seq[i], c.seq[i-1])
		}
	}
}

func recs(n int, topic string) []*client.Record {
	out := make([]*client.Record, n)
	for i := range out {
		out[i] = &client.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte("v" + strconv.Itoa(i)),
			Headers: []client.Header{{Key: "h", Value: []byte("x")}}}
	}
	return out
}

// TestDeliversInOrder: records from one producer arrive complete, in
// order, with their keys and headers; every callback runs once, in
// produce order.
func TestDeliversInOrder(t *testing.T) {
	for _, comp := range []string{"none", "lz4", "zstd"} {
		t.Run(comp, func(t *testing.T) {
			sink := &consumertest.Sink{}
			_, sock := agent(t, sink, nil)
			c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, Compression: comp, BatchRecords: 97})
			cl := newCalls()
			rs := recs(5000, "t")
			for _, r := range rs {
				c.Produce(context.Background(), r, cl.cb)
			}
			if err := c.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			cl.check(t, len(rs))
			if len(cl.errs) != 0 {
				t.Fatalf("errors: %v", cl.errs)
			}
			got := sink.Records()
			if len(got) != len(rs) {
				t.Fatalf("the agent got %d records, want %d", len(got), len(rs))
			}
			for i, r := range got {
				if string(r.Value) != "v"+strconv.Itoa(i) || string(r.Key) != "k"+strconv.Itoa(i%7) || r.Topic != "t" ||
					len(r.Headers) != 1 || r.Headers[0].Key != "h" {
					t.Fatalf("record %d: %+v", i, r)
				}
			}
		})
	}
}

// flaky refuses the first n batches as full, then passes them on.
type flaky struct {
	left atomic.Int64
	next consumer.Consumer
}

func (f *flaky) Consume(ctx context.Context, b *record.Batch) error {
	if f.left.Add(-1) >= 0 {
		return consumer.ErrFull
	}
	return f.next.Consume(ctx, b)
}

// TestRetriesRefusals: batches the agent refuses for a passing reason are
// sent again until accepted; nothing is lost or called back twice.
func TestRetriesRefusals(t *testing.T) {
	sink := &consumertest.Sink{}
	f := &flaky{next: sink}
	f.left.Store(5)
	_, sock := agent(t, f, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, BatchRecords: 50, RetryBackoff: time.Millisecond, RetryBackoffMax: 5 * time.Millisecond})
	cl := newCalls()
	for _, r := range recs(1000, "t") {
		c.Produce(context.Background(), r, cl.cb)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	cl.check(t, 1000)
	if len(cl.errs) != 0 || len(sink.Records()) != 1000 {
		t.Fatalf("errors %v, delivered %d", cl.errs, len(sink.Records()))
	}
}

// perRecord fails, for good, the records whose value starts with "bad".
type perRecord struct{}

func (perRecord) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	for i := range b.Records {
		var err error
		if bytes.HasPrefix(b.Records[i].Value, []byte("bad")) {
			err = consumer.TooLarge("record", 10, 5, nil)
		}
		go b.AckAt(i, err)
	}
	return nil
}

// TestPerRecordOutcomes: in one batch, a record Kafka refuses and a record
// with a topic Kafka cannot have fail with their own reasons; the others
// are accepted.
func TestPerRecordOutcomes(t *testing.T) {
	_, sock := agent(t, perRecord{}, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}})
	rs := []*client.Record{{Topic: "t", Value: []byte("ok1")}, {Topic: "t", Value: []byte("bad1")},
		{Topic: "no spaces allowed", Value: []byte("ok2")}, {Topic: "t", Value: []byte("ok3")}}
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	wg.Add(len(rs))
	for i, r := range rs {
		c.Produce(context.Background(), r, func(_ *client.Record, err error) { errs[i] = err; wg.Done() })
	}
	wg.Wait()
	var fe *client.Error
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("accepted records failed: %v %v", errs[0], errs[3])
	}
	if !errors.As(errs[1], &fe) || fe.Reason != "record_too_large" || fe.Retryable {
		t.Fatalf("refused record: %v", errs[1])
	}
	if !errors.As(errs[2], &fe) || fe.Reason != "invalid_topic" {
		t.Fatalf("invalid topic: %v", errs[2])
	}
}

// TestReconnects: the agent goes away and comes back on the same socket
// while records are produced; every callback runs once, and every record
// reported accepted reached the agent.
func TestReconnects(t *testing.T) {
	sink := &consumertest.Sink{}
	r, sock := agent(t, sink, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, BatchRecords: 20, RetryBackoff: 5 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond})
	cl := newCalls()
	rs := recs(3000, "t")
	for i, rec := range rs {
		c.Produce(context.Background(), rec, cl.cb)
		if i == 1000 {
			_ = r.Shutdown(context.Background())
			time.Sleep(50 * time.Millisecond)
			r2, err := localreceiver.New(localreceiver.Config{Enabled: true, Socket: sock, SocketMode: "0660", MaxFrameBytes: 1 << 20,
				MaxRecords: 10_000, MaxInflightBytes: 4 << 20, MaxConnections: 16, IdleTimeout: time.Minute, AckTimeout: 5 * time.Second, BodyTimeout: 10 * time.Second,
				Topics: []string{"*"}}, receiver.Env{Set: telemetry.TestSettings(), Next: sink})
			if err != nil {
				t.Fatal(err)
			}
			if err := r2.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r2.Shutdown(context.Background()) })
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cl.check(t, len(rs))
	if len(cl.errs) != 0 {
		t.Fatalf("errors: %v", cl.errs)
	}
	got := map[string]bool{}
	for _, r := range sink.Records() {
		got[string(r.Value)] = true
	}
	for _, rec := range rs {
		if !got[string(rec.Value)] {
			t.Fatalf("%s was reported accepted but never reached the agent", rec.Value)
		}
	}
}

// TestCloseFailsWhatIsLeft: with no agent, Close after its deadline fails
// every record with ErrClosed, each exactly once; Produce after Close
// fails at once.
func TestCloseFailsWhatIsLeft(t *testing.T) {
	c, err := client.New(client.Options{Addrs: []string{"unix:/nonexistent/f.sock"}, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cl := newCalls()
	for _, r := range recs(100, "t") {
		c.Produce(context.Background(), r, cl.cb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Close(ctx); err == nil {
		t.Fatal("Close reported everything delivered")
	}
	cl.check(t, 100)
	if cl.errs[client.ErrClosed.Error()] != 100 {
		t.Fatalf("errors %v", cl.errs)
	}
	late := &client.Record{Topic: "t", Value: []byte("v1000")}
	c.Produce(context.Background(), late, cl.cb)
	if cl.errs[client.ErrClosed.Error()] != 101 {
		t.Fatal("Produce after Close did not fail the record")
	}
}

// TestBufferFullWaitsThenFails: with the agent not answering, Produce
// waits MaxBlock for room, then fails the record with ErrBufferFull.
func TestBufferFullWaitsThenFails(t *testing.T) {
	h := &consumertest.Holder{}
	_, sock := agent(t, h, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, MaxBufferedBytes: 4096, MaxBlock: 100 * time.Millisecond})
	cl := newCalls()
	big := bytes.Repeat([]byte("x"), 1000)
	start := time.Now()
	for i := 0; i < 10; i++ {
		c.Produce(context.Background(), &client.Record{Topic: "t", Value: append([]byte("v"+strconv.Itoa(i)+" "), big...)}, cl.cb)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("Produce did not wait for room (%s)", d)
	}
	cl.mu.Lock()
	full := cl.errs[client.ErrBufferFull.Error()]
	cl.mu.Unlock()
	if full == 0 {
		t.Fatalf("no record failed with ErrBufferFull: %v", cl.errs)
	}
	h.Release(nil)
	_ = c.Flush(context.Background())
}

// TestBufferWaitEndsWithCtx: a Produce waiting for room whose ctx ends
// fails its record with the ctx's error, not ErrBufferFull: the caller gave
// up, the buffer did not stay full for MaxBlock (the load tool counted its
// own stop as records failed for a full buffer).
func TestBufferWaitEndsWithCtx(t *testing.T) {
	h := &consumertest.Holder{}
	_, sock := agent(t, h, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, MaxBufferedRecords: 1, MaxBlock: time.Minute})
	defer h.Release(nil) // before the client's cleanup flushes
	c.Produce(context.Background(), &client.Record{Topic: "t", Value: []byte("first")}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	c.Produce(ctx, &client.Record{Topic: "t", Value: []byte("second")}, func(_ *client.Record, err error) { got <- err })
	err := <-got
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrBufferFull) {
		t.Fatalf("a wait ended by ctx: %v", err)
	}
}

// TestBufferBoundsRecords: the buffer is bounded in records too: with
// MaxBufferedRecords 50 and an agent that answers nothing, the 51st small
// record fails with ErrBufferFull (its bytes are far below
// MaxBufferedBytes), and once the agent answers there is room again.
func TestBufferBoundsRecords(t *testing.T) {
	h := &consumertest.Holder{}
	_, sock := agent(t, h, nil)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, MaxBufferedRecords: 50, MaxBlock: -1})
	cl := newCalls()
	for i := 0; i < 60; i++ {
		c.Produce(context.Background(), &client.Record{Topic: "t", Value: []byte("v" + strconv.Itoa(i))}, cl.cb)
	}
	cl.mu.Lock()
	full := cl.errs[client.ErrBufferFull.Error()]
	cl.mu.Unlock()
	if full != 10 {
		t.Fatalf("%d records failed with ErrBufferFull, want 10: %v", full, cl.errs)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		h.Release(nil)
		cl.mu.Lock()
		n := len(cl.seen)
		cl.mu.Unlock()
		if n == 60 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 60 called back", n)
		}
	}
	done := make(chan error, 1)
	c.Produce(context.Background(), &client.Record{Topic: "t", Value: []byte("v60")}, func(_ *client.Record, err error) { done <- err })
	for deadline := time.After(5 * time.Second); ; {
		h.Release(nil)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("after the agent answered: %v", err)
			}
			return
		case <-deadline:
			t.Fatal("the record after the agent answered was never called back")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestSyncAndTCP: ProduceSync over TCP returns after the records are
// durable, with the agent's refusal as its error.
func TestSyncAndTCP(t *testing.T) {
	sink := &consumertest.Sink{}
	r, _ := agent(t, sink, nil)
	c := newClient(t, client.Options{Addrs: []string{"tcp:" + r.TCPAddr()}})
	if err := c.ProduceSync(context.Background(), &client.Record{Topic: "t", Value: []byte("one")}); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("ProduceSync returned before the record was delivered (%d)", n)
	}
	err := c.ProduceSync(context.Background(), &client.Record{Topic: "bad topic", Value: []byte("x")})
	var fe *client.Error
	if !errors.As(err, &fe) || fe.Reason != "invalid_topic" {
		t.Fatalf("ProduceSync of an invalid topic: %v", err)
	}
}

func ExampleClient_Produce() {
	c, err := client.New(client.Options{}) // the agent's socket, then 127.0.0.1:8090
	if err != nil {
		panic(err)
	}
	defer c.Close(context.Background())
	c.Produce(context.Background(), &client.Record{Topic: "app-logs", Key: []byte("user-42"), Value: []byte(`{"msg":"hi"}`)},
		func(r *client.Record, err error) {
			if err != nil {
				fmt.Println("not delivered:", err)
			}
		})
}

func ExampleClient_ProduceSync() {
	c, err := client.New(client.Options{Addrs: []string{"unix:ferry-data/ferry.sock"}, Compression: "lz4"})
	if err != nil {
		panic(err)
	}
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Returns once Kafka (or the agent's spool) has the record.
	if err := c.ProduceSync(ctx, &client.Record{Topic: "billing", Value: []byte(`{"amount":12}`)}); err != nil {
		var fe *client.Error
		if errors.As(err, &fe) && !fe.Retryable {
			fmt.Println("refused for good:", fe.Reason)
		}
	}
}

// TestInFlightFillsTheAgentsWindow: unset, MaxInFlight follows the window
// the agent's hello announces (max_inflight_bytes), so a connection keeps
// as many frames unanswered as the agent allows rather than a fixed 32,
// which at 1000 B records through Kafka left three quarters of the default
// window unused (issue 37); set, it is the bound.
func TestInFlightFillsTheAgentsWindow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      int
		min, max int
	}{
		// 4 MiB window ÷ 32 KiB frames: 128, fewer as each frame is a
		// little over BatchBytes and the window is bytes too.
		{"default", 0, 100, 128},
		{"set", 5, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &consumertest.Holder{}
			_, sock := agent(t, h, func(c *localreceiver.Config) { c.MaxInflightBytes = 4 << 20 })
			c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, BatchBytes: 32 << 10, MaxInFlight: tc.set})
			cl := newCalls()
			val := bytes.Repeat([]byte("x"), 1000)
			const n = 200 * 32 // 200 frames' worth, more than either bound
			for i := 0; i < n; i++ {
				c.Produce(context.Background(), &client.Record{Topic: "t", Value: val}, cl.cb)
			}
			// Held only grows; wait until it has stood still for a while.
			last, still := -1, 0
			for deadline := time.Now().Add(10 * time.Second); still < 10 && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
				if got := h.Held(); got == last {
					still++
				} else {
					last, still = got, 0
				}
			}
			if last < tc.min || last > tc.max {
				t.Errorf("%d frames unanswered at once, want %d-%d", last, tc.min, tc.max)
			}
			// Records sent after a release are held again: release until
			// every one is called back.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				h.Release(nil)
				cl.mu.Lock()
				done := len(cl.seen) >= n
				cl.mu.Unlock()
				if done {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("records still unanswered after 30 s of releases")
				}
			}
			cl.check(t, n)
		})
	}
}

// holdThenPass holds every batch (never answered) until pass is set, then
// hands them to sink.
type holdThenPass struct {
	pass atomic.Bool
	held consumertest.Holder
	sink consumertest.Sink
}

func (h *holdThenPass) Consume(ctx context.Context, b *record.Batch) error {
	if h.pass.Load() {
		return h.sink.Consume(ctx, b)
	}
	return h.held.Consume(ctx, b)
}

// produceUntilHeld produces n records, one a frame, and waits until the
// agent holds held of them unanswered.
func produceUntilHeld(t *testing.T, c *client.Client, h *holdThenPass, n, held int) (*calls, []*client.Record) {
	t.Helper()
	cl := newCalls()
	rs := recs(n, "t")
	for _, rec := range rs {
		c.Produce(context.Background(), rec, cl.cb)
	}
	for deadline := time.Now().Add(3 * time.Second); h.held.Held() < held; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d frames in flight", h.held.Held())
		}
	}
	return cl, rs
}

// cutter forwards unix connections to an agent's socket until cut, which
// breaks every one of them at once (the agent does not answer what it
// holds: their fate is unknown to the client).
type cutter struct {
	ln    net.Listener
	mute  atomic.Bool // the agent's answers are dropped
	mu    sync.Mutex
	conns []net.Conn
}

func newCutter(t *testing.T, to string) (*cutter, string) {
	path := filepath.Join(filepath.Dir(to), "cut.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln}
	t.Cleanup(func() { ln.Close(); c.cut() })
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("unix", to)
			if err != nil {
				a.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, a, b)
			c.mu.Unlock()
			go func() {
				defer a.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := b.Read(buf)
					if c.mute.Load() {
						n = 0
					}
					if _, werr := a.Write(buf[:n]); err != nil || werr != nil {
						return
					}
				}
			}()
			go func() { _, _ = io.Copy(b, a); b.Close() }()
		}
	}()
	return c, path
}

// cut closes every connection and unmutes, under the lock new connections
// register with before they forward anything: the next connection's
// answers all arrive.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.conns {
		x.Close()
	}
	c.conns = nil
	c.mute.Store(false)
}

// TestResendsInSendOrder: frames unanswered when a connection breaks are
// sent again in the order they were first sent, so that a key's records
// keep their order across a reconnect (at least once may repeat them, not
// reorder them). Before, they were resent in a map's order: with 100+
// frames in flight, nearly always reordered.
func TestResendsInSendOrder(t *testing.T) {
	h := &holdThenPass{}
	_, sock := agent(t, h, nil)
	cut, via := newCutter(t, sock)
	c := newClient(t, client.Options{Addrs: []string{"unix:" + via}, BatchRecords: 1, MaxInFlight: 100, RetryBackoff: 5 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond})
	cl, rs := produceUntilHeld(t, c, h, 300, 100)
	// Their first copies fail in the agent, answers the client never sees
	// (as when the agent restarts): a copy still in flight there would make
	// it answer the resent one in_flight. Then the connection breaks.
	cut.mute.Store(true)
	h.pass.Store(true)
	h.held.Release(consumer.ErrFull)
	time.Sleep(100 * time.Millisecond)
	cut.cut()
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cl.check(t, len(rs))
	got := h.sink.Records()
	if len(got) != len(rs) {
		t.Fatalf("%d records delivered after the cut, want %d (none was answered before it)", len(got), len(rs))
	}
	for i, r := range got {
		if want := fmt.Sprintf("v%d", i); string(r.Value) != want {
			var vs []string
			for _, r := range got {
				vs = append(vs, string(r.Value))
			}
			t.Fatalf("record %d is %s, want %s: resent out of send order: %v", i, r.Value, want, vs)
		}
	}
}

// TestTimedOutResentInSendOrder: frames the agent answers ack_timeout are
// answered in the order they arrived, so the client resends them in send
// order (records produced later may pass them: a refusal's retry is not
// ordered with what is sent meanwhile, the package's documented
// exception). Before, the agent answered its late frames in a map's order.
func TestTimedOutResentInSendOrder(t *testing.T) {
	h := &holdThenPass{}
	_, sock := agent(t, h, func(c *localreceiver.Config) { c.AckTimeout = 300 * time.Millisecond })
	c := newClient(t, client.Options{Addrs: []string{"unix:" + sock}, BatchRecords: 1, MaxInFlight: 100, RetryBackoff: 5 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond})
	cl, rs := produceUntilHeld(t, c, h, 150, 100)
	h.pass.Store(true) // what comes now (the resent copies, the rest) is delivered
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cl.check(t, len(rs))
	var firstHundred []int
	for _, r := range h.sink.Records() {
		if n, _ := strconv.Atoi(strings.TrimPrefix(string(r.Value), "v")); n < 100 {
			firstHundred = append(firstHundred, n)
		}
	}
	if len(firstHundred) != 100 {
		t.Fatalf("%d of the 100 timed-out records delivered", len(firstHundred))
	}
	for i, n := range firstHundred {
		if n != i {
			t.Fatalf("timed-out records resent out of send order: %v", firstHundred)
		}
	}
}

// silent stands for a Kafka that never answers: every frame stays in
// flight until Close fails it.
type silent struct{}

func (silent) Consume(context.Context, *record.Batch) error { return nil }

// TestCloseDuringACopyCallsBackAfterIt: the sender copies a batch's
// records into a frame without the client's lock (so Produce does not
// wait behind it). Close, racing that copy, fails the records; their
// callbacks, after which the application may reuse a record, must wait
// until the copy is done, and still run exactly once. The callbacks here
// overwrite the values, so under -race a callback run during the copy is
// reported (and the bytes a frame carried would be torn).
func TestCloseDuringACopyCallsBackAfterIt(t *testing.T) {
	_, sock := agent(t, silent{}, func(c *localreceiver.Config) {
		c.MaxRecords = 100_000
		c.MaxFrameBytes = 8 << 20
		c.MaxInflightBytes = 64 << 20
	})
	for round := 0; round < 20; round++ {
		c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, BatchBytes: 4 << 20, BatchRecords: 100_000, Linger: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var called atomic.Int64
		var twice atomic.Bool
		cb := func(r *client.Record, err error) {
			if !errors.Is(err, client.ErrClosed) {
				t.Errorf("record failed with %v, want ErrClosed", err)
			}
			if r.Value[0] == 'X' {
				twice.Store(true)
			}
			for i := range r.Value {
				r.Value[i] = 'X'
			}
			called.Add(1)
		}
		const n = 2000
		for i := 0; i < n; i++ {
			c.Produce(context.Background(), &client.Record{Topic: "t", Value: bytes.Repeat([]byte{'v'}, 1024)}, cb)
		}
		// Flush seals the batch and wakes the sender; Close follows at
		// once, while the 2 MB are being copied (or just before or after).
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Duration(round%5) * 50 * time.Microsecond); cancel() }()
		_ = c.Flush(ctx)
		_ = c.Close(ctx)
		cancel()
		if got := called.Load(); got != n || twice.Load() {
			t.Fatalf("round %d: %d callbacks for %d records (a record called back twice: %v)", round, got, n, twice.Load())
		}
	}
}

// TestCloseEndsAWriteTheAgentDoesNotRead: an agent that says hello and then
// reads nothing fills the socket; the sender blocks in its write. Close
// must still return (closing the connection ends the write), and every
// record is called back with ErrClosed.
func TestCloseEndsAWriteTheAgentDoesNotRead(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if err := sayHello(c, protocol.HelloOK{MaxFrameBytes: 8 << 20, MaxRecords: 100_000, MaxInflightBytes: 64 << 20, Server: "deaf"}); err != nil {
			return
		}
		accepted <- c // and never read again
	}()
	c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, BatchBytes: 1 << 20, MaxBufferedBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var called atomic.Int64
	value := bytes.Repeat([]byte("v"), 64<<10)
	const n = 400 // 25 MiB: far more than any socket holds
	for range n {
		c.Produce(context.Background(), &client.Record{Topic: "t", Value: value}, func(_ *client.Record, err error) {
			if !errors.Is(err, client.ErrClosed) {
				t.Errorf("record failed with %v, want ErrClosed", err)
			}
			called.Add(1)
		})
	}
	var agent net.Conn
	select {
	case agent = <-accepted:
		defer agent.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not connect")
	}
	time.Sleep(200 * time.Millisecond) // the sender fills the socket and blocks
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	closed := make(chan struct{})
	go func() { _ = c.Close(ctx); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs behind a write the agent does not read")
	}
	if got := called.Load(); got != n {
		t.Fatalf("%d callbacks for %d records", got, n)
	}
}
