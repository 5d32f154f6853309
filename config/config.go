package config

import (
	"fmt"
	"net"
	"time"

	"github.com/ferryhq/ferry/admin"
	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/buffer/memqueue"
	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/exporter/kafkaexporter"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/processor/sampler"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"github.com/ferryhq/ferry/receiver/kafkafront"
	"github.com/ferryhq/ferry/receiver/localreceiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/routing"
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

// Telemetry is logs and the summary line (package telemetry) and the admin
// listener (package admin).
type Telemetry struct {
	telemetry.Config `yaml:",inline"`
	Admin            admin.Config `yaml:"admin"`
}

// Receivers holds every receiver's section.
type Receivers struct {
	HTTP  httpreceiver.Config  `yaml:"http"`
	OTLP  otlpreceiver.Config  `yaml:"otlp"`
	Local localreceiver.Config `yaml:"local"`
	Kafka kafkafront.Config    `yaml:"kafka"`
}

// Processors configures the processing stages.
type Processors struct {
	Sampler    sampler.Config    `yaml:"sampler"`
	Attributes attributes.Config `yaml:"attributes"`
}

// Delivery chooses when a client is answered and whether a disk spool
// sits between the receivers and Kafka (docs/reliability.md).
type Delivery struct {
	// Mode: kafka (answer after Kafka's ack; no disk), spool (answer after
	// the spool append under its fsync policy; Kafka is fed from the
	// spool) or spill (memory first; disk when the queue is full or Kafka
	// is unreachable).
	Mode       string            `yaml:"mode"`
	Spool      spool.Config      `yaml:"spool"`
	DeadLetter deadletter.Config `yaml:"dead_letter"`
}

// Exporter selects and configures the exporter.
type Exporter struct {
	Type  string               `yaml:"type"`
	Kafka kafkaexporter.Config `yaml:"kafka"`
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

// Validate checks every section and names the failing key by its full path.
func (c *Config) Validate() error {
	wrap := func(prefix string, err error) error {
		if err != nil {
			return fmt.Errorf("config: %s.%w", prefix, err)
		}
		return nil
	}
	if err := wrap("telemetry", c.Telemetry.Config.Validate()); err != nil {
		return err
	}
	if err := wrap("telemetry.admin", c.Telemetry.Admin.Validate()); err != nil {
		return err
	}
	if err := wrap("receivers.http", c.Receivers.HTTP.Validate()); err != nil {
		return err
	}
	if err := wrap("receivers.otlp", c.Receivers.OTLP.Validate()); err != nil {
		return err
	}
	if err := wrap("receivers.local", c.Receivers.Local.Validate()); err != nil {
		return err
	}
	if err := wrap("receivers.kafka", c.Receivers.Kafka.Validate()); err != nil {
		return err
	}
	if k := c.Receivers.Kafka; k.Enabled && k.MaxDecompressedBytes > c.Queue.MemoryLimit/2 {
		return fmt.Errorf("config: receivers.kafka.max_decompressed_bytes (%s) exceeds half of queue.memory_limit (%s): a compressed request may reserve it for its decompressed batches", k.MaxDecompressedBytes, c.Queue.MemoryLimit)
	}
	if l := c.Receivers.Local; l.Enabled && l.MaxFrameBytes != 0 && l.MaxFrameBytes > c.Queue.MemoryLimit/2 {
		return fmt.Errorf("config: receivers.local.max_frame_bytes (%s) exceeds half of queue.memory_limit (%s): a compressed frame reserves the limit for its decompressed body", l.MaxFrameBytes, c.Queue.MemoryLimit)
	}
	if c.Receivers.OTLP.Enabled && c.Receivers.OTLP.MaxRequestBytes > c.Queue.MemoryLimit/2 {
		return fmt.Errorf("config: receivers.otlp.max_request_bytes (%s) exceeds half of queue.memory_limit (%s): an OTLP request holds its bytes and their encoding",
			c.Receivers.OTLP.MaxRequestBytes, c.Queue.MemoryLimit)
	}
	if c.Receivers.OTLP.Enabled && c.Receivers.OTLP.MaxExpandedBytes != 0 && c.Receivers.OTLP.MaxExpandedBytes > c.Queue.MemoryLimit {
		return fmt.Errorf("config: receivers.otlp.max_expanded_bytes (%s) exceeds queue.memory_limit (%s): such a request could never be accepted",
			c.Receivers.OTLP.MaxExpandedBytes, c.Queue.MemoryLimit)
	}
	if err := wrap("queue", c.Queue.Validate()); err != nil {
		return err
	}
	switch c.Delivery.Mode {
	case "kafka":
	case "spool", "spill":
		if err := wrap("delivery.spool", c.Delivery.Spool.Validate()); err != nil {
			return err
		}
		if err := wrap("delivery.dead_letter", c.Delivery.DeadLetter.Validate()); err != nil {
			return err
		}
		if ra := c.Delivery.Spool.ReadAhead; ra != 0 && (ra > c.Queue.MemoryLimit || ra < 2*c.Exporter.Kafka.MaxBatchBytes) {
			return fmt.Errorf("config: delivery.spool.read_ahead (%s) must be between two exporter.kafka.max_batch_bytes (%s) and queue.memory_limit (%s)",
				ra, 2*c.Exporter.Kafka.MaxBatchBytes, c.Queue.MemoryLimit)
		}
		// The reader holds what it read until Kafka answers, from the
		// queue's memory: it must be able to hold two of the largest records
		// at once (read_ahead 0 is half of memory_limit).
		if c.Delivery.Spool.ReadAhead == 0 && c.Queue.MemoryLimit/2 < 2*c.Exporter.Kafka.MaxBatchBytes {
			return fmt.Errorf("config: queue.memory_limit (%s) must be at least four exporter.kafka.max_batch_bytes (%s) in %s mode: the spool reader takes half of it and must hold two of the largest records",
				c.Queue.MemoryLimit, 4*c.Exporter.Kafka.MaxBatchBytes, c.Delivery.Mode)
		}
		// A request is appended whole: one larger than the spool can never be.
		for _, r := range []struct {
			key string
			on  bool
			max bytesize.Size
		}{{"receivers.http.max_request_bytes", c.Receivers.HTTP.Enabled, c.Receivers.HTTP.MaxRequestBytes},
			{"receivers.otlp.max_request_bytes", c.Receivers.OTLP.Enabled, c.Receivers.OTLP.MaxRequestBytes},
			{"receivers.local.max_frame_bytes", c.Receivers.Local.Enabled, c.Receivers.Local.MaxFrameBytes},
			{"receivers.kafka.max_request_bytes", c.Receivers.Kafka.Enabled, c.Receivers.Kafka.MaxRequestBytes}} {
			if r.max == 0 { // derived: at most a quarter of memory_limit
				continue
			}
			if r.on && c.Delivery.Spool.MaxBytes < 2*r.max {
				return fmt.Errorf("config: delivery.spool.max_bytes (%s) must be at least two %s (%s): a request is appended whole",
					c.Delivery.Spool.MaxBytes, r.key, 2*r.max)
			}
		}
	default:
		return fmt.Errorf("config: delivery.mode: %q is not one of kafka, spool, spill", c.Delivery.Mode)
	}
	if c.Exporter.Type != "kafka" && c.Exporter.Type != "blackhole" {
		return fmt.Errorf("config: exporter.type: %q is not one of kafka, blackhole", c.Exporter.Type)
	}
	if err := wrap("exporter.kafka", c.Exporter.Kafka.Validate()); err != nil {
		return err
	}
	if mb := c.Exporter.Kafka.MaxBufferedBytes; mb != 0 && mb < c.Queue.MemoryLimit {
		return fmt.Errorf("config: exporter.kafka.max_buffered_bytes (%s) is below queue.memory_limit (%s): the queue admits what the Kafka client could not take, and requests fail after admission; raise it or leave it 0 (sized from the queue)",
			mb, c.Queue.MemoryLimit)
	}
	if c.Telemetry.Admin.Pprof && !loopback(c.Telemetry.Admin.Listen) {
		return fmt.Errorf("config: telemetry.admin.pprof is on and telemetry.admin.listen (%s) is not a loopback address: the profiler would be open to the network", c.Telemetry.Admin.Listen)
	}
	if c.Exporter.Kafka.AutoCreateTopics {
		// Creation only for names an operator allowed, never for whatever
		// a client sends.
		for _, r := range []struct {
			name    string
			on      bool
			allowed []string
		}{{"receivers.http", c.Receivers.HTTP.Enabled, c.Receivers.HTTP.Topics}, {"receivers.otlp", c.Receivers.OTLP.Enabled, c.Receivers.OTLP.Topics}} {
			if a, err := routing.NewAllow(r.allowed); r.on && err == nil && a.Any() {
				return fmt.Errorf("config: exporter.kafka.auto_create_topics is on but %s.topics allows any name: list the patterns that may be created", r.name)
			}
		}
	}
	if err := wrap("auth", c.Auth.Validate()); err != nil {
		return err
	}
	if err := wrap("rate_limits", c.RateLimits.Validate()); err != nil {
		return err
	}
	if err := wrap("processors.sampler", c.Processors.Sampler.Validate()); err != nil {
		return err
	}
	if err := wrap("processors.attributes", c.Processors.Attributes.Validate()); err != nil {
		return err
	}
	for _, r := range []struct {
		name string
		rc   auth.ReceiverConfig
	}{{"receivers.http", c.Receivers.HTTP.Auth}, {"receivers.otlp", c.Receivers.OTLP.Auth}} {
		if r.rc.Mode != "none" && r.rc.Mode != "" && len(c.Auth.Keys) == 0 {
			return fmt.Errorf("config: %s.auth.mode is %s but auth.keys is empty: add a key (ferry token keygen)", r.name, r.rc.Mode)
		}
	}
	if c.ShutdownTimeout < time.Second {
		return fmt.Errorf("config: shutdown_timeout: %s is below 1s", c.ShutdownTimeout)
	}
	if c.Receivers.HTTP.MaxRequestBytes > c.Queue.MemoryLimit {
		return fmt.Errorf("config: receivers.http.max_request_bytes (%s) exceeds queue.memory_limit (%s): such a request could never be accepted",
			c.Receivers.HTTP.MaxRequestBytes, c.Queue.MemoryLimit)
	}
	return nil
}
