package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/proofs/harness/testcerts"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestShutdownCutsRequestsPastItsContext: a request still running when the
// stop's context ends does not keep its connection: Shutdown returns the
// context's error and the client is disconnected without an answer.
func TestShutdownCutsRequestsPastItsContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s, _ := testHTTP(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(200)
	}))
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); s.Active() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the request never reached the handler")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a request running past its context: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection of the cut request is still open after Shutdown returned: %d %v", n, err)
	}
}

// TestReadTimeoutCutsSlowHeader: a client that trickles its request header
// is disconnected at read_timeout; one that sends it at once is answered.
func TestReadTimeoutCutsSlowHeader(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewHTTP("test", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute,
		MaxHeaderBytes: 4096}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }), quiet, reg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())

	fast, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	if _, err := io.WriteString(fast, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if res, err := http.ReadResponse(bufio.NewReader(fast), nil); err != nil || res.StatusCode != 204 {
		t.Fatalf("a prompt request: %v %v", res, err)
	}

	slow, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := time.Now()
	if _, err := io.WriteString(slow, "GET / HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	// The rest never comes; the server must close the connection.
	_ = slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(slow)
	if err != nil {
		t.Fatalf("a trickled header was not cut off: %v", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("cut after %s, before the 200 ms read_timeout", d)
	}
}

// TestIdleTimeoutClosesKeptAliveConnection: a kept-alive connection with
// no new request is closed after idle_timeout.
func TestIdleTimeoutClosesKeptAliveConnection(t *testing.T) {
	s := NewHTTP("test", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: 200 * time.Millisecond,
		MaxHeaderBytes: 4096}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }), quiet, prometheus.NewRegistry())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 204 {
		t.Fatalf("%v %v", res, err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle kept-alive connection: %v, want EOF", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("closed after %s, before the 200 ms idle_timeout", d)
	}
}

// TestHTTPSListener: with tls set, the listener serves HTTP/1.1 over TLS
// with the configured certificate; with client_ca_file a client without a
// certificate is refused at the handshake and one with a certificate is
// served; a connection over max_connections is closed without a plain-text
// answer (a TLS client could not read it).
func TestHTTPSListener(t *testing.T) {
	certs := testcerts.New(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			w.WriteHeader(500)
			return
		}
		w.WriteHeader(204)
	})
	get := func(addr string, conf *tls.Config) (int, error) {
		tr := &http.Transport{TLSClientConfig: conf}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + addr)
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}

	reg := prometheus.NewRegistry()
	s := NewHTTP("tls", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 4096,
		MaxConnections: 1, TLS: TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.3"}}, h, quiet, reg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	if code, err := get(s.Addr(), certs.Client(false)); err != nil || code != 204 {
		t.Fatalf("HTTPS: %d %v", code, err)
	}
	plain, err := http.Get("http://" + s.Addr())
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode != 400 {
			t.Fatalf("plain HTTP to the TLS listener: %d", plain.StatusCode)
		}
	}
	tls12 := certs.Client(false)
	tls12.MaxVersion = tls.VersionTLS12
	if _, err := get(s.Addr(), tls12); err == nil {
		t.Fatal("a TLS 1.2 client was served though min_version is 1.3")
	}
	// max_connections 1: once the connections above are gone, hold one
	// handshaken connection; the next is closed.
	waitCounter(t, shared(reg, connectionsVec()).WithLabelValues("tls"), 0)
	refusedBefore := testutil.ToFloat64(shared(reg, refusedVec()).WithLabelValues("tls"))
	held, err := tls.Dial("tcp", s.Addr(), certs.Client(false))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	over, err := tls.Dial("tcp", s.Addr(), certs.Client(false))
	if err == nil {
		_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = over.Read(make([]byte, 1))
		over.Close()
	}
	if err == nil {
		t.Fatal("a TLS connection over max_connections was served")
	}
	waitCounter(t, shared(reg, refusedVec()).WithLabelValues("tls"), refusedBefore+1)
	held.Close()

	m := NewHTTP("mtls", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 4096,
		TLS: TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA}}, h, quiet, prometheus.NewRegistry())
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	if _, err := get(m.Addr(), certs.Client(false)); err == nil {
		t.Fatal("mTLS: a client without a certificate was served")
	}
	if code, err := get(m.Addr(), certs.Client(true)); err != nil || code != 204 {
		t.Fatalf("mTLS with a client certificate: %d %v", code, err)
	}
}

// TestTLSStartErrors: TLS files that cannot be read fail Start, naming the
// listener, and leave nothing bound.
func TestTLSStartErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []TLSConfig{
		{CertFile: dir + "/missing.pem", KeyFile: dir + "/missing-key.pem"},
		{CertFile: dir + "/c.pem"}, // no key
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		s := NewHTTP("receivers.tls", HTTPConfig{Listen: addr, ReadTimeout: time.Second, IdleTimeout: time.Second, MaxHeaderBytes: 4096, TLS: tc},
			http.NotFoundHandler(), quiet, prometheus.NewRegistry())
		err = s.Start(context.Background())
		if err == nil || !strings.Contains(err.Error(), "receivers.tls") {
			t.Fatalf("%+v: %v", tc, err)
		}
		if s.Addr() != "" {
			t.Fatalf("%+v: Addr %q after a failed Start", tc, s.Addr())
		}
		// The port was released.
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%+v: the port is still held after a failed Start: %v", tc, err)
		}
		ln.Close()
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHTTPConfigValidate(t *testing.T) {
	ok := HTTPConfig{Listen: ":0", ReadTimeout: time.Second, IdleTimeout: time.Second, MaxHeaderBytes: 1024}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*HTTPConfig){
		"listen":          func(c *HTTPConfig) { c.Listen = "" },
		"read_timeout":    func(c *HTTPConfig) { c.ReadTimeout = 0 },
		"idle_timeout":    func(c *HTTPConfig) { c.IdleTimeout = -1 },
		"max_header":      func(c *HTTPConfig) { c.MaxHeaderBytes = 1023 },
		"max_connections": func(c *HTTPConfig) { c.MaxConnections = -1 },
		"tls key only":    func(c *HTTPConfig) { c.TLS.KeyFile = "k" },
		"tls cert only":   func(c *HTTPConfig) { c.TLS.CertFile = "c" },
		"client ca alone": func(c *HTTPConfig) { c.TLS.ClientCAFile = "ca" },
		"tls version":     func(c *HTTPConfig) { c.TLS = TLSConfig{CertFile: "c", KeyFile: "k", MinVersion: "1.1"} },
	} {
		c := ok
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestTLSCheckFiles(t *testing.T) {
	certs := testcerts.New(t)
	off := TLSConfig{}
	if err := off.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	good := TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA}
	if err := good.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	bad := TLSConfig{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.ServerKey}
	if err := bad.CheckFiles(); err == nil {
		t.Fatal("a key file as client CA accepted")
	}
}

func waitCounter(t *testing.T, c prometheus.Collector, want float64) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(c) != want {
		if time.Now().After(end) {
			t.Fatalf("counter %v, want %v", testutil.ToFloat64(c), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAnswersNeverReadFreeTheSlot: a client that pipelines requests and
// reads none of the answers is disconnected once an answer's write has
// waited httpWriteTimeout, so it does not keep one of max_connections
// for good (the listener had no write timeout: a handler that waited for
// Kafka could not have one from the request's start).
func TestAnswersNeverReadFreeTheSlot(t *testing.T) {
	defer func(d time.Duration) { httpWriteTimeout = d }(httpWriteTimeout)
	httpWriteTimeout = 300 * time.Millisecond
	big := strings.Repeat("a", 256<<10)
	s := NewHTTP("test", HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		MaxHeaderBytes: 4096}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // as a handler waiting for Kafka: no deadline runs meanwhile
		_, _ = io.WriteString(w, big)
	}), quiet, prometheus.NewRegistry())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	go func() {
		_, _ = io.WriteString(c, strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200))
	}()
	time.Sleep(2 * time.Second) // reading nothing
	for end := time.Now().Add(5 * time.Second); s.Active() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a handler is still writing to a client that reads nothing")
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the connection is still open")
	}
}
