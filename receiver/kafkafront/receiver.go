// Package kafkafront owns the Kafka-protocol front: a listener that speaks
// enough of Kafka's wire protocol for an unmodified producer (the Java
// client, librdkafka, franz-go) to use ferry as its bootstrap broker, and
// get ferry's tokens, limits, local durability and pooled connections to
// the real cluster with no new library.
//
// What a producer sees. ferry answers ApiVersions with the subset it
// serves; Metadata presents ferry as the one broker leading every
// partition of the real topics, with partition counts (and topic ids)
// mirrored from the cluster; InitProducerId hands out producer ids so
// idempotent producers (the Java default) start; Produce v3 and later
// takes v2 record batches in every codec. Any other API is answered
// UNSUPPORTED_VERSION where its response has a top-level error code, and
// otherwise the connection is closed, as a broker does for a request it
// cannot parse. SASL PLAIN maps the password to an application token.
//
// What happens to the records. Each produce request becomes one
// record.Batch. Every record keeps its key, value, headers, timestamp and
// the partition the client chose (its own partitioner against the mirrored
// counts), so it lands where a direct produce would have put it. A request
// with acks 1 or all is answered when ferry's delivery mode says the
// records are durable (Kafka's acks=all, or the spool's fsync), with the
// base offset Kafka gave when it is known; acks 0 is fire-and-forget and
// counted as such. Answers go out in request order, as Kafka clients
// require, however their acknowledgements arrive.
//
// What a hostile client cannot do. A request's size prefix is checked
// before anything is read; a produce request's bytes are reserved from
// the shared memory budget before they are read, its topic-partitions are
// counted by a walk over the bytes before kmsg decodes them, its record
// counts are checked from the batch headers before records are decoded,
// and decompression stops at max_decompressed_bytes, reserved beforehand.
// Other requests are capped at 64 KiB. A request that does not parse, or
// breaks the protocol, closes the connection and is counted.
//
// Idempotent producers' retries are recognised (sequence.go): a batch
// sent again after ferry delivered it is answered with its offset, not
// delivered twice. In delivery mode spool they are recognised across
// agent restarts too, by keys the spool keeps with the records
// (durable.go).
//
// env.Idem is the idempotency store (delivery mode spool; nil otherwise).
//
// Not served: transactions (a transactional producer is refused at
// InitProducerId), consumers (Fetch, groups), admin APIs.
package kafkafront

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

// nodeID is the broker id ferry presents itself as.
const nodeID = 0

// maxOtherRequest bounds every request but Produce: a producer's
// Metadata request names the few topics it writes to.
const maxOtherRequest = 64 << 10

// Receiver serves the Kafka protocol.
type Receiver struct {
	cfg    Config
	set    telemetry.Settings
	log    *telemetry.Limited
	m      *receivermetrics.Metrics
	body   *httpbody.Reader
	gate   *auth.Gate
	allow  *routing.Allow
	sub    *submit.Submitter
	topics *topicCache
	// watchShrink is the exporter's notice of shrunk topics (nil: none);
	// unwatch ends it.
	watchShrink func(fn func(topic string, partition int32)) (stop func())
	unwatch     func()
	ln          *server.Stream
	batchP      sync.Pool

	// refusals bounds what answers to refused produce requests keep
	// (refusal.go), across all connections: refusalRoom.
	refusals *budget.Budget
	// answers is what connections hold of answers not yet read.
	answers *server.Answers
	// decoding admits a few non-produce requests to kmsg at once.
	decoding chan struct{}

	// seqs hands out producer ids and recognises idempotent producers'
	// retried batches.
	seqs *producers
	// idem, in delivery mode spool (nil otherwise), recognises them
	// across restarts too (durable.go).
	idem *idempotency.Store
}

// New builds the front from a configuration and everything it needs:
// env.Next receives the batches, env.Topics describes the real topics,
// env.Bodies is the budget produce requests reserve from before they are
// read.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	set := env.Set
	r := &Receiver{cfg: cfg, set: set, body: httpbody.NewReader(int64(cfg.MaxRequestBytes)), gate: env.Pre.Gate(cfg.Auth),
		topics: newTopicCache(env.Topics, cfg.MetadataMaxAge), refusals: budget.New(refusalRoom(cfg)),
		decoding: make(chan struct{}, 2*runtime.GOMAXPROCS(0)), seqs: newProducers(50000, 200000), idem: env.Idem,
		watchShrink: env.WatchShrink}
	if env.Bodies != nil {
		r.body.SetBudget(env.Bodies)
	}
	r.log = telemetry.NewLimited(set.Logger.With("component", "receiver/kafka"), 10*time.Second)
	r.m = receivermetrics.New(set.Registry, "kafka")
	r.answers = server.NewAnswers(server.AnswersRoom(env.Bounds.MemoryLimit), r.m.UnreadAnswers())
	r.allow, _ = routing.NewAllow(cfg.Topics) // checked by Validate
	r.batchP.New = func() any { return new(record.Batch) }
	r.sub = &submit.Submitter{Next: env.Next, Bodies: r.body, AckTimeout: cfg.AckTimeout, M: r.m,
		Recycle: func(b *record.Batch) { b.Reset(); r.batchP.Put(b) }}
	r.ln = server.NewStream("kafka", server.StreamConfig{Network: "tcp", Addr: cfg.Listen, MaxConnections: cfg.MaxConnections, TLS: cfg.TLS},
		r.serve, set.Logger, set.Registry)
	return r, nil
}

// Start binds the listener, then listens for the exporter's notices of
// topics that lost partitions (their cached answers are dropped).
func (r *Receiver) Start(ctx context.Context) error {
	if err := r.ln.Start(ctx); err != nil {
		return err
	}
	if r.watchShrink != nil {
		r.unwatch = r.watchShrink(r.topics.forget)
	}
	return nil
}

// Shutdown stops accepting; connections stop reading, answer what they
// have in flight and close, within ctx.
func (r *Receiver) Shutdown(ctx context.Context) error {
	if r.unwatch != nil {
		r.unwatch()
		r.unwatch = nil
	}
	return r.ln.Shutdown(ctx)
}

// Addr is the bound address.
func (r *Receiver) Addr() string { return r.ln.Addr() }

// advertised is the host and port Metadata names.
func (r *Receiver) advertised() (string, int32) {
	a := r.cfg.Advertised
	if a == "" {
		a = r.ln.Addr()
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return a, 9092
	}
	p, _ := strconv.Atoi(port)
	return host, int32(p)
}

func (r *Receiver) serve(ctx context.Context, c net.Conn) {
	newConn(r, ctx, c).run()
}

func (r *Receiver) logWarn(reason, msg string, args ...any) {
	r.log.Log(slog.LevelWarn, reason, msg, args...)
}

func (r *Receiver) String() string { return fmt.Sprintf("kafka front on %s", r.Addr()) }
