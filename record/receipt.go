package record

import "math"

// Delivery receipts: a client that asks learns where each of its records
// landed in Kafka (topic, partition, offset), or, when the agent answers at
// the spool's fsync before Kafka has the record, an id to look that up
// later (package receipt).
//
// Cost model: nothing when not asked. A Batch carries a *Receipt that is
// nil on the hot path; the exporter checks the pointer and writes nothing
// else. When asked, the receiver allocates one Receipt for the request,
// three slices of len(Records) (a topic string header, a partition, an
// offset: 28 bytes a record), which the exporter fills from franz-go's
// promise (each index written once, before that record's Ack, so the
// completion that runs after the last Ack sees them all). The answer
// compresses them into ranges: records of one request that went to one
// partition in one produce batch have consecutive offsets, so a request of
// thousands of records usually answers with one range per partition.

// Receipt collects where each record of a batch went. Index i is
// Batch.Records[i]. It outlives the batch (the batch goes back to a pool at
// its completion; the receiver keeps its own pointer to the Receipt).
type Receipt struct {
	// Topic, Partition and Offset of record i once Kafka acknowledged
	// it; Offset is -1 while it is not (not yet, or failed).
	Topic     []string
	Partition []int32
	Offset    []int64
	// SpoolID is set by the spool when it took the batch: the client is
	// answered at the fsync, before Kafka has the records, and looks them
	// up later under this id. Empty when the batch went to Kafka from
	// memory.
	SpoolID string
	// Owner is who may look the receipt up later (receipt.Owner of the
	// request's token), set by the receiver.
	Owner uint64
}

// NewReceipt returns a Receipt for n records, none acknowledged yet.
func NewReceipt(n int) *Receipt {
	rc := &Receipt{Topic: make([]string, n), Partition: make([]int32, n), Offset: make([]int64, n)}
	for i := range rc.Offset {
		rc.Offset[i] = -1
	}
	return rc
}

// Acked notes that record i is at topic/partition/offset. Called by the
// exporter before record i's Ack; out-of-range indexes are ignored (a
// Receipt sized for a different batch is a bug, not a crash).
func (rc *Receipt) Acked(i int, topic string, partition int32, offset int64) {
	if i < 0 || i >= len(rc.Offset) {
		return
	}
	rc.Topic[i], rc.Partition[i], rc.Offset[i] = topic, partition, offset
}

// Range is a run of records with consecutive offsets in one partition:
// offsets Offset … Offset+Count-1 of Topic/Partition.
type Range struct {
	Topic     string
	Partition int32
	Offset    int64
	Count     int
}

// Ranges appends to dst the acknowledged records of rc in record order,
// merged into ranges where a record continues the previous one (same
// topic and partition, the next offset). Records not acknowledged are
// skipped; a range never spans one.
func (rc *Receipt) Ranges(dst []Range) []Range {
	return AppendRanges(dst, rc.Topic, rc.Partition, rc.Offset)
}

// AppendRanges is Ranges over parallel slices (the spool's receipt store
// keeps the same three columns).
func AppendRanges(dst []Range, topic []string, partition []int32, offset []int64) []Range {
	dst, _ = AppendRangesUpTo(dst, topic, partition, offset, 0, math.MaxInt)
	return dst
}

// AppendRangesUpTo is AppendRanges from record from on, stopping before a
// range past max would start (an answer's page); next is the record it
// stopped at (0: it reached the end).
func AppendRangesUpTo(dst []Range, topic []string, partition []int32, offset []int64, from, max int) (_ []Range, next int) {
	open := false
	for i := from; i < len(offset); i++ {
		if offset[i] < 0 {
			open = false
			continue
		}
		if k := len(dst) - 1; open && k >= 0 && dst[k].Topic == topic[i] && dst[k].Partition == partition[i] &&
			dst[k].Offset+int64(dst[k].Count) == offset[i] {
			dst[k].Count++
			continue
		}
		if len(dst) >= max {
			return dst, i
		}
		dst = append(dst, Range{Topic: topic[i], Partition: partition[i], Offset: offset[i], Count: 1})
		open = true
	}
	return dst, 0
}
