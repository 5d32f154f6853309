// Package server owns ferry's listeners: the HTTP servers (messages, OTLP/HTTP,
// admin) and the gRPC server (OTLP/gRPC), with what every one of them must
// have and none should write again — the bind at Start (a taken port fails
// start-up, never later), the bound on open connections, the timeouts a
// slow or idle client is held to, and a graceful stop.
//
// Graceful stop: requests in progress finish (they may be waiting for
// Kafka's acknowledgement), while connections that never sent a request do
// not hold the stop. net/http's Server.Shutdown treats a connection that
// has not sent its first request as busy for 5 seconds; Go's own HTTP
// client leaves such connections behind routinely (it dials a spare while
// waiting for an idle one), so a stop with a short shutdown_timeout failed
// for no reason. Here, once no handler is running, the remaining
// connections are closed: a client on one of them gets no answer, so
// nothing it sent was acknowledged.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/bytesize"
)

// HTTPConfig is what every HTTP listener is configured with (inline in
// receivers.http, receivers.otlp.http and telemetry.admin).
type HTTPConfig struct {
	Listen string `yaml:"listen"`
	// ReadTimeout bounds reading a request, headers and body: a client
	// that trickles its bytes is cut off instead of holding a connection
	// and its buffer.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes a kept-alive connection with no request.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's header block.
	MaxHeaderBytes bytesize.Size `yaml:"max_header_bytes"`
	// MaxConnections bounds the connections open at once; beyond it a new
	// connection gets 503 and is closed (0: unbounded).
	MaxConnections int `yaml:"max_connections"`
	// TLS serves HTTPS (HTTP/1.1) when tls.cert_file is set.
	TLS TLSConfig `yaml:"tls"`
}

// Validate names the first invalid field.
func (c *HTTPConfig) Validate() error {
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.Listen == "" {
		return errors.New("listen: required")
	}
	if c.ReadTimeout <= 0 || c.IdleTimeout <= 0 {
		return errors.New("read_timeout and idle_timeout must be positive")
	}
	if c.MaxHeaderBytes < 1024 {
		return fmt.Errorf("max_header_bytes: %s is below 1KiB", c.MaxHeaderBytes)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("max_connections: %d is negative", c.MaxConnections)
	}
	return nil
}

// httpWriteTimeout: a client that reads none of an answer for this long
// is disconnected (a variable for the tests). It runs from each write of
// an answer: a handler may wait for Kafka much longer before it writes.
var httpWriteTimeout = 30 * time.Second

// answerWriter gives every write of an answer a deadline of
// httpWriteTimeout: http.Server's WriteTimeout would run from the
// request's start, and without one a client that pipelines requests and
// reads nothing keeps its connection (one of max_connections) for good.
// Each write moves it on, so an answer written as it goes (a pprof trace)
// lasts as long as its client reads.
type answerWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (a *answerWriter) start() {
	if a.rc == nil {
		a.rc = http.NewResponseController(a.ResponseWriter)
	}
	_ = a.rc.SetWriteDeadline(time.Now().Add(httpWriteTimeout))
}

func (a *answerWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx answers are not the answer
		a.start()
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerWriter) Write(b []byte) (int, error) {
	a.start()
	return a.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (a *answerWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// HTTP is one HTTP listener.
type HTTP struct {
	name   string
	cfg    HTTPConfig
	log    *slog.Logger
	reg    prometheus.Registerer
	srv    *http.Server
	ln     net.Listener
	active atomic.Int64 // handlers running
}

// NewHTTP builds a server for h; name labels its log lines and connection
// metrics. Nothing is bound until Start.
func NewHTTP(name string, cfg HTTPConfig, h http.Handler, log *slog.Logger, reg prometheus.Registerer) *HTTP {
	s := &HTTP{name: name, cfg: cfg, log: log, reg: reg}
	s.srv = &http.Server{
		Addr: cfg.Listen,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.active.Add(1)
			defer s.active.Add(-1)
			// A kept-alive connection keeps the last answer's deadline,
			// which this request's 100 Continue would hit: cleared.
			aw := &answerWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
			_ = aw.rc.SetWriteDeadline(time.Time{})
			h.ServeHTTP(aw, r)
		}),
		ReadHeaderTimeout: cfg.ReadTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    int(cfg.MaxHeaderBytes),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return s
}

// Start binds the listener and serves in the background.
func (s *HTTP) Start(context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if s.cfg.TLS.On() {
		conf, err := serverTLS(s.cfg.TLS, []string{"http/1.1"}, s.name, s.log)
		if err != nil {
			ln.Close()
			return err
		}
		// The refusal over the limit is plain HTTP, which a TLS client
		// cannot read: the connection is just closed.
		s.ln = tls.NewListener(limit(ln, s.cfg.MaxConnections, s.name, s.reg, nil), conf)
	} else {
		s.ln = limit(ln, s.cfg.MaxConnections, s.name, s.reg, httpRefusal)
	}
	go func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("server stopped", "server", s.name, "err", err)
		}
	}()
	return nil
}

// Addr is the bound address (useful with port 0); empty before Start.
func (s *HTTP) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Handler is what the server serves (with its request count), for tests
// that call it without a socket.
func (s *HTTP) Handler() http.Handler { return s.srv.Handler }

// Active is the number of requests in progress.
func (s *HTTP) Active() int64 { return s.active.Load() }

// Shutdown stops accepting; requests in progress finish within ctx, then
// every connection is closed. A server never started returns at once.
func (s *HTTP) Shutdown(ctx context.Context) error {
	if s.ln == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.srv.Shutdown(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				// ctx ended with requests still running: net/http
				// leaves their connections open; cut them, as promised.
				_ = s.srv.Close()
			}
			return err
		case <-tick.C:
			if s.Active() == 0 {
				_ = s.srv.Close()
				<-done
				return nil
			}
		}
	}
}
