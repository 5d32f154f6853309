package kafkaexporter

// Exactly once (delivery.guarantee exactly_once).
//
// At least once, the spool's checkpoint trails Kafka: after a crash the
// records Kafka acknowledged since the last checkpoint are sent again. To
// send each record once, Kafka itself must remember how far in the spool it
// got, atomically with the records: each Kafka transaction carries a run of
// the spool's batches, in spool order, and one state record — this agent's
// key in the compacted state topic, valued with the spool place the last of
// those batches ends at. A transaction commits both or neither, so the
// state topic's last committed value for the key is exactly how far Kafka
// has the spool. At start the spool's reader asks Committed and begins
// there (spool.Links.Resume).
//
// The committer goroutine owns the transactional client: begin, produce
// every queued batch (more join while the transaction is open, for
// commit_interval), produce the state record, flush, commit; then complete
// every batch of the transaction (the spool's watermark moves, its client
// answers have long been given at fsync). Completions run here, never on
// the Kafka client's promise goroutine, which only records outcomes. One
// transaction is open at a time, so transactions commit in spool order and
// the state can never pass a batch that is not committed.
//
// What that costs (BENCHMARKS.md section 6b): the client cannot produce
// the next transaction's records before EndTransaction returns, and on
// Kafka 4 (KIP-890 part 2) each commit bumps the producer epoch, after
// which franz-go sends one batch per partition until the first answer.
// So at every commit the broker path drains and refills: the flush's
// tail, the EndTxn round trip, handing the next transaction's records to
// the client and that first batch, 15-45 ms at 1 KB records against the
// 100-150 ms a 64 MiB transaction takes to send. Nothing else may stall
// between two transactions: completing a committed transaction's batches
// moves the spool's watermark, which must not wait for the spool's append
// lock (it did, up to a second per transaction while 32 clients
// appended).
//
// A failed attempt is aborted and the same batches go again in the next
// one. A record Kafka refuses for good (too large, unknown or refused
// topic) is dead-lettered first, synchronously (record.Batch.DeadLetterNow),
// and left out of the next attempt: the commit that passes it never comes
// before its dead letter is durable. A commit whose outcome is unknown (the
// connection broke) is aborted as franz-go requires and the state topic is
// read again: if it holds this transaction's number, it committed.
//
// Reading the state: Committed first makes the client's producer id, which
// fences any earlier instance with this transactional id and aborts its
// open transaction; then it commits a start record (key id+"/start", a
// random nonce) and reads the state topic's partition read_committed
// backwards in growing windows up to that start record, whose arrival
// proves everything committed before it has been seen. The last value under
// the key is the position. Values carry the spool directory's id and apply
// only to that spool.
//
// Fencing: a second agent with the same transactional id (a copied state
// directory) makes this one's producer fail with PRODUCER_FENCED. If the
// state topic holds a newer start record than ours, this agent stops
// delivering and reports not ready (an operator must sort out which agent
// owns the spool); other fatal producer errors (a transaction Kafka aborted
// after transaction_timeout during a long outage) rebuild the client and
// recover from the state topic.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/record"
)

// The pipeline tells receivers of shrunk topics through this (a wrapped
// exporter that lost it would turn the notices off silently).
var _ exporter.ShrinkWatcher = (*Exporter)(nil)

// stateValue is a state record's value (JSON: an operator can read it with
// any consumer).
type stateValue struct {
	V     int    `json:"v"`
	Kind  string `json:"kind"` // "position" or "start"
	Spool string `json:"spool"`
	Seg   uint64 `json:"seg,omitempty"`
	Off   int64  `json:"off,omitempty"`
	Txn   uint64 `json:"txn,omitempty"`
	Nonce string `json:"nonce,omitempty"`
	Time  string `json:"time"`
}

// stateTopicPartitions is how many partitions a state topic ferry creates
// has: state records of a fleet's agents (a few a second each) spread over
// brokers. An agent's key maps to a partition by the count it finds, so
// the count must not change once agents use the topic.
const stateTopicPartitions = 16

// eoBatch carries one spool batch through a transaction. It is the
// records' kgo.Context so the shared promise finds it without a closure.
type eoBatch struct {
	context.Context
	b    *record.Batch
	recs []kgo.Record
	// errs[i]: record i's failure in the current attempt; out[i]: it was
	// dead-lettered and is left out of later attempts.
	errs []error
	out  []bool
}

type exactlyOnce struct {
	e   *Exporter
	cfg exporter.ExactlyOnce
	id  string
	key []byte
	// nonce marks this instance's start record.
	nonce string

	// maxTxnBytes: a transaction stops taking batches past this much of
	// their memory (a quarter of queue.memory_limit: half the spool's
	// default read-ahead), so the next one fills while it commits.
	maxTxnBytes int64

	cl   *kgo.Client // transactional; the committer's alone after Start
	part int32       // the state topic partition of key
	seq  uint64      // the last committed transaction's number

	mu    sync.Mutex
	queue []*eoBatch
	// closed: shutdown has taken the queue; a batch enqueued later would
	// never be completed, so it is refused (under mu).
	closed bool
	kick   chan struct{}
	pool   sync.Pool

	pending atomic.Int64
	flushed chan struct{}
	// refresh: Partitions found the producer's partition counts behind
	// the cluster's; the committer, cl's only user, refreshes it.
	refresh atomic.Bool

	stop    chan struct{}
	done    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	stopped atomic.Pointer[string] // why delivery stopped for good (fenced)
	left    []*eoBatch             // what run had not committed when it stopped
	startAt atomic.Int64           // offset of this instance's last start record
	// resumed: Committed answered once; resumeErr: why it has not.
	resumed   atomic.Bool
	resumeErr atomic.Pointer[string]
	started   atomic.Bool

	m eoMetrics
	// promiseFn is eo.promise bound once (a method value per record would
	// allocate).
	promiseFn func(*kgo.Record, error)
}

type eoMetrics struct {
	txns   *prometheus.CounterVec
	commit prometheus.Histogram
	fenced prometheus.Gauge
}

func (e *Exporter) enableExactlyOnce(cfg exporter.ExactlyOnce) error {
	id := cfg.TransactionalID
	if id == "" {
		if cfg.SpoolID == "" {
			return errors.New("exactly once: no transactional_id and no spool id")
		}
		id = "ferry-" + cfg.SpoolID
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	eo := &exactlyOnce{e: e, cfg: cfg, id: id, key: []byte(id), nonce: hex.EncodeToString(raw[:]),
		kick: make(chan struct{}, 1), flushed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	eo.ctx, eo.cancel = context.WithCancel(context.Background())
	eo.maxTxnBytes = max(4<<20, e.bufferedBytes/4)
	eo.startAt.Store(-1)
	eo.pool.New = func() any { return &eoBatch{Context: context.Background()} }
	eo.promiseFn = eo.promise
	cl, err := eo.newClient()
	if err != nil {
		return err
	}
	eo.cl = cl
	eo.m = eoMetrics{
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_exactly_once_transactions_total",
			Help: "Kafka transactions of the spool's records, by result: committed, aborted (tried again), unknown (the commit's answer was lost; the state topic decided)."},
			[]string{"result"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exactly_once_transaction_seconds",
			Help:    "Time from a transaction's begin to its commit (records become visible to read_committed consumers at the end).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
		fenced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_exactly_once_fenced",
			Help: "1 when another agent with this transactional id took over and this one stopped delivering."}),
	}
	for _, r := range []string{"committed", "aborted", "unknown"} {
		eo.m.txns.WithLabelValues(r)
	}
	e.set.Registry.MustRegister(eo.m.txns, eo.m.commit, eo.m.fenced)
	e.set.Health.Register("exactly_once", eo.health)
	e.eo = eo
	return nil
}

func (eo *exactlyOnce) newClient() (*kgo.Client, error) {
	opts := append([]kgo.Opt{}, eo.e.opts...)
	opts = append(opts, kgo.TransactionalID(eo.id), kgo.TransactionTimeout(eo.cfg.TransactionTimeout))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka transactional client: %w", err)
	}
	return cl, nil
}

// health: not ready once fenced, and until the committed position was
// read (nothing is sent before: the spool waits for it).
func (eo *exactlyOnce) health() error {
	if p := eo.stopped.Load(); p != nil {
		return errors.New(*p)
	}
	if !eo.resumed.Load() {
		if p := eo.resumeErr.Load(); p != nil {
			return fmt.Errorf("exactly once: how far Kafka committed this spool is not known yet (nothing is sent until it is): %s", *p)
		}
		return errors.New("exactly once: reading how far Kafka committed this spool")
	}
	return nil
}

// enqueue takes a spool batch for the next transaction.
func (eo *exactlyOnce) enqueue(b *record.Batch) error {
	if p := eo.stopped.Load(); p != nil {
		return &consumer.PermanentError{Reason: "fenced", Msg: *p, Kind: consumer.KindUnavailable}
	}
	n := len(b.Records)
	if n == 0 {
		b.Arm()
		b.Fail(nil)
		return nil
	}
	eo.mu.Lock()
	if eo.closed {
		eo.mu.Unlock()
		return consumer.ErrShuttingDown
	}
	tb := eo.pool.Get().(*eoBatch)
	tb.b = b
	tb.recs = resize(tb.recs, n)
	tb.errs = resize(tb.errs, n)
	tb.out = resize(tb.out, n)
	b.Arm()
	eo.e.inflight.Add(int64(n))
	eo.e.m.inflight.Add(float64(n))
	eo.e.spooled.Add(int64(n))
	eo.queue = append(eo.queue, tb)
	eo.mu.Unlock()
	select {
	case eo.kick <- struct{}{}:
	default:
	}
	return nil
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// take moves queued batches into cur while cur holds less than
// maxTxnBytes (at least one batch); full reports that the transaction has
// its share. A transaction holds its batches' memory until it commits: if
// it took the spool's whole read-ahead, the reader would stall through
// every flush and commit; capped at a part of it, the reader fills the
// next transaction meanwhile.
func (eo *exactlyOnce) take(cur []*eoBatch, held *int64) (_ []*eoBatch, full bool) {
	eo.mu.Lock()
	n := 0
	for n < len(eo.queue) && (len(cur) == 0 || *held < eo.maxTxnBytes) {
		*held += eo.queue[n].b.MemBytes
		cur = append(cur, eo.queue[n])
		n++
	}
	rest := copy(eo.queue, eo.queue[n:])
	clear(eo.queue[rest:])
	eo.queue = eo.queue[:rest]
	eo.mu.Unlock()
	return cur, *held >= eo.maxTxnBytes
}

func (eo *exactlyOnce) start() {
	eo.started.Store(true)
	go eo.run()
}

// run is the committer.
func (eo *exactlyOnce) run() {
	var cur []*eoBatch
	defer func() {
		eo.left = cur
		close(eo.done)
	}()
	tries := 0
	for {
		if len(cur) == 0 {
			var held int64
			if cur, _ = eo.take(cur, &held); len(cur) == 0 {
				select {
				case <-eo.stop:
					return
				case <-eo.kick:
				}
				continue
			}
		}
		if eo.stopped.Load() != nil {
			// Fenced: nothing is delivered again by this instance; the
			// batches stay unanswered in the spool for whoever owns it.
			<-eo.stop
			return
		}
		var ok bool
		cur, ok = eo.attempt(cur)
		if ok {
			tries = 0
			continue
		}
		tries++
		select {
		case <-eo.stop:
			return
		case <-time.After(backoff(eo.e.cfg.RetryBackoffMax)(tries)):
		}
	}
}

// attempt runs one transaction over cur (and the batches that join it)
// and completes them if it commits; it returns the batches still to send.
func (eo *exactlyOnce) attempt(cur []*eoBatch) ([]*eoBatch, bool) {
	ctx := eo.ctx
	if eo.refresh.Swap(false) {
		eo.cl.ForceMetadataRefresh()
	}
	if err := eo.cl.BeginTransaction(); err != nil {
		eo.failed("begin", err)
		return cur, false
	}
	began := time.Now()
	var held int64
	for _, tb := range cur {
		held += tb.b.MemBytes
		eo.produce(ctx, tb)
	}
	// More batches join until the interval has passed since the begin, or
	// the transaction has its share of memory.
	timer := time.NewTimer(eo.cfg.CommitInterval)
	defer timer.Stop()
	for open := held < eo.maxTxnBytes; open; {
		select {
		case <-timer.C:
			open = false
		case <-eo.stop:
			open = false
		case <-eo.kick:
			n := len(cur)
			var full bool
			cur, full = eo.take(cur, &held)
			for _, tb := range cur[n:] {
				eo.produce(ctx, tb)
			}
			open = !full
		}
	}
	eo.seq++
	seq := eo.seq
	end := cur[len(cur)-1].b.End
	// The nonce says which instance committed it: after a lost commit
	// answer only a position with this instance's nonce and number proves
	// this transaction committed (another instance with the same id may
	// have committed its own number meanwhile).
	val, _ := json.Marshal(stateValue{V: 1, Kind: "position", Spool: eo.cfg.SpoolID, Seg: end.Seg, Off: end.Off, Txn: seq,
		Nonce: eo.nonce, Time: time.Now().UTC().Format(time.RFC3339Nano)})
	var stateErr atomic.Pointer[error]
	eo.pending.Add(1)
	eo.cl.Produce(ctx, &kgo.Record{Topic: eo.cfg.StateTopic, Partition: eo.part, Key: eo.key, Value: val}, func(_ *kgo.Record, err error) {
		if err != nil {
			stateErr.Store(&err)
		}
		eo.answered()
	})
	ferr := eo.cl.Flush(ctx)
	if !eo.waitAnswered(ctx) {
		// Shutting down with records unanswered: the promises still run
		// (shutdown waits for them); nothing here may read their results.
		eo.seq--
		return cur, false
	}
	var serr error
	if p := stateErr.Load(); p != nil {
		serr = *p
	}
	failed := ferr != nil || serr != nil
	for _, tb := range cur {
		for i := range tb.errs {
			if tb.errs[i] != nil {
				failed = true
			}
		}
	}
	if failed {
		eo.seq--
		eo.abort(ctx)
		eo.m.txns.WithLabelValues("aborted").Inc()
		eo.sortFailures(cur, ferr, serr)
		return cur, false
	}
	err := eo.cl.EndTransaction(ctx, kgo.TryCommit)
	if err != nil {
		// The commit's outcome may be unknown (even a fatal error may come
		// from franz-go's retry of a commit that went through): abort as
		// franz-go asks, then the state topic says whether it committed.
		// Until it has answered the batches cannot go again (they may be
		// in Kafka already).
		if !eo.fatal(err) {
			eo.abort(ctx)
		}
		eo.m.txns.WithLabelValues("unknown").Inc()
		st, ok, rerr := eo.resolve(ctx)
		if rerr != nil {
			eo.seq--
			return cur, false // shutting down or fenced: the spool keeps them
		}
		if !ok || st.Txn < seq || st.Nonce != eo.nonce {
			eo.seq--
			eo.e.log.Log(slog.LevelWarn, "eo-commit", "exactly once: a commit's answer was lost; the state topic says it did not commit; its batches go again", "err", err)
			return cur, false
		}
		eo.e.log.Log(slog.LevelInfo, "eo-commit", "exactly once: a commit's answer was lost; the state topic says it committed", "txn", seq)
	} else {
		eo.m.txns.WithLabelValues("committed").Inc()
	}
	eo.m.commit.Observe(time.Since(began).Seconds())
	eo.complete(cur)
	clear(cur)
	return cur[:0], true
}

// produce hands tb's records (those not dead-lettered) to the
// transactional client. Produce blocks when the client's buffer is full:
// this is the committer's goroutine, not a promise.
func (eo *exactlyOnce) produce(ctx context.Context, tb *eoBatch) {
	b := tb.b
	for i := range b.Records {
		tb.errs[i] = nil
		if tb.out[i] {
			continue
		}
		r := &b.Records[i]
		if r.Topic == eo.cfg.StateTopic {
			// Only ferry writes its positions: a client's record there
			// could make a restart skip what Kafka never had.
			perr := &consumer.PermanentError{Reason: "topic_rejected", Kind: consumer.KindForbidden,
				Msg: fmt.Sprintf("topic %q is the exactly-once state topic (delivery.exactly_once.state_topic); clients cannot write to it", r.Topic)}
			if b.DeadLetterNow != nil && b.DeadLetterNow(i, perr) {
				tb.out[i] = true
			} else {
				tb.errs[i] = perr
			}
			continue
		}
		kr := &tb.recs[i]
		*kr = kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp, Partition: -1, Context: tb}
		if p, ok := r.Partition(); ok {
			kr.Partition = p
		}
		if len(r.Headers) > 0 {
			kr.Headers = *(*[]kgo.RecordHeader)(unsafe.Pointer(&r.Headers))
		}
		eo.pending.Add(1)
		eo.cl.Produce(ctx, kr, eo.promiseFn)
	}
}

// promise records an outcome; in memory only (it runs on the Kafka
// client's promise goroutine).
func (eo *exactlyOnce) promise(kr *kgo.Record, err error) {
	if err != nil {
		tb := kr.Context.(*eoBatch)
		idx := int((uintptr(unsafe.Pointer(kr)) - uintptr(unsafe.Pointer(&tb.recs[0]))) / unsafe.Sizeof(kgo.Record{}))
		tb.errs[idx] = err
	}
	eo.answered()
}

func (eo *exactlyOnce) answered() {
	if eo.pending.Add(-1) == 0 {
		select {
		case eo.flushed <- struct{}{}:
		default:
		}
	}
}

// waitAnswered waits until every record produced in this attempt had its
// promise run (Flush returns when the client's buffer is empty, which may
// be just before the last promise).
func (eo *exactlyOnce) waitAnswered(ctx context.Context) bool {
	for eo.pending.Load() > 0 {
		select {
		case <-eo.flushed:
		case <-ctx.Done():
			// Shutting down: the client is closed after us, which fails
			// (and answers) whatever is left.
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}

// abort ends the open transaction with an abort, retried as franz-go asks
// when its outcome was unknown.
func (eo *exactlyOnce) abort(ctx context.Context) {
	_ = eo.cl.AbortBufferedRecords(ctx)
	eo.waitAnswered(ctx)
	for i := 0; i < 3; i++ {
		err := eo.cl.EndTransaction(ctx, kgo.TryAbort)
		if err == nil || ctx.Err() != nil {
			return
		}
		if eo.fatal(err) {
			eo.failed("abort", err)
			return
		}
	}
}

// resolve reads the committed state until it can (rebuilding the client
// when it cannot go on); an error when shutting down, or when another
// instance with this transactional id has taken over (then this one stops:
// reading would write a start record and fence the newer instance back).
func (eo *exactlyOnce) resolve(ctx context.Context) (stateValue, bool, error) {
	for tries := 1; ; tries++ {
		// Whatever the error: a newer instance may be why the answer was
		// lost, and reading writes a start record that would fence it.
		if eo.stopIfNewer() {
			return stateValue{}, false, errors.New("fenced")
		}
		st, ok, err := eo.read(ctx)
		if err == nil {
			return st, ok, nil
		}
		if ctx.Err() != nil {
			return stateValue{}, false, ctx.Err()
		}
		eo.e.log.Log(slog.LevelWarn, "eo-read", "exactly once: the state topic could not be read; retrying (nothing is sent until it is)", "err", err)
		eo.rebuild()
		select {
		case <-ctx.Done():
			return stateValue{}, false, ctx.Err()
		case <-time.After(backoff(eo.e.cfg.RetryBackoffMax)(tries)):
		}
	}
}

var errBegin = errors.New("begin transaction")

// rebuild replaces the transactional client; the new one's first
// transaction gets a new producer epoch, which aborts whatever the old
// one left open.
func (eo *exactlyOnce) rebuild() {
	cl, err := eo.newClient()
	if err != nil {
		return
	}
	old := eo.cl
	eo.cl = cl
	old.Close()
}

// sortFailures handles the records an aborted attempt failed: a record
// Kafka refuses for good is dead-lettered now and left out of the next
// attempt; every other failure is retried with the whole transaction.
func (eo *exactlyOnce) sortFailures(cur []*eoBatch, ferr, stateErr error) {
	var first error
	for _, tb := range cur {
		for i, err := range tb.errs {
			if err == nil || errors.Is(err, kgo.ErrAborting) {
				continue
			}
			if first == nil {
				first = err
			}
			if eo.fatal(err) {
				continue
			}
			cerr := eo.e.classify(&tb.recs[i], err, true) // always spooled
			var pe *consumer.PermanentError
			if !errors.As(cerr, &pe) || pe.Reason == "kafka_error" || tb.b.DeadLetterNow == nil {
				continue
			}
			if tb.b.DeadLetterNow(i, cerr) {
				tb.out[i] = true
			}
		}
	}
	if first == nil {
		first = stateErr
	}
	if first == nil {
		first = ferr
	}
	if first != nil && eo.fatal(first) {
		eo.failed("produce", first)
		return
	}
	if first != nil {
		eo.e.log.Log(slog.LevelWarn, "eo-abort", "exactly once: a transaction was aborted and goes again", "err", first)
	}
}

// complete answers every batch of a committed transaction.
func (eo *exactlyOnce) complete(cur []*eoBatch) {
	e := eo.e
	for _, tb := range cur {
		b := tb.b
		n := len(b.Records)
		var sent, bytes int64
		topic := ""
		for i := range b.Records {
			kr := &tb.recs[i]
			if !tb.out[i] {
				if b.Receipt != nil {
					b.Receipt.Acked(i, kr.Topic, kr.Partition, kr.Offset)
				}
				if topic == "" {
					topic = kr.Topic
				}
				if kr.Topic == topic {
					sent++
					bytes += int64(len(kr.Key) + len(kr.Value))
				} else {
					e.m.sent.WithLabelValues(e.topics.Get(kr.Topic)).Inc()
					e.m.sentBytes.WithLabelValues(e.topics.Get(kr.Topic)).Add(float64(len(kr.Key) + len(kr.Value)))
				}
			}
		}
		if sent > 0 {
			t := e.topics.Get(topic)
			e.m.sent.WithLabelValues(t).Add(float64(sent))
			e.m.sentBytes.WithLabelValues(t).Add(float64(bytes))
		}
		clear(tb.recs)
		tb.b = nil
		eo.pool.Put(tb)
		for range n {
			b.Ack(nil)
		}
		eo.settle(int64(n))
	}
	e.lastProduced.Store(time.Now().UnixNano())
}

// settle counts n records as answered (the shutdown drain waits for it).
func (eo *exactlyOnce) settle(n int64) {
	e := eo.e
	e.spooled.Add(-n)
	e.m.inflight.Sub(float64(n))
	if e.inflight.Add(-n) == 0 && e.closing.Load() {
		e.drainedOnce.Do(func() { close(e.drained) })
	}
}

// fatal: the producer cannot go on with this client.
func (eo *exactlyOnce) fatal(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
		errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.InvalidProducerIDMapping) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.UnknownProducerID) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// failed handles an error the transactional client cannot go on after:
// fenced by a newer agent with this id, it stops for good; otherwise the
// client is rebuilt (the transaction goes again).
func (eo *exactlyOnce) failed(where string, err error) {
	if !eo.fatal(err) && where != "begin" {
		return
	}
	if eo.ctx.Err() != nil {
		return
	}
	if eo.stopIfNewer() {
		return
	}
	if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		eo.e.log.Log(slog.LevelError, "eo-auth", "exactly once: Kafka refuses this agent's transactional id (it needs WRITE and DESCRIBE on TransactionalId "+eo.id+"); retrying", "err", err)
	}
	eo.e.log.Log(slog.LevelWarn, "eo-fatal", "exactly once: the transactional producer failed; rebuilding it (the transaction goes again)",
		"at", where, "err", err)
	eo.rebuild()
}

// stopIfNewer stops delivery for good when the state topic holds a start
// record of another instance with this transactional id, committed after
// this instance's own: the agent that fenced this one.
func (eo *exactlyOnce) stopIfNewer() bool {
	newer, err := eo.newerStart()
	if err != nil || newer == "" {
		return false
	}
	why := fmt.Sprintf("exactly once: another agent with transactional id %q started (start record %s) and fenced this one; this agent no longer delivers (records stay in its spool): make sure one agent owns the spool directory, then restart", eo.id, newer)
	eo.stopped.Store(&why)
	eo.m.fenced.Set(1)
	eo.e.set.Logger.Error(why, "component", "exporter/kafka")
	return true
}

// Committed is how far Kafka has committed the spool (exporter.Resumer):
// the spool's reader starts there. It fences any earlier instance with
// this transactional id first.
func (e *Exporter) Committed(ctx context.Context) (record.SpoolPos, bool, error) {
	if e.eo == nil {
		return record.SpoolPos{}, false, errors.New("kafka exporter: not in exactly-once mode")
	}
	return e.eo.committed(ctx)
}

func (eo *exactlyOnce) committed(ctx context.Context) (p record.SpoolPos, ok bool, err error) {
	defer func() {
		if err != nil {
			msg := err.Error()
			eo.resumeErr.Store(&msg)
		} else {
			eo.resumed.Store(true)
		}
	}()
	if err := eo.ensureStateTopic(ctx); err != nil {
		return record.SpoolPos{}, false, err
	}
	if eo.stopped.Load() != nil {
		return record.SpoolPos{}, false, errors.New(*eo.stopped.Load())
	}
	st, ok, err := eo.read(ctx)
	if err != nil {
		// The client may be left in a transaction or fenced: a new one
		// for the next try (the committer is idle until this answers).
		if eo.fatal(err) {
			eo.stopIfNewer()
		}
		eo.rebuild()
		return record.SpoolPos{}, false, err
	}
	eo.seq = 0
	if ok {
		eo.seq = st.Txn
	}
	if !ok {
		return record.SpoolPos{}, false, nil
	}
	if st.Spool != eo.cfg.SpoolID {
		eo.e.set.Logger.Warn("exactly once: the state topic's position for this transactional id belongs to another spool directory; starting from this spool's checkpoint",
			"component", "exporter/kafka", "transactional_id", eo.id, "state_spool", st.Spool, "spool", eo.cfg.SpoolID)
		return record.SpoolPos{}, false, nil
	}
	return record.SpoolPos{Seg: st.Seg, Off: st.Off}, true, nil
}

// ensureStateTopic creates the state topic when missing (compacted) and
// finds the partition of this agent's key.
func (eo *exactlyOnce) ensureStateTopic(ctx context.Context) error {
	adm := kadm.NewClient(eo.e.cl)
	adm.SetTimeoutMillis(int32(eo.e.cfg.RequestTimeout.Milliseconds()))
	partitions := func(n int) {
		h := fnv.New32a()
		h.Write(eo.key)
		eo.part = int32(h.Sum32() % uint32(n))
	}
	for i := 0; i < 20; i++ {
		td, err := adm.ListTopics(ctx, eo.cfg.StateTopic)
		if err != nil {
			return fmt.Errorf("state topic metadata: %w", err)
		}
		if t, ok := td[eo.cfg.StateTopic]; ok && t.Err == nil && len(t.Partitions) > 0 {
			partitions(len(t.Partitions))
			return nil
		}
		ct := eo.e.cfg.CreateTopics
		resp, err := adm.CreateTopic(ctx, stateTopicPartitions, int16(ct.ReplicationFactor),
			map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, eo.cfg.StateTopic)
		if err == nil && resp.Err == nil {
			eo.e.set.Logger.Info("created the exactly-once state topic", "component", "exporter/kafka", "topic", eo.cfg.StateTopic,
				"partitions", resp.NumPartitions, "cleanup.policy", "compact")
			partitions(int(resp.NumPartitions))
			return nil
		}
		if err == nil {
			err = resp.Err
		}
		if !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("creating the state topic %s (or create it compacted by hand): %w %s", eo.cfg.StateTopic, err, resp.ErrMessage)
		}
		// Created by another agent a moment ago: its metadata can lag.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("state topic %s: exists but its metadata does not show its partitions", eo.cfg.StateTopic)
}

// read commits a start record and returns the last committed position
// record for this agent's key before it.
func (eo *exactlyOnce) read(ctx context.Context) (stateValue, bool, error) {
	// A transaction of its own: producing it fences earlier instances and
	// aborts their open transaction, and its commit marks the end of what
	// must be read.
	if err := eo.cl.BeginTransaction(); err != nil {
		return stateValue{}, false, fmt.Errorf("%w: %w", errBegin, err)
	}
	val, _ := json.Marshal(stateValue{V: 1, Kind: "start", Spool: eo.cfg.SpoolID, Nonce: eo.nonce, Time: time.Now().UTC().Format(time.RFC3339Nano)})
	res := eo.cl.ProduceSync(ctx, &kgo.Record{Topic: eo.cfg.StateTopic, Partition: eo.part, Key: []byte(eo.id + "/start"), Value: val})
	if err := res.FirstErr(); err != nil {
		_ = eo.cl.EndTransaction(ctx, kgo.TryAbort)
		return stateValue{}, false, fmt.Errorf("start record: %w", err)
	}
	startAt := res[0].Record.Offset
	if err := eo.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		_ = eo.cl.EndTransaction(ctx, kgo.TryAbort)
		return stateValue{}, false, fmt.Errorf("start record commit: %w", err)
	}
	eo.startAt.Store(startAt)
	adm := kadm.NewClient(eo.e.cl)
	starts, err := adm.ListStartOffsets(ctx, eo.cfg.StateTopic)
	if err != nil {
		return stateValue{}, false, fmt.Errorf("state topic offsets: %w", err)
	}
	logStart := int64(0)
	if o, ok := starts.Lookup(eo.cfg.StateTopic, eo.part); ok && o.Err == nil {
		logStart = o.Offset
	}
	for window := int64(1024); ; window *= 4 {
		from := max(logStart, startAt-window)
		st, found, err := eo.scan(ctx, from, startAt, func(v *stateValue) bool { return v.Kind == "position" }, eo.key)
		if err != nil || found {
			return st, found, err
		}
		if from == logStart {
			return stateValue{}, false, nil
		}
	}
}

// scan reads the state partition read_committed from offset from up to
// and including until (a committed record), and returns the last value
// under key that match accepts.
func (eo *exactlyOnce) scan(ctx context.Context, from, until int64, match func(*stateValue) bool, key []byte) (stateValue, bool, error) {
	opts := append([]kgo.Opt{}, eo.e.opts...)
	opts = append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{eo.cfg.StateTopic: {eo.part: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(500*time.Millisecond))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return stateValue{}, false, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, eo.cfg.TransactionTimeout+30*time.Second)
	defer cancel()
	var last stateValue
	found := false
	for {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return stateValue{}, false, fmt.Errorf("reading the state topic up to offset %d: %w", until, err)
		}
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, context.Canceled) && !errors.Is(fe.Err, context.DeadlineExceeded) {
				eo.e.log.Log(slog.LevelWarn, "eo-fetch", "exactly once: reading the state topic", "err", fe.Err)
			}
		}
		reached := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset > until || reached {
				reached = true
				return
			}
			if r.Offset == until {
				reached = true
			}
			if string(r.Key) != string(key) {
				return
			}
			var v stateValue
			if json.Unmarshal(r.Value, &v) == nil && match(&v) {
				last, found = v, true
			}
		})
		if reached {
			return last, found, nil
		}
	}
}

// newerStart reads the state partition after this instance's start
// record for a start record of this transactional id that is not ours:
// the agent that fenced this one. "" when there is none within a few
// seconds (the fence came from Kafka, e.g. a transaction it aborted after
// transaction_timeout; or the read failed, and a later fence asks again).
func (eo *exactlyOnce) newerStart() (string, error) {
	ours := eo.startAt.Load()
	if ours < 0 {
		// No start record of ours yet: nothing can be newer than it.
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := append([]kgo.Opt{}, eo.e.opts...)
	opts = append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{eo.cfg.StateTopic: {eo.part: kgo.NewOffset().At(ours + 1)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(500*time.Millisecond))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	startKey := eo.id + "/start"
	for empty := 0; ctx.Err() == nil && empty < 2; {
		newer, n := "", 0
		pctx, pcancel := context.WithTimeout(ctx, 700*time.Millisecond)
		fs := cl.PollFetches(pctx)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if r.Offset <= ours || string(r.Key) != startKey {
				return
			}
			var v stateValue
			if json.Unmarshal(r.Value, &v) == nil && v.Nonce != "" && v.Nonce != eo.nonce {
				newer = v.Nonce
			}
		})
		if newer != "" {
			return newer, nil
		}
		if n == 0 {
			empty++
		} else {
			empty = 0
		}
	}
	return "", nil
}

// shutdown lets the open transaction finish within ctx, then stops the
// committer; batches not committed are failed back to the spool, which
// keeps them for the next start.
func (eo *exactlyOnce) shutdown(ctx context.Context) {
	close(eo.stop)
	if !eo.started.Load() {
		close(eo.done)
	}
	select {
	case <-eo.done:
	case <-ctx.Done():
		eo.cancel()
		<-eo.done
	}
	eo.cancel()
	eo.cl.Close()
	// Close fails what was still buffered; franz-go runs those promises
	// after Close returns. They write into the batches' records: wait for
	// them before the batches go back (bounded: they are in-memory calls).
	deadline := time.Now().Add(5 * time.Second)
	for eo.pending.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	eo.mu.Lock()
	left := append(eo.left, eo.queue...)
	eo.queue = nil
	eo.closed = true
	eo.mu.Unlock()
	eo.fail(left)
}

// fail answers batches that were not committed with a shutdown error: the
// spool keeps their records (its watermark cannot pass them).
func (eo *exactlyOnce) fail(bs []*eoBatch) {
	for _, tb := range bs {
		b := tb.b
		n := len(b.Records)
		for i := range n {
			if tb.out[i] {
				b.Ack(nil)
				continue
			}
			b.AckAt(i, consumer.ErrShuttingDown)
		}
		if eo.pending.Load() == 0 {
			// Reused only when no promise can still touch it.
			clear(tb.recs)
			tb.b = nil
			eo.pool.Put(tb)
		}
		eo.settle(int64(n))
	}
}
