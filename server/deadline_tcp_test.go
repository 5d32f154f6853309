package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// tcpPair is a connected pair of real TCP sockets on 127.0.0.1.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// TestBodyDeadlinesOverTCP: ReadBody and DiscardBody take a body sent at
// once, and cut a sender that stops half way at the deadline, not before
// and not much after; the deadline is from the call, whatever came before.
func TestBodyDeadlinesOverTCP(t *testing.T) {
	const timeout = 200 * time.Millisecond
	read := map[string]func(c net.Conn, n int) error{
		"ReadBody": func(c net.Conn, n int) error {
			b := make([]byte, n)
			err := ReadBody(c, b, timeout)
			if err == nil {
				for i := range b {
					if b[i] != byte(i) {
						return fmt.Errorf("byte %d is %d", i, b[i])
					}
				}
			}
			return err
		},
		"DiscardBody": func(c net.Conn, n int) error { return DiscardBody(c, int64(n), timeout) },
	}
	for name, fn := range read {
		t.Run(name, func(t *testing.T) {
			srv, cli := tcpPair(t)
			body := make([]byte, 64<<10)
			for i := range body {
				body[i] = byte(i)
			}
			go func() { _, _ = cli.Write(body) }()
			if err := fn(srv, len(body)); err != nil {
				t.Fatalf("a body sent at once: %v", err)
			}
			// Half a body, then nothing.
			if _, err := cli.Write(body[:100]); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res := make(chan error, 1)
			go func() { res <- fn(srv, 200) }()
			var err error
			select {
			case err = <-res:
			case <-time.After(5 * time.Second): // a watchdog, so a missing deadline fails instead of hanging
				srv.Close()
				<-res
				t.Fatal("a stalled body was never cut off")
			}
			d := time.Since(start)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a stalled body: %v, want the deadline", err)
			}
			if d < timeout-20*time.Millisecond || d > 3*time.Second {
				t.Fatalf("a stalled body was cut after %s, deadline %s", d, timeout)
			}
			// A body that trickles within the deadline is read whole.
			done := make(chan error, 1)
			go func() { done <- fn(srv, 100) }()
			for i := 0; i < 100; i += 25 {
				if _, err := cli.Write(body[i : i+25]); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // pacing the sender, not synchronising
			}
			if err := <-done; err != nil {
				t.Fatalf("a body within its deadline: %v", err)
			}
		})
	}
	t.Run("closed mid-body", func(t *testing.T) {
		srv, cli := tcpPair(t)
		_, _ = cli.Write([]byte{1, 2})
		cli.Close()
		if err := ReadBody(srv, make([]byte, 8), time.Minute); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("ReadBody: %v", err)
		}
	})
}

// TestReadHeaderOverTCP: a header that arrives whole is read; one
// trickled a byte per wait is cut after at most two waits; a client that
// closes is EOF, not idle.
func TestReadHeaderOverTCP(t *testing.T) {
	const idle = 100 * time.Millisecond
	never := func() bool { return false }
	srv, cli := tcpPair(t)
	var hdr [8]byte
	go func() { _, _ = cli.Write([]byte("ABCDEFGH")) }()
	if err := ReadHeader(context.Background(), srv, hdr[:], idle, never); err != nil || string(hdr[:]) != "ABCDEFGH" {
		t.Fatalf("%q %v", hdr, err)
	}
	// A byte, then silence: the rest must come within one more wait.
	if _, err := cli.Write([]byte{'a'}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := ReadHeader(context.Background(), srv, hdr[:], idle, func() bool { return true }); !errors.Is(err, ErrIdle) {
		t.Fatalf("a stalled header: %v", err)
	}
	if d := time.Since(start); d < idle || d > 3*time.Second {
		t.Fatalf("a stalled header cut after %s (idle %s)", d, idle)
	}
	cli.Close()
	if err := ReadHeader(context.Background(), srv, hdr[:], idle, never); !errors.Is(err, io.EOF) {
		t.Fatalf("a closed client: %v, want EOF", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ReadHeader(ctx, srv, hdr[:], idle, never); !errors.Is(err, context.Canceled) {
		t.Fatalf("an ended context: %v", err)
	}
}

// TestWriterOrderUnderConcurrency: answers queued from several goroutines
// reach the socket whole and, per goroutine, in the order queued; Close
// flushes everything queued before it.
func TestWriterOrderUnderConcurrency(t *testing.T) {
	srv, cli := tcpPair(t)
	w := NewWriter(srv, nil, nil, nil)
	const producers, each = 4, 500
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if i%2 == 0 {
					w.Append([]byte{byte(p), byte(i >> 8), byte(i)})
				} else {
					w.Queue(func(q []byte) []byte { return append(q, byte(p), byte(i>>8), byte(i)) })
				}
			}
		}()
	}
	got := make(chan error, 1)
	go func() {
		next := make([]int, producers)
		var rec [3]byte
		_ = cli.SetReadDeadline(time.Now().Add(10 * time.Second))
		for n := 0; n < producers*each; n++ {
			if _, err := io.ReadFull(cli, rec[:]); err != nil {
				got <- err
				return
			}
			p, i := int(rec[0]), int(rec[1])<<8|int(rec[2])
			if p >= producers || i != next[p] {
				got <- fmt.Errorf("answer %d: producer %d's #%d, want #%d", n, p, i, next[p])
				return
			}
			next[p]++
		}
		got <- nil
	}()
	wg.Wait()
	w.Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if !w.Closed() || w.Queued() != 0 {
		t.Fatalf("after Close: closed %v, %d queued", w.Closed(), w.Queued())
	}
}

// TestWriterPeerGone: a write that fails (the peer reset) closes the
// writer, wakes a reader blocked on the connection, and drops later
// answers; drained runs so a waiting reader sees the queue shrink.
func TestWriterPeerGone(t *testing.T) {
	srv, cli := tcpPair(t)
	var mu sync.Mutex
	drains := 0
	w := NewWriter(srv, nil, func() { mu.Lock(); drains++; mu.Unlock() }, nil)
	readErr := make(chan error, 1)
	go func() { _, err := srv.Read(make([]byte, 1)); readErr <- err }()
	_ = cli.(*net.TCPConn).SetLinger(0)
	cli.Close() // reset
	end := time.Now().Add(5 * time.Second)
	for !w.Closed() {
		if time.Now().After(end) {
			t.Fatal("writing to a reset peer never closed the writer")
		}
		w.Append(make([]byte, 4096))
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-readErr; err == nil {
		t.Fatal("the reader was not woken")
	}
	w.Append([]byte("late"))
	if w.Queued() != 0 {
		t.Fatalf("%d bytes queued after the writer closed", w.Queued())
	}
	mu.Lock()
	if drains == 0 {
		t.Error("drained never ran")
	}
	mu.Unlock()
	w.Close()
}
