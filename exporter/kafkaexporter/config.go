package kafkaexporter

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferryhq/ferry/bytesize"
)

// Config is the user configuration of the Kafka exporter (YAML
// exporter.kafka). Defaults live in this package's default.yaml, which
// `ferry config default` prints in its place.
type Config struct {
	Brokers  []string `yaml:"brokers"`
	ClientID string   `yaml:"client_id"`
	// Acks: "all" (default; required for idempotence), "leader" or "none".
	Acks       string `yaml:"acks"`
	Idempotent bool   `yaml:"idempotent"`
	// Compression: none, gzip, snappy, lz4 (default) or zstd; level 0 = codec default.
	Compression      string `yaml:"compression"`
	CompressionLevel int    `yaml:"compression_level"`
	// Linger is how long a partition's batch may wait for more records:
	// always in LingerMode fixed, only while Kafka is busy in adaptive.
	Linger time.Duration `yaml:"linger"`
	// LingerMode: adaptive (default; "" too) sends at once while no
	// broker has a produce request in flight and lingers up to Linger
	// only while one has or the brokers queue (adaptive.go); fixed always
	// lingers.
	LingerMode string `yaml:"linger_mode"`
	// MaxBatchBytes is the largest record batch sent to a partition, and so
	// the largest record accepted. Keep it ≤ the broker's message.max.bytes.
	MaxBatchBytes bytesize.Size `yaml:"max_batch_bytes"`
	// MaxBufferedBytes bounds the Kafka client's own buffer. 0 = derived from
	// the queue's memory_limit, so that the queue, not the client, is the bound
	// and producing never blocks.
	MaxBufferedBytes bytesize.Size `yaml:"max_buffered_bytes"`
	// Partitioner: murmur2 (Java-client compatible for keyed records, sticky
	// for keyless), round_robin, or uniform_bytes (KIP-480 sticky by bytes).
	Partitioner     string        `yaml:"partitioner"`
	RequestTimeout  time.Duration `yaml:"request_timeout"`
	DialTimeout     time.Duration `yaml:"dial_timeout"`
	RetryBackoffMax time.Duration `yaml:"retry_backoff_max"`
	// AutoCreateTopics lets the broker create any topic a record names
	// (the broker's auto.create.topics.enable must be on too); the
	// receivers must then list the names allowed.
	AutoCreateTopics bool `yaml:"auto_create_topics"`
	// CreateTopics creates the topics the configuration names in full
	// when they are missing (create.go).
	CreateTopics CreateTopics `yaml:"create_topics"`
	// MaxPendingTopics bounds the topics, not yet confirmed by Kafka, that
	// records may be waiting on at once (each costs the Kafka client a
	// metadata entry and a goroutine); beyond it a batch is refused (429).
	// Topics that turn out not to exist are purged from the client.
	MaxPendingTopics    int           `yaml:"max_pending_topics"`
	HealthCheckInterval time.Duration `yaml:"health_check_interval"`
	TLS                 TLSConfig     `yaml:"tls"`
	SASL                SASLConfig    `yaml:"sasl"`
}

// Validate reports every invalid field, each named by its YAML key.
func (c *Config) Validate() error { return errors.Join(c.problems()...) }

// problems is every invalid field, each named by its YAML key.
func (c *Config) problems() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Brokers) == 0 {
		add("brokers: at least one broker address is required")
	}
	for _, b := range c.Brokers {
		if !strings.Contains(b, ":") {
			add("brokers: %q is not host:port", b)
		}
	}
	switch c.Acks {
	case "all", "leader", "none":
		if c.Idempotent && c.Acks != "all" {
			add("idempotent: requires acks: all (set idempotent: false to use acks: %s)", c.Acks)
		}
	default:
		add("acks: %q is not one of all, leader, none", c.Acks)
	}
	if _, err := compressionCodec(c.Compression, c.CompressionLevel); err != nil {
		add("compression: %w", err)
	}
	switch c.Partitioner {
	case "murmur2", "round_robin", "uniform_bytes":
	default:
		add("partitioner: %q is not one of murmur2, round_robin, uniform_bytes", c.Partitioner)
	}
	if c.Linger < 0 || c.Linger > time.Minute {
		add("linger: %s is outside 0..1m", c.Linger)
	}
	switch c.LingerMode {
	case "", "adaptive", "fixed":
	default:
		add("linger_mode: %q is not one of adaptive, fixed", c.LingerMode)
	}
	if c.MaxBatchBytes < 1024 || c.MaxBatchBytes > 1<<30 {
		add("max_batch_bytes: %s is outside 1KiB..1GiB", c.MaxBatchBytes)
	}
	if c.MaxPendingTopics < 1 {
		add("max_pending_topics: %d is below 1", c.MaxPendingTopics)
	}
	if c.MaxBufferedBytes < 0 {
		add("max_buffered_bytes: must not be negative")
	}
	if c.RequestTimeout < time.Second {
		add("request_timeout: %s is below 1s", c.RequestTimeout)
	}
	if c.DialTimeout <= 0 || c.RetryBackoffMax <= 0 || c.HealthCheckInterval <= 0 {
		add("dial_timeout, retry_backoff_max and health_check_interval must be positive")
	}
	errs = append(errs, c.CreateTopics.problems()...)
	if err := c.TLS.validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.SASL.problems()...)
	if c.SASL.Mechanism == "AWS_MSK_IAM" && !c.TLS.Enabled {
		// MSK serves IAM only over TLS (port 9098); without it a signed
		// request could be read and replayed for its 5 minutes.
		errs = append(errs, errors.New("sasl.mechanism AWS_MSK_IAM needs tls.enabled: true (MSK's IAM listener is TLS, port 9098)"))
	}
	return errs
}
