package kafkafront

import (
	"encoding/binary"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
)

// Idempotent producers' retries across restarts. The sequence table
// (sequence.go) lives in memory: after an agent restart it knows no
// producer, and a retry of a batch the previous run had stored in its
// disk spool would be stored again. In delivery mode spool the front
// also gives each idempotent producer's batch a key in the agent's
// idempotency store (package idempotency: the HTTP Idempotency-Key's),
// which the spool writes with the records in the same append and fsync
// round and gives back to the store at start:
//
//   - The key is the batch's place in its producer's numbering: producer
//     id, epoch, partition, first and last sequence and the topic (a
//     64-bit hash: a topic name may take 249 bytes), 30 bytes in all,
//     scoped to the door ("kafka") and the application the connection
//     authenticated as (Scope), so one application's batches never match
//     another's, whatever ids it sends. The fingerprint is the batch's
//     CRC-32C (which covers the producer id, epoch, sequences and
//     records), its record count and its length: a client's retry repeats
//     the batch's bytes, so it matches; the sequence table trusts the same
//     CRC.
//   - Each partition's batch of a produce request has its own key (a
//     client retries them one by one, regrouped into other requests);
//     the request's record.Batch carries them all (record.Idem.Next).
//   - Fresh: delivered with its key; the spool commits it once the
//     records are stored, or aborts it when they are not, and the front
//     aborts it on every path where the batch never reaches the spool.
//   - Replay: answered as the first copy was (no error, offset -1, as
//     every spool-mode answer), nothing appended: duplicate_batch.
//   - InFlight: the first copy is still being stored: retriable, as the
//     table's duplicate in flight.
//   - Mismatch: the same producer id, epoch, partition and sequences with
//     other bytes. A client's retry never does that; Kafka would answer
//     it as a duplicate of what it has and drop the new records (or
//     DUPLICATE_SEQUENCE_NUMBER, which the Java producer counts as
//     success). ferry refuses it with OUT_OF_ORDER_SEQUENCE_NUMBER,
//     nothing stored: the producer's numbering disagrees with what the
//     broker has, and producers answer it by renumbering (franz-go takes
//     a new producer id and resends, the Java producer and librdkafka
//     bump the epoch), so the records go under a new key; never
//     answered success.
//   - Full: the store's max_bytes is taken by batches still being
//     stored: retriable (NOT_ENOUGH_REPLICAS), counted idempotency_full.
//
// The table stays in front (every mode): its answers (a duplicate it
// knows, a fenced epoch) cost no key. Producer ids are random 63-bit
// numbers from crypto/rand, so ids handed out after a restart do not
// repeat the previous run's (two of a million ids collide with odds of
// about 3·10⁻⁸, and a collision matters only for the same application,
// epoch, partition, sequences and CRC; any other overlap is a Mismatch,
// refused and renumbered, never a loss).

// errSequenceReused refuses a batch whose producer sequences were stored
// with other records.
var errSequenceReused = &consumer.PermanentError{Reason: "producer_sequence_reused", Kind: consumer.KindRefused,
	Err: kerr.OutOfOrderSequenceNumber,
	Msg: "ferry already stored other records under this producer id, epoch and sequence range (a retry repeats the batch's bytes): refused, nothing stored; the producer must renumber (a new epoch or producer id)"}

// errIdemFull: the idempotency store has no room for another batch in
// flight.
var errIdemFull = &consumer.RetryableError{Reason: "idempotency_full", Kind: consumer.KindBusy, After: time.Second,
	Msg: "too many idempotent batches are being stored at once (delivery.idempotency.max_bytes); retry"}

// durableKeyBytes is a batch's key before its scope.
const durableKeyBytes = 8 + 2 + 4 + 4 + 4 + 8

// durable asks the idempotency store about c's batch (bt, size bytes), as
// sent by this connection's application: Fresh keeps the reservation in
// c; the others answer rp (dup true: nothing to decode) or refuse (err),
// and settle c's table claim.
func (d *decoder) durable(c *seqClaim, bt *batch, size int, rp *kmsg.ProduceResponseTopicPartition) (*seqClaim, bool, error) {
	r := d.cn.r
	v, _, id := r.idem.Begin(d.cn.durableKey(c), durableSum(bt, size), int(bt.count))
	switch v {
	case idempotency.Fresh:
		c.idem = id
		return c, false, nil
	case idempotency.Replay:
		// The table remembers it too: the next retry is answered there.
		c.settle(r, true, -1)
		d.refused = append(d.refused, "duplicate_batch")
		rp.BaseOffset = -1
		return nil, true, nil
	case idempotency.InFlight:
		c.settle(r, false, 0)
		d.refused = append(d.refused, errDuplicateInFlight.Reason)
		setError(rp, errDuplicateInFlight)
		return nil, true, nil
	case idempotency.Mismatch:
		c.settle(r, false, 0)
		return nil, false, errSequenceReused
	}
	c.settle(r, false, 0)
	return nil, false, errIdemFull
}

// durableKey is c's batch's scoped key: door, this connection's
// application, and the batch's place in its producer's numbering.
func (cn *conn) durableKey(c *seqClaim) []byte {
	owner := cn.owner()
	if cn.scope == nil || cn.scopeOwner != owner {
		// Hashed once per connection (and again if its token changes).
		cn.scope, cn.scopeOwner = idempotency.Scope("kafka", owner, ""), owner
	}
	k := make([]byte, len(cn.scope), len(cn.scope)+durableKeyBytes)
	copy(k, cn.scope)
	k = binary.BigEndian.AppendUint64(k, uint64(c.key.pid))
	k = binary.BigEndian.AppendUint16(k, uint16(c.key.epoch))
	k = binary.BigEndian.AppendUint32(k, uint32(c.key.part))
	k = binary.BigEndian.AppendUint32(k, uint32(c.first))
	k = binary.BigEndian.AppendUint32(k, uint32(c.last))
	return binary.BigEndian.AppendUint64(k, topicHash(c.key.topic))
}

// topicHash is FNV-1a 64 of a topic name: stable across restarts (the
// key is on disk), and only ever compared along with the producer id,
// sequences and CRC.
func topicHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// durableSum is a batch's fingerprint: its CRC-32C, record count and
// length, and a tag for this layout.
func durableSum(bt *batch, size int) (s [16]byte) {
	binary.BigEndian.PutUint32(s[0:], bt.crc)
	binary.BigEndian.PutUint32(s[4:], uint32(bt.count))
	binary.BigEndian.PutUint32(s[8:], uint32(size))
	copy(s[12:], "kfb1")
	return s
}
