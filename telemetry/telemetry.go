// Package telemetry owns ferry's view of itself: structured logs, Prometheus
// metrics, health and readiness (package admin serves them). Every
// component receives a Settings and uses it; telemetry imports nothing of
// ferry, so it can never be the reason a component is hard to test.
package telemetry

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Config is the user configuration of logs and the summary line (YAML
// telemetry, whose admin section is package admin's).
type Config struct {
	Log LogConfig `yaml:"log"`
	// ReportInterval is how often an INFO line summarises records and bytes
	// forwarded (default 1m; 0 disables it).
	ReportInterval time.Duration `yaml:"report_interval"`
}

// LogConfig selects the log level and format.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if _, err := parseLevel(c.Log.Level); err != nil {
		return fmt.Errorf("log.level: %w", err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return fmt.Errorf("log.format: %q is not text or json", c.Log.Format)
	}
	if c.ReportInterval < 0 {
		return fmt.Errorf("report_interval: must not be negative")
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not one of debug, info, warn, error", s)
}

// Settings is what every component is built with.
type Settings struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Runtime holds the Go runtime's and the process's collectors, apart
	// from Registry: /metrics serves both (Gatherer), while the status
	// sampler, which gathers every second, reads only ferry's own series
	// and would otherwise spend most of a sample on these (and list
	// /proc/self/fd each time).
	Runtime *prometheus.Registry
	Health  *Health
	// Topics and Apps are the label values metrics may use for topic and
	// application (tenant) names, capped once for the whole agent: if
	// each component kept its own cap they could fold different names
	// into "_other", and received − sent − dropped per topic would no
	// longer add up.
	Topics *Labels
	Apps   *Labels
}

// maxLabelValues caps the distinct topic (and application) label values.
const maxLabelValues = 1000

// NewSettings builds the logger and an empty registry (with Go runtime and
// process collectors) from cfg. Logs go to w (stderr when nil).
func NewSettings(cfg Config, w io.Writer) Settings {
	if w == nil {
		w = os.Stderr
	}
	lvl, _ := parseLevel(cfg.Log.Level)
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	rt := prometheus.NewRegistry()
	rt.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return Settings{Logger: slog.New(h), Registry: prometheus.NewRegistry(), Runtime: rt, Health: NewHealth(),
		Topics: NewLabels(maxLabelValues), Apps: NewLabels(maxLabelValues)}
}

// Gatherer is every metric the agent serves on /metrics: its own
// (Registry) and the runtime's.
func (s Settings) Gatherer() prometheus.Gatherer {
	if s.Runtime == nil {
		return s.Registry
	}
	return prometheus.Gatherers{s.Registry, s.Runtime}
}

// TestSettings is NewSettings with logs discarded unless FERRY_TEST_LOG is set.
func TestSettings() Settings {
	var w io.Writer = io.Discard
	if os.Getenv("FERRY_TEST_LOG") != "" {
		w = os.Stderr
	}
	return NewSettings(Config{Log: LogConfig{Level: "debug", Format: "text"}}, w)
}

// Limited logs at most once per interval per key; it reports how many
// messages it suppressed in between, so bursts stay visible but bounded.
type Limited struct {
	log      *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
	dropped  map[string]int
}

// NewLimited returns a limiter over log.
func NewLimited(log *slog.Logger, interval time.Duration) *Limited {
	return &Limited{log: log, interval: interval, last: map[string]time.Time{}, dropped: map[string]int{}}
}

// Log logs msg at level unless key was logged less than interval ago.
func (l *Limited) Log(level slog.Level, key, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.interval {
		l.dropped[key]++
		l.mu.Unlock()
		return
	}
	if len(l.last) > 1000 { // keys come from a fixed set of reasons; this only guards a bug
		clear(l.last)
	}
	n := l.dropped[key]
	l.last[key] = now
	delete(l.dropped, key)
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Log(nil, level, msg, args...)
}

// Labels hands out label values from an open set (topics) with a cap, so a
// client sending to many topic names cannot grow the metrics without bound.
// Beyond the cap every new value maps to "_other".
type Labels struct {
	max int
	n   atomic.Int64
	m   sync.Map
}

// NewLabels caps distinct values at max.
func NewLabels(max int) *Labels { return &Labels{max: max} }

// Get returns v itself while under the cap, "_other" after.
func (l *Labels) Get(v string) string {
	if _, ok := l.m.Load(v); ok {
		return v
	}
	if l.n.Add(1) > int64(l.max) {
		l.n.Add(-1)
		return "_other"
	}
	l.m.Store(v, struct{}{})
	return v
}

// Shared registers c in reg, or returns the collector already registered
// under the same description, so that components can share one metric name
// (Prometheus refuses the same name twice, and splitting it would break the
// one-scheme rule: received − sent − dropped).
func Shared[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector.(C)
		}
		panic(err)
	}
	return c
}

// DroppedItems is the counter of items dropped by policy (sampling,
// filters), shared by every processor.
func DroppedItems(reg prometheus.Registerer) *prometheus.CounterVec {
	return Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_processor_dropped_items_total",
		Help: "Items dropped by policy (never delivered, by design), by processor, signal and tenant."},
		[]string{"processor", "signal", "tenant"}))
}
