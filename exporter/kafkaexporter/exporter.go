// Package kafkaexporter owns delivery of record batches to Apache Kafka with
// franz-go.
//
// Guarantees:
//   - A record is reported done (Batch.Ack) only from franz-go's promise: with
//     acks=all that is after every in-sync replica has it. No delivery timeout
//     is set and record retries are unbounded, so while ferry runs a record is
//     retried until Kafka takes it or fails it for a reason retrying cannot fix
//     (too large, unknown topic, authorization); those are reported as
//     consumer.PermanentError.
//   - The idempotent producer is on by default, so broker restarts and retried
//     requests do not duplicate or reorder records within a partition.
//     Records with the same key go to the same partition (murmur2, as the Java
//     client) in the order they were consumed.
//   - Consume never blocks: it uses TryProduce, so if the client's own buffer
//     were ever full the batch fails at once with consumer.ErrFull instead of
//     stalling a receiver. The pipeline sizes that buffer above the queue's
//     memory limit so the queue is the bound users configure.
//   - The exporter starts while Kafka is unreachable; readiness reports it and
//     a line is logged once per interval, not per record.
//   - Batching follows the load (linger_mode adaptive, the default; see
//     adaptive.go): a batch is sent at once while no broker has a produce
//     request of ours in flight, and otherwise waits for that request's
//     answer, at most linger; once the brokers queue, it waits longer, up
//     to linger (pacing). linger_mode fixed always waits linger.
//
// Lifecycle: New builds the client without connecting. Start begins the
// health probe. Consume may be called between Start and Shutdown. Shutdown
// refuses new batches, flushes what is buffered until ctx ends, then closes
// the client, failing what is left; those records are counted as dropped
// with reason shutdown_timeout and the count is logged.
package kafkaexporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Exporter delivers batches to Kafka.
type Exporter struct {
	cfg Config
	// given is the configuration as written (cfg may differ: delivery
	// mode spool replaces the linger), for Reload's comparison.
	given Config
	set   telemetry.Settings
	log   *telemetry.Limited
	// noOffsets: acks none, Kafka answers nothing, so franz-go's offsets
	// are made up (each record's index in its batch).
	noOffsets bool
	cl        *kgo.Client
	m         *metrics
	topics    *telemetry.Labels
	// seen: the partition counts the client's producer partitions with
	// (Partitions answers no more).
	seen *producerCounts

	up      atomic.Bool
	downErr atomic.Pointer[string]
	// lastProduced is when a produce request last succeeded (unix ns): a
	// broker that answers produce requests needs no probe. A probe is a
	// Metadata request, and from every host of a fleet every 2 s they add
	// up (docs/scaling.md).
	lastProduced atomic.Int64
	closing      atomic.Bool
	inflight     atomic.Int64
	// spooled counts the inflight records the spool also holds.
	spooled atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
	pool    sync.Pool
	// promiseFn is e.promise bound once: a method value taken per record
	// would allocate a closure per record.
	promiseFn func(*kgo.Record, error)
	// buffered mirrors the Kafka client's buffered-bytes count (key, value
	// and headers per record), taken for a whole batch before any record is
	// produced and given back by the batch's last promise (so for a while
	// it counts more than the client does, never less): a batch that would
	// overflow the client's buffer is refused whole and TryProduce never
	// fails part of one.
	buffered, maxBuffered int64
	tp                    *topics
	sec                   *security
	shutOnce              sync.Once
	shutErr               error
	// drained is closed when, after Shutdown began, the last record in
	// flight has been answered.
	drained     chan struct{}
	drainedOnce sync.Once
	// want are the topics the configuration names in full, created when
	// missing (create_topics); reached tells the creator Kafka was reached;
	// gate holds their records until the creator's first round is over
	// (nil without create_topics).
	want    []string
	reached chan struct{}
	gate    *gate
	// opts built the client; exactly once builds its transactional
	// client and its state reader from them.
	opts []kgo.Opt
	// bufferedBytes is queue.memory_limit (New's argument).
	bufferedBytes int64
	// eo delivers the spool's batches in transactions
	// (delivery.guarantee exactly_once); nil otherwise.
	eo *exactlyOnce
	// shrink are the functions WatchShrink registered (by key).
	shrinkMu   sync.Mutex
	shrinkNext int
	shrink     map[int]func(topic string, partition int32)
	// ad sends batches before the linger while Kafka is idle
	// (linger_mode adaptive, adaptive.go); nil in fixed mode.
	ad *adaptive
}

// New builds the exporter. bufferedBytes is the queue's memory limit, used to
// size the client's own buffer when max_buffered_bytes is 0.
func New(cfg Config, set telemetry.Settings, bufferedBytes int64) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Exporter{cfg: cfg, given: cfg, noOffsets: cfg.Acks == "none", set: set, stop: make(chan struct{}), drained: make(chan struct{}), topics: set.Topics, tp: newTopics(cfg.MaxPendingTopics),
		reached: make(chan struct{}, 1)}
	e.log = telemetry.NewLimited(set.Logger.With("component", "exporter/kafka"), 30*time.Second)
	e.m = newMetrics(set.Registry)
	e.pool.New = func() any { return &exportBatch{e: e} }
	e.promiseFn = e.promise
	if cfg.LingerMode != "fixed" && cfg.Linger > 0 {
		// Before the client exists: its hooks read e.ad. The flusher
		// runs from Start on, after e.cl is set.
		flush := clientFlush(func(ctx context.Context) error { return e.cl.Flush(ctx) })
		e.ad = newAdaptive(adaptiveBudget, cfg.Linger, flush, e.m.lingerSkipped.Inc)
		e.ad.noMore = !cfg.Idempotent
		set.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_exporter_kafka_linger_pacing_seconds",
			Help:        "How long the adaptive linger lets a batch gather before its early send because the brokers queue (a broker's median round trip of produce requests up to 16 KiB beyond max(2 × its least lately, least + 2 ms)); 0 on an idle cluster; at exporter.kafka.linger every batch waits the linger as in the fixed mode, unless 16 KiB gather first.",
			ConstLabels: prometheus.Labels{"exporter": "kafka"}}, func() float64 { return e.ad.Gap().Seconds() }))
	}

	buffered := int64(cfg.MaxBufferedBytes)
	if buffered == 0 {
		// Above the queue's bound (records carry a little framing the queue
		// does not count), so the queue refuses first and TryProduce never does.
		buffered = bufferedBytes + bufferedBytes/4 + 1<<20
	}
	// TLS and SASL are looked up at each connection (see security), so
	// files are read here once to fail early and again when they change.
	sec := &security{dialTimeout: cfg.DialTimeout, brokers: cfg.Brokers,
		fetched: func(result string) { e.m.tokens.WithLabelValues(result).Inc() },
		authed:  func() { e.m.auths.Inc() },
		warn: func(err error) {
			e.log.Log(slog.LevelWarn, "oauth", "OAUTHBEARER token refresh failed; the current token is still valid and the request is retried", "err", err)
		}}
	if err := sec.set(cfg.TLS, cfg.SASL); err != nil {
		return nil, err
	}
	e.sec = sec
	codec, _ := compressionCodec(cfg.Compression, cfg.CompressionLevel)
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxBatchBytes)),
		kgo.MaxBufferedBytes(int(buffered)),
		// Records are bounded by bytes above; the record count bound only has
		// to be out of the way (one byte per record is the floor).
		kgo.MaxBufferedRecords(int(buffered)),
		kgo.ProduceRequestTimeout(cfg.RequestTimeout),
		kgo.Dialer(sec.dial),
		// RecordRetries and RecordDeliveryTimeout are left at franz-go's
		// defaults, which are unlimited and none: a record is never given up
		// on for being slow. (RecordRetries(-1) would mean zero retries.)
		kgo.RetryBackoffFn(backoff(cfg.RetryBackoffMax)),
		kgo.WithHooks(hooks{e}),
		kgo.WithLogger(kgoLogger{e}),
	}
	if cfg.Compression == "lz4" && cfg.CompressionLevel == 0 {
		// lz4 at its default level: ferry's compressor, same format and about
		// twice as fast (package lz4frame); a level asks for pierrec/lz4's own search.
		opts = append(opts, kgo.WithCompressor(lz4Compressor{}))
	}
	switch cfg.Acks {
	case "all":
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	case "leader":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
	case "none":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
	}
	if cfg.SASL.Mechanism != "" {
		opts = append(opts, kgo.SASL(mechanism{sec}))
		if !cfg.TLS.Enabled {
			set.Logger.Warn("SASL without TLS: the brokers' traffic, and with PLAIN the password or with OAUTHBEARER the token, cross the network in clear",
				"component", "exporter/kafka", "mechanism", cfg.SASL.Mechanism)
		}
	}
	if !cfg.Idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	if cfg.AutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	var part kgo.Partitioner
	switch cfg.Partitioner {
	case "murmur2":
		part = kgo.StickyKeyPartitioner(nil)
	case "round_robin":
		part = kgo.RoundRobinPartitioner()
	case "uniform_bytes":
		part = kgo.UniformBytesPartitioner(64<<10, true, true, nil)
	}
	e.seen = new(producerCounts)
	opts = append(opts, kgo.RecordPartitioner(chosenFirst(part, e.seen)))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		sec.close()
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	e.cl, e.maxBuffered, e.opts, e.bufferedBytes = cl, buffered, opts, bufferedBytes
	set.Health.Register("kafka", e.ready)
	return e, nil
}

// SetSecurity applies new TLS and SASL settings (a reload) from the next
// connection on; connections already authenticated stay as they are. It
// reads the files to check them first: on error nothing changes. Turning
// SASL on or off needs a restart.
func (e *Exporter) SetSecurity(t TLSConfig, s SASLConfig) error {
	if (s.Mechanism == "") != (e.cfg.SASL.Mechanism == "") {
		return errors.New("sasl: turning SASL on or off needs a restart")
	}
	return e.sec.set(t, s)
}

// backoff grows 100ms ×2 up to max; a record is never given up on.
func backoff(max time.Duration) func(int) time.Duration {
	return func(tries int) time.Duration {
		d := 100 * time.Millisecond
		for i := 1; i < tries && d < max; i++ {
			d *= 2
		}
		return min(d, max)
	}
}

func compressionCodec(name string, level int) (kgo.CompressionCodec, error) {
	var c kgo.CompressionCodec
	switch name {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		c = kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		c = kgo.Lz4Compression()
	case "zstd":
		c = kgo.ZstdCompression()
	default:
		return c, fmt.Errorf("%q is not one of none, gzip, snappy, lz4, zstd", name)
	}
	if level != 0 {
		c = c.WithLevel(level)
	}
	return c, nil
}

// Start begins probing the brokers for readiness and, with create_topics,
// creating the configured topics each time Kafka is reached. It does not
// wait for Kafka.
func (e *Exporter) Start(context.Context) error {
	if e.cfg.CreateTopics.Enabled && len(e.want) > 0 {
		e.gate = newGate(e.want, e.eo != nil) // before the goroutines that read it
	}
	e.wg.Add(2)
	go e.probe()
	go e.purger()
	if e.cfg.CreateTopics.Enabled && len(e.want) > 0 {
		e.wg.Add(1)
		go e.creator()
	}
	if e.ad != nil {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.ad.run(e.stop)
		}()
	}
	if e.eo != nil {
		e.eo.start()
	}
	return nil
}

// Up reports whether the last probe reached a broker.
func (e *Exporter) Up() bool { return e.up.Load() }

func (e *Exporter) ready() error {
	if e.up.Load() {
		return nil
	}
	if p := e.downErr.Load(); p != nil {
		return fmt.Errorf("kafka unreachable: %s", *p)
	}
	return errors.New("kafka not reached yet")
}

func (e *Exporter) probe() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.HealthCheckInterval)
	defer t.Stop()
	var downSince time.Time
	for {
		if e.up.Load() && time.Since(time.Unix(0, e.lastProduced.Load())) < e.cfg.HealthCheckInterval {
			select {
			case <-e.stop:
				return
			case <-t.C:
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.DialTimeout+time.Second)
		err := e.cl.Ping(ctx)
		cancel()
		switch {
		case err == nil && !e.up.Load():
			if !downSince.IsZero() {
				e.set.Logger.Info("kafka reachable again", "component", "exporter/kafka", "down_for", time.Since(downSince).Round(time.Second))
			} else {
				e.set.Logger.Info("kafka reachable", "component", "exporter/kafka", "brokers", e.cfg.Brokers)
			}
			e.up.Store(true)
			e.m.up.Set(1)
			downSince = time.Time{}
			select {
			case e.reached <- struct{}{}:
			default: // the creator has one round pending already
			}
		case err != nil:
			if e.up.Load() || downSince.IsZero() {
				downSince = time.Now()
			}
			e.up.Store(false)
			e.m.up.Set(0)
			s := e.sec.describe(err)
			e.downErr.Store(&s)
			e.log.Log(slog.LevelWarn, "down", "kafka unreachable; records are held and retried",
				"brokers", e.cfg.Brokers, "since", downSince.Format(time.RFC3339), "records_waiting", e.inflight.Load()+e.gate.records(), "err", s)
		}
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
	}
}

// The exporter's record struct mirrors record.Header exactly; this conversion
// compiles only while the two layouts are identical, which makes the
// zero-copy slice cast in Consume safe.
var _ = kgo.RecordHeader(record.Header{})

// exportBatch carries one batch through franz-go. It implements
// context.Context so it can ride in kgo.Record.Context: that lets one shared
// promise find its batch without a closure or map per record.
type exportBatch struct {
	e    *Exporter
	b    *record.Batch
	recs []kgo.Record
	// unconfirmed[i]: record i's topic was not known when it was produced
	// (empty when all of the batch's topics were known).
	unconfirmed []bool
	// pending counts the records not yet answered; the record that takes
	// it to 0 settles the batch's totals: one set of atomic updates per
	// batch, not per record, on the agent's hottest path.
	pending atomic.Int64
	// failed: records Kafka did not take; failedTopic, failedB: those of
	// them for topic, and their key and value bytes.
	failed, failedTopic, failedB atomic.Int64
	topic                        string
	// Set by produce, read by the last promise: the batch's records and
	// the bytes counted against the client's buffer; of them, those for
	// topic and their key and value bytes (the sent metrics).
	n, size, nTopic, bytesTopic int64
	spooled                     bool
}

func (*exportBatch) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*exportBatch) Done() <-chan struct{}       { return nil }
func (*exportBatch) Err() error                  { return nil }
func (*exportBatch) Value(any) any               { return nil }

// Consume hands every record of b to the Kafka client and returns at once;
// b's completions run when Kafka has answered for all of them.
func (e *Exporter) Consume(_ context.Context, b *record.Batch) error {
	if e.closing.Load() {
		return consumer.ErrShuttingDown
	}
	if e.gate.hold(b) {
		return nil
	}
	return e.dispatch(b)
}

// dispatch sends b the way its delivery asks: in a transaction (exactly
// once, the spool's batches) or straight to the Kafka client.
func (e *Exporter) dispatch(b *record.Batch) error {
	if e.eo != nil && b.Spooled {
		return e.eo.enqueue(b)
	}
	return e.produce(b)
}

// failBatch completes every record of a batch that never reached the
// Kafka client with err, as the promise would: per record, so that a
// receiver or the spool that tracks records (OnFailure) keeps them to
// retry, and counted as dropped unless the spool keeps them.
func (e *Exporter) failBatch(b *record.Batch, err error) {
	b.Arm()
	reason := consumer.Reason(err)
	if !b.Spooled && len(b.Records) > 0 {
		e.log.Log(slog.LevelError, reason, "records not delivered to kafka", "topic", b.Records[0].Topic, "records", len(b.Records), "reason", reason, "err", err)
	}
	for i := range b.Records {
		if !b.Spooled {
			e.m.dropped.WithLabelValues(e.topics.Get(b.Records[i].Topic), reason).Inc()
		}
		b.AckAt(i, err)
	}
}

// produce hands b's records to the Kafka client (Consume's work once b
// may go).
func (e *Exporter) produce(b *record.Batch) error {
	if len(b.Records) == 0 {
		b.Arm()
		b.Fail(nil)
		return nil
	}
	eb, err := e.begin(b)
	if err != nil {
		return err
	}
	// After the last record's promise eb may be back in the pool: the loop
	// has read its slice already and touches nothing of it after that.
	recs, size := eb.recs, eb.size
	for i := range recs {
		e.cl.TryProduce(context.Background(), &recs[i], e.promiseFn)
	}
	if e.ad != nil {
		e.ad.submitted(size)
	}
	return nil
}

// begin takes b's room in the client's buffer, admits its topics, counts
// it in flight and prepares its Kafka records, which point into b.
func (e *Exporter) begin(b *record.Batch) (*exportBatch, error) {
	n := len(b.Records)
	// One pass: the bytes the client's buffer will count, and the records
	// and bytes of the batch's (first) topic, which the last promise adds
	// to the sent metrics at once.
	size, nTopic, bytesTopic := int64(0), int64(0), int64(0)
	topic := b.Records[0].Topic
	for i := range b.Records {
		r := &b.Records[i]
		size += userSize(r)
		if r.Topic == topic {
			nTopic++
			bytesTopic += int64(len(r.Key) + len(r.Value))
		}
	}
	if atomic.AddInt64(&e.buffered, size) > e.maxBuffered {
		atomic.AddInt64(&e.buffered, -size)
		return nil, consumer.ErrFull
	}
	eb := e.pool.Get().(*exportBatch)
	eb.unconfirmed = eb.unconfirmed[:0]
	if err := e.tp.admit(b, &eb.unconfirmed); err != nil {
		atomic.AddInt64(&e.buffered, -size)
		e.pool.Put(eb)
		return nil, err
	}
	eb.b = b
	eb.topic = topic
	if cap(eb.recs) < n {
		eb.recs = make([]kgo.Record, n)
	}
	eb.recs = eb.recs[:n]
	eb.pending.Store(int64(n))
	eb.n, eb.size, eb.spooled = int64(n), size, b.Spooled
	eb.nTopic, eb.bytesTopic = nTopic, bytesTopic
	b.Arm()
	e.inflight.Add(int64(n))
	e.m.inflight.Add(float64(n))
	if b.Spooled {
		e.spooled.Add(int64(n))
	}
	for i := range b.Records {
		r := &b.Records[i]
		kr := &eb.recs[i]
		*kr = kgo.Record{
			Topic:     r.Topic,
			Key:       r.Key,
			Value:     r.Value,
			Timestamp: r.Timestamp,
			Partition: -1,
			Context:   eb,
		}
		if p, ok := r.Partition(); ok {
			kr.Partition = p
		}
		if len(r.Headers) > 0 {
			kr.Headers = *(*[]kgo.RecordHeader)(unsafe.Pointer(&r.Headers))
		}
	}
	return eb, nil
}

// userSize is what the Kafka client counts of a record against its buffer.
func userSize(r *record.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for i := range r.Headers {
		n += len(r.Headers[i].Key) + len(r.Headers[i].Value)
	}
	return int64(n)
}

// promise runs once per record, in the Kafka client's promise goroutine
// (franz-go runs them one at a time; nothing here relies on it). A failed
// record is acknowledged at once, alone; the delivered ones together, by
// the batch's last record, which also settles the batch's metrics and
// buffer bytes: a delivered record costs two atomic updates here (its
// batch's count and the exporter's in-flight count) instead of eight.
func (e *Exporter) promise(kr *kgo.Record, err error) {
	eb := kr.Context.(*exportBatch)
	b := eb.b
	// kr points into eb.recs, which mirrors b.Records index for index.
	idx := int((uintptr(unsafe.Pointer(kr)) - uintptr(unsafe.Pointer(&eb.recs[0]))) / unsafe.Sizeof(kgo.Record{}))
	if len(eb.unconfirmed) > 0 && eb.unconfirmed[idx] {
		e.tp.settle(kr.Topic, err == nil, err != nil && isUnknownTopic(err))
	}
	if err != nil {
		err = e.classify(kr, err, b.Spooled)
		reason := consumer.Reason(err)
		if !b.Spooled {
			e.m.dropped.WithLabelValues(e.topics.Get(kr.Topic), reason).Inc()
			e.log.Log(slog.LevelError, reason, "record not delivered to kafka", "topic", kr.Topic, "reason", reason, "err", err)
		}
		if kr.Topic == eb.topic {
			eb.failedTopic.Add(1)
			eb.failedB.Add(int64(len(kr.Key) + len(kr.Value)))
		}
		eb.failed.Add(1) // before the decrement below: the last record reads it
	} else {
		if b.OnAcked != nil {
			// Kafka-protocol clients are answered their batch's base
			// offset; with acks none Kafka answered nothing and
			// franz-go's offset is an index in its batch, so they are
			// told -1 (unknown), as Kafka answers an offset it lacks.
			off := kr.Offset
			if e.noOffsets {
				off = -1
			}
			b.OnAcked(idx, off)
		}
		if b.Receipt != nil && !e.noOffsets {
			// A client asked where its records went: three stores into
			// slices the receiver sized, no allocation, no I/O. With
			// acks none Kafka answered nothing and franz-go's offset is
			// the record's index in its batch, not a place in Kafka:
			// the receipt says unknown (receivers refuse to ask then).
			b.Receipt.Acked(idx, kr.Topic, kr.Partition, kr.Offset)
		}
		if kr.Topic != eb.topic {
			e.m.sent.WithLabelValues(e.topics.Get(kr.Topic)).Inc()
			e.m.sentBytes.WithLabelValues(e.topics.Get(kr.Topic)).Add(float64(len(kr.Key) + len(kr.Value)))
		}
	}
	spooled := eb.spooled
	var ok, n int64 // the last record: the delivered records it acknowledges, of n
	if eb.pending.Add(-1) == 0 {
		// Every failure was counted before its decrement: totals are final.
		n = eb.n
		ok = n - eb.failed.Load()
		if s := eb.nTopic - eb.failedTopic.Load(); s > 0 {
			t := e.topics.Get(eb.topic)
			e.m.sent.WithLabelValues(t).Add(float64(s))
			e.m.sentBytes.WithLabelValues(t).Add(float64(eb.bytesTopic - eb.failedB.Load()))
		}
		atomic.AddInt64(&e.buffered, -eb.size)
		clear(eb.recs)
		eb.b = nil
		eb.failed.Store(0)
		eb.failedTopic.Store(0)
		eb.failedB.Store(0)
		e.pool.Put(eb)
	}
	// Nothing of eb or kr is touched past this point (the last record may
	// have given eb back), and after the batch's last acknowledgement its
	// owner may reuse it.
	if err != nil {
		if b.OnFailure != nil {
			b.AckAt(idx, err)
		} else {
			b.Ack(err)
		}
	}
	if ok > 0 {
		b.AckN(ok)
	}
	if n > 0 {
		// The gauge follows batches: it may lag a batch's first answers by
		// the time its last one takes.
		e.m.inflight.Sub(float64(n))
	}
	// This record is answered: Shutdown's count of what Kafka never
	// answered stays exact. A batch's last record counts only after its
	// acknowledgement, so a Shutdown that sees nothing in flight has every
	// batch completed.
	if spooled {
		e.spooled.Add(-1)
	}
	if e.inflight.Add(-1) == 0 && e.closing.Load() {
		e.drainedOnce.Do(func() { close(e.drained) })
	}
}

// WatchShrink implements exporter.ShrinkWatcher.
func (e *Exporter) WatchShrink(fn func(topic string, partition int32)) (stop func()) {
	e.shrinkMu.Lock()
	defer e.shrinkMu.Unlock()
	if e.shrink == nil {
		e.shrink = map[int]func(string, int32){}
	}
	k := e.shrinkNext
	e.shrinkNext++
	e.shrink[k] = fn
	return func() {
		e.shrinkMu.Lock()
		delete(e.shrink, k)
		e.shrinkMu.Unlock()
	}
}

// shrunk tells the watchers that topic no longer has partition (in the
// promise goroutine: they do not block).
func (e *Exporter) shrunk(topic string, partition int32) {
	e.shrinkMu.Lock()
	defer e.shrinkMu.Unlock()
	for _, fn := range e.shrink {
		fn(topic, partition)
	}
}

// isUnknownTopic: Kafka says the topic does not exist (or the client
// purged it, which it does only for such topics).
func isUnknownTopic(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) || err.Error() == errPurgedText
}

// errPurgedText is the Kafka client's (unexported) error for a record of a
// topic purged while it was buffered.
const errPurgedText = "topic purged while buffered"

// isStalePartitionChoice is franz-go's refusal of a chosen partition its
// producer does not know (it has no exported error for it;
// TestChosenPartitionWins checks the text still matches).
func isStalePartitionChoice(err error) bool {
	return strings.Contains(err.Error(), "invalid record partitioning choice")
}

// refreshMetadata asks the clients that produce to reload the cluster's
// metadata now rather than at their max age: the exactly-once client is
// its committer's alone, so it is asked through a flag.
func (e *Exporter) refreshMetadata() {
	e.cl.ForceMetadataRefresh()
	if e.eo != nil {
		e.eo.refresh.Store(true)
	}
}

// classify turns a franz-go failure into the consumer error kinds receivers
// understand.
func (e *Exporter) classify(kr *kgo.Record, err error, spooled bool) error {
	switch {
	case errors.Is(err, kgo.ErrMaxBuffered):
		return consumer.ErrFull
	case errors.Is(err, kgo.ErrClientClosed):
		return consumer.ErrShutdownTimeout
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return consumer.TooLarge("record", int64(len(kr.Key)+len(kr.Value)), int64(e.cfg.MaxBatchBytes), err)
	case isUnknownTopic(err):
		return consumer.UnknownTopic(kr.Topic, err)
	case isStalePartitionChoice(err):
		// A partition chosen beyond the ones the producer knows. Partitions
		// never offers more than the producer partitions with, so the topic
		// has fewer partitions than when the record was placed (deleted and
		// created again). A spooled record keeps its partition on disk:
		// retrying cannot bring it back and would hold the spool forever,
		// so it is refused for good and dead-lettered. Any other record's
		// request is encoded again when its client retries, placed within
		// the new count. The refresh lets the next choices see it.
		e.refreshMetadata()
		e.shrunk(kr.Topic, kr.Partition)
		msg := fmt.Sprintf("partition %d of topic %q does not exist (the topic has fewer partitions than when the record was placed): %v", kr.Partition, kr.Topic, err)
		if spooled {
			return &consumer.PermanentError{Reason: "partition_unknown", Kind: consumer.KindUnknownTopic, Msg: msg, Err: err}
		}
		return &consumer.RetryableError{Reason: "partition_unknown", Msg: msg + "; retry", After: 5 * time.Second}
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.InvalidTopicException):
		return &consumer.PermanentError{Reason: "topic_rejected", Msg: fmt.Sprintf("Kafka refused topic %q: %v", kr.Topic, err), Err: err, Kind: consumer.KindForbidden}
	}
	return &consumer.PermanentError{Reason: "kafka_error", Msg: "Kafka failed the record: " + err.Error(), Err: err}
}

// Shutdown refuses new batches, flushes until ctx ends and closes the client.
// It may be called without Start (a pipeline that failed to start releases
// the client this way) and more than once: only the first call acts.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.shutOnce.Do(func() { e.shutErr = e.shutdown(ctx) })
	return e.shutErr
}

func (e *Exporter) shutdown(ctx context.Context) error {
	e.closing.Store(true)
	// Records still waiting for their topic's creation were never handed
	// to Kafka: they fail as a shutdown (a spooled batch stays in the
	// spool for the next start; the others are counted as dropped).
	if held := e.gate.release(); len(held) > 0 {
		n := 0
		for _, b := range held {
			n += len(b.Records)
			e.failBatch(b, consumer.ErrShuttingDown)
		}
		e.set.Logger.Warn("shutdown: records waiting for their configured topic's creation were not sent (reason shutting_down; spooled ones stay in the spool)",
			"component", "exporter/kafka", "records", n)
	}
	if e.eo != nil {
		// The open transaction commits within ctx, or its batches stay
		// in the spool for the next start.
		e.eo.shutdown(ctx)
	}
	ferr := e.cl.Flush(ctx)
	spooled := e.spooled.Load()
	left := e.inflight.Load() - spooled
	if ferr != nil && left > 0 {
		e.set.Logger.Error("shutdown: Kafka did not acknowledge every record in time; they are failed and counted as dropped (reason shutdown_timeout)",
			"component", "exporter/kafka", "records", left)
	}
	if ferr != nil && spooled > 0 {
		e.set.Logger.Info("shutdown: records Kafka has not acknowledged stay in the spool for the next start",
			"component", "exporter/kafka", "records", spooled)
	}
	close(e.stop)
	e.wg.Wait()
	e.cl.Close() // fails whatever is still buffered with ErrClientClosed
	// Those failures reach our promise through franz-go's promise worker,
	// after Close returns: wait for the last one, so every batch is
	// completed and counted before Shutdown reports. They are in-memory
	// callbacks, so when the flush spent ctx they still get a short grace.
	if e.inflight.Load() > 0 {
		wctx := ctx
		if ctx.Err() != nil {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(context.Background(), time.Second)
			defer cancel()
		}
		select {
		case <-e.drained:
		case <-wctx.Done():
			e.set.Logger.Warn("shutdown: some records were still unanswered when the client closed", "component", "exporter/kafka", "records", e.inflight.Load())
		}
	}
	e.sec.close()
	if left > 0 {
		return fmt.Errorf("kafka exporter: %d records not acknowledged at shutdown", left)
	}
	return nil
}

// Inflight is the number of records handed to Kafka and not yet answered.
func (e *Exporter) Inflight() int64 { return e.inflight.Load() }

type metrics struct {
	sent      *prometheus.CounterVec
	sentBytes *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	inflight  prometheus.Gauge
	up        prometheus.Gauge
	latency   prometheus.Histogram
	batchRecs prometheus.Histogram
	batchB    prometheus.Histogram
	batchC    prometheus.Histogram
	brokerErr *prometheus.CounterVec
	// lingerSkipped: early sends of the adaptive linger.
	lingerSkipped prometheus.Counter
	purged        prometheus.Counter
	created       prometheus.Counter
	tokens        *prometheus.CounterVec
	auths         prometheus.Counter
	connects      prometheus.Counter
	// requests by Kafka API key, resolved once: what this agent costs the
	// cluster (docs/scaling.md sizes fleets from these two).
	requests [kmsg.MaxKey + 1]prometheus.Counter
	conns    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	lbl := prometheus.Labels{"exporter": "kafka"}
	m := &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_sent_records_total",
			Help: "Records acknowledged by Kafka.", ConstLabels: lbl}, []string{"topic"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_sent_bytes_total",
			Help: "Key and value bytes acknowledged by Kafka.", ConstLabels: lbl}, []string{"topic"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_dropped_records_total",
			Help: "Records that left ferry without reaching Kafka, by reason.", ConstLabels: lbl}, []string{"topic", "reason"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_exporter_inflight_records",
			Help: "Records handed to the Kafka client and not yet answered (settled per batch, when its last record is answered).", ConstLabels: lbl}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_exporter_kafka_up",
			Help: "1 if the last probe reached a broker.", ConstLabels: lbl}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exporter_kafka_produce_latency_seconds",
			Help: "Produce request round trip to a broker (write to response).", ConstLabels: lbl,
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		batchRecs: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exporter_kafka_batch_records",
			Help: "Records per partition batch written.", ConstLabels: lbl, Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		batchB: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exporter_kafka_batch_bytes",
			Help: "Uncompressed bytes per partition batch written.", ConstLabels: lbl, Buckets: prometheus.ExponentialBuckets(256, 4, 10)}),
		batchC: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exporter_kafka_batch_compressed_bytes",
			Help: "Compressed bytes per partition batch written.", ConstLabels: lbl, Buckets: prometheus.ExponentialBuckets(256, 4, 10)}),
		brokerErr: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_errors_total",
			Help: "Broker connection and request errors (retried), by kind.", ConstLabels: lbl}, []string{"reason"}),
		lingerSkipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_exporter_kafka_linger_skipped_total",
			Help: "Times the adaptive linger sent the buffered batches before the linger: no broker had a produce request in flight, and the brokers did not queue or the pacing gap had passed; or, in a second request, nothing had been handed over for a quarter of the produce round trip lately (exporter.kafka.linger_mode adaptive).", ConstLabels: lbl}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_exporter_kafka_purged_topics_total",
			Help: "Topics that turned out not to exist, removed from the Kafka client's metadata.", ConstLabels: lbl}),
		created: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_exporter_kafka_created_topics_total",
			Help: "Topics named in the configuration that ferry created because they were missing (create_topics).", ConstLabels: lbl}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_kafka_oauth_token_requests_total",
			Help: "Requests to the OAUTHBEARER token endpoint, by result (ok, error).", ConstLabels: lbl}, []string{"result"}),
		// Beyond connects, these are re-authentications of open
		// connections (the brokers' connections.max.reauth.ms, KIP-368).
		auths: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_exporter_kafka_sasl_authentications_total",
			Help: "SASL authentications begun with a broker: one per new connection, one per re-authentication.", ConstLabels: lbl}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_exporter_kafka_connects_total",
			Help: "Connections opened to brokers.", ConstLabels: lbl}),
	}
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exporter_kafka_requests_total",
		Help: "Requests written to brokers, by Kafka API (Produce, Metadata, ...).", ConstLabels: lbl}, []string{"api"})
	for k := range m.requests {
		if name := kmsg.NameForKey(int16(k)); name != "" && name != "Unknown" {
			m.requests[k] = reqs.WithLabelValues(name)
		}
	}
	m.conns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_exporter_kafka_connections",
		Help: "Open connections to brokers.", ConstLabels: lbl})
	reg.MustRegister(m.sent, m.sentBytes, m.dropped, m.inflight, m.up, m.latency, m.batchRecs, m.batchB, m.batchC, m.brokerErr, m.lingerSkipped, m.purged, m.created, m.tokens, m.auths, m.connects, reqs, m.conns)
	return m
}

type hooks struct{ e *Exporter }

var (
	_ kgo.HookBrokerE2E           = hooks{}
	_ kgo.HookProduceBatchWritten = hooks{}
	_ kgo.HookBrokerConnect       = hooks{}
	_ kgo.HookBrokerDisconnect    = hooks{}
	_ kgo.HookBrokerWrite         = hooks{}
)

func (h hooks) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && h.e.ad != nil {
		h.e.ad.written(meta.NodeID)
	}
	if err == nil && key >= 0 && int(key) < len(h.e.m.requests) && h.e.m.requests[key] != nil {
		h.e.m.requests[key].Inc()
	}
}

func (h hooks) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { h.e.m.conns.Dec() }

func (h hooks) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != 0 { // produce requests only
		return
	}
	if h.e.ad != nil {
		h.e.ad.answered(meta.NodeID, e2e.DurationE2E(), e2e.BytesWritten, e2e.Err() == nil)
	}
	if e2e.Err() != nil {
		h.e.m.brokerErr.WithLabelValues("produce_request").Inc()
		return
	}
	h.e.m.latency.Observe(e2e.DurationE2E().Seconds())
	h.e.lastProduced.Store(time.Now().UnixNano())
}

func (h hooks) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	h.e.m.batchRecs.Observe(float64(m.NumRecords))
	h.e.m.batchB.Observe(float64(m.UncompressedBytes))
	h.e.m.batchC.Observe(float64(m.CompressedBytes))
}

func (h hooks) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.e.m.brokerErr.WithLabelValues("connect").Inc()
		return
	}
	h.e.m.conns.Inc()
	h.e.m.connects.Inc()
}

// kgoLogger routes franz-go's own warnings and errors into ferry's log at a
// bounded rate (a down broker makes it log on every reconnect attempt).
type kgoLogger struct{ e *Exporter }

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	lvl := slog.LevelWarn
	if level == kgo.LogLevelError {
		lvl = slog.LevelError
	}
	l.e.log.Log(lvl, "kgo:"+msg, "kafka client: "+msg, kv...)
}
