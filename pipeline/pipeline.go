// Package pipeline owns the wiring of ferry's components from a Config and
// their lifecycle as one unit.
//
// New builds the components and the ordered list they start in (see
// components): admin, exporter, spool reader, queue, auth, receivers, so
// nothing accepts data before the stage behind it runs. A component whose
// Start fails stops those already started, in reverse, and a failing New
// releases what it built. Shutdown walks the list backwards: receivers stop
// accepting and wait for requests in flight (which wait for Kafka's
// acknowledgements), then the exporter flushes, all within one deadline;
// what Kafka has not acknowledged by then is counted and logged by the
// exporter.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry/admin"
	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/buffer/memqueue"
	"github.com/ferryhq/ferry/buffer/spill"
	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/status"
	"github.com/ferryhq/ferry/telemetry"
)

// Pipeline is a running agent.
type Pipeline struct {
	// state is starting, running or stopping (/readyz says which).
	state atomic.Int32
	cfg   *config.Config
	Set   telemetry.Settings
	Admin *admin.Admin
	// Status is the live view the admin listener serves (/status, /).
	Status   *status.Status
	Exporter exporter.Exporter
	// Budget is the memory bound every stage that holds data reserves from.
	Budget *budget.Budget
	Queue  *memqueue.Queue
	// Spool, DeadLetter and Spill exist in the spool and spill delivery modes.
	Spool *spool.Spool
	// Receipts keeps spool receipts for GET /receipts/{id} (spool and
	// spill modes).
	Receipts *receipt.Store
	// Idem remembers Idempotency-Keys (delivery mode spool only).
	Idem       *idempotency.Store
	DeadLetter *deadletter.Writer
	Spill      *spill.Router
	// Receivers are the enabled receivers, in config's order.
	Receivers []Receiver
	Auth      *auth.Checker
	Limiter   *ratelimit.Limiter
	Sampler   *sampler.Sampler
	Attrs     *attributes.Processor
	// SpanMetrics is nil unless processors.span_metrics.enabled.
	SpanMetrics *spanmetrics.Processor
	reloadMu    sync.Mutex
	life        *lifecycle
	stop        chan struct{}
	done        chan struct{}
}

// Receiver is one running receiver and its section's name.
type Receiver struct {
	Type string // receivers.<Type>
	receiver.Receiver
}

// Receiver returns the running receiver of receivers.<typ> (nil: none).
func (p *Pipeline) Receiver(typ string) receiver.Receiver {
	for _, r := range p.Receivers {
		if r.Type == typ {
			return r.Receiver
		}
	}
	return nil
}

// exporterEnv is what the exporter is built with: in delivery mode spool
// no client waits for Kafka's ack, so batches linger for
// delivery.spool.linger; the topics the configuration names in full, for
// the exporter to create when missing.
func exporterEnv(cfg *config.Config, set telemetry.Settings) exporter.Env {
	env := exporter.Env{Set: set, BufferedBytes: int64(cfg.Queue.MemoryLimit), Topics: cfg.FixedTopics()}
	if cfg.Delivery.Mode == "spool" {
		env.Spooled, env.SpoolLinger = true, cfg.Delivery.Spool.Linger
	}
	return env
}

// New builds every component; nothing listens or connects yet. If a step
// fails, what the earlier ones built is released.
func New(cfg *config.Config, set telemetry.Settings) (_ *Pipeline, err error) {
	p := &Pipeline{cfg: cfg, Set: set, stop: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if err != nil {
			p.abandon()
		}
	}()
	typ := cfg.Exporter.Type
	f := cfg.Exporter.Factory()
	if f == nil {
		return nil, fmt.Errorf("exporter.type: unknown exporter %q", typ)
	}
	xenv := exporterEnv(cfg, set)
	if cfg.Delivery.Guarantee == "exactly_once" {
		eo := cfg.Delivery.ExactlyOnce
		// Kafka's state is keyed by the spool directory's id, so it
		// never applies to another spool.
		if eo.SpoolID, err = spool.DirID(cfg.Delivery.Spool.Dir); err != nil {
			return nil, fmt.Errorf("delivery.exactly_once: %w", err)
		}
		xenv.ExactlyOnce = &eo
	}
	if p.Exporter, err = f.Create(cfg.Exporter.Config(typ), xenv); err != nil {
		return nil, fmt.Errorf("exporter.%s: %w", typ, err)
	}
	// What the receivers hand their batches to, by delivery mode:
	//   kafka: queue → exporter
	//   spool: queue → spool; the spool's reader → exporter
	//   spill: router → (queue → exporter) or spool; the spool's reader → exporter
	//
	// One memory budget is shared by the stages that hold data: the queue,
	// the spool's reader and the request bodies being read.
	p.Budget = budget.New(int64(cfg.Queue.MemoryLimit))
	var intake consumer.Consumer
	if cfg.Delivery.Mode != "kafka" {
		if p.DeadLetter, err = deadletter.New(cfg.Delivery.DeadLetter, set, p.Exporter); err != nil {
			return nil, fmt.Errorf("delivery.dead_letter: %w", err)
		}
		sc := cfg.Delivery.Spool
		if sc.ReadAhead == 0 {
			sc.ReadAhead = cfg.Queue.MemoryLimit / 2
		}
		if p.Receipts, err = receipt.NewStore(cfg.Delivery.Receipts, set.Registry); err != nil {
			return nil, fmt.Errorf("delivery.receipts: %w", err)
		}
		links := spool.Links{Next: p.Exporter, MaxRecordBytes: int(cfg.SpoolRecordBytes()),
			Budget: p.Budget, DeadLetter: p.DeadLetter, Up: p.Exporter.Up, Receipts: p.Receipts}
		if cfg.Delivery.Mode == "spool" {
			// Only where every accepted record is in the spool: in spill
			// mode most are answered from Kafka's ack, with no key kept.
			if p.Idem, err = idempotency.NewStore(cfg.Delivery.Idempotency, set.Registry); err != nil {
				return nil, fmt.Errorf("delivery.idempotency: %w", err)
			}
			links.Idem = p.Idem
		}
		if cfg.Delivery.Guarantee == "exactly_once" {
			r, ok := p.Exporter.(exporter.Resumer)
			if !ok {
				return nil, fmt.Errorf("delivery.guarantee exactly_once: exporter %s cannot resume the spool", typ)
			}
			links.Resume = r.Committed
		}
		if p.Spool, err = spool.Open(sc, set, links); err != nil {
			return nil, fmt.Errorf("delivery.spool: %w", err)
		}
	}
	next := consumer.Consumer(p.Exporter)
	if cfg.Delivery.Mode == "spool" {
		next = p.Spool
	}
	if p.Queue, err = memqueue.New(cfg.Queue, set, p.Budget, next, p.Exporter.Up); err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	intake = p.Queue
	if cfg.Delivery.Mode == "spill" {
		p.Spill = spill.New(set, p.Queue, p.Spool, p.Exporter.Up)
		intake = p.Spill
	}
	// Built even when unconfigured, so a reload can add keys and limits.
	if p.Auth, err = auth.New(cfg.Auth, set); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if p.Limiter, err = ratelimit.New(cfg.RateLimits, set); err != nil {
		return nil, fmt.Errorf("rate_limits: %w", err)
	}
	if p.Sampler, err = sampler.New(cfg.Processors.Sampler, set); err != nil {
		return nil, fmt.Errorf("processors.sampler: %w", err)
	}
	if p.Attrs, err = attributes.New(cfg.Processors.Attributes, set); err != nil {
		return nil, fmt.Errorf("processors.attributes: %w", err)
	}
	if p.SpanMetrics, err = spanmetrics.New(cfg.Processors.SpanMetrics, set); err != nil {
		return nil, fmt.Errorf("processors.span_metrics: %w", err)
	}
	pre := &receiver.Prechecks{Checker: p.Auth, Limiter: p.Limiter, Sampler: p.Sampler, Attributes: p.Attrs, SpanMetrics: p.SpanMetrics}
	// Request bodies reserve their memory before they are read: from the
	// shared budget, except in spill mode, where a full queue must send
	// requests to disk rather than refuse them, so bodies have a budget of
	// their own.
	bodies := p.Budget
	if cfg.Delivery.Mode == "spill" {
		bodies = budget.New(int64(cfg.Queue.MemoryLimit))
	}
	env := receiver.Env{Set: set, Next: intake, Pre: pre, Bodies: bodies, Bounds: cfg.Bounds(), Topics: p.cluster(), Receipts: p.Receipts,
		NoReceipts: cfg.Exporter.Limits().NoReceipts, Idem: p.Idem}
	if w, ok := p.Exporter.(exporter.ShrinkWatcher); ok {
		env.WatchShrink = w.WatchShrink
	}
	var rerr error
	cfg.Receivers.Each(func(f receiver.Factory, rc receiver.Config) {
		if rerr != nil || !rc.On() {
			return
		}
		r, err := f.Create(rc, env)
		if err != nil {
			rerr = fmt.Errorf("receivers.%s: %w", f.Type(), err)
			return
		}
		p.Receivers = append(p.Receivers, Receiver{Type: f.Type(), Receiver: r})
	})
	if rerr != nil {
		return nil, rerr
	}
	p.Admin = admin.New(cfg.Telemetry.Admin, set)
	if p.Status, err = status.New(cfg.Telemetry.Status, set, Version); err != nil {
		return nil, fmt.Errorf("telemetry.status: %w", err)
	}
	p.Admin.Handle("GET /status", http.HandlerFunc(p.Status.ServeJSON))
	p.Admin.Handle("GET /{$}", http.HandlerFunc(p.Status.ServePage))
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_build_info", Help: "Always 1; labels say what runs.",
		ConstLabels: prometheus.Labels{"version": Version}})
	info.Set(1)
	set.Registry.MustRegister(info)
	p.life = p.components()
	// Not ready until every door is open: the admin listener starts first
	// and answers /readyz from then on, and a load balancer or a restart
	// script must not send to a door that is not listening yet; not ready
	// again once a stop begins, so traffic moves away while it drains.
	set.Health.Register("pipeline", p.lifeState)
	return p, nil
}

// Pipeline states for /readyz.
const (
	stateStarting int32 = iota
	stateRunning
	stateStopping
)

func (p *Pipeline) lifeState() error {
	switch p.state.Load() {
	case stateStarting:
		return errors.New("starting: the receivers open once every component has started")
	case stateStopping:
		return errors.New("stopping")
	}
	return nil
}

// Version is set at build time (-ldflags "-X .../pipeline.Version=...").
var Version = "dev"

// components lists the pipeline's parts in start order (see lifecycle):
// the admin server first, so /metrics and /readyz answer until the end of
// a stop, and the status sampler it serves; the spool's files closed after the exporter has flushed; the
// exporter before the spool reader that feeds it; the queue and the token
// checker before the receivers; the report loop last.
func (p *Pipeline) components() *lifecycle {
	l := &lifecycle{}
	l.add("admin", step{start: func(ctx context.Context) error { return p.Admin.Start(ctx) },
		stop: func(context.Context) error {
			// The admin server has its own short deadline: it is stopped last,
			// when the shared one may be spent, and holds no data.
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return p.Admin.Shutdown(sctx)
		}})
	// Sampled from the start to the end of a stop: the last report, served
	// while the receivers drain, shows the stop itself.
	l.add("telemetry.status", p.Status)
	if p.Spool != nil {
		// Stopped after the exporter: the checkpoint written here records
		// how far Kafka got.
		l.add("delivery.spool", step{stop: func(context.Context) error {
			_ = p.DeadLetter.Close()
			return p.Spool.Close()
		}})
	}
	l.add("exporter", p.Exporter)
	if p.Spool != nil {
		l.add("delivery.spool reader", step{start: p.Spool.Start, stop: p.Spool.Shutdown})
	}
	l.add("queue", p.Queue)
	l.add("auth", p.Auth)
	if p.SpanMetrics != nil {
		// Stopped after the receivers, so the spans of their last requests
		// are in its last flush, which goes through the queue and the
		// exporter, still running.
		l.add("processors.span_metrics", p.SpanMetrics)
	}
	for _, r := range p.Receivers {
		l.add("receivers."+r.Type, r)
	}
	l.add("report", step{
		start: func(context.Context) error { go p.report(); return nil },
		stop:  func(context.Context) error { close(p.stop); <-p.done; return nil }})
	return l
}

// Start starts every component in order; if one fails, those started are
// shut down in reverse and the error names the one that failed.
func (p *Pipeline) Start(ctx context.Context) error {
	if err := p.life.start(ctx); err != nil {
		// Components built but never started hold resources too (the Kafka
		// client's goroutines, the spool's lock).
		p.abandon()
		return err
	}
	attrs := append([]any{"admin", p.Admin.Addr()}, p.Exporter.Describe()...)
	attrs = append(attrs, "memory_limit", p.cfg.Queue.MemoryLimit.String())
	for _, r := range p.Receivers {
		attrs = append(attrs, r.Listening()...)
	}
	p.state.CompareAndSwap(stateStarting, stateRunning)
	p.Set.Logger.Info("ferry started", attrs...)
	return nil
}

// Shutdown stops gracefully within ctx, in the reverse order of Start:
// receivers stop accepting and wait for requests in flight, the spool stops
// reading, the exporter flushes, the spool records how far Kafka got. It may
// be called after a failed Start (it stops nothing twice).
func (p *Pipeline) Shutdown(ctx context.Context) error {
	p.state.Store(stateStopping)
	err := p.life.shutdown(ctx)
	p.logTotals("ferry stopped")
	return err
}

// abandon releases what New built, when New or Start failed: the Kafka
// client's goroutines and connections, the spool's lock and files. What a
// shutdown already released is not released twice.
func (p *Pipeline) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if p.Exporter != nil {
		_ = p.Exporter.Shutdown(ctx)
	}
	if p.DeadLetter != nil {
		_ = p.DeadLetter.Close()
	}
	if p.Spool != nil {
		_ = p.Spool.Close()
	}
}

// Reload applies what can change while running: token keys, rate limits,
// the receivers' auth settings and the Kafka exporter's TLS and SASL
// settings (from its next connection). Data in flight is untouched: requests in
// progress finish under the settings they started with. cfg must be
// validated (config.Load does). Differences in anything else (listeners,
// exporter, queue) need a restart; they are listed in the returned warning
// and not applied.
func (p *Pipeline) Reload(cfg *config.Config) (warning string, err error) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	// Check everything before changing anything, so a bad config changes nothing.
	if _, err := cfg.Auth.Keyring(); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	if err := cfg.RateLimits.Validate(); err != nil {
		return "", fmt.Errorf("rate_limits: %w", err)
	}
	if err := cfg.Processors.Sampler.Validate(); err != nil {
		return "", fmt.Errorf("processors.sampler: %w", err)
	}
	if err := cfg.Processors.Attributes.Validate(); err != nil {
		return "", fmt.Errorf("processors.attributes: %w", err)
	}
	// The exporter applies what it can (TLS files, SASL credentials) and
	// says whether the rest needs a restart; another type always does.
	exporterRestart := cfg.Exporter.Type != p.cfg.Exporter.Type
	if !exporterRestart {
		r, err := p.Exporter.Reload(cfg.Exporter.Config(cfg.Exporter.Type))
		if err != nil {
			return "", fmt.Errorf("exporter.%s: %w", cfg.Exporter.Type, err)
		}
		exporterRestart = r
	}
	if err := p.Auth.SetKeys(cfg.Auth); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	if err := p.Limiter.SetConfig(cfg.RateLimits); err != nil {
		return "", fmt.Errorf("rate_limits: %w", err)
	}
	if err := p.Sampler.SetConfig(cfg.Processors.Sampler); err != nil {
		return "", fmt.Errorf("processors.sampler: %w", err)
	}
	if err := p.Attrs.SetConfig(cfg.Processors.Attributes); err != nil {
		return "", fmt.Errorf("processors.attributes: %w", err)
	}
	var restart []string
	for _, r := range p.Receivers {
		if r.Reload(cfg.Receivers.ReceiverConfig(r.Type)) {
			restart = append(restart, "receivers."+r.Type)
		}
	}
	// A receiver the reload enables or disables.
	cfg.Receivers.Each(func(f receiver.Factory, rc receiver.Config) {
		running := false
		for _, r := range p.Receivers {
			running = running || r.Type == f.Type()
		}
		if running != rc.On() {
			restart = append(restart, "receivers."+f.Type())
		}
	})
	// Span metrics keep the configuration they started with.
	running := p.cfg.Processors.SpanMetrics
	if !reflect.DeepEqual(running, cfg.Processors.SpanMetrics) {
		restart = append(restart, "processors.span_metrics")
	}
	old, next := *p.cfg, *cfg
	old.Auth, next.Auth = auth.Config{}, auth.Config{}
	old.RateLimits, next.RateLimits = ratelimit.Config{}, ratelimit.Config{}
	old.Processors, next.Processors = config.Processors{}, config.Processors{}
	old.Receivers, next.Receivers = config.Receivers{}, config.Receivers{}
	old.Exporter, next.Exporter = config.Exporter{}, config.Exporter{}
	for _, d := range []struct {
		name string
		a, b any
	}{
		{"telemetry", old.Telemetry, next.Telemetry}, {"queue", old.Queue, next.Queue}, {"delivery", old.Delivery, next.Delivery},
		{"exporter", false, exporterRestart}, {"shutdown_timeout", old.ShutdownTimeout, next.ShutdownTimeout},
		{"runtime", old.Runtime, next.Runtime},
	} {
		if !reflect.DeepEqual(d.a, d.b) {
			restart = append(restart, d.name)
		}
	}
	p.cfg.Auth, p.cfg.RateLimits, p.cfg.Processors = cfg.Auth, cfg.RateLimits, cfg.Processors
	p.cfg.Processors.SpanMetrics = running
	p.Set.Logger.Info("configuration reloaded", "applied", "auth keys, rate limits, sampler, attribute filters, receivers' auth, Kafka TLS and SASL")
	if len(restart) > 0 {
		warning = "changes to " + strings.Join(restart, ", ") + " need a restart and were not applied"
		p.Set.Logger.Warn(warning)
	}
	return warning, nil
}

// report logs records and bytes forwarded per interval and the rate.
func (p *Pipeline) report() {
	defer close(p.done)
	iv := p.cfg.Telemetry.ReportInterval
	if iv <= 0 {
		<-p.stop
		return
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	var lastR, lastB float64
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		r, b := p.sum("ferry_exporter_sent_records_total"), p.sum("ferry_exporter_sent_bytes_total")
		attrs := []any{"interval", iv, "records", int64(r - lastR), "bytes", int64(b - lastB),
			"records_per_sec", int64((r - lastR) / iv.Seconds()), "mb_per_sec", fmt.Sprintf("%.2f", (b-lastB)/iv.Seconds()/1e6),
			"queued_bytes", p.Queue.Used(), "kafka_up", p.Exporter.Up()}
		if p.Spool != nil {
			attrs = append(attrs, "spool_backlog_bytes", p.Spool.Backlog(), "spool_disk_bytes", p.Spool.DiskBytes())
		}
		p.Set.Logger.Info("forwarded", attrs...)
		lastR, lastB = r, b
	}
}

func (p *Pipeline) logTotals(msg string) {
	p.Set.Logger.Info(msg, "received_records", int64(p.sum("ferry_receiver_received_records_total")),
		"sent_records", int64(p.sum("ferry_exporter_sent_records_total")),
		"dropped_records", int64(p.sum("ferry_exporter_dropped_records_total")))
}

// sum adds up every series of a counter in the registry.
func (p *Pipeline) sum(name string) float64 {
	mfs, err := p.Set.Registry.Gather()
	if err != nil {
		return 0
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += counterValue(m)
		}
	}
	return total
}

func counterValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return 0
}

// cluster is what the Kafka front mirrors: the destination's topics as
// the exporter describes them (the blackhole takes any topic, as one
// partition).
func (p *Pipeline) cluster() receiver.Topics {
	return func(ctx context.Context, topics []string) ([]receiver.TopicInfo, error) {
		got, err := p.Exporter.Partitions(ctx, topics)
		out := make([]receiver.TopicInfo, len(got))
		for i, t := range got {
			out[i] = receiver.TopicInfo{Topic: t.Topic, ID: t.ID, Partitions: t.Partitions, Err: t.Err}
		}
		return out, err
	}
}
