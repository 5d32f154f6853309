package config

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/ferryhq/ferry/admin"
	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/buffer/memqueue"
	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/processor/spanmetrics"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/status"
	"github.com/ferryhq/ferry/telemetry"
)

// Config is the whole agent configuration.
type Config struct {
	Telemetry  Telemetry        `yaml:"telemetry"`
	Receivers  Receivers        `yaml:"receivers"`
	Queue      memqueue.Config  `yaml:"queue"`
	Delivery   Delivery         `yaml:"delivery"`
	Exporter   Exporter         `yaml:"exporter"`
	Auth       auth.Config      `yaml:"auth"`
	RateLimits ratelimit.Config `yaml:"rate_limits"`
	Processors Processors       `yaml:"processors"`
	// ShutdownTimeout bounds a graceful stop: waiting requests, then
	// flushing Kafka. What is not acknowledged by then is counted and logged.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	Runtime         Runtime       `yaml:"runtime"`
}

// Runtime tunes the Go runtime under the agent; it is applied when ferry
// run starts (cmd/ferry), so a change needs a restart.
type Runtime struct {
	// MonitorDeepSleep true: Go's own behaviour. false (the default): ferry
	// run starts itself again with the Go setting that keeps the runtime's
	// monitor thread on its steady tick (default.yaml says what that saves
	// and costs).
	MonitorDeepSleep bool `yaml:"monitor_deep_sleep"`
	// AdaptiveProcs runs Go's scheduler on one core while the agent's load
	// is light and on every core above it (package scheduler).
	AdaptiveProcs bool `yaml:"adaptive_procs"`
}

// Telemetry is logs and the summary line (package telemetry), the admin
// listener (package admin) and the live view it serves (package status).
type Telemetry struct {
	telemetry.Config `yaml:",inline"`
	Admin            admin.Config  `yaml:"admin"`
	Status           status.Config `yaml:"status"`
}

// Processors configures the processing stages.
type Processors struct {
	Sampler    sampler.Config    `yaml:"sampler"`
	Attributes attributes.Config `yaml:"attributes"`
	// SpanMetrics: RED metrics derived from spans (docs/span-metrics.md).
	SpanMetrics spanmetrics.Config `yaml:"span_metrics"`
}

// Delivery chooses when a client is answered and whether a disk spool
// sits between the receivers and Kafka (docs/reliability.md).
type Delivery struct {
	// Mode: kafka (answer after Kafka's ack; no disk), spool (answer after
	// the spool append under its fsync policy; Kafka is fed from the
	// spool) or spill (memory first; disk when the queue is full or Kafka
	// is unreachable).
	Mode string `yaml:"mode"`
	// Guarantee: at_least_once, or exactly_once (mode spool; the
	// exporter writes the spool's records in Kafka transactions and
	// resumes after what Kafka committed).
	Guarantee   string               `yaml:"guarantee"`
	ExactlyOnce exporter.ExactlyOnce `yaml:"exactly_once"`
	Spool       spool.Config         `yaml:"spool"`
	DeadLetter  deadletter.Config    `yaml:"dead_letter"`
	// Receipts bounds the receipts kept for GET /receipts/{id} (spool and
	// spill modes: records answered from the spool before Kafka has them).
	Receipts receipt.Config `yaml:"receipts"`
	// Idempotency bounds the Idempotency-Keys remembered (mode spool,
	// where the spool keeps them durable with their records).
	Idempotency idempotency.Config `yaml:"idempotency"`
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Bounds are the agent-wide facts every receiver's section is checked
// against and derives its defaults from.
func (c *Config) Bounds() receiver.Bounds {
	l := c.Exporter.Limits()
	b := receiver.Bounds{MemoryLimit: int64(c.Queue.MemoryLimit), Keys: len(c.Auth.Keys) > 0,
		AutoCreateTopics: l.AutoCreateTopics, MaxRecordBytes: l.MaxRecordBytes}
	if c.Delivery.Mode == "spool" || c.Delivery.Mode == "spill" {
		b.SpoolBytes = int64(c.Delivery.Spool.MaxBytes)
	}
	return b
}

// FixedTopics is every topic the configuration names in full, for the
// exporter to create when missing (exporter.kafka.create_topics): each
// enabled receiver's (receiver.FixedTopics: one method per receiver) and,
// in the modes that write dead letters, the dead-letter topic. Never a
// name a client chooses or a request fills into a template. Sorted, each
// once.
func (c *Config) FixedTopics() []string {
	seen := map[string]bool{}
	var out []string
	add := func(names []string) {
		for _, n := range names {
			if !seen[n] && routing.ValidTopic(n) {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	c.Receivers.Each(func(_ receiver.Factory, rc receiver.Config) {
		if ft, ok := rc.(receiver.FixedTopics); ok && rc.On() {
			add(ft.FixedTopics())
		}
	})
	if c.Delivery.Mode == "spool" || c.Delivery.Mode == "spill" {
		add(c.Delivery.DeadLetter.FixedTopics())
	}
	sort.Strings(out)
	return out
}

// SpoolRecordBytes is the largest record the spool must hold: the
// exporter's limit or, for an exporter that takes any record (blackhole),
// the spool's own frame bound (8 MiB with its framing).
func (c *Config) SpoolRecordBytes() int64 {
	if m := c.Exporter.Limits().MaxRecordBytes; m > 0 {
		return m
	}
	return 8<<20 - 4096
}

// Warnings are settings that are valid but do not do together what each
// says alone, one sentence each, naming the keys by their full paths:
// ferry validate prints them and ferry run logs them at start.
func (c *Config) Warnings() []string {
	var out []string
	if why := c.Exporter.Limits().KeysIgnored; why != "" {
		c.Receivers.Each(func(f receiver.Factory, rc receiver.Config) {
			if kp, ok := rc.(receiver.KeyedPlacement); ok {
				for _, s := range kp.KeyedPlacement() {
					out = append(out, fmt.Sprintf("receivers.%s.%s, but %s", f.Type(), s, why))
				}
			}
		})
	}
	return out
}

// Validate checks every section and reports every error it finds, each
// naming its key by its full path.
func (c *Config) Validate() error {
	var errs []error
	wrap := func(prefix string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s.%w", prefix, err))
		}
	}
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: "+format, args...)) }
	wrap("telemetry", c.Telemetry.Config.Validate())
	wrap("telemetry.admin", c.Telemetry.Admin.Validate())
	wrap("telemetry.status", c.Telemetry.Status.Validate())
	if c.Telemetry.Admin.Pprof && !loopback(c.Telemetry.Admin.Listen) {
		fail("telemetry.admin.pprof is on and telemetry.admin.listen (%s) is not a loopback address: the profiler would be open to the network", c.Telemetry.Admin.Listen)
	}
	b := c.Bounds()
	maxRecord := bytesize.Size(c.SpoolRecordBytes())
	c.Receivers.Each(func(f receiver.Factory, rc receiver.Config) {
		for _, err := range rc.Check(b) {
			wrap("receivers."+f.Type(), err)
		}
	})
	wrap("queue", c.Queue.Validate())
	switch c.Delivery.Mode {
	case "kafka":
	case "spool", "spill":
		wrap("delivery.spool", c.Delivery.Spool.Validate())
		wrap("delivery.dead_letter", c.Delivery.DeadLetter.Validate())
		wrap("delivery.receipts", c.Delivery.Receipts.Validate())
		if c.Delivery.Mode == "spool" {
			wrap("delivery.idempotency", c.Delivery.Idempotency.Validate())
		}
		if ra := c.Delivery.Spool.ReadAhead; ra != 0 && (ra > c.Queue.MemoryLimit || ra < 2*maxRecord) {
			fail("delivery.spool.read_ahead (%s) must be between two exporter.kafka.max_batch_bytes (%s) and queue.memory_limit (%s)",
				ra, 2*maxRecord, c.Queue.MemoryLimit)
		}
		// The reader holds what it read until Kafka answers, from the
		// queue's memory: it must be able to hold two of the largest records
		// at once (read_ahead 0 is half of memory_limit).
		if c.Delivery.Spool.ReadAhead == 0 && c.Queue.MemoryLimit/2 < 2*maxRecord {
			fail("queue.memory_limit (%s) must be at least four exporter.kafka.max_batch_bytes (%s) in %s mode: the spool reader takes half of it and must hold two of the largest records",
				c.Queue.MemoryLimit, 4*maxRecord, c.Delivery.Mode)
		}
	default:
		fail("delivery.mode: %q is not one of kafka, spool, spill", c.Delivery.Mode)
	}
	switch c.Delivery.Guarantee {
	case "at_least_once":
	case "exactly_once":
		if c.Delivery.Mode != "spool" {
			fail("delivery.guarantee exactly_once needs delivery.mode spool (it is %s): only records in the spool can be resumed after what Kafka committed", c.Delivery.Mode)
		}
		if why := c.Exporter.Limits().NoExactlyOnce; why != "" {
			fail("delivery.guarantee exactly_once: %s", why)
		}
		eo := c.Delivery.ExactlyOnce
		if eo.StateTopic == "" || !routing.ValidTopic(eo.StateTopic) {
			fail("delivery.exactly_once.state_topic: %q is not a Kafka topic name", eo.StateTopic)
		}
		if eo.CommitInterval < time.Millisecond || eo.CommitInterval > 10*time.Second {
			fail("delivery.exactly_once.commit_interval: %s is not between 1ms and 10s", eo.CommitInterval)
		}
		if eo.TransactionTimeout < time.Second || eo.TransactionTimeout < 10*eo.CommitInterval || eo.TransactionTimeout > 15*time.Minute {
			fail("delivery.exactly_once.transaction_timeout: %s must be at least 1s and ten commit intervals, and at most 15m (Kafka's default transaction.max.timeout.ms)", eo.TransactionTimeout)
		}
		for _, t := range c.FixedTopics() {
			if t == eo.StateTopic {
				fail("delivery.exactly_once.state_topic: %q is also a topic records are written to (a receiver's or the dead-letter topic); the state topic holds ferry's positions only", t)
			}
		}
		if len(eo.TransactionalID) > 200 {
			fail("delivery.exactly_once.transactional_id: %d bytes, at most 200", len(eo.TransactionalID))
		}
	default:
		fail("delivery.guarantee: %q is not one of at_least_once, exactly_once", c.Delivery.Guarantee)
	}
	if c.Exporter.Factory() == nil {
		fail("exporter.type: %q is not one of %s", c.Exporter.Type, strings.Join(exporterTypes(), ", "))
	}
	c.Exporter.each(func(f exporter.Factory, ec exporter.Config) {
		for _, err := range ec.Check(exporter.Bounds{MemoryLimit: int64(c.Queue.MemoryLimit)}) {
			wrap("exporter."+f.Type(), err)
		}
	})
	wrap("auth", c.Auth.Validate())
	wrap("rate_limits", c.RateLimits.Validate())
	wrap("processors.sampler", c.Processors.Sampler.Validate())
	wrap("processors.attributes", c.Processors.Attributes.Validate())
	wrap("processors.span_metrics", c.Processors.SpanMetrics.Validate())
	if c.Processors.SpanMetrics.Enabled {
		if rc := c.Receivers.ReceiverConfig("otlp"); rc == nil || !rc.On() {
			fail("processors.span_metrics.enabled is true and receivers.otlp.enabled is false: spans reach span metrics, and their metrics reach Kafka, through the OTLP receiver")
		}
	}
	if c.ShutdownTimeout < time.Second {
		fail("shutdown_timeout: %s is below 1s", c.ShutdownTimeout)
	}
	return errors.Join(errs...)
}
