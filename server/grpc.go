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
	srv      *grpc.Server
	ln       net.Listener
}

// NewGRPC serves srv on listen with at most maxConns connections open (0:
// unbounded), over TLS when tlsc is on; name labels its log lines and
// connection metrics. Nothing is bound until Start.
func NewGRPC(name, listen string, maxConns int, tlsc TLSConfig, srv *grpc.Server, log *slog.Logger, reg prometheus.Registerer) *GRPC {
	return &GRPC{name: name, listen: listen, maxConns: maxConns, tls: tlsc, log: log, reg: reg, srv: srv}
}

// Start binds the listener and serves in the background.
func (g *GRPC) Start(context.Context) error {
	ln, err := net.Listen("tcp", g.listen)
	if err != nil {
		return fmt.Errorf("%s: %w", g.name, err)
	}
	// HTTP/2 has no answer before its preface: a refused connection is
	// closed, and gRPC clients back off and reconnect.
	g.ln = limit(ln, g.maxConns, g.name, g.reg, nil)
	if g.tls.On() {
		// TLS ends at the listener and gRPC speaks HTTP/2 on what it
		// accepts; "h2" is negotiated, as gRPC clients require.
		conf, err := serverTLS(g.tls, []string{"h2"}, g.name, g.log)
		if err != nil {
			ln.Close()
			return err
		}
		g.ln = tls.NewListener(g.ln, conf)
	}
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
