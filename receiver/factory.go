package receiver

import (
	"context"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/telemetry"
)

// Factory makes one kind of receiver, as the OpenTelemetry Collector's
// receiver factories do: its key under receivers: in YAML, its default
// section, a configuration to decode that section into, and the receiver
// itself, given at creation everything it needs. config decodes
// receivers.<Type> into NewConfig() over DefaultYAML; pipeline calls
// Create. Adding a receiver is its package plus one line in config's list
// of factories.
type Factory interface {
	// Type is the receiver's key under receivers: (http, otlp, local, ...).
	Type() string
	// DefaultYAML is the receiver's commented default section, as it
	// appears under receivers: in `ferry config default` (indented two
	// spaces, starting with "<type>:"). It is the only place its defaults
	// are written.
	DefaultYAML() []byte
	// NewConfig returns a zero configuration to decode the section into.
	NewConfig() Config
	// Create builds the receiver from a configuration that passed Check
	// against env.Bounds; it listens only at Start.
	Create(cfg Config, env Env) (Receiver, error)
}

// Config is one receiver's configuration (a pointer to the package's own
// Config struct).
type Config interface {
	// On reports whether the receiver runs (enabled: true).
	On() bool
	// Check validates the section, also against the agent-wide bounds,
	// and returns every error it finds, each naming its key relative to
	// the section (config adds receivers.<type>).
	Check(b Bounds) []error
	// CheckFiles reads the files the section names (TLS material), for
	// ferry validate.
	CheckFiles() error
}

// FixedTopics is implemented by a Config whose records go to topics its
// configuration names in full (a topic key without placeholders, or with
// only {signal}); the exporter creates those that are missing (exporter.
// kafka.create_topics). A receiver whose clients choose the topic, or
// whose template a request fills in, names none of those: ferry never
// creates a topic a client chose. One method per receiver, no list to
// keep elsewhere.
type FixedTopics interface {
	// FixedTopics is the names, when the receiver is enabled (nil when
	// not).
	FixedTopics() []string
}

// KeyedPlacement is implemented by a Config with settings that keep
// related records on one partition through their Kafka key (a key
// template, OTLP's partition: trace_id). When the exporter's partitioner
// ignores keys (exporter.Limits.KeysIgnored), the configuration warns
// about each: the records are still written, keyed, but spread.
type KeyedPlacement interface {
	// KeyedPlacement is each such setting, when the receiver is enabled:
	// its key relative to the section and what the key keeps together.
	KeyedPlacement() []string
}

// Bounds are the agent-wide facts a receiver's configuration is checked
// against and its derived defaults are computed from, in one place.
type Bounds struct {
	// MemoryLimit is queue.memory_limit: every request's memory comes
	// out of it.
	MemoryLimit int64
	// MaxRecordBytes is the largest record the exporter takes (0: any).
	MaxRecordBytes int64
	// SpoolBytes is delivery.spool.max_bytes when the delivery mode
	// writes requests to disk whole (0: it does not).
	SpoolBytes int64
	// Keys: auth.keys holds at least one key (a token can be checked).
	Keys bool
	// AutoCreateTopics: the exporter creates the topics it is asked for,
	// so a receiver whose clients name topics must list the names allowed.
	AutoCreateTopics bool
}

// Env is what a receiver is built with besides its configuration.
type Env struct {
	Set telemetry.Settings
	// Next receives the receiver's batches.
	Next consumer.Consumer
	// Pre are the shared pre-checks (tokens, rate limits, processors).
	Pre *Prechecks
	// Bodies is the memory budget request bodies reserve from before they
	// are read (nil: unbounded, for tests).
	Bodies httpbody.Budget
	Bounds Bounds
	// Topics describes the real cluster's topics, for a receiver that
	// mirrors them to its clients (the Kafka front).
	Topics Topics
	// WatchShrink, when set, calls fn with a topic and partition each
	// time Kafka refuses a record for a partition the topic no longer has
	// (the exporter's exporter.ShrinkWatcher); fn must not block; stop
	// ends it.
	WatchShrink func(fn func(topic string, partition int32)) (stop func())
	// Receipts answers for records the spool took before Kafka had them
	// (GET /receipts/{id}); nil in delivery mode kafka.
	Receipts *receipt.Store
	// NoReceipts, when set, says why no receipt can be given (the
	// exporter's Limits: Kafka with acks none answers nothing): a request
	// that asks for one is refused for good, reason receipts_unavailable.
	NoReceipts string
	// Idem remembers the idempotency keys of accepted requests (delivery
	// mode spool, where the spool keeps them durable with the records);
	// nil in the other modes, where a request with a key is refused.
	Idem *idempotency.Store
}

// Receiver is a receiver built by its factory.
type Receiver interface {
	// Start binds the listeners; Shutdown stops accepting, answers what is
	// in flight and returns within ctx.
	Start(ctx context.Context) error
	Shutdown(ctx context.Context) error
	// Listening is where it serves, as key/value pairs for the start line.
	Listening() []any
	// Reload applies what a reload may change while running (its token
	// settings) and says whether anything else in cfg differs from the
	// configuration it runs with (that needs a restart).
	Reload(cfg Config) (restart bool)
}

// TopicInfo is one real topic as the cluster describes it.
type TopicInfo struct {
	Topic      string
	ID         [16]byte
	Partitions int32
	// Err is the cluster's error for the topic (nil: it exists).
	Err error
}

// Topics asks the real cluster for topics' partitions (nil: all topics).
type Topics func(ctx context.Context, topics []string) ([]TopicInfo, error)
