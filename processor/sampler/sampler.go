// Package sampler owns ferry's probabilistic sampling, consistent by trace
// id: the decision is a pure function of the trace id and the percentage,
// the same rule as OpenTelemetry's TraceIDRatioBased sampler (the low 63
// bits of the trace id's second half against the ratio). So every ferry
// agent, and every SDK using that sampler, keeps or drops a trace alike, and
// log records that carry a trace id follow their trace. Items without a
// trace id are always kept. What is dropped is counted (never lost
// silently): ferry_processor_dropped_items_total{processor="sampler"}.
package sampler

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/sampling"
	"github.com/ferryhq/ferry/signal"
	"github.com/ferryhq/ferry/telemetry"
)

// Config is the user configuration (YAML processors.sampler).
type Config struct {
	// Percent of traces kept, per signal that carries trace ids; 100 = all.
	TracesPercent float64 `yaml:"traces_percent"`
	LogsPercent   float64 `yaml:"logs_percent"`
	// Tenants overrides both percentages for the apps of particular tokens.
	Tenants map[string]float64 `yaml:"tenants"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	for name, p := range map[string]float64{"traces_percent": c.TracesPercent, "logs_percent": c.LogsPercent} {
		if p < 0 || p > 100 {
			return fmt.Errorf("%s: %v is outside 0..100", name, p)
		}
	}
	for t, p := range c.Tenants {
		if p < 0 || p > 100 {
			return fmt.Errorf("tenants.%s: %v is outside 0..100", t, p)
		}
	}
	return nil
}

// Decision is a keep-or-drop rule by trace id (package sampling).
type Decision = sampling.Decision

// For returns the decision for percent.
func For(percent float64) Decision { return sampling.For(percent) }

// Sampler picks decisions per signal and tenant and counts drops.
type Sampler struct {
	cfg     atomic.Pointer[Config]
	dropped *prometheus.CounterVec
	labels  *telemetry.Labels
	log     *telemetry.Limited
}

// New builds a sampler.
func New(cfg Config, set telemetry.Settings) (*Sampler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sampler{labels: set.Apps, log: telemetry.NewLimited(set.Logger.With("component", "processor/sampler"), time.Minute)}
	s.cfg.Store(&cfg)
	s.dropped = telemetry.DroppedItems(set.Registry)
	return s, nil
}

// SetConfig swaps the configuration (reload).
func (s *Sampler) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.cfg.Store(&cfg)
	return nil
}

// Decide returns the decision for a signal (traces or logs are sampled)
// and tenant.
func (s *Sampler) Decide(sig signal.Signal, tenant string) Decision {
	if s == nil {
		return sampling.Decision{}
	}
	cfg := s.cfg.Load()
	if p, ok := cfg.Tenants[tenant]; ok && tenant != "" {
		return For(p)
	}
	switch sig {
	case signal.Traces:
		return For(cfg.TracesPercent)
	case signal.Logs:
		return For(cfg.LogsPercent)
	}
	return sampling.Decision{}
}

// Dropped counts n items dropped for signal and tenant.
func (s *Sampler) Dropped(sig signal.Signal, tenant string, n int) {
	if s != nil && n > 0 {
		s.dropped.WithLabelValues("sampler", sig.String(), s.labels.Get(tenant)).Add(float64(n))
		s.log.Log(slog.LevelInfo, "dropped", "items dropped by sampling (by policy; counted in ferry_processor_dropped_items_total)",
			"signal", sig.String(), "tenant", tenant, "items", n)
	}
}

// DroppedCounter is the drop counter for signal and tenant (for tests).
func (s *Sampler) DroppedCounter(sig signal.Signal, tenant string) prometheus.Counter {
	return s.dropped.WithLabelValues("sampler", sig.String(), s.labels.Get(tenant))
}
