package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// GRPC is one gRPC listener.
type GRPC struct {
	name     string
	listen   string
	maxConns int
	tls      TLSConfig
	log      *slog.Logger
	reg      prometheus.Registerer
	build    func() *grpc.Server
	srv      *grpc.Server // built at Start
	ln       net.Listener
}

// NewGRPC serves the server build returns on listen with at most maxConns
// connections open (0: unbounded), over TLS when tlsc is on; name labels
// its log lines and connection metrics. Nothing is bound or built until
// Start: gRPC starts goroutines (its stream workers) as soon as a server is
// built, and an agent that fails to start must leave none behind.
func NewGRPC(name, listen string, maxConns int, tlsc TLSConfig, build func() *grpc.Server, log *slog.Logger, reg prometheus.Registerer) *GRPC {
	return &GRPC{name: name, listen: listen, maxConns: maxConns, tls: tlsc, log: log, reg: reg, build: build}
}

// Start binds the listener and serves in the background.
func (g *GRPC) Start(context.Context) error {
	ln, err := net.Listen("tcp", g.listen)
	if err != nil {
		return fmt.Errorf("%s: %w", g.name, err)
	}
	// HTTP/2 has no answer before its preface: a refused connection is
	// closed, and gRPC clients back off and reconnect.
	var l net.Listener = limit(ln, g.maxConns, g.name, g.reg, nil)
	if g.tls.On() {
		// TLS ends at the listener and gRPC speaks HTTP/2 on what it
		// accepts; "h2" is negotiated, as gRPC clients require.
		conf, err := serverTLS(g.tls, []string{"h2"}, g.name, g.log)
		if err != nil {
			ln.Close()
			return err
		}
		l = tls.NewListener(l, conf)
	}
	g.srv, g.ln = g.build(), l
	go func() {
		if err := g.srv.Serve(g.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			g.log.Error("server stopped", "server", g.name, "err", err)
		}
	}()
	return nil
}

// Addr is the bound address; empty before Start.
func (g *GRPC) Addr() string {
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// Shutdown stops accepting and lets RPCs in progress finish within ctx;
// then the rest are cut off. A server never started returns at once.
func (g *GRPC) Shutdown(ctx context.Context) error {
	if g.ln == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { g.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		g.srv.Stop()
		<-done
		return ctx.Err()
	}
}
