package kafkaexporter

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
)

// chosenFirst wraps the configured partitioner so that a record whose
// partition the client chose (a Kafka-protocol client, which partitioned
// with its own partitioner against the partition counts ferry mirrored to
// it) goes to exactly that partition; every other record is partitioned as
// configured. Consume marks a chosen partition in kgo.Record.Partition
// (-1: not chosen), which franz-go reads only through the partitioner.
//
// A chosen record requires consistency: it must land on its partition even
// while that partition's leader is down (it waits and is retried), never
// on a writable neighbour. A choice beyond the topic's partitions fails the
// record in franz-go ("invalid record partitioning choice").
func chosenFirst(p kgo.Partitioner, seen *producerCounts) kgo.Partitioner {
	return chosenPartitioner{p, seen}
}

type chosenPartitioner struct {
	inner kgo.Partitioner
	seen  *producerCounts
}

// producerCounts keeps, per topic, the partition count the exporter's Kafka
// clients last partitioned a record with (the exactly-once client shares
// it: it is built from the same options; data topics go through one of the
// two): the producer's own metadata, refreshed every
// metadata max age (5 min) or after an error, not when another request
// (Partitions) learns of new partitions. A choice must be below it, or the
// client fails the record ("invalid record partitioning choice"), so
// Partitions answers no more than this.
type producerCounts struct{ m sync.Map } // topic → *atomic.Int32

func (p *producerCounts) slot(topic string) *atomic.Int32 {
	if v, ok := p.m.Load(topic); ok {
		return v.(*atomic.Int32)
	}
	v, _ := p.m.LoadOrStore(topic, new(atomic.Int32))
	return v.(*atomic.Int32)
}

// get is topic's count as the producer last partitioned a record of it
// (0: none yet).
func (p *producerCounts) get(topic string) int32 {
	if v, ok := p.m.Load(topic); ok {
		return v.(*atomic.Int32).Load()
	}
	return 0
}

// ForTopic keeps the optional interfaces of the inner partitioner: franz-go
// takes a lock around buffering only for partitioners with OnNewBatch, and
// uses PartitionByBackup when it exists, so the wrapper must have exactly
// the inner one's.
func (c chosenPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	in := c.inner.ForTopic(t)
	base := chosenTopic{inner: in, n: c.seen.slot(t)}
	nb, hasNB := in.(kgo.TopicPartitionerOnNewBatch)
	bp, hasBP := in.(kgo.TopicBackupPartitioner)
	switch {
	case hasNB && hasBP:
		return &chosenTopicBoth{chosenTopicBackup{base, bp}, nb}
	case hasNB:
		return &chosenTopicNewBatch{base, nb}
	case hasBP:
		return &chosenTopicBackup{base, bp}
	}
	return &base
}

type chosenTopic struct {
	inner kgo.TopicPartitioner
	n     *atomic.Int32 // the producer's count (producerCounts)
	// chosen is whether the client chose the record being placed, read
	// at franz-go's first ask; again marks its second. For a partitioner
	// with OnNewBatch (the sticky one, murmur2's keyless records), a
	// record that would open a new batch is not buffered: franz-go calls
	// OnNewBatch and asks again (KIP-480), after writing the partition it
	// tried into the record's Partition, where Consume marks a choice.
	// Read there, every keyless record asked again looked chosen and
	// stayed where the sticky partitioner had just moved away from, so it
	// never picked again: each linger window opened batches on three to
	// five partitions, and a fleet's produce requests grew by as much
	// (TestKeylessRecordsStick). franz-go asks under the topic's
	// partitioner lock, and always asks again after OnNewBatch; last is
	// the address of the first ask's record, so that a second ask that
	// never came cannot lend its reading to another record. An address,
	// not a pointer: a pointer would keep each topic's last record (and
	// its value) alive outside the buffer's byte budget.
	chosen, again bool
	last          uintptr
}

// isChosen is whether the client chose r's partition (Consume's mark),
// read at the first ask for r and kept for the second.
func (c *chosenTopic) isChosen(r *kgo.Record) bool {
	addr := uintptr(unsafe.Pointer(r))
	if c.again && c.last == addr {
		c.again = false
		return c.chosen
	}
	c.again, c.last, c.chosen = false, addr, r.Partition >= 0
	return c.chosen
}

// newBatch passes a new batch on to the sticky partitioner only for a
// record it placed: a batch opened by a record the client chose says
// nothing about the sticky partition, and moving on there would scatter
// the keyless records of a topic the Kafka front also writes (the Java
// client moves on only when the batch was on its sticky partition).
func (c *chosenTopic) newBatch(nb kgo.TopicPartitionerOnNewBatch) {
	c.again = true
	if !c.chosen {
		nb.OnNewBatch()
	}
}

// see records n as the producer's partition count of the topic when it is
// the whole count: franz-go passes every partition only for a record that
// requires consistency (a chosen or keyed one); for others, only the
// writable ones, fewer while a leader is missing. Those still set a count
// not known yet: a lower bound is a safe cap until a whole count comes. A
// load per record, a store only when the count changed.
func (c *chosenTopic) see(r *kgo.Record, n int, chosen bool) {
	if cur := c.n.Load(); cur != int32(n) && (cur == 0 || chosen || c.inner.RequiresConsistency(r)) {
		c.n.Store(int32(n))
	}
}

func (c *chosenTopic) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || c.inner.RequiresConsistency(r)
}

func (c *chosenTopic) Partition(r *kgo.Record, n int) int {
	chosen := c.isChosen(r)
	c.see(r, n, chosen)
	if chosen {
		return int(r.Partition)
	}
	return c.inner.Partition(r, n)
}

type chosenTopicNewBatch struct {
	chosenTopic
	nb kgo.TopicPartitionerOnNewBatch
}

func (c *chosenTopicNewBatch) OnNewBatch() { c.newBatch(c.nb) }

type chosenTopicBackup struct {
	chosenTopic
	bp kgo.TopicBackupPartitioner
}

func (c *chosenTopicBackup) PartitionByBackup(r *kgo.Record, n int, it kgo.TopicBackupIter) int {
	chosen := c.isChosen(r)
	c.see(r, n, chosen)
	if chosen {
		return int(r.Partition)
	}
	return c.bp.PartitionByBackup(r, n, it)
}

type chosenTopicBoth struct {
	chosenTopicBackup
	nb kgo.TopicPartitionerOnNewBatch
}

func (c *chosenTopicBoth) OnNewBatch() { c.newBatch(c.nb) }
