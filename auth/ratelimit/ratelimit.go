// Package ratelimit owns per-application rate limits: a records/s and a
// bytes/s token bucket for each app, with bursts, sized by the app's class
// (from its token, or an override in config). Receivers ask before they hand
// anything to the queue, so a tenant over its limit is refused (429 /
// RESOURCE_EXHAUSTED with a retry delay) without costing the others memory.
//
// A request is admitted whole or not at all: when the buckets hold all of it,
// or when they are full (so a request larger than the burst still passes, and
// the bucket goes into debt that the refill pays back before anything else is
// admitted). The long-run rate holds either way.
package ratelimit

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// Class is one rate-limit class. A zero rate means unlimited on that axis.
type Class struct {
	RecordsPerSec float64 `yaml:"records_per_sec"`
	BytesPerSec   float64 `yaml:"bytes_per_sec"`
	// Bursts default to one second of the rate.
	BurstRecords float64 `yaml:"burst_records"`
	BurstBytes   float64 `yaml:"burst_bytes"`
}

// Config is the user configuration (YAML rate_limits).
type Config struct {
	// Classes by name; a token names its class (rate_class).
	Classes map[string]Class `yaml:"classes"`
	// DefaultClass applies to apps whose token names none (or an unknown
	// one), and to requests without a token; "" = unlimited.
	DefaultClass string `yaml:"default_class"`
	// Apps overrides the class of particular apps.
	Apps map[string]string `yaml:"apps"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	for name, cl := range c.Classes {
		if cl.RecordsPerSec < 0 || cl.BytesPerSec < 0 || cl.BurstRecords < 0 || cl.BurstBytes < 0 {
			return fmt.Errorf("classes.%s: rates and bursts must not be negative", name)
		}
	}
	if c.DefaultClass != "" {
		if _, ok := c.Classes[c.DefaultClass]; !ok {
			return fmt.Errorf("default_class: %q is not in classes", c.DefaultClass)
		}
	}
	for app, cl := range c.Apps {
		if _, ok := c.Classes[cl]; !ok {
			return fmt.Errorf("apps.%s: class %q is not in classes", app, cl)
		}
	}
	return nil
}

// Limiter holds one pair of buckets per app.
type Limiter struct {
	// active is false when no class is configured: Allow then returns at
	// once, without touching the lock every core would contend on.
	active  atomic.Bool
	mu      sync.RWMutex
	cfg     Config
	buckets map[string]*bucket
	labels  *telemetry.Labels
	refused *prometheus.CounterVec
	// admitted counts every request let through, limited or not, so an
	// operator sees each application's rate beside its refusals (ferry
	// top, /status).
	admitted, admittedBytes *prometheus.CounterVec
	// admittedBy holds each label value's two counters (*admittedPair):
	// WithLabelValues hashes and locks twice a request, which doubled
	// Allow's cost. Bounded by telemetry.Labels' cap on label values.
	admittedBy sync.Map
	now        func() time.Time
}

type admittedPair struct{ records, bytes prometheus.Counter }

type bucket struct {
	mu            sync.Mutex
	class         Class
	tokenClass    string // the token's rate_class the class was chosen with
	records, byts float64
	last          time.Time
}

// New builds a limiter.
func New(cfg Config, set telemetry.Settings) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg, buckets: map[string]*bucket{}, labels: set.Apps, now: time.Now}
	l.active.Store(len(cfg.Classes) > 0)
	l.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_ratelimit_refused_records_total",
		Help: "Records refused because their app was over its rate limit, by app."}, []string{"app"})
	l.admitted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_ratelimit_admitted_records_total",
		Help: "Records let through the rate limit (limited or not), by app (\"\" for requests without a token)."}, []string{"app"})
	l.admittedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_ratelimit_admitted_bytes_total",
		Help: "Bytes let through the rate limit (limited or not), by app."}, []string{"app"})
	set.Registry.MustRegister(l.refused, l.admitted, l.admittedBytes, debtCollector{l})
	return l, nil
}

// SetConfig swaps the configuration (reload): an application whose class is
// unchanged keeps its bucket, the others start full under their new class.
func (l *Limiter) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	l.mu.Lock()
	old := l.buckets
	l.cfg, l.buckets = cfg, make(map[string]*bucket, len(old))
	// An application whose class did not change keeps its bucket, debt
	// and all: a reload must not refill every bucket (a client over its
	// limit would otherwise be let through by any reload). The others
	// start afresh on their next request, under their new class.
	for app, b := range old {
		if class, limited := l.classOf(app, b.tokenClass); limited && class == b.class {
			l.buckets[app] = b
		}
	}
	l.active.Store(len(cfg.Classes) > 0)
	l.mu.Unlock()
	return nil
}

func (l *Limiter) classOf(app, tokenClass string) (Class, bool) {
	name := l.cfg.Apps[app]
	if name == "" {
		name = tokenClass
	}
	c, ok := l.cfg.Classes[name]
	if !ok {
		c, ok = l.cfg.Classes[l.cfg.DefaultClass]
	}
	return c, ok && (c.RecordsPerSec > 0 || c.BytesPerSec > 0)
}

// Allow admits records and bytes for app (whose token names tokenClass), or
// says how long to wait before retrying.
func (l *Limiter) Allow(app, tokenClass string, records, bytes int) (bool, time.Duration) {
	if !l.active.Load() {
		l.admit(app, records, bytes)
		return true, 0
	}
	l.mu.RLock()
	b := l.buckets[app]
	l.mu.RUnlock()
	if b == nil {
		class, limited := l.classOf(app, tokenClass)
		if !limited {
			l.admit(app, records, bytes)
			return true, 0
		}
		l.mu.Lock()
		if b = l.buckets[app]; b == nil {
			if len(l.buckets) > 100_000 { // bounded: forget idle apps wholesale
				l.buckets = map[string]*bucket{}
			}
			b = &bucket{class: class, tokenClass: tokenClass, records: burst(class.BurstRecords, class.RecordsPerSec),
				byts: burst(class.BurstBytes, class.BytesPerSec), last: l.now()}
			l.buckets[app] = b
		}
		l.mu.Unlock()
	}
	ok, wait := b.take(l.now(), float64(records), float64(bytes))
	if !ok {
		l.refused.WithLabelValues(l.labels.Get(app)).Add(float64(records))
	} else {
		l.admit(app, records, bytes)
	}
	return ok, wait
}

// admit counts a request let through: once per request, not per record.
func (l *Limiter) admit(app string, records, bytes int) {
	a := l.labels.Get(app)
	v, ok := l.admittedBy.Load(a)
	if !ok {
		v, _ = l.admittedBy.LoadOrStore(a, &admittedPair{l.admitted.WithLabelValues(a), l.admittedBytes.WithLabelValues(a)})
	}
	c := v.(*admittedPair)
	c.records.Add(float64(records))
	c.bytes.Add(float64(bytes))
}

// debtDesc is the debt of the applications whose bucket is below zero.
var debtDesc = prometheus.NewDesc("ferry_ratelimit_debt_seconds",
	"Rate-limit debt: seconds of refill an app's buckets need to be back to zero after a request larger than "+
		"what they held was admitted whole; it is refused everything until then. Only apps in debt are listed, by app.", []string{"app"}, nil)

// debtCollector reports, at each scrape, the applications that owe refill:
// the buckets are refilled lazily, on each request, so the debt is
// computed at the scrape's time without changing them.
type debtCollector struct{ l *Limiter }

func (c debtCollector) Describe(ch chan<- *prometheus.Desc) { ch <- debtDesc }

func (c debtCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.l
	if !l.active.Load() {
		return
	}
	now := l.now()
	// Apps beyond the label cap share "_other": the largest debt stands
	// for them (one series per label value, or the scrape fails).
	debt := map[string]float64{}
	l.mu.RLock()
	for app, b := range l.buckets {
		if d := b.debt(now); d > 0 {
			a := l.labels.Get(app)
			debt[a] = math.Max(debt[a], d)
		}
	}
	l.mu.RUnlock()
	for app, d := range debt {
		ch <- prometheus.MustNewConstMetric(debtDesc, prometheus.GaugeValue, d, app)
	}
}

// debt is how many seconds of refill the bucket needs to be out of debt
// (back to zero on both axes): until then the app is refused everything.
func (b *bucket) debt(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.class
	dt := now.Sub(b.last).Seconds()
	var d float64
	if c.RecordsPerSec > 0 {
		if level := math.Min(burst(c.BurstRecords, c.RecordsPerSec), b.records+dt*c.RecordsPerSec); level < 0 {
			d = math.Max(d, -level/c.RecordsPerSec)
		}
	}
	if c.BytesPerSec > 0 {
		if level := math.Min(burst(c.BurstBytes, c.BytesPerSec), b.byts+dt*c.BytesPerSec); level < 0 {
			d = math.Max(d, -level/c.BytesPerSec)
		}
	}
	return d
}

func burst(b, rate float64) float64 {
	if b > 0 {
		return b
	}
	return rate
}

func (b *bucket) take(now time.Time, records, bytes float64) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.class
	dt := now.Sub(b.last).Seconds()
	b.last = now
	if c.RecordsPerSec > 0 {
		b.records = math.Min(burst(c.BurstRecords, c.RecordsPerSec), b.records+dt*c.RecordsPerSec)
	}
	if c.BytesPerSec > 0 {
		b.byts = math.Min(burst(c.BurstBytes, c.BytesPerSec), b.byts+dt*c.BytesPerSec)
	}
	var wait float64
	if c.RecordsPerSec > 0 {
		full := burst(c.BurstRecords, c.RecordsPerSec)
		if need := math.Min(records, full); b.records < need {
			wait = math.Max(wait, (need-b.records)/c.RecordsPerSec)
		}
	}
	if c.BytesPerSec > 0 {
		full := burst(c.BurstBytes, c.BytesPerSec)
		if need := math.Min(bytes, full); b.byts < need {
			wait = math.Max(wait, (need-b.byts)/c.BytesPerSec)
		}
	}
	if wait > 0 {
		return false, time.Duration(wait * float64(time.Second))
	}
	if c.RecordsPerSec > 0 {
		b.records -= records
	}
	if c.BytesPerSec > 0 {
		b.byts -= bytes
	}
	return true, 0
}
