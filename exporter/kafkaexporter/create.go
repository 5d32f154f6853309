package kafkaexporter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// CreateTopics is exporter.kafka.create_topics: the topics ferry's own
// configuration names in full (each receiver's fixed topic, the OTLP
// signals' topics, the dead-letter topic: exporter.Env.Topics) are created
// when Kafka is reached and they are missing. A topic a client names, or
// a request fills into a template, is never created here.
type CreateTopics struct {
	Enabled bool `yaml:"enabled"`
	// Partitions and ReplicationFactor of a created topic; -1 is the
	// cluster's default (num.partitions, default.replication.factor; Kafka
	// 2.4 and later).
	Partitions        int `yaml:"partitions"`
	ReplicationFactor int `yaml:"replication_factor"`
}

func (c *CreateTopics) problems() []error {
	var errs []error
	if c.Partitions != -1 && (c.Partitions < 1 || c.Partitions > 100000) {
		errs = append(errs, fmt.Errorf("create_topics.partitions: %d is neither -1 (the cluster's default) nor within 1..100000", c.Partitions))
	}
	if c.ReplicationFactor != -1 && (c.ReplicationFactor < 1 || c.ReplicationFactor > 32767) {
		errs = append(errs, fmt.Errorf("create_topics.replication_factor: %d is neither -1 (the cluster's default) nor within 1..32767", c.ReplicationFactor))
	}
	return errs
}

// createRetry is how soon a creation round that could not ask Kafka (a
// request failed, not a broker's refusal) is tried again.
var createRetry = 10 * time.Second

// creator creates the configured topics that are missing each time Kafka
// becomes reachable (the probe signals e.reached), off the data path: a
// record for a topic still being created waits in the Kafka client, which
// finds the topic at its next metadata refresh.
func (e *Exporter) creator() {
	defer e.wg.Done()
	var retry <-chan time.Time
	for {
		select {
		case <-e.stop:
			return
		case <-e.reached:
		case <-retry:
		}
		retry = nil
		err := e.createMissing()
		// Whatever the round's outcome, records stop waiting for it: a
		// cluster that cannot create (a proxy without the API, no right)
		// must not hold back records for the configured topics that do
		// exist; those for a missing one fail as unknown, as they would
		// without create_topics.
		e.openGate()
		if err != nil {
			e.set.Logger.Warn("could not check the configured topics in Kafka; trying again",
				"component", "exporter/kafka", "in", createRetry, "err", err)
			retry = time.After(createRetry)
		}
	}
}

// createMissing asks Kafka which of the configured topics exist and
// creates the others, logging one line per topic created (INFO) or
// refused (WARN, with the broker's reason). It returns an error only when
// it could not ask: a refusal is not retried until Kafka is reached again.
func (e *Exporter) createMissing() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*e.cfg.RequestTimeout)
	defer cancel()
	go func() {
		select {
		case <-e.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	got, err := e.Partitions(ctx, e.want)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	exists := map[string]bool{}
	for _, t := range got {
		if t.Err == nil {
			exists[t.Topic] = true
		}
	}
	var missing []string
	for _, t := range e.want {
		if !exists[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	adm := kadm.NewClient(e.cl)
	adm.SetTimeoutMillis(int32(e.cfg.RequestTimeout.Milliseconds()))
	ct := e.cfg.CreateTopics
	resp, err := adm.CreateTopics(ctx, int32(ct.Partitions), int16(ct.ReplicationFactor), nil, missing...)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	created := false
	for _, t := range missing {
		r, ok := resp[t]
		switch {
		case !ok:
			e.m.brokerErr.WithLabelValues("create_topic").Inc()
			e.set.Logger.Warn("could not create Kafka topic: the broker did not answer for it", "component", "exporter/kafka", "topic", t)
		case r.Err == nil:
			created = true
			e.m.created.Inc()
			e.set.Logger.Info("created Kafka topic named in the configuration (exporter.kafka.create_topics)", "component", "exporter/kafka",
				"topic", t, "partitions", r.NumPartitions, "replication_factor", r.ReplicationFactor)
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			// Another agent (or an operator) created it meanwhile.
		default:
			e.m.brokerErr.WithLabelValues("create_topic").Inc()
			reason := r.Err.Error()
			if r.ErrMessage != "" {
				reason += ": " + r.ErrMessage
			}
			e.set.Logger.Warn("could not create Kafka topic named in the configuration; records for it fail until it exists (create it with kafka-topics.sh --create --topic "+t+", or give ferry the right to: CREATE on the cluster or the topic)",
				"component", "exporter/kafka", "topic", t, "partitions", ct.Partitions, "replication_factor", ct.ReplicationFactor, "reason", reason)
		}
	}
	if created {
		// Records already waiting for a created topic find it now rather
		// than at the next periodic refresh.
		e.cl.ForceMetadataRefresh()
	}
	return nil
}

// gate holds the batches naming a configured topic from the start until
// the creator's first round is over (Kafka was reached and the topics were
// found, created, refused, or could not be asked about). Without it a
// record for a topic still being created fails: franz-go gives a record up
// after four metadata answers of "unknown topic" (~1.5 s with ferry's retry
// backoff), and on a loaded broker creation takes longer, so an OTLP SDK's
// first export after the agent started was answered 500 unknown_topic on a
// cluster ferry was about to create the topic on (and in exactly-once mode
// such records went to the dead-letter topic). Held batches are bounded by
// the memory they reserved in the queue (queue.memory_limit), like records
// waiting in the Kafka client while Kafka is unreachable; once open the
// gate costs one atomic load per batch.
type gate struct {
	open atomic.Bool
	want map[string]struct{}
	// spooled: every spooled batch is held while the gate is closed
	// (exactly once): a transaction commits the spool position of its last
	// batch, so a later batch for another topic must not commit past a
	// held one.
	spooled bool
	mu      sync.Mutex
	held    []*record.Batch
	// n is the records held (the probe's records_waiting).
	n atomic.Int64
}

func newGate(want []string, spooled bool) *gate {
	g := &gate{want: make(map[string]struct{}, len(want)), spooled: spooled}
	for _, t := range want {
		g.want[t] = struct{}{}
	}
	return g
}

// hold keeps b if the gate is closed and b names a configured topic (or,
// exactly once, is spooled).
func (g *gate) hold(b *record.Batch) bool {
	if g == nil || g.open.Load() {
		return false
	}
	names := g.spooled && b.Spooled
	for i := 0; i < len(b.Records) && !names; i++ {
		if i > 0 && b.Records[i].Topic == b.Records[i-1].Topic {
			continue
		}
		_, names = g.want[b.Records[i].Topic]
	}
	if !names {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open.Load() {
		return false
	}
	g.held = append(g.held, b)
	g.n.Add(int64(len(b.Records)))
	return true
}

// records is how many records the gate holds.
func (g *gate) records() int64 {
	if g == nil {
		return 0
	}
	return g.n.Load()
}

// release opens the gate and returns what it held.
func (g *gate) release() []*record.Batch {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open.Store(true)
	held := g.held
	g.held = nil
	g.n.Store(0)
	return held
}

// openGate hands the held batches on in the order they came, then lets
// batches through. Holding the gate's lock while doing so keeps a batch
// that arrives meanwhile behind them (handing on does not block: TryProduce,
// or the exactly-once queue), so records of one key keep their order; the
// batches that could not be handed on are failed after the lock is let go.
func (e *Exporter) openGate() {
	g := e.gate
	if g == nil || g.open.Load() {
		return
	}
	type failed struct {
		b   *record.Batch
		err error
	}
	var fails []failed
	g.mu.Lock()
	if !g.open.Load() {
		for _, b := range g.held {
			if err := e.dispatch(b); err != nil {
				if b.Spooled {
					// A refusal here (exactly once fenced, the client's
					// buffer full) is no verdict on the records: the spool
					// retries them, as it retries a batch Consume refused,
					// rather than dead-lettering them.
					err = &consumer.RetryableError{Reason: consumer.Reason(err), Msg: err.Error()}
				}
				fails = append(fails, failed{b, err})
			}
		}
		g.held = nil
		g.n.Store(0)
		g.open.Store(true)
	}
	g.mu.Unlock()
	for _, f := range fails {
		e.failBatch(f.b, f.err)
	}
}
