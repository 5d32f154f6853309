// Package admin owns the agent's admin listener: /metrics, /healthz,
// /readyz, the profiler when asked, and the routes the agent adds (reload).
// It answers only requests addressed to its own address (a DNS-rebinding
// page in the user's browser must not reach it).
package admin

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// Config is the admin listener (YAML telemetry.admin).
type Config struct {
	// The listener: listen, read_timeout, idle_timeout, max_header_bytes,
	// max_connections.
	server.HTTPConfig `yaml:",inline"`
	// Pprof serves Go's profiler under /debug/pprof/ (loopback admin only).
	Pprof bool `yaml:"pprof"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error { return c.HTTPConfig.Validate() }

// Admin is the admin HTTP server: /metrics, /healthz, /readyz. More routes
// (reload) are added by the pipeline through Handle.
type Admin struct {
	mux *http.ServeMux
	srv *server.HTTP
}

// New builds the admin server for cfg.Listen.
func New(cfg Config, set telemetry.Settings) *Admin {
	a := &Admin{mux: http.NewServeMux()}
	// /readyz as a series, read at each scrape: an alert on it needs no
	// probe of its own, and a Prometheus that scrapes the agent sees what
	// the kubelet's readiness probe sees.
	telemetry.Shared(set.Registry, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_ready",
		Help: "1 while /readyz says ready (every receiver listening and not stopping, Kafka reachable, queue and spool below their ready fraction), else 0."},
		func() float64 {
			if ok, _ := set.Health.Ready(); ok {
				return 1
			}
			return 0
		}))
	if cfg.Pprof {
		a.mux.HandleFunc("/debug/pprof/", pprof.Index)
		a.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		a.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	a.mux.Handle("GET /metrics", promhttp.HandlerFor(set.Gatherer(), promhttp.HandlerOpts{ErrorLog: nil}))
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"alive"}` + "\n"))
	})
	a.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := set.Health.Ready()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": ok, "not_ready": why})
	})
	a.srv = server.NewHTTP("admin", cfg.HTTPConfig, hostGuard(cfg.Listen, a.mux), set.Logger, set.Registry)
	return a
}

// hostGuard refuses requests whose Host names something other than this
// listener: a web page that rebinds its own DNS name to 127.0.0.1 reaches
// the admin port from the user's browser, but still says its own name in
// Host. Programs say the address they dialled (127.0.0.1, localhost, ::1
// or the configured listen host).
func hostGuard(listen string, next http.Handler) http.Handler {
	lhost, _, _ := net.SplitHostPort(listen)
	// On every interface, any IP literal is one of ours: a DNS-rebinding
	// page can only send its own name as Host, never an IP.
	wildcard := lhost == "" || net.ParseIP(lhost) != nil && net.ParseIP(lhost).IsUnspecified()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		h = strings.Trim(h, "[]")
		ip := net.ParseIP(h)
		if h == "localhost" || ip != nil && (ip.IsLoopback() || wildcard || ip.Equal(net.ParseIP(lhost))) || h == lhost && lhost != "" {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMisdirectedRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": "the admin server answers only requests addressed to its own address (Host header)"})
	})
}

// Handle adds a route.
func (a *Admin) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// Start binds the listener (so a port conflict fails start-up) and serves in
// the background.
func (a *Admin) Start(ctx context.Context) error { return a.srv.Start(ctx) }

// Addr is the bound address (useful with port 0).
func (a *Admin) Addr() string { return a.srv.Addr() }

// Shutdown stops the server, waiting for requests until ctx ends.
func (a *Admin) Shutdown(ctx context.Context) error { return a.srv.Shutdown(ctx) }
