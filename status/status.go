// Package status is the agent's live view of itself: what `ferry top`, the
// JSON at GET /status and the status page at GET / (both on the admin
// listener) show an operator on the host. Who is sending, at what rate, to
// which topics, who is being refused and why, per token application (rate,
// refusals, sampled out, rate-limit debt), how full the queue and the spool
// are, how fast Kafka answers and whether it is reachable, dead letters and
// file lag.
//
// It reads nothing but the Prometheus registry every component already
// counts in (docs/metrics.md) and the readiness checks: one goroutine
// gathers the registry once an interval (telemetry.status.interval, 1 s),
// turns the counters into rates over that interval and the produce latency
// histogram into p50 and p99 over the last ten seconds, and keeps the
// result, immutable, for the handlers to serve. Requests never gather: a
// page left open in a browser, or ten `ferry top`s, cost the agent one
// encoding of the last report each, not a scrape.
//
// The charts' history is a ring of fixed size: telemetry.status.history /
// interval samples (at most 3600) of eight numbers each, 64 bytes a sample
// (600 samples, 38 KiB, by default), allocated once at New.
//
// What a response holds is bounded: every table lists at most MaxRows rows,
// the most active first, and says in "omitted" how many it left out; label
// values are already capped by telemetry.Labels (topics and applications
// beyond 1000 are "_other").
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ferryhq/ferry/telemetry"
)

// Config is YAML telemetry.status.
type Config struct {
	// Interval is how often the registry is sampled: the period rates are
	// computed over and the charts' resolution.
	Interval time.Duration `yaml:"interval"`
	// History is how far back the charts of the status page reach.
	History time.Duration `yaml:"history"`
}

// maxSamples bounds the ring: 3600 samples of 64 bytes.
const maxSamples = 3600

// MaxRows is the most rows any table of a report lists.
const MaxRows = 50

// latencyWindow is the time the produce latency quantiles are computed
// over: long enough to hold some produce requests on a quiet agent, short
// enough that a slow broker shows within seconds.
const latencyWindow = 10 * time.Second

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.Interval < 100*time.Millisecond || c.Interval > time.Minute {
		return fmt.Errorf("interval: %v is not between 100ms and 1m", c.Interval)
	}
	if c.History < c.Interval {
		return fmt.Errorf("history: %v is shorter than interval (%v)", c.History, c.Interval)
	}
	if n := c.History / c.Interval; n > maxSamples {
		return fmt.Errorf("history: %v is %d samples of %v; at most %d", c.History, n, c.Interval, maxSamples)
	}
	return nil
}

// Status samples the registry and serves what it found.
type Status struct {
	cfg     Config
	set     telemetry.Settings
	version string
	started time.Time

	mu     sync.Mutex
	latest *Report
	ring   []sample // fixed length; the newest at head-1
	head   int
	n      int

	// The sampling goroutine's own state (no lock: only it touches them).
	prev     map[string]float64
	prevTime time.Time
	lat      []histSnap // the last latency histograms, newest last, bounded to the window
	latCap   int

	warn    *telemetry.Limited // a failing gather is said once a minute, not every second
	running bool               // Start was called (Shutdown waits for the loop only then)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// New builds the sampler; it samples nothing until Start.
func New(cfg Config, set telemetry.Settings, version string) (*Status, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := int(cfg.History / cfg.Interval)
	latCap := int(latencyWindow/cfg.Interval) + 1
	return &Status{cfg: cfg, set: set, version: version, started: time.Now(), ring: make([]sample, n),
		warn:   telemetry.NewLimited(set.Logger, time.Minute),
		latCap: max(latCap, 2), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start takes the first sample, so /status answers at once, and samples
// every interval in the background.
func (s *Status) Start(context.Context) error {
	s.Sample(time.Now())
	s.running = true
	go s.loop()
	return nil
}

// Shutdown stops sampling; the last report is still served.
func (s *Status) Shutdown(context.Context) error {
	s.once.Do(func() { close(s.stop) })
	if s.running {
		<-s.done
	}
	return nil
}

func (s *Status) loop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			// The time of the gather, not of the tick: a sampler
			// delayed by a busy CPU or the GC must not credit one
			// interval with another's counts.
			s.Sample(time.Now())
		}
	}
}

// Sample gathers the registry once and makes the report current. The
// sampling goroutine calls it; tests call it to step time.
func (s *Status) Sample(now time.Time) {
	mfs, err := s.set.Registry.Gather()
	if err != nil && len(mfs) == 0 {
		s.warn.Log(slog.LevelWarn, "gather", "status: gathering the metrics failed", "error", err)
		return
	}
	dt := now.Sub(s.prevTime).Seconds()
	if s.prevTime.IsZero() || dt <= 0 {
		dt = 0 // the first sample has totals and no rates
	}
	b := newBuilder(mfs, s.prev, dt)
	r := b.report()
	r.Version = s.version
	r.Time = now.UTC().Truncate(time.Millisecond)
	r.UptimeSeconds = max(0, math.Round(now.Sub(s.started).Seconds()))
	r.IntervalSeconds = s.cfg.Interval.Seconds()
	r.Ready, r.NotReady = s.set.Health.Ready()

	// Produce latency: p50 and p99 over the window, and the p99 of this
	// interval alone for the chart.
	h, ok := b.histogram("ferry_exporter_kafka_produce_latency_seconds")
	var p99now float64
	if ok {
		if len(s.lat) > 0 {
			last := s.lat[len(s.lat)-1]
			p99now = h.since(last).quantile(0.99)
		}
		s.lat = append(s.lat, h)
		if len(s.lat) > s.latCap {
			s.lat = append(s.lat[:0], s.lat[len(s.lat)-s.latCap:]...)
		}
		win := h
		if len(s.lat) > 1 {
			win = h.since(s.lat[0])
		}
		// The first sample's window is everything since the start.
		r.Kafka.LatencyWindowSeconds = r.UptimeSeconds
		if len(s.lat) > 1 {
			r.Kafka.LatencyWindowSeconds = float64(len(s.lat)-1) * s.cfg.Interval.Seconds()
		}
		if win.count > 0 {
			p50, p99 := ms(win.quantile(0.5)), ms(win.quantile(0.99))
			r.Kafka.ProduceP50Ms, r.Kafka.ProduceP99Ms = &p50, &p99
		}
		r.Kafka.ProduceRequests = win.count
	}
	smp := sample{
		r.Totals.ReceivedRecords.PerSec, r.Totals.SentRecords.PerSec, r.Totals.RefusedRequests.PerSec,
		r.Totals.DroppedRecords.PerSec + r.Totals.DeadLetters.PerSec, r.Queue.Bytes, 0, ms(p99now), 0,
	}
	if r.Spool != nil {
		smp[seriesSpoolBacklog] = r.Spool.BacklogBytes
	}
	if r.Kafka.Up != nil && *r.Kafka.Up {
		smp[seriesKafkaUp] = 1
	}

	s.prev, s.prevTime = b.next, now
	s.mu.Lock()
	s.latest = r
	s.ring[s.head] = smp
	s.head = (s.head + 1) % len(s.ring)
	s.n = min(s.n+1, len(s.ring))
	s.mu.Unlock()
}

func ms(sec float64) float64 { return round(sec*1000, 3) }

// Report returns the current report with the last seconds of history
// (0: none; more than the ring holds: all of it); nil before the first
// sample.
func (s *Status) Report(seconds float64) *Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.latest == nil {
		return nil
	}
	r := *s.latest
	n := s.n
	if want := seconds / s.cfg.Interval.Seconds(); want < float64(n) {
		n = int(math.Ceil(want))
	}
	if n <= 0 {
		return &r
	}
	h := &History{IntervalSeconds: s.cfg.Interval.Seconds(), End: r.Time, Series: map[string][]float64{}}
	cols := make([][]float64, numSeries)
	for i := range cols {
		cols[i] = make([]float64, n)
	}
	for k := 0; k < n; k++ {
		smp := s.ring[(s.head-n+k+len(s.ring))%len(s.ring)]
		for i := range cols {
			cols[i][k] = smp[i]
		}
	}
	for i, name := range seriesNames {
		h.Series[name] = cols[i]
	}
	r.History = h
	return &r
}

// ServeJSON answers GET /status: the current report as JSON, with
// ?history=SECONDS of the charts' samples (default: all the ring holds;
// 0: none).
func (s *Status) ServeJSON(w http.ResponseWriter, req *http.Request) {
	seconds := math.Inf(1)
	if v := req.URL.Query().Get("history"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsNaN(f) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "history: want a number of seconds, 0 or more", "reason": "invalid_parameter"})
			return
		}
		seconds = f
	}
	r := s.Report(seconds)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if r == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "no sample yet", "reason": "starting"})
		return
	}
	_ = json.NewEncoder(w).Encode(r)
}
