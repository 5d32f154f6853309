package httpreceiver

import (
	"bufio"
	"context"
	"fmt"
	"github.com/ferryhq/ferry/receiver"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/telemetry"
)

// slowBody opens a connection, sends headers declaring size bytes and all
// but the last byte of the body, and leaves it hanging.
func slowBody(t *testing.T, addr string, size int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/messages/t HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := c.Write(make([]byte, size-1)); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestBodiesReserveBeforeRead: clients that declare large bodies and hold
// the last byte cannot make ferry hold more than its memory budget: a body
// reserves its declared size before it is read, and one that does not fit
// is answered 429 at once.
func TestBodiesReserveBeforeRead(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 512 << 10
	budget := budget.New(1 << 20)
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Bodies: budget})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	var held []net.Conn
	for i := 0; i < 2; i++ {
		held = append(held, slowBody(t, r.Addr(), 400<<10))
	}
	deadline := time.Now().Add(5 * time.Second)
	for budget.Used() < 800<<10 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("reserved by two held bodies: %d", budget.Used())
	// The third does not fit: answered now, not after its body.
	c := slowBody(t, r.Addr(), 400<<10)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer while the body is incomplete: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 429 || !strings.Contains(string(body), "queue_full") || res.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %s, want 429 queue_full with Retry-After", res.StatusCode, body)
	}
	if u := budget.Used(); u > budget.Limit() {
		t.Fatalf("%d bytes reserved, over the %d budget", u, budget.Limit())
	}
	c.Close()
	for _, h := range held {
		h.Close()
	}
	deadline = time.Now().Add(5 * time.Second)
	for budget.Used() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still reserved after every client left", budget.Used())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxConnections: beyond max_connections a new connection is answered
// 503 too_many_connections and closed; once one closes, a new one is served.
func TestMaxConnections(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConnections = 4
	r, url := start(t, cfg, &consumertest.Sink{})
	addr := strings.TrimPrefix(url, "http://")
	var idle []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	waitConnections(t, r, 4) // the server has accepted them
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	out, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(out), "HTTP/1.1 503") || !strings.Contains(string(out), "too_many_connections") {
		t.Fatalf("fifth connection got %q", out)
	}
	idle[0].Close()
	waitConnections(t, r, 3) // the server has seen it close
	res := post(t, url+"/v1/messages/t", "text/plain", "", []byte("x"))
	if res.code != 200 {
		t.Fatalf("after a connection closed: %d %v", res.code, res.body)
	}
	for _, c := range idle[1:] {
		c.Close()
	}
}

// waitConnections waits until r's listener counts n connections open
// (ferry_receiver_connections).
func waitConnections(t *testing.T, r *Receiver, n float64) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		mfs, err := r.set.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ferry_receiver_connections" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "receiver" && l.GetValue() == "http" {
						got = m.GetGauge().GetValue()
					}
				}
			}
		}
		if got == n {
			return
		}
	}
	t.Fatalf("%v connections open, want %v", got, n)
}
