package kafkaexporter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"reflect"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/exporter"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the Kafka exporter's factory (exporter.type: kafka).
func NewFactory() exporter.Factory { return factory{} }

func (factory) Type() string               { return "kafka" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() exporter.Config { return &Config{} }
func (factory) Create(cfg exporter.Config, env exporter.Env) (exporter.Exporter, error) {
	given := *cfg.(*Config)
	run := given
	if env.Spooled {
		// Nobody waits for Kafka's ack: batches always wait the spool's
		// linger, which is what saves the fleet's brokers requests.
		run.Linger, run.LingerMode = env.SpoolLinger, "fixed"
	}
	e, err := New(run, env.Set, env.BufferedBytes)
	if err != nil {
		// Not a nil *Exporter in a non-nil interface.
		return nil, err
	}
	e.given = given
	e.want = env.Topics
	if env.ExactlyOnce != nil {
		if why := cfg.Limits().NoExactlyOnce; why != "" {
			_ = e.Shutdown(context.Background())
			return nil, errors.New(why)
		}
		if err := e.enableExactlyOnce(*env.ExactlyOnce); err != nil {
			_ = e.Shutdown(context.Background())
			return nil, err
		}
	}
	return e, nil
}

// Check validates the section against the agent's bounds.
func (c *Config) Check(b exporter.Bounds) []error {
	errs := c.problems()
	if mb := int64(c.MaxBufferedBytes); mb != 0 && mb < b.MemoryLimit {
		errs = append(errs, fmt.Errorf("max_buffered_bytes (%s) is below queue.memory_limit (%s): the queue admits what the Kafka client could not take, and requests fail after admission; raise it or leave it 0 (sized from the queue)",
			c.MaxBufferedBytes, bytesize.Size(b.MemoryLimit)))
	}
	return errs
}

// Limits: the largest record is the largest batch; with acks none Kafka
// answers nothing, so no receipt can be true.
func (c *Config) Limits() exporter.Limits {
	l := exporter.Limits{MaxRecordBytes: int64(c.MaxBatchBytes), AutoCreateTopics: c.AutoCreateTopics}
	if c.Acks == "none" {
		l.NoReceipts = NoReceiptsAcksNone
	}
	if c.Acks != "all" || !c.Idempotent {
		// Kafka transactions need the idempotent producer, which needs
		// acks all.
		l.NoExactlyOnce = "exporter.kafka needs acks: all and idempotent: true for Kafka transactions"
	}
	if c.Partitioner == "round_robin" {
		l.KeysIgnored = "exporter.kafka.partitioner is round_robin, which ignores keys and spreads these records over partitions " +
			"(murmur2, the default, and uniform_bytes place records by key)"
	}
	return l
}

// NoReceiptsAcksNone is why receipts are refused with acks none.
const NoReceiptsAcksNone = "exporter.kafka.acks is none: Kafka does not answer, so where a record landed is unknown " +
	"(set acks: all to ask for receipts)"

// Describe is what the start-up line says of the exporter.
func (e *Exporter) Describe() []any { return []any{"kafka", e.cfg.Brokers} }

// Reload applies new TLS and SASL settings from the next connection on
// (files are read first: on error nothing changes) and reports whether
// anything else differs from the configuration the exporter was created
// with. Turning SASL on or off needs a restart.
func (e *Exporter) Reload(cfg exporter.Config) (bool, error) {
	next := *cfg.(*Config)
	if err := e.SetSecurity(next.TLS, next.SASL); err != nil {
		return false, err
	}
	old := e.given
	old.TLS, old.SASL, next.TLS, next.SASL = TLSConfig{}, SASLConfig{}, TLSConfig{}, SASLConfig{}
	return !reflect.DeepEqual(old, next), nil
}
