package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StreamConfig is a listener for a stream protocol (the local record
// protocol): a Unix socket or a TCP address.
type StreamConfig struct {
	// Network is "unix" or "tcp".
	Network string
	// Addr is the socket's path or host:port.
	Addr string
	// SocketMode is the Unix socket file's permission bits (e.g. 0660).
	SocketMode os.FileMode
	// MaxConnections bounds the connections open at once (0: unbounded);
	// beyond it a new connection is closed at once.
	MaxConnections int
	// TLS, for a TCP listener.
	TLS TLSConfig
}

// Stream serves a stream protocol: Handle runs once per connection, in its
// own goroutine, with a context that ends when the server stops.
type Stream struct {
	name   string
	cfg    StreamConfig
	log    *slog.Logger
	reg    prometheus.Registerer
	handle func(ctx context.Context, c net.Conn)

	ln     net.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// NewStream builds a stream server; name labels its logs and metrics.
func NewStream(name string, cfg StreamConfig, handle func(ctx context.Context, c net.Conn), log *slog.Logger, reg prometheus.Registerer) *Stream {
	return &Stream{name: name, cfg: cfg, log: log, reg: reg, handle: handle, conns: map[net.Conn]struct{}{}}
}

// Start binds. A Unix socket's directory is created; a stale socket file
// (left by a crash, nobody listening) is replaced, a live one is an error.
func (s *Stream) Start(context.Context) error {
	if s.cfg.Network == "unix" {
		if err := os.MkdirAll(filepath.Dir(s.cfg.Addr), 0o750); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if _, err := os.Stat(s.cfg.Addr); err == nil {
			if c, err := net.DialTimeout("unix", s.cfg.Addr, time.Second); err == nil {
				c.Close()
				return fmt.Errorf("%s: %s is in use by another process", s.name, s.cfg.Addr)
			}
			_ = os.Remove(s.cfg.Addr)
		}
	}
	ln, err := net.Listen(s.cfg.Network, s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if s.cfg.Network == "unix" && s.cfg.SocketMode != 0 {
		if err := os.Chmod(s.cfg.Addr, s.cfg.SocketMode); err != nil {
			ln.Close()
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	s.ln = limit(ln, s.cfg.MaxConnections, s.name, s.reg, nil)
	if s.cfg.TLS.On() {
		conf, err := serverTLS(s.cfg.TLS, nil, s.name, s.log)
		if err != nil {
			ln.Close()
			return err
		}
		s.ln = tls.NewListener(s.ln, conf)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.accept()
	return nil
}

func (s *Stream) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("server stopped accepting", "server", s.name, "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			// A bug reached by one client's bytes must cost that client
			// its connection, not every client of the host the agent.
			defer func() {
				if v := recover(); v != nil {
					s.log.Error("connection handler panicked; connection closed", "server", s.name,
						"remote", c.RemoteAddr().String(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				}
			}()
			s.handle(s.ctx, c)
		}()
	}
}

// Addr is the bound address; empty before Start.
func (s *Stream) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Shutdown stops accepting and ends every connection's context: handlers
// stop reading, answer what they have in flight and return, within ctx;
// then the remaining connections are closed.
func (s *Stream) Shutdown(ctx context.Context) error {
	if s.ln == nil {
		return nil
	}
	s.ln.Close()
	s.mu.Lock()
	s.cancel()
	for c := range s.conns {
		// Wake a handler blocked reading: it sees its context ended.
		_ = c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-done
		err = ctx.Err()
	}
	if s.cfg.Network == "unix" {
		_ = os.Remove(s.cfg.Addr)
	}
	return err
}

// ParseMode reads a socket mode written as octal ("0660").
func ParseMode(s string) (os.FileMode, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return 0, fmt.Errorf("%q is not an octal file mode", s)
	}
	return os.FileMode(v), nil
}
