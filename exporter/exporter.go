// Package exporter holds what every exporter is built with, as package
// receiver does for receivers: the factory contract (Factory, Config,
// Env, Exporter). The exporters are its subpackages: kafkaexporter (Apache
// Kafka, the product's destination) and blackholeexporter (acknowledges
// and discards; benchmarks only).
//
// config decodes exporter.<type> into the factory's NewConfig over its
// DefaultYAML and checks it; pipeline creates the one exporter.type names
// and, on reload, asks it what changed. Adding an exporter is its package
// and one line in config's list of factories.
package exporter

import (
	"context"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Factory makes one kind of exporter.
type Factory interface {
	// Type is the exporter's name: exporter.type, and the key of its
	// section under exporter:.
	Type() string
	// DefaultYAML is its commented default section as it appears under
	// exporter: in `ferry config default` (indented two spaces, starting
	// with "<type>:"), or nil if it has no settings.
	DefaultYAML() []byte
	// NewConfig returns a zero configuration to decode the section into.
	NewConfig() Config
	// Create builds the exporter from a configuration that passed Check;
	// it connects only at Start.
	Create(cfg Config, env Env) (Exporter, error)
}

// Config is one exporter's configuration (a pointer to the package's own
// Config struct).
type Config interface {
	// Check validates the section against the agent-wide bounds and
	// returns every error it finds, each naming its key relative to the
	// section (config adds exporter.<type>).
	Check(b Bounds) []error
	// CheckFiles reads the files the section names (TLS material, secret
	// files), for ferry validate.
	CheckFiles() error
	// Limits are what the rest of the agent must respect of this
	// destination.
	Limits() Limits
}

// Bounds are the agent-wide facts an exporter's section is checked
// against.
type Bounds struct {
	// MemoryLimit is queue.memory_limit: what the pipeline may hand the
	// exporter unanswered.
	MemoryLimit int64
}

// Limits are what the receivers, the queue and the spool must respect of
// the destination.
type Limits struct {
	// MaxRecordBytes is the largest record it takes (0: any).
	MaxRecordBytes int64
	// AutoCreateTopics: it creates the topics it is asked for, so clients
	// that name topics must be held to a list.
	AutoCreateTopics bool
	// NoReceipts, when set, says why this destination cannot tell where
	// a record landed (Kafka with acks none answers nothing): receivers
	// refuse a request for a receipt with it rather than answer made-up
	// places.
	NoReceipts string
	// NoExactlyOnce, when set, says why this destination cannot take
	// part in delivery.guarantee exactly_once.
	NoExactlyOnce string
	// KeysIgnored, when set, says why a record's key does not choose its
	// partition here: settings that keep related records together
	// through their key (receiver.KeyedPlacement) then do not, and the
	// configuration warns about each.
	KeysIgnored string
}

// ExactlyOnce is delivery.exactly_once: how an exporter delivers the
// spool's records exactly once (delivery.guarantee exactly_once). The
// exporter writes them in transactions, each also writing how far in the
// spool it reached to StateTopic; a restart resumes after that.
type ExactlyOnce struct {
	// TransactionalID names this agent's producer to Kafka; "" means
	// "ferry-" and the spool directory's id. Two agents with one id fence
	// each other: the newer one writes, the older one stops.
	TransactionalID string `yaml:"transactional_id"`
	// StateTopic is the compacted topic the positions are committed to,
	// one key per agent; created when missing.
	StateTopic string `yaml:"state_topic"`
	// CommitInterval is how long a transaction gathers records before it
	// commits: records become visible to read_committed consumers about
	// this much later.
	CommitInterval time.Duration `yaml:"commit_interval"`
	// TransactionTimeout is how long Kafka waits for an agent that died
	// in a transaction before aborting it (read_committed consumers of
	// the partitions it wrote wait that long; a restart aborts it at once).
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`

	// SpoolID is the spool directory's id (set by the pipeline): the
	// committed positions are tagged with it and apply to that spool only.
	SpoolID string `yaml:"-"`
}

// Env is what an exporter is built with besides its configuration.
type Env struct {
	Set telemetry.Settings
	// BufferedBytes is queue.memory_limit: the most the pipeline hands the
	// exporter before it answered (its own buffer is sized above it, so
	// the queue is the only bound).
	BufferedBytes int64
	// SpoolLinger, when Spooled, replaces the exporter's own linger (0
	// included): in delivery mode spool no client waits for the answer,
	// so batches wait delivery.spool.linger for more records.
	Spooled     bool
	SpoolLinger time.Duration
	// Topics are the topics the configuration names in full (config's
	// FixedTopics: receivers' fixed topics, the dead-letter topic); an
	// exporter that can creates those missing (exporter.kafka.create_topics).
	// Never a name a client chose.
	Topics []string
	// ExactlyOnce, when set, asks for delivery.guarantee exactly_once:
	// the spool's batches (Spooled, with End) are delivered in
	// transactions, and the exporter implements Resumer.
	ExactlyOnce *ExactlyOnce
}

// Resumer is an exporter that knows how far Kafka committed the spool
// (exactly once): the spool's reader starts there (spool.Links.Resume).
type Resumer interface {
	Committed(ctx context.Context) (record.SpoolPos, bool, error)
}

// Exporter is the pipeline's last stage: it completes each record of a
// batch it consumed when its destination answered for it.
type Exporter interface {
	consumer.Consumer
	// Start connects in the background; Shutdown flushes what it holds
	// within ctx and counts what is left.
	Start(ctx context.Context) error
	Shutdown(ctx context.Context) error
	// Up reports whether the destination is reachable (a full queue
	// answers 429 while it is, 503 while it is not).
	Up() bool
	// Partitions describes the destination's topics (nil: all of them),
	// for receivers that mirror them to their clients (the Kafka front).
	Partitions(ctx context.Context, topics []string) ([]TopicInfo, error)
	// Describe is what the start-up line says of it, as key/value pairs.
	Describe() []any
	// Reload applies what a reload may change while running and says
	// whether anything else in cfg differs from the configuration it runs
	// with (that needs a restart). An error changes nothing.
	Reload(cfg Config) (restart bool, err error)
}

// ShrinkWatcher is implemented by an exporter that can tell when a topic
// has fewer partitions than a record was placed for (deleted and created
// again with fewer): receivers that cache partition counts drop the
// topic's (the OTLP receiver's trace_partition grouping), whatever the
// delivery mode, so that new requests are not placed by the old count.
type ShrinkWatcher interface {
	// WatchShrink calls fn with the topic and partition each time Kafka
	// refuses a record for a partition its topic no longer has. fn runs
	// in the Kafka client's promise goroutine: it must not block. stop
	// ends it.
	WatchShrink(fn func(topic string, partition int32)) (stop func())
}

// TopicInfo is one topic as the destination describes it.
type TopicInfo struct {
	Topic      string
	ID         [16]byte
	Partitions int32
	// Err is the destination's answer for the topic (nil: it exists).
	Err error
}
