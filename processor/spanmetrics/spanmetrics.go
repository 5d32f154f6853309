// Package spanmetrics owns ferry's RED metrics derived from spans
// (processors.span_metrics): per service.name (resource attribute), span
// name, span kind and status code, the number of calls and a histogram of
// durations, flushed every interval as OTLP metrics named as the
// OpenTelemetry Collector's spanmetrics connector names them
// (traces.span.metrics.calls, traces.span.metrics.duration in ms, with
// cumulative temporality). Errors are the calls whose status.code is
// STATUS_CODE_ERROR, as in the Collector.
//
// Where it sits: the OTLP receiver's encoder (otlp/encoding) records what
// metrics need of every span as it decodes a traces request, before the
// sampler's decision, and the receiver hands those facts to Add once the
// request is accepted: spans of traces the sampler drops are counted, and
// so are spans of any door that converts to OTLP and goes through the
// receiver's export path (Zipkin, Jaeger). Sharing the encoder's walk is
// what keeps the cost near 10 % of the span path: a walk of its own
// (Observe, wire.SpanSkim) costs twice as much. No pdata, no allocation
// per span, one lock per request.
//
// How the metrics reach Kafka: at each flush the processor builds an OTLP
// ExportMetricsServiceRequest and hands its protobuf bytes to a Sink, which
// the OTLP receiver provides: its own export path, as a metrics request
// with a server-side identity (no token). So the metrics take exactly the
// way OTLP metrics from a client take (the metrics topic and its template,
// the key, every encoding: otlp_proto, otlp_json, flat_json; attribute
// filters; the memory budget; every delivery mode) and nothing about
// routing or encoding is written twice. The alternative, encoding here
// with otlp/encoding and submitting to the pipeline, would have copied the
// receiver's routing, headers, memory charge and batch handling, and
// drifted from it.
//
// Bounds: at most max_series series (each with service and span names cut
// to 256 bytes); a span of a new series beyond that is counted in an
// overflow series (attribute otel.metric.overflow=true, one per status
// code, so errors stay countable) and in
// ferry_processor_span_metrics_overflow_spans_total. A series without a
// span for expire_after stops being exported and is forgotten; if spans
// come back it starts again from zero with a new start time, as a
// cumulative series that was reset. A flush is cut into requests of at most
// 500 series (1000 data points) so it passes max_items_per_request and the
// record size limit.
//
// A request the receiver refuses after Observe (rate limit, full queue,
// Kafka down) and that its client sends again is counted again: the
// counts are at least once, as the Collector's connector counts what it
// was given. A flush that fails is counted
// (ferry_processor_span_metrics_flushes_total{result="failed"}) and lost
// only as a resolution: the next flush carries the cumulative totals.
//
// Lifecycle: Start runs the flush loop; Shutdown stops it and flushes the
// last interval (the pipeline stops it after the receivers, before the
// queue and the exporter). The configuration is read at start: a reload
// that changes processors.span_metrics asks for a restart.
package spanmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/ferryhq/ferry/otlp/wire"
	"github.com/ferryhq/ferry/telemetry"
)

// Names of what is exported, as the Collector's spanmetrics connector
// (namespace traces.span.metrics) names them.
const (
	CallsMetric    = "traces.span.metrics.calls"
	DurationMetric = "traces.span.metrics.duration"
	OverflowAttr   = "otel.metric.overflow"
	ScopeName      = "ferry/span_metrics"
)

// maxNameBytes bounds the service and span names a series keeps.
const maxNameBytes = 256

// seriesPerRequest is how many series one flushed request holds at most
// (two data points each).
const seriesPerRequest = 500

// DefaultBuckets are the Collector's default explicit bounds.
var DefaultBuckets = []time.Duration{2 * time.Millisecond, 4 * time.Millisecond, 6 * time.Millisecond, 8 * time.Millisecond,
	10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
	800 * time.Millisecond, time.Second, 1400 * time.Millisecond, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second}

// Config is the user configuration (YAML processors.span_metrics).
type Config struct {
	// Enabled turns the processor on (off by default).
	Enabled bool `yaml:"enabled"`
	// Interval between flushes to the metrics topic.
	Interval time.Duration `yaml:"interval"`
	// Buckets are the duration histogram's explicit upper bounds, ascending.
	Buckets []time.Duration `yaml:"buckets"`
	// MaxSeries bounds the series kept; spans of new series beyond it go
	// to the overflow series.
	MaxSeries int `yaml:"max_series"`
	// ExpireAfter: a series without a span for this long is forgotten.
	ExpireAfter time.Duration `yaml:"expire_after"`
}

// Validate names the first invalid key.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.Interval < time.Second {
		return fmt.Errorf("interval: %s is below 1s", c.Interval)
	}
	if c.MaxSeries < 1 || c.MaxSeries > 1_000_000 {
		return fmt.Errorf("max_series: %d is outside 1..1000000", c.MaxSeries)
	}
	if c.ExpireAfter < c.Interval {
		return fmt.Errorf("expire_after: %s is below interval (%s)", c.ExpireAfter, c.Interval)
	}
	if len(c.Buckets) == 0 || len(c.Buckets) > 100 {
		return fmt.Errorf("buckets: %d bounds, want 1..100", len(c.Buckets))
	}
	for i, b := range c.Buckets {
		if b <= 0 {
			return fmt.Errorf("buckets[%d]: %s is not positive", i, b)
		}
		if i > 0 && b <= c.Buckets[i-1] {
			return fmt.Errorf("buckets[%d]: %s is not above %s: bounds must ascend", i, b, c.Buckets[i-1])
		}
	}
	return nil
}

// Sink takes one flushed ExportMetricsServiceRequest (protobuf), owned by
// the sink from the call on.
type Sink func(ctx context.Context, req []byte) error

// series is one (service, span name, kind, status) aggregate.
type series struct {
	service, name string
	kind, status  int32
	overflow      bool
	calls         uint64
	sumMS         float64
	counts        []uint64 // len(bounds)+1
	start         uint64   // Unix ns the series began
	last          int64    // Unix ns of its last span, as the processor's clock saw it
}

// Processor aggregates spans into series and flushes them.
type Processor struct {
	cfg      Config
	bounds   []uint64 // ns
	boundsMS []float64
	log      *telemetry.Limited
	now      func() time.Time

	mu       sync.Mutex
	series   map[string]*series
	overflow [3]*series // by status code
	key      []byte     // scratch, under mu
	clock    int64      // Unix ns, refreshed per Observe

	sink      atomic.Pointer[Sink]
	flushMu   sync.Mutex // one flush at a time
	stop      chan struct{}
	done      chan struct{}
	started   bool
	shut      sync.Once
	overflowC prometheus.Counter
	seriesG   prometheus.Gauge
	flushes   *prometheus.CounterVec
}

// New builds a processor (nil when cfg is not enabled: a nil processor
// observes nothing).
func New(cfg Config, set telemetry.Settings) (*Processor, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Processor{cfg: cfg, series: map[string]*series{}, now: time.Now,
		log:  telemetry.NewLimited(set.Logger.With("component", "processor/span_metrics"), time.Minute),
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, b := range cfg.Buckets {
		p.bounds = append(p.bounds, uint64(b))
		p.boundsMS = append(p.boundsMS, float64(b)/float64(time.Millisecond))
	}
	p.overflowC = telemetry.Shared(set.Registry, prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_processor_span_metrics_overflow_spans_total",
		Help: "Spans counted in the span metrics' overflow series because max_series series existed."}))
	p.seriesG = telemetry.Shared(set.Registry, prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_processor_span_metrics_series",
		Help: "Series the span metrics processor holds (overflow series included)."}))
	p.flushes = telemetry.Shared(set.Registry, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_processor_span_metrics_flushes_total",
		Help: "Span metrics requests flushed to the metrics topic, by result (ok, failed)."}, []string{"result"}))
	return p, nil
}

// SetSink sets where flushed requests go (the OTLP receiver's export path).
func (p *Processor) SetSink(s Sink) {
	if p != nil {
		p.sink.Store(&s)
	}
}

// Add counts spans as otlp/encoding's walk recorded them (Encoder.
// RecordSpans), for a request it accepted. Safe for concurrent use; a nil
// processor does nothing.
func (p *Processor) Add(spans []wire.SpanFacts) {
	if p == nil || len(spans) == 0 {
		return
	}
	now := p.now().UnixNano()
	var res, svc []byte
	p.mu.Lock()
	p.clock = now
	for i := range spans {
		f := &spans[i]
		// Spans come grouped by resource: its service.name is read once.
		if i == 0 || len(f.Res) != len(res) || (len(res) > 0 && &f.Res[0] != &res[0]) {
			res, svc = f.Res, wire.ServiceName(f.Res)
		}
		p.add(svc, f.Name, f.Kind, f.Status, f.Start, f.End)
	}
	p.mu.Unlock()
}

// Observe counts the spans of one TracesData / ExportTraceServiceRequest
// (already accepted by ferry's decoder) with a walk of its own
// (wire.SpanSkim), for callers that do not encode it. Safe for concurrent
// use; a nil processor does nothing.
func (p *Processor) Observe(raw []byte) {
	if p == nil {
		return
	}
	now := p.now().UnixNano()
	p.mu.Lock()
	p.clock = now
	it := wire.NewSpanSkim(raw)
	for it.Next() {
		p.add(it.Service, it.Name, it.Kind, it.StatusCode, it.Start, it.End)
	}
	p.mu.Unlock()
}

// add counts one span; p.mu is held.
func (p *Processor) add(service, name []byte, kind, status int32, start, end uint64) {
	if kind < 0 || int(kind) >= len(wire.SpanKindNames) {
		kind = 0
	}
	if status < 0 || int(status) >= len(wire.StatusCodeNames) {
		status = 0
	}
	service, name = cut(service), cut(name)
	k := append(p.key[:0], byte(len(service)), byte(len(service)>>8))
	k = append(k, service...)
	k = append(k, name...)
	k = append(k, byte(kind), byte(status))
	p.key = k
	s := p.series[string(k)]
	if s == nil {
		s = p.create(k, service, name, kind, status)
	}
	var d uint64
	if end > start {
		d = end - start
	}
	// The first bound at or above d (bounds are upper bounds, inclusive).
	lo, hi := 0, len(p.bounds)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.bounds[m] < d {
			lo = m + 1
		} else {
			hi = m
		}
	}
	s.counts[lo]++
	s.calls++
	s.sumMS += float64(d) / 1e6
	s.last = p.clock
}

// create makes the series of key k, or returns the overflow series of its
// status when max_series are held.
func (p *Processor) create(k, service, name []byte, kind, status int32) *series {
	if len(p.series) >= p.cfg.MaxSeries {
		p.overflowC.Inc()
		o := p.overflow[status]
		if o == nil {
			o = &series{status: status, overflow: true, counts: make([]uint64, len(p.bounds)+1), start: uint64(p.clock)}
			p.overflow[status] = o
			p.seriesG.Inc()
		}
		return o
	}
	s := &series{service: string(service), name: string(name), kind: kind, status: status,
		counts: make([]uint64, len(p.bounds)+1), start: uint64(p.clock)}
	p.series[string(k)] = s
	p.seriesG.Inc()
	return s
}

// cut bounds a name to maxNameBytes, at a UTF-8 boundary.
func cut(b []byte) []byte {
	if len(b) <= maxNameBytes {
		return b
	}
	n := maxNameBytes
	for n > maxNameBytes-utf8.UTFMax && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n]
}

// Start runs the flush loop every interval.
func (p *Processor) Start(context.Context) error {
	if p == nil {
		return nil
	}
	p.started = true
	go p.loop()
	return nil
}

func (p *Processor) loop() {
	defer close(p.done)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Interval)
			_ = p.Flush(ctx)
			cancel()
		}
	}
}

// Shutdown stops the loop and flushes the last interval within ctx.
func (p *Processor) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	var err error
	p.shut.Do(func() {
		close(p.stop)
		if p.started {
			<-p.done
		}
		err = p.Flush(ctx)
	})
	return err
}

// Flush exports every live series (cumulative, since its start) and
// forgets those idle for expire_after. Safe for concurrent use.
func (p *Processor) Flush(ctx context.Context) error {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	reqs := p.Build()
	sp := p.sink.Load()
	if sp == nil || len(reqs) == 0 {
		return nil
	}
	var errs []error
	for _, req := range reqs {
		if err := (*sp)(ctx, req); err != nil {
			p.flushes.WithLabelValues("failed").Inc()
			p.log.Log(slog.LevelWarn, "flush", "span metrics not delivered (the next flush carries the cumulative totals)", "error", err)
			errs = append(errs, err)
			continue
		}
		p.flushes.WithLabelValues("ok").Inc()
	}
	return errors.Join(errs...)
}

// snapshot is a copy of one series taken under the lock.
type snapshot struct {
	series
}

// Build takes a snapshot of every series, expires the idle ones and
// returns the ExportMetricsServiceRequests (protobuf) of the snapshot.
func (p *Processor) Build() [][]byte {
	now := p.now().UnixNano()
	idle := now - int64(p.cfg.ExpireAfter)
	p.mu.Lock()
	snap := make([]snapshot, 0, len(p.series)+len(p.overflow))
	for k, s := range p.series {
		if s.last < idle {
			delete(p.series, k)
			p.seriesG.Dec()
			continue
		}
		c := *s
		c.counts = slices.Clone(s.counts)
		snap = append(snap, snapshot{c})
	}
	for i, s := range p.overflow {
		if s == nil {
			continue
		}
		if s.last < idle {
			p.overflow[i] = nil
			p.seriesG.Dec()
			continue
		}
		c := *s
		c.counts = slices.Clone(s.counts)
		snap = append(snap, snapshot{c})
	}
	p.mu.Unlock()
	if len(snap) == 0 {
		return nil
	}
	// By service, so each request holds few resources.
	sort.Slice(snap, func(i, j int) bool {
		a, b := &snap[i], &snap[j]
		if a.overflow != b.overflow {
			return b.overflow
		}
		if a.service != b.service {
			return a.service < b.service
		}
		if a.name != b.name {
			return a.name < b.name
		}
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		return a.status < b.status
	})
	var out [][]byte
	for len(snap) > 0 {
		n := min(len(snap), seriesPerRequest)
		out = append(out, p.request(snap[:n], uint64(now)))
		snap = snap[n:]
	}
	return out
}

// request is one ExportMetricsServiceRequest of the series in snap.
func (p *Processor) request(snap []snapshot, now uint64) []byte {
	md := pmetric.NewMetrics()
	var calls pmetric.NumberDataPointSlice
	var hist pmetric.HistogramDataPointSlice
	for i := range snap {
		s := &snap[i]
		if i == 0 || s.service != snap[i-1].service || s.overflow != snap[i-1].overflow {
			rm := md.ResourceMetrics().AppendEmpty()
			if !s.overflow && s.service != "" {
				rm.Resource().Attributes().PutStr("service.name", s.service)
			}
			sm := rm.ScopeMetrics().AppendEmpty()
			sm.Scope().SetName(ScopeName)
			m := sm.Metrics().AppendEmpty()
			m.SetName(CallsMetric)
			m.SetUnit("{call}")
			m.SetDescription("Spans seen, by service, span name, kind and status (errors: status.code STATUS_CODE_ERROR).")
			sum := m.SetEmptySum()
			sum.SetIsMonotonic(true)
			sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
			calls = sum.DataPoints()
			m = sm.Metrics().AppendEmpty()
			m.SetName(DurationMetric)
			m.SetUnit("ms")
			m.SetDescription("Span durations (end - start).")
			h := m.SetEmptyHistogram()
			h.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
			hist = h.DataPoints()
		}
		dp := calls.AppendEmpty()
		dp.SetStartTimestamp(pcommon.Timestamp(s.start))
		dp.SetTimestamp(pcommon.Timestamp(now))
		dp.SetIntValue(int64(s.calls))
		s.attrs(dp.Attributes())
		hp := hist.AppendEmpty()
		hp.SetStartTimestamp(pcommon.Timestamp(s.start))
		hp.SetTimestamp(pcommon.Timestamp(now))
		hp.SetCount(s.calls)
		hp.SetSum(s.sumMS)
		hp.ExplicitBounds().FromRaw(p.boundsMS)
		hp.BucketCounts().FromRaw(s.counts)
		s.attrs(hp.Attributes())
	}
	raw, err := (&pmetric.ProtoMarshaler{}).MarshalMetrics(md)
	if err != nil { // cannot happen: pdata marshals what it built
		panic(err)
	}
	return raw
}

// attrs are a data point's attributes.
func (s *snapshot) attrs(m pcommon.Map) {
	if s.overflow {
		m.PutBool(OverflowAttr, true)
		m.PutStr("status.code", wire.StatusCodeNames[s.status])
		return
	}
	if s.service != "" { // absent from the resource: absent here
		m.PutStr("service.name", s.service)
	}
	m.PutStr("span.name", s.name)
	m.PutStr("span.kind", wire.SpanKindNames[s.kind])
	m.PutStr("status.code", wire.StatusCodeNames[s.status])
}

// Series is how many series are held (overflow series included).
func (p *Processor) Series() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.series)
	for _, o := range p.overflow {
		if o != nil {
			n++
		}
	}
	return n
}

// OverflowCounter is ferry_processor_span_metrics_overflow_spans_total.
func (p *Processor) OverflowCounter() prometheus.Counter { return p.overflowC }
