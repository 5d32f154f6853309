// Package record owns the one data model every ferry receiver produces and
// every exporter consumes: a Record (topic, key, value, headers, timestamp)
// and a Batch of records that share one completion.
//
// A Batch is the unit of acknowledgement. The receiver that built it attaches
// a completion with OnDone; each stage that holds resources for it (the
// queue's byte reservation, the receiver's body buffer) attaches its own. The
// exporter reports every record exactly once through Ack; when the last record
// is reported the completions run, newest first, with the first error seen.
// So a client can be answered "accepted" precisely when every record of its
// request is acknowledged, and never before.
//
// Records reference the receiver's decoded buffer (Key and Value are slices of
// it): payload bytes are not copied between decode and the Kafka client. The
// buffer is owned by the batch and returned by one of its completions, so no
// stage may keep a record past its Ack.
package record

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Overhead is what a record costs in memory besides its payload while ferry
// holds it: our Record, franz-go's Record and its promise wrapper, measured
// with -benchmem. Stages add it per record to a batch's MemBytes.
const Overhead = 320

// HeaderOverhead is what a record header costs in memory besides its
// bytes while ferry holds it: our Header and franz-go's copy of it. A
// header takes two bytes on a client's wire (an empty key and value): a
// receiver charges this per header so that a request of empty headers
// does not hold twenty times what it reserved.
const HeaderOverhead = 2 * int(unsafe.Sizeof(Header{}))

// ReserveHeaders is the step in which a receiver reserves HeaderOverhead
// for the headers it decodes: one reservation (an atomic on the budget
// every receiver shares) per chunk, not per record. room is what the
// previous steps reserved and the headers have not used; need is this
// record's; reserve asks the budget. False: no room for need.
func ReserveHeaders(room *int64, need int64, reserve func(int64) bool) bool {
	if need <= *room {
		*room -= need
		return true
	}
	take := max(need-*room, headerChunk)
	if !reserve(take) {
		if take == need-*room || !reserve(need-*room) {
			return false
		}
		take = need - *room
	}
	*room += take - need
	return true
}

// headerChunk is what ReserveHeaders reserves at a time.
const headerChunk = 64 << 10

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one message on its way to Kafka.
type Record struct {
	Topic     string
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	// partition is the Kafka partition the client chose, plus one; zero
	// (the default) leaves the choice to the exporter's partitioner. Only
	// a Kafka-protocol client chooses: it asked for the topic's partitions
	// and picked one with its own partitioner, and must find the record
	// there.
	partition int32
}

// SetPartition fixes the record's partition (p >= 0); -1 leaves the
// choice to the exporter again.
func (r *Record) SetPartition(p int32) { r.partition = max(p, -1) + 1 }

// Partition is the partition the client chose, if it chose one.
func (r *Record) Partition() (p int32, chosen bool) { return r.partition - 1, r.partition != 0 }

// Size is the payload size the record is accounted with in metrics: key,
// value and headers, without framing.
func (r *Record) Size() int { return len(r.Key) + len(r.Value) + HeaderBytes(r.Headers) }

// HeaderBytes is what hs add to a record on its way to Kafka: their keys
// and values. Receivers often share one header slice among a request's
// records, but the Kafka client copies (and counts against its buffer) the
// headers of each record: they are charged, and rate-limited, per record.
func HeaderBytes(hs []Header) int {
	n := 0
	for i := range hs {
		n += len(hs[i].Key) + len(hs[i].Value)
	}
	return n
}

// Charge sets b.MemBytes, what the batch is reserved for in the pipeline's
// memory budget from its receiver to Kafka's answer: bufs, the capacity of
// the pooled buffers its records point into; an Overhead per record; and
// copied, the bytes the Kafka client copies per record beyond those
// buffers (keys and headers shared in memory, summed over the records).
// Every receiver charges through it, so the queue's bound is the Kafka
// client's too.
func (b *Batch) Charge(bufs, copied int) {
	b.MemBytes = int64(bufs) + int64(len(b.Records))*Overhead + int64(copied)
}

// SpoolPos is a place in the spool: a segment's id and a byte offset in
// it, at a frame boundary. Places grow in write order and survive
// restarts (segment ids are never reused within a spool directory).
type SpoolPos struct {
	Seg uint64
	Off int64
}

// Less orders places in the spool.
func (a SpoolPos) Less(b SpoolPos) bool { return a.Seg < b.Seg || a.Seg == b.Seg && a.Off < b.Off }

// Idem is a request's idempotency key on its way to the spool: Key is
// the scoped key its receiver built (owned, not a slice of the request's
// buffers), Sum the fingerprint of the request, Seq the reservation the
// idempotency store made for it (package idempotency), Records the
// records the key answers for (0: the whole batch).
//
// Next chains the other keys of the same batch: a request made of parts
// a client retries one by one (the Kafka front's batches, one per
// partition, each under its own producer sequence) carries a key per
// part, all written with the records in one append and resolved
// together.
type Idem struct {
	Key     []byte
	Sum     [16]byte
	Seq     uint64
	Records int
	Next    *Idem
}

// Batch is a group of records completed together. Its zero value is ready to
// use; a Batch must not be copied after first use.
type Batch struct {
	Records []Record

	// MemBytes is what this batch costs in memory while it is held by ferry
	// (decoded buffer plus per-record overhead). Queues bound themselves on it.
	MemBytes int64

	// OnFailure, when set, is told which record failed and why, before that
	// record's Ack. The spool uses it to dead-letter or retry exactly the
	// records that failed; it is nil on the hot path and costs nothing there.
	OnFailure func(i int, err error)

	// OnAcked, when set, is told each record's offset in Kafka before its
	// Ack (Kafka-protocol clients are answered with their batch's base
	// offset; -1 when the exporter's acks is none and Kafka answered no
	// offset). Nil on every other path.
	OnAcked func(i int, offset int64)

	// Receipt, when set, is told where each record landed (a client asked
	// for delivery receipts). Nil on the hot path: see receipt.go.
	Receipt *Receipt

	// Spooled: every record is also in the disk spool, which keeps it until
	// Kafka acknowledges it, so a failure here (a shutdown before Kafka
	// answered) loses nothing and is not a drop.
	Spooled bool

	// End is where in the spool this batch's records end (set by the
	// spool's reader; zero elsewhere). An exactly-once exporter commits
	// it to Kafka in the transaction that carries the records, so a
	// restart resumes after what Kafka committed (delivery.guarantee).
	End SpoolPos

	// DeadLetterNow, when set (by the spool), stores record i's dead
	// letter and returns only once it is durable (true) or could not be
	// stored (false). An exactly-once exporter calls it from its own
	// goroutine, never the Kafka client's promise, for a record Kafka
	// refused for good, before committing the position past it: a
	// dead letter settled later could be lost by a crash in between.
	DeadLetterNow func(i int, err error) bool

	// Idem, when set, marks the batch as a client request with an
	// idempotency key (package idempotency): the spool writes the key
	// durably with the records, in the same append and fsync round. Nil
	// on the hot path.
	Idem *Idem

	pending atomic.Int64
	failed  atomic.Int64
	mu      sync.Mutex
	err     error

	// Completions are few (receiver, queue, buffer release); an inline array
	// keeps attaching them free of allocation.
	dones  [4]func(error)
	ndones int
	extra  []func(error)
}

// OnDone attaches a completion. Completions run once, after the last record
// is acknowledged, in reverse order of attachment (the last stage to attach,
// nearest the exporter, releases its resources first). OnDone must not be
// called after the batch has been handed to the next stage.
func (b *Batch) OnDone(fn func(err error)) {
	if b.ndones < len(b.dones) {
		b.dones[b.ndones] = fn
		b.ndones++
		return
	}
	b.extra = append(b.extra, fn)
}

// PopDone detaches the most recently attached completion. A stage calls it
// when the next stage refused the batch, so that the caller, who still owns
// the batch, does not run that stage's completion later.
func (b *Batch) PopDone() {
	if n := len(b.extra); n > 0 {
		b.extra = b.extra[:n-1]
		return
	}
	if b.ndones > 0 {
		b.ndones--
		b.dones[b.ndones] = nil
	}
}

// Arm prepares the batch for acknowledgement of all its records. The stage
// that starts delivery (the exporter) calls it once before the first Ack.
func (b *Batch) Arm() { b.pending.Store(int64(len(b.Records))) }

// Ack reports one record as done (err == nil: durably accepted by Kafka).
// When the last record is reported the completions run in the caller's
// goroutine. Ack must be called exactly once per record after Arm.
func (b *Batch) Ack(err error) {
	if err != nil {
		b.failed.Add(1)
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	if b.pending.Add(-1) == 0 {
		b.complete()
	}
}

// AckN reports n records at once as durably accepted: an exporter that
// counts its records' answers itself pays one atomic update per batch.
// The n records are part of the Ack-once-per-record rule.
func (b *Batch) AckN(n int64) {
	if n > 0 && b.pending.Add(-n) == 0 {
		b.complete()
	}
}

// AckAt is Ack for the record at index i, reporting i to OnFailure when the
// record failed.
func (b *Batch) AckAt(i int, err error) {
	if err != nil && b.OnFailure != nil {
		b.OnFailure(i, err)
	}
	b.Ack(err)
}

// Complete reports every record at once with err (nil: durably stored), for
// a stage that stores a batch as a unit (the spool). Arm must not have been
// called.
func (b *Batch) Complete(err error) {
	if err != nil {
		b.failed.Store(int64(len(b.Records)))
		b.err = err
	}
	b.complete()
}

// Fail completes a batch that never reached delivery (for example refused by
// a later stage after earlier ones attached completions). Every record counts
// as failed.
func (b *Batch) Fail(err error) {
	b.failed.Store(int64(len(b.Records)))
	b.err = err
	b.complete()
}

// Failed is the number of records reported with an error. Valid inside a
// completion.
func (b *Batch) Failed() int { return int(b.failed.Load()) }

func (b *Batch) complete() {
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	for i := len(b.extra) - 1; i >= 0; i-- {
		b.extra[i](err)
	}
	for i := b.ndones - 1; i >= 0; i-- {
		b.dones[i](err)
	}
}

// Reset clears the batch for reuse from a pool, keeping the Records capacity.
func (b *Batch) Reset() {
	clear(b.Records)
	b.Records = b.Records[:0]
	b.MemBytes = 0
	b.OnFailure = nil
	b.OnAcked = nil
	b.Receipt = nil
	b.Spooled = false
	b.End = SpoolPos{}
	b.DeadLetterNow = nil
	b.Idem = nil
	b.pending.Store(0)
	b.failed.Store(0)
	b.err = nil
	b.dones = [4]func(error){}
	b.ndones = 0
	b.extra = nil
}
