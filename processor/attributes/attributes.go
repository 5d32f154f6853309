// Package attributes owns ferry's attribute and resource filters: ordered
// actions on attribute keys (keep, delete, insert, update, upsert, rename,
// hash) on resources or on items (spans, log records, data points), and
// rules that drop items by match, with per-tenant overrides.
//
// Design: these rewrite data, which the zero-copy wire path cannot do, so a
// request that has filters configured for its signal and tenant takes a
// detour through pdata: decode, apply, encode back to OTLP protobuf, then the
// usual encoding path. Requests without filters never pay for it. Items
// dropped by a rule are counted (ferry_processor_dropped_items_total{
// processor="filter"}) and logged at a bounded rate, never lost silently.
package attributes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/ferryhq/ferry/signal"
	"github.com/ferryhq/ferry/telemetry"
)

// Action is one change to attribute keys.
type Action struct {
	// Action: keep (only Keys stay), delete, insert (if absent), update (if
	// present), upsert, rename (Key → NewKey), hash (SHA-256 hex of the value).
	Action string   `yaml:"action"`
	Key    string   `yaml:"key"`
	Keys   []string `yaml:"keys"`
	Value  string   `yaml:"value"`
	NewKey string   `yaml:"new_key"`
	// On: item (span, log record, data point attributes; default) or resource.
	On string `yaml:"on"`
	// Signals it applies to; empty = all.
	Signals []string `yaml:"signals"`
}

// Match drops an item whose attribute (or its resource's) equals a value.
type Match struct {
	On      string   `yaml:"on"` // item (default) or resource
	Key     string   `yaml:"key"`
	Equals  string   `yaml:"equals"`
	Signals []string `yaml:"signals"`
}

// Rules are what applies to one tenant.
type Rules struct {
	Actions []Action `yaml:"actions"`
	DropIf  []Match  `yaml:"drop_if"`
}

// Config is the user configuration (YAML processors.attributes).
type Config struct {
	Actions []Action `yaml:"actions"`
	DropIf  []Match  `yaml:"drop_if"`
	// Tenants replaces the rules for particular apps.
	Tenants map[string]Rules `yaml:"tenants"`
}

func (c *Config) base() Rules { return Rules{Actions: c.Actions, DropIf: c.DropIf} }

// Validate names the first invalid field.
func (c *Config) Validate() error {
	check := func(prefix string, r Rules) error {
		for i, a := range r.Actions {
			p := fmt.Sprintf("%sactions[%d]", prefix, i)
			switch a.Action {
			case "keep":
				if len(a.Keys) == 0 {
					return fmt.Errorf("%s: keep needs keys", p)
				}
			case "delete", "insert", "update", "upsert", "hash":
				if a.Key == "" {
					return fmt.Errorf("%s: %s needs key", p, a.Action)
				}
			case "rename":
				if a.Key == "" || a.NewKey == "" {
					return fmt.Errorf("%s: rename needs key and new_key", p)
				}
			default:
				return fmt.Errorf("%s.action: %q is not one of keep, delete, insert, update, upsert, rename, hash", p, a.Action)
			}
			if err := checkOnSignals(p, a.On, a.Signals); err != nil {
				return err
			}
		}
		for i, m := range r.DropIf {
			p := fmt.Sprintf("%sdrop_if[%d]", prefix, i)
			if m.Key == "" {
				return fmt.Errorf("%s: key is required", p)
			}
			if err := checkOnSignals(p, m.On, m.Signals); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check("", c.base()); err != nil {
		return err
	}
	for t, r := range c.Tenants {
		if err := check("tenants."+t+".", r); err != nil {
			return err
		}
	}
	return nil
}

func checkOnSignals(p, on string, signals []string) error {
	if on != "" && on != "item" && on != "resource" {
		return fmt.Errorf("%s.on: %q is not item or resource", p, on)
	}
	for _, s := range signals {
		if s != "traces" && s != "metrics" && s != "logs" {
			return fmt.Errorf("%s.signals: %q is not traces, metrics or logs", p, s)
		}
	}
	return nil
}

// Processor applies the configured rules.
type Processor struct {
	cfg     atomic.Pointer[compiled]
	dropped *prometheus.CounterVec
	labels  *telemetry.Labels
	log     *telemetry.Limited
}

// New builds a processor.
func New(cfg Config, set telemetry.Settings) (*Processor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Processor{labels: set.Apps, log: telemetry.NewLimited(set.Logger.With("component", "processor/attributes"), time.Minute)}
	p.cfg.Store(compile(cfg))
	p.dropped = telemetry.DroppedItems(set.Registry)
	return p, nil
}

// SetConfig swaps the rules (reload).
func (p *Processor) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	p.cfg.Store(compile(cfg))
	return nil
}

// compiled is a Config ready for the request path: the default rules and
// whether anything is configured at all, so that a request costs nothing
// (no allocation, one atomic load) when there are no filters.
type compiled struct {
	base    Rules
	tenants map[string]Rules
	empty   bool
}

func compile(c Config) *compiled {
	return &compiled{base: c.base(), tenants: c.Tenants,
		empty: len(c.Actions) == 0 && len(c.DropIf) == 0 && len(c.Tenants) == 0}
}

// rules returns what applies to signal and tenant, or nil for nothing.
func (p *Processor) rules(signal, tenant string) *Rules {
	if p == nil {
		return nil
	}
	cfg := p.cfg.Load()
	if cfg.empty {
		return nil
	}
	r := &cfg.base
	if tenant != "" {
		if _, ok := cfg.tenants[tenant]; ok {
			t := cfg.tenants[tenant]
			r = &t
		}
	}
	for _, a := range r.Actions {
		if applies(a.Signals, signal) {
			return r
		}
	}
	for _, m := range r.DropIf {
		if applies(m.Signals, signal) {
			return r
		}
	}
	return nil
}

func applies(signals []string, signal string) bool {
	return len(signals) == 0 || slices.Contains(signals, signal)
}

// Active reports whether anything applies to sig and tenant (the caller
// skips the pdata detour otherwise). With no filters configured it is one
// atomic load.
func (p *Processor) Active(sig signal.Signal, tenant string) bool {
	return p.rules(sig.String(), tenant) != nil
}

// Apply rewrites an OTLP protobuf request of sig and returns the new bytes
// and the number of items dropped by rules.
func (p *Processor) Apply(sig signal.Signal, tenant string, raw []byte) ([]byte, int, error) {
	signal := sig.String()
	r := p.rules(signal, tenant)
	if r == nil {
		return raw, 0, nil
	}
	var out []byte
	dropped := 0
	switch signal {
	case "traces":
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(raw)
		if err != nil {
			return nil, 0, err
		}
		rss := td.ResourceSpans()
		for i := 0; i < rss.Len(); i++ {
			res := rss.At(i).Resource().Attributes()
			r.act(signal, "resource", res)
			for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
				rss.At(i).ScopeSpans().At(j).Spans().RemoveIf(func(s ptrace.Span) bool {
					if r.drop(signal, res, s.Attributes()) {
						dropped++
						return true
					}
					r.act(signal, "item", s.Attributes())
					return false
				})
			}
		}
		out, err = (&ptrace.ProtoMarshaler{}).MarshalTraces(td)
		if err != nil {
			return nil, 0, err
		}
	case "logs":
		ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(raw)
		if err != nil {
			return nil, 0, err
		}
		rls := ld.ResourceLogs()
		for i := 0; i < rls.Len(); i++ {
			res := rls.At(i).Resource().Attributes()
			r.act(signal, "resource", res)
			for j := 0; j < rls.At(i).ScopeLogs().Len(); j++ {
				rls.At(i).ScopeLogs().At(j).LogRecords().RemoveIf(func(l plog.LogRecord) bool {
					if r.drop(signal, res, l.Attributes()) {
						dropped++
						return true
					}
					r.act(signal, "item", l.Attributes())
					return false
				})
			}
		}
		out, err = (&plog.ProtoMarshaler{}).MarshalLogs(ld)
		if err != nil {
			return nil, 0, err
		}
	default:
		md, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(raw)
		if err != nil {
			return nil, 0, err
		}
		rms := md.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			res := rms.At(i).Resource().Attributes()
			r.act(signal, "resource", res)
			for j := 0; j < rms.At(i).ScopeMetrics().Len(); j++ {
				ms := rms.At(i).ScopeMetrics().At(j).Metrics()
				for k := 0; k < ms.Len(); k++ {
					dropped += eachPoints(ms.At(k), func(attrs pcommon.Map) bool {
						if r.drop(signal, res, attrs) {
							return true
						}
						r.act(signal, "item", attrs)
						return false
					})
				}
			}
		}
		out, err = (&pmetric.ProtoMarshaler{}).MarshalMetrics(md)
		if err != nil {
			return nil, 0, err
		}
	}
	if dropped > 0 {
		p.dropped.WithLabelValues("filter", signal, p.labels.Get(tenant)).Add(float64(dropped))
		p.log.Log(slog.LevelInfo, "dropped", "items dropped by a drop_if rule (by policy; counted in ferry_processor_dropped_items_total, processor filter)",
			"signal", signal, "tenant", tenant, "items", dropped)
	}
	return out, dropped, nil
}

// eachPoints applies fn to every data point's attributes, removing the
// points for which it returns true; it returns how many were removed.
func eachPoints(m pmetric.Metric, fn func(pcommon.Map) bool) int {
	n := 0
	switch m.Type() {
	case pmetric.MetricTypeGauge:
		m.Gauge().DataPoints().RemoveIf(func(d pmetric.NumberDataPoint) bool { r := fn(d.Attributes()); n += b2i(r); return r })
	case pmetric.MetricTypeSum:
		m.Sum().DataPoints().RemoveIf(func(d pmetric.NumberDataPoint) bool { r := fn(d.Attributes()); n += b2i(r); return r })
	case pmetric.MetricTypeHistogram:
		m.Histogram().DataPoints().RemoveIf(func(d pmetric.HistogramDataPoint) bool { r := fn(d.Attributes()); n += b2i(r); return r })
	case pmetric.MetricTypeExponentialHistogram:
		m.ExponentialHistogram().DataPoints().RemoveIf(func(d pmetric.ExponentialHistogramDataPoint) bool {
			r := fn(d.Attributes())
			n += b2i(r)
			return r
		})
	case pmetric.MetricTypeSummary:
		m.Summary().DataPoints().RemoveIf(func(d pmetric.SummaryDataPoint) bool { r := fn(d.Attributes()); n += b2i(r); return r })
	}
	return n
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (r *Rules) drop(signal string, res, item pcommon.Map) bool {
	for _, m := range r.DropIf {
		if !applies(m.Signals, signal) {
			continue
		}
		attrs := item
		if m.On == "resource" {
			attrs = res
		}
		if v, ok := attrs.Get(m.Key); ok && v.AsString() == m.Equals {
			return true
		}
	}
	return false
}

func (r *Rules) act(signal, on string, attrs pcommon.Map) {
	for _, a := range r.Actions {
		target := a.On
		if target == "" {
			target = "item"
		}
		if target != on || !applies(a.Signals, signal) {
			continue
		}
		switch a.Action {
		case "keep":
			attrs.RemoveIf(func(k string, _ pcommon.Value) bool { return !slices.Contains(a.Keys, k) })
		case "delete":
			attrs.Remove(a.Key)
		case "insert":
			if _, ok := attrs.Get(a.Key); !ok {
				attrs.PutStr(a.Key, a.Value)
			}
		case "update":
			if _, ok := attrs.Get(a.Key); ok {
				attrs.PutStr(a.Key, a.Value)
			}
		case "upsert":
			attrs.PutStr(a.Key, a.Value)
		case "rename":
			if v, ok := attrs.Get(a.Key); ok {
				v.CopyTo(attrs.PutEmpty(a.NewKey))
				attrs.Remove(a.Key)
			}
		case "hash":
			if v, ok := attrs.Get(a.Key); ok {
				sum := sha256.Sum256([]byte(v.AsString()))
				attrs.PutStr(a.Key, hex.EncodeToString(sum[:]))
			}
		}
	}
}
