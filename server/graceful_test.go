package server

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testHTTP(t *testing.T, maxConns int, h http.Handler) (*HTTP, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := NewHTTP("test", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		MaxHeaderBytes: 64 << 10, MaxConnections: maxConns}, h, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, reg
}

// TestIdleNewConnectionDoesNotHoldShutdown: a connection that never sent a
// request would make net/http wait 5 s; a request in progress is waited for.
func TestIdleNewConnectionDoesNotHoldShutdown(t *testing.T) {
	release := make(chan struct{})
	s, _ := testHTTP(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(200)
	}))
	idle, err := net.Dial("tcp", s.Addr()) // never sends a request
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	answered := make(chan int, 1)
	go func() {
		res, err := http.Get("http://" + s.Addr())
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	for s.Active() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { time.Sleep(200 * time.Millisecond); close(release) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	// The bound is generous (a loaded test machine is slow) yet below the
	// 5 s net/http would wait for the idle connection.
	if d := time.Since(start); d < 150*time.Millisecond || d > 3*time.Second {
		t.Fatalf("shutdown took %s: it must wait for the request (200 ms) and not for the idle connection (5 s)", d)
	}
	if code := <-answered; code != 200 {
		t.Fatalf("the request in progress was not answered: %d", code)
	}
}

// TestConnectionLimit: past max_connections a new connection is answered
// 503 too_many_connections and closed, counted; once one closes, a new one
// is served.
func TestConnectionLimit(t *testing.T) {
	s, reg := testHTTP(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	defer s.Shutdown(context.Background())
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// Make sure both are accepted before the third arrives.
	for _, c := range held {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || res.StatusCode != 204 {
			t.Fatalf("held connection: %v %v", res, err)
		}
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the connection over the limit got no answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 503 || !strings.Contains(string(body), "too_many_connections") {
		t.Fatalf("over the limit: %d %s", res.StatusCode, body)
	}
	if n := testutil.ToFloat64(shared(reg, refusedVec()).WithLabelValues("test")); n != 1 {
		t.Fatalf("refused counter %v, want 1", n)
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := http.Get("http://" + s.Addr())
		if err == nil {
			// Every answer's body is closed, the 503s too: an unread one
			// holds its client connection's goroutines past the tests.
			res.Body.Close()
			if res.StatusCode == 204 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("a slot freed by a closed connection was not reused: %v %v", res, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTakenPortFailsStart: a port in use is an error at Start, naming the
// server, not a log line later.
func TestTakenPortFailsStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := NewHTTP("receivers.test", HTTPConfig{Listen: ln.Addr().String(), ReadTimeout: time.Second, IdleTimeout: time.Second,
		MaxHeaderBytes: 4096}, http.NotFoundHandler(), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	err = s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "receivers.test") {
		t.Fatalf("Start on a taken port: %v", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown of a server that never started: %v", err)
	}
}
