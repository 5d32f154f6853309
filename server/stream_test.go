package server

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ferryhq/ferry/proofs/harness/testcerts"
)

// echo answers every byte it reads until the connection or the server ends.
func echo(ctx context.Context, c net.Conn) {
	b := make([]byte, 1)
	for ctx.Err() == nil {
		if _, err := c.Read(b); err != nil {
			return
		}
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
		t.Fatalf("echo: %q %v", b, err)
	}
}

// closedByPeer waits for c to be closed by the server.
func closedByPeer(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		return errors.New("read a byte")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return nil
}

// TestStreamMaxConnections: the stream listener serves max_connections at
// once; the next is closed and counted; a slot freed is reused.
func TestStreamMaxConnections(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewStream("local_tcp", StreamConfig{Network: "tcp", Addr: "127.0.0.1:0", MaxConnections: 2}, echo, quiet, reg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c)
		held = append(held, c)
	}
	over, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if err := closedByPeer(over); err != nil {
		t.Fatalf("the connection over max_connections: %v", err)
	}
	waitCounter(t, shared(reg, refusedVec()).WithLabelValues("local_tcp"), 1)
	held[0].Close()
	end := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte{'y'})
		_, err = io.ReadFull(c, make([]byte, 1))
		c.Close()
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the slot of a closed connection was never reused")
		}
	}
}

// TestStreamShutdown: Shutdown ends every connection's context and wakes a
// handler blocked reading; a handler that returns in time is waited for,
// one that does not is cut off (its connection closed) when ctx ends, and
// Shutdown then reports the context's error.
func TestStreamShutdown(t *testing.T) {
	t.Run("handlers return", func(t *testing.T) {
		s := NewStream("s", StreamConfig{Network: "tcp", Addr: "127.0.0.1:0"}, echo, quiet, prometheus.NewRegistry())
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c) // the handler is now blocked reading
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown with a handler blocked reading: %v", err)
		}
		if err := closedByPeer(c); err != nil {
			t.Fatalf("the connection after Shutdown: %v", err)
		}
		if _, err := net.Dial("tcp", s.Addr()); err == nil {
			t.Fatal("still accepting after Shutdown")
		}
	})
	t.Run("a handler past ctx", func(t *testing.T) {
		release := make(chan struct{})
		returned := make(chan struct{})
		started := make(chan struct{})
		s := NewStream("s", StreamConfig{Network: "tcp", Addr: "127.0.0.1:0"}, func(ctx context.Context, c net.Conn) {
			defer close(returned)
			close(started)
			<-ctx.Done()
			// Answering what is in flight, slowly: blocked until the
			// connection is closed under it (or the test ends).
			_, _ = c.Read(make([]byte, 1)) // woken by the past deadline
			_ = c.SetReadDeadline(time.Time{})
			if _, err := c.Read(make([]byte, 1)); err == nil {
				<-release
			}
		}, quiet, prometheus.NewRegistry())
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer close(release)
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		stopped := make(chan error, 1)
		go func() { stopped <- s.Shutdown(ctx) }()
		select {
		case err := <-stopped:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Shutdown past its context: %v", err)
			}
		case <-time.After(5 * time.Second): // a watchdog, so a Shutdown that never cuts fails instead of hanging
			c.Close()
			<-stopped
			t.Fatal("Shutdown did not cut the connection when its context ended")
		}
		select {
		case <-returned:
		default:
			t.Fatal("Shutdown returned before the handler it cut off")
		}
		if err := closedByPeer(c); err != nil {
			t.Fatalf("the cut connection: %v", err)
		}
	})
}

// TestStreamHandlerPanic: a handler's panic costs its connection only.
func TestStreamHandlerPanic(t *testing.T) {
	s := NewStream("s", StreamConfig{Network: "tcp", Addr: "127.0.0.1:0"}, func(ctx context.Context, c net.Conn) {
		b := make([]byte, 1)
		if _, err := c.Read(b); err == nil && b[0] == '!' {
			panic("boom")
		}
		echo(ctx, c)
	}, quiet, prometheus.NewRegistry())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	bad, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Write([]byte{'!'}); err != nil {
		t.Fatal(err)
	}
	if err := closedByPeer(bad); err != nil {
		t.Fatalf("the panicking connection: %v", err)
	}
	good, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	_, _ = good.Write([]byte{'a'}) // the first byte is consumed by the check
	roundTrip(t, good)
}

// TestStreamUnixSocket: the socket's directory is made and its mode set; a
// live socket is refused with a clear error, a stale one replaced; Shutdown
// removes the file.
func TestStreamUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "ferry") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "sub", "s.sock")
	s := NewStream("local_socket", StreamConfig{Network: "unix", Addr: path, SocketMode: 0o600}, echo, quiet, prometheus.NewRegistry())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v %v", fi, err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c)
	c.Close()

	other := NewStream("local_socket", StreamConfig{Network: "unix", Addr: path}, echo, quiet, prometheus.NewRegistry())
	if err := other.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the socket file outlived Shutdown: %v", err)
	}

	// A stale file (nobody listening) is replaced.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	again := NewStream("local_socket", StreamConfig{Network: "unix", Addr: path}, echo, quiet, prometheus.NewRegistry())
	if err := again.Start(context.Background()); err != nil {
		t.Fatalf("over a stale socket file: %v", err)
	}
	defer again.Shutdown(context.Background())
	c, err = net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c)
}

// TestStreamTLSAndTakenPort: a TCP stream listener serves TLS when
// configured; a taken port fails Start naming the listener.
func TestStreamTLSAndTakenPort(t *testing.T) {
	certs := testcerts.New(t)
	s := NewStream("kafka", StreamConfig{Network: "tcp", Addr: "127.0.0.1:0",
		TLS: TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey}}, echo, quiet, prometheus.NewRegistry())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := tls.Dial("tcp", s.Addr(), certs.Client(false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c)

	taken := NewStream("kafka", StreamConfig{Network: "tcp", Addr: s.Addr()}, echo, quiet, prometheus.NewRegistry())
	if err := taken.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "kafka") {
		t.Fatalf("Start on a taken port: %v", err)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]os.FileMode{"0660": 0o660, "600": 0o600, "0777": 0o777} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("%q: %o %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0999", "rw", "01000", "-1"} {
		if _, err := ParseMode(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestGRPCListener: the gRPC listener binds at Start (a taken port fails
// it, naming the server), serves over TLS with h2 negotiated, and stops.
func TestGRPCListener(t *testing.T) {
	certs := testcerts.New(t)
	g := NewGRPC("otlp_grpc", "127.0.0.1:0", 0, TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey},
		func() *grpc.Server { return grpc.NewServer() }, quiet, prometheus.NewRegistry())
	if g.Addr() != "" {
		t.Fatal("an address before Start")
	}
	if err := g.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown before Start: %v", err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conf := certs.Client(false)
	conf.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", g.Addr(), conf)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN %q, want h2", p)
	}
	c.Close()

	taken := NewGRPC("otlp_grpc", g.Addr(), 0, TLSConfig{}, func() *grpc.Server { return grpc.NewServer() }, quiet, prometheus.NewRegistry())
	if err := taken.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "otlp_grpc") {
		t.Fatalf("Start on a taken port: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
