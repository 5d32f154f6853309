package kafkafront

import (
	"context"
	"errors"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/receiver/submit"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
)

// partResult is one topic-partition of a produce request whose records
// were handed on: its place in the response and its range of records.
type partResult struct {
	t, p     int // resp.Topics[t].Partitions[p]
	first, n int // b.Records[first:first+n]
	err      error
	base     int64
	seq      *seqClaim // an idempotent producer's batch, settled on completion
}

// seqClaim is one idempotent batch on its way: marked in flight in the
// sequence table (tracked), and reserved in the idempotency store (idem,
// delivery mode spool), or both.
type seqClaim struct {
	key         seqKey
	first, last int32
	crc         uint32
	tracked     bool
	idem        *record.Idem
}

// settle tells the table how the batch ended, and gives back its key's
// reservation when the records were not stored (the spool resolves it
// when they reached it; Abort after that is a no-op).
func (c *seqClaim) settle(r *Receiver, delivered bool, offset int64) {
	if c.tracked {
		r.seqs.settle(c.key, c.first, c.last, c.crc, delivered, offset)
	}
	if !delivered && c.idem != nil {
		r.idem.Abort(c.idem)
	}
}

// errDuplicateInFlight: the client sent again a batch ferry is still
// delivering; it asks again once that attempt has settled.
var errDuplicateInFlight = &consumer.RetryableError{Reason: "duplicate_in_flight", Kind: consumer.KindBusy, After: 100 * time.Millisecond,
	Msg: "this batch (same producer id and sequence) is still being delivered from an earlier attempt; retry"}

// produceReq is a produce request between its hand-off and its answer.
type produceReq struct {
	cn    *conn
	slot  *slot
	corr  int32
	resp  *kmsg.ProduceResponse
	parts []partResult // sorted by first

	mu       sync.Mutex
	failures int
	answered bool
}

// produce reads one Produce request of n bytes (after the fixed header)
// and hands its records on.
func (cn *conn) produce(ver int16, corr int32, n int) *connErr {
	r := cn.r
	if v := served[0]; ver < v[0] || ver > v[1] {
		return cn.fail("unsupported_api", "Produce v%d is not served (v%d to v%d are)", ver, v[0], v[1])
	}
	if !cn.authed {
		if cerr := cn.anonymous(); cerr != nil {
			return cerr
		}
	}
	// Flow control: wait for answers before reading more.
	cn.mu.Lock()
	for cn.inflight > 0 && cn.inflight+int64(n) > int64(r.cfg.MaxInflightBytes) && cn.ctx.Err() == nil {
		cn.cond.Wait()
	}
	cn.mu.Unlock()
	// The body's time starts now: waiting for answers is not trickling.
	cn.bodyBy = time.Now().Add(r.cfg.BodyTimeout)
	raw, ok := r.body.GetReserved(n)
	if !ok {
		return cn.refuse(ver, corr, n)
	}
	raw.B = raw.B[:n]
	_ = cn.c.SetReadDeadline(cn.bodyBy)
	if _, err := io.ReadFull(cn.c, raw.B); err != nil {
		r.body.Put(raw)
		return cn.slow(err)
	}
	req, cerr := cn.parseProduce(ver, raw.B)
	if cerr != nil {
		r.body.Put(raw)
		return cerr
	}
	cn.handOn(req, corr, raw, int64(n))
	return nil
}

// parseProduce bounds, then decodes, a Produce request body.
func (cn *conn) parseProduce(ver int16, b []byte) (*kmsg.ProduceRequest, *connErr) {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(ver)
	body, ok := skipHeader(b, req.IsFlexible())
	if !ok {
		return nil, cn.fail("malformed_request", "Produce request header")
	}
	if _, err := countPartitions(body, ver, cn.r.cfg.MaxPartitions); err != nil {
		var le *limitError
		if errors.As(err, &le) {
			return nil, cn.fail("too_many_partitions", "%v", err)
		}
		return nil, cn.fail("malformed_request", "Produce v%d: %v", ver, err)
	}
	if err := req.ReadFrom(body); err != nil {
		return nil, cn.fail("malformed_request", "Produce v%d: %v", ver, err)
	}
	return req, nil
}

// newProduceResponse mirrors the request's topics and partitions, each
// answered "no error, offset unknown" until told otherwise.
func newProduceResponse(req *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.SetVersion(req.Version)
	resp.Topics = make([]kmsg.ProduceResponseTopic, len(req.Topics))
	for t := range req.Topics {
		rt := &resp.Topics[t]
		rt.Topic = req.Topics[t].Topic
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(req.Topics[t].Partitions))
		for p := range rt.Partitions {
			rp := &rt.Partitions[p]
			*rp = kmsg.NewProduceResponseTopicPartition()
			rp.Partition = req.Topics[t].Partitions[p].Partition
			rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = -1, -1, -1
		}
	}
	return resp
}

// owedCost is what an owed produce answer is counted as until it is made:
// resp's structs, which wait with it, and its encoding (as a refusal's,
// answerCost), so that the reader stops before answers to requests it
// already read exceed the connection's bound.
func owedCost(resp *kmsg.ProduceResponse) int {
	n, words := 0, 0
	for t := range resp.Topics {
		n += answerTopicCost + 2*len(resp.Topics[t].Topic) + len(resp.Topics[t].Partitions)*answerPartitionCost
		// Refusals decided already carry words (the answer keeps those of
		// the first receiver.MaxMessages).
		for p := range resp.Topics[t].Partitions {
			if m := resp.Topics[t].Partitions[p].ErrorMessage; m != nil && words < receiver.MaxMessages {
				words++
				n += min(len(*m), receiver.MaxMessageBytes)
			}
		}
	}
	return n
}

// setError answers a partition with err's Kafka code and ferry's words.
func setError(rp *kmsg.ProduceResponseTopicPartition, err error) {
	rp.ErrorCode = codeFor(err).Code
	rp.BaseOffset = -1
	msg := err.Error()
	rp.ErrorMessage = &msg
}

// handOn turns the request's batches into one record.Batch and submits it.
func (cn *conn) handOn(req *kmsg.ProduceRequest, corr int32, raw *httpbody.Buf, size int64) {
	r := cn.r
	resp := newProduceResponse(req)
	pr := &produceReq{cn: cn, corr: corr, resp: resp}
	if req.TransactionID != nil {
		r.body.Put(raw)
		cn.r.m.Error("transactions_unsupported")
		for t := range resp.Topics {
			for p := range resp.Topics[t].Partitions {
				rp := &resp.Topics[t].Partitions[p]
				rp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
				rp.ErrorMessage = ptr("ferry's Kafka front does not serve transactions")
			}
		}
		if req.Acks != 0 {
			cn.answerNow(corr, resp)
		}
		return
	}
	// Only topics this connection may write to are looked up: a client
	// naming others would otherwise make ferry ask the cluster about
	// them and crowd the cache (they are refused below all the same).
	// A refused topic's info carries the refusal, so decoding checks no
	// topic twice.
	infos := make([]TopicInfo, len(req.Topics))
	names := make([]string, 0, len(req.Topics))
	asked := make([]int, 0, len(req.Topics)) // names[j] is req.Topics[asked[j]]
	for i := range req.Topics {
		if err := cn.check(req.Topics[i].Topic); err != nil {
			infos[i] = TopicInfo{Topic: req.Topics[i].Topic, Err: err}
			continue
		}
		names, asked = append(names, req.Topics[i].Topic), append(asked, i)
	}
	ctx, cancel := context.WithTimeout(cn.ctx, 5*time.Second)
	got := r.topics.get(ctx, names)
	cancel()
	for j, i := range asked {
		infos[i] = got[j]
	}

	b := r.batchP.Get().(*record.Batch)
	// The decompressed batches usually take a few times the request: that
	// much is reserved first, and only a request that inflates further is
	// decoded again with max_decompressed_bytes reserved.
	d := decoder{cn: cn, b: b, now: time.Now(), maxRecords: r.cfg.MaxRecords,
		outCap: min(int(r.cfg.MaxDecompressedBytes), 8*int(size)+64<<10)}
	if !d.all(req, resp, infos, pr) {
		r.body.Put(d.out)
		r.body.Release(&d.hdr)
		d = decoder{cn: cn, b: b, now: d.now, maxRecords: r.cfg.MaxRecords, outCap: int(r.cfg.MaxDecompressedBytes)}
		resp = newProduceResponse(req)
		pr.resp, pr.parts = resp, pr.parts[:0]
		d.all(req, resp, infos, pr)
	}
	// The headers' reservation goes with the request's, which the queue's
	// charge of the batch (headers included) replaces.
	r.body.Move(&d.hdr, raw, d.hdr.Reserved())
	out := d.out
	release := func() {
		b.Reset()
		r.batchP.Put(b)
		r.body.Put(raw)
		r.body.Put(out)
	}
	if len(b.Records) == 0 {
		release()
		if req.Acks != 0 {
			cn.answerNow(corr, resp)
		}
		return
	}
	// Headers are charged to memory and sent to Kafka: they count too.
	if err := r.gate.Limit(cn.claims, len(b.Records), d.payload+d.headerBytes); err != nil {
		r.m.Error(consumer.Reason(err)) // rate_limited, as every receiver counts it
		release()
		pr.settle(err, true)
		pr.failAll(err)
		if req.Acks != 0 {
			cn.answerNow(corr, resp)
		}
		return
	}
	bufs := cap(raw.B)
	if out != nil {
		bufs += cap(out.B)
	}
	b.Charge(bufs, d.headerBytes+d.headers*record.HeaderOverhead)
	if r.idem != nil {
		// Each partition's key goes with the records to the spool, which
		// writes them in the same append (chained; record.Idem.Next).
		for i := len(d.claims) - 1; i >= 0; i-- {
			if id := d.claims[i].idem; id != nil {
				id.Next, b.Idem = b.Idem, id
			}
		}
	}
	nrec := len(b.Records)
	r.m.Items("records", nrec)
	if req.Acks == 0 {
		r.m.NoWait(nrec)
		b.OnFailure, b.OnAcked = pr.onFailure, pr.onAcked
		if err := r.sub.SubmitAsync(cn.ctx, b, raw, out, func(err error) { pr.settle(err, false) }); err != nil {
			pr.settle(err, true)
			r.m.Error(consumer.Reason(err))
			r.logWarn(consumer.Reason(err), "acks=0 produce request dropped: "+err.Error(), "records", nrec)
		}
		return
	}
	pr.slot = cn.owe(size, owedCost(resp))
	b.OnFailure = pr.onFailure
	b.OnAcked = pr.onAcked
	cn.mu.Lock()
	pr.slot.deadline = time.Now().Add(r.cfg.AckTimeout)
	pr.slot.timeout = func() {
		r.m.Error("ack_timeout")
		pr.answer(submit.AckTimeout(r.cfg.AckTimeout, nrec), true)
	}
	cn.mu.Unlock()
	if err := r.sub.SubmitAsync(cn.ctx, b, raw, out, func(err error) { pr.settle(err, false); pr.answer(err, false) }); err != nil {
		r.m.Error(consumer.Reason(err))
		pr.settle(err, true)
		pr.answer(err, true)
	}
}

// all decodes every partition of req into d.b, answering in resp those
// refused; false: the decompressed batches need more than d.outCap, and
// nothing is kept (d.b is empty, d.out still reserved).
func (d *decoder) all(req *kmsg.ProduceRequest, resp *kmsg.ProduceResponse, infos []TopicInfo, pr *produceReq) bool {
	r, b := d.cn.r, d.b
	for t := range req.Topics {
		topic := req.Topics[t].Topic
		topicErr := infos[t].Err // the connection's refusal, or the cluster's
		for p := range req.Topics[t].Partitions {
			rp := &resp.Topics[t].Partitions[p]
			part := req.Topics[t].Partitions[p]
			err := topicErr
			if err == nil && (part.Partition < 0 || part.Partition >= infos[t].Partitions) {
				err = errUnknownTopic
			}
			var claim *seqClaim
			if err == nil {
				var dup bool
				if claim, dup, err = d.claim(topic, part.Partition, part.Records, rp); dup {
					continue
				}
			}
			first, payload, headerBytes, headers := len(b.Records), d.payload, d.headerBytes, d.headers
			if err == nil {
				err = d.partition(topic, part.Partition, part.Records)
			}
			if errors.Is(err, errNeedMore) {
				clear(b.Records)
				b.Records = b.Records[:0]
				for _, c := range append(d.claims, claim) {
					if c != nil {
						c.settle(r, false, 0)
					}
				}
				d.claims = nil
				return false
			}
			if err != nil {
				if claim != nil {
					claim.settle(r, false, 0)
				}
				clear(b.Records[first:])
				b.Records = b.Records[:first]
				d.payload, d.headerBytes, d.headers = payload, headerBytes, headers
				d.refused = append(d.refused, reasonOf(err))
				setError(rp, err)
				continue
			}
			n := len(b.Records) - first
			switch {
			case n > 0:
				pr.parts = append(pr.parts, partResult{t: t, p: p, first: first, n: n, base: -1, seq: claim})
				if claim != nil {
					d.claims = append(d.claims, claim)
				}
			case claim != nil:
				claim.settle(r, false, 0) // nothing to deliver (never so: claimed batches have records)
			}
		}
	}
	// Counted once the pass stands (a pass redone with more room for
	// decompression would otherwise count them twice).
	for _, reason := range d.refused {
		r.m.Error(reason)
	}
	for _, p := range pr.parts {
		n, bytes := p.n, 0
		for i := p.first; i < p.first+n; i++ {
			bytes += len(b.Records[i].Key) + len(b.Records[i].Value)
		}
		r.m.Received(r.set.Topics.Get(req.Topics[p.t].Topic), n, bytes)
	}
	return true
}

// claim looks up an idempotent producer's batch (one batch for the
// partition, as every client sends) in the sequence table: a duplicate of
// an acknowledged batch is answered in rp with its offset, one still in
// flight is answered retriable (dup true for both: nothing to decode); a
// batch under a producer id or epoch this client may not use is refused
// (err); otherwise the batch is claimed in flight, or not tracked at all.
func (d *decoder) claim(topic string, part int32, recs []byte, rp *kmsg.ProduceResponseTopicPartition) (*seqClaim, bool, error) {
	bt, rest, err := nextBatch(recs)
	if err != nil || bt.producerID < 0 || len(rest) != 0 || bt.count == 0 {
		return nil, false, nil
	}
	r := d.cn.r
	c := &seqClaim{key: seqKey{pid: bt.producerID, epoch: bt.epoch, seqPart: seqPart{topic: topic, part: part}},
		first: bt.baseSeq, last: bt.baseSeq + bt.count - 1, crc: bt.crc}
	v, offset, err := r.seqs.claim(d.cn.owner(), c.key, c.first, c.last, c.crc, d.now)
	switch v {
	case claimed:
		c.tracked = true
	case dupInflight:
		d.refused = append(d.refused, errDuplicateInFlight.Reason)
		setError(rp, errDuplicateInFlight)
		return nil, true, nil
	case dupAcked:
		d.refused = append(d.refused, "duplicate_batch")
		rp.BaseOffset = offset
		return nil, true, nil
	case refusedBatch:
		return nil, false, err
	case foreign:
		// Delivered, but never matched against the owner's batches.
		r.m.Error("producer_id_not_yours")
		r.logWarn("producer_id_not_yours", "kafka produce under a producer id issued to another application: delivered without the owner's retry check",
			"remote", d.cn.c.RemoteAddr().String(), "user", d.cn.user)
	}
	if r.idem != nil {
		// Keys are scoped to the sender's application: an id issued to
		// another, or to a previous run, is checked among its own.
		return d.durable(c, &bt, len(recs), rp)
	}
	if c.tracked {
		return c, false, nil
	}
	return nil, false, nil
}

// errNeedMore: decompression needs more than the first reservation.
var errNeedMore = errors.New("decompressed batches exceed the first reservation")

// partOf is the partition record i belongs to.
func (pr *produceReq) partOf(i int) *partResult {
	k := sort.Search(len(pr.parts), func(k int) bool { return pr.parts[k].first+pr.parts[k].n > i })
	return &pr.parts[k]
}

// onFailure and onAcked run on the Kafka client's goroutines, before the
// record's Ack: they only note, under the request's lock.
func (pr *produceReq) onFailure(i int, err error) {
	pr.mu.Lock()
	pr.failures++
	if p := pr.partOf(i); p.err == nil {
		p.err = err
	}
	pr.mu.Unlock()
}

func (pr *produceReq) onAcked(i int, offset int64) {
	pr.mu.Lock()
	if p := pr.partOf(i); i == p.first {
		p.base = offset
	}
	pr.mu.Unlock()
}

// failAll answers every handed-on partition with err.
func (pr *produceReq) failAll(err error) {
	for _, p := range pr.parts {
		setError(&pr.resp.Topics[p.t].Partitions[p.p], err)
	}
	pr.setThrottle(err)
}

func (pr *produceReq) setThrottle(err error) {
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		pr.resp.ThrottleMillis = int32(max(re.After, time.Second) / time.Millisecond)
	}
}

// settle tells the sequence table how each idempotent batch ended, when
// the records really have (after an ack-timeout answer too): delivered
// batches are remembered with their offsets, the others forgotten so the
// client's retry is delivered. whole: err applies to every partition.
func (pr *produceReq) settle(err error, whole bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	allFailed := whole || err != nil && pr.failures == 0
	for _, p := range pr.parts {
		if p.seq == nil {
			continue
		}
		p.seq.settle(pr.cn.r, !allFailed && p.err == nil, p.base)
	}
}

// answer sends the response once: from the batch's completion, the ack
// timer or a refusal (whole: err applies to every partition handed on).
func (pr *produceReq) answer(err error, whole bool) {
	pr.mu.Lock()
	if pr.answered {
		pr.mu.Unlock()
		return
	}
	pr.answered = true
	switch {
	case whole || err != nil && pr.failures == 0:
		// Refused, timed out, or failed as a unit (the spool).
		if err != nil {
			pr.failAll(err)
		}
	default:
		for _, p := range pr.parts {
			rp := &pr.resp.Topics[p.t].Partitions[p.p]
			if p.err != nil {
				setError(rp, p.err)
				pr.setThrottle(p.err)
			} else {
				rp.BaseOffset = p.base
			}
		}
	}
	out := encode(nil, pr.corr, pr.resp)
	pr.mu.Unlock()
	pr.cn.complete(pr.slot, out)
}

// decoder turns one request's record batches into records.
type decoder struct {
	cn          *conn
	b           *record.Batch
	out         *httpbody.Buf // decompressed batches, reserved at the limit
	dec         []byte        // out.B's bytes so far, capped at outCap
	now         time.Time
	outCap      int
	claims      []*seqClaim
	refused     []string // reasons to count when the pass stands
	maxRecords  int
	payload     int
	headerBytes int
	headers     int // the records' headers, charged record.HeaderOverhead each
	// hdr holds the reservation of the headers' structs until it joins
	// the request's (handOn).
	hdr     httpbody.Buf
	hdrRoom int64 // of hdr, not used by headers yet
}

// partition decodes one partition's batches into d.b.
func (d *decoder) partition(topic string, part int32, recs []byte) error {
	r := d.cn.r
	for len(recs) > 0 {
		bt, rest, err := nextBatch(recs)
		if err != nil {
			return err
		}
		recs = rest
		if bt.attrs&(attrTxn|attrControl) != 0 {
			return &consumer.PermanentError{Reason: "transactions_unsupported", Kind: consumer.KindInvalid,
				Msg: "a transactional or control batch: ferry's Kafka front does not serve transactions"}
		}
		if len(d.b.Records)+int(bt.count) > d.maxRecords {
			return consumer.OverLimit("too_many_records", "records in one produce request", int64(d.maxRecords), "receivers.kafka.max_records_per_request")
		}
		data := bt.records
		if codec := int(bt.attrs & attrCodec); codec != codecNone {
			if d.out == nil {
				out, ok := r.body.GetReserved(d.outCap)
				if !ok {
					return consumer.ErrFull
				}
				d.out = out
				// Decoded into a view capped at the reservation; the
				// pooled buffer keeps its own capacity.
				d.dec = out.B[:0:d.outCap]
			}
			start := len(d.dec)
			d.dec, err = decompress(d.dec, data, codec)
			if err != nil {
				var tl *protocol.TooLargeError
				if errors.As(err, &tl) && d.outCap < int(r.cfg.MaxDecompressedBytes) {
					return errNeedMore
				}
				if errors.As(err, &tl) {
					return consumer.OverLimit("request_too_large", "decompressed bytes in one produce request", int64(r.cfg.MaxDecompressedBytes), "receivers.kafka.max_decompressed_bytes")
				}
				if !errors.Is(err, errCorrupt) {
					err = errors.Join(errCorrupt, err)
				}
				return err
			}
			data = d.dec[start:]
		} else if bt.count > int32(len(data)/minRecordBytes) {
			return errCorrupt
		}
		if err := d.records(topic, part, bt, data); err != nil {
			return err
		}
	}
	return nil
}

// records appends a batch's records.
func (d *decoder) records(topic string, part int32, bt batch, data []byte) error {
	for i := int32(0); i < bt.count; i++ {
		rr, rest, err := nextRecord(data)
		if err != nil {
			return err
		}
		data = rest
		rec := record.Record{Topic: topic, Key: rr.key, Value: rr.value, Timestamp: d.now}
		if bt.firstTS >= 0 {
			rec.Timestamp = time.UnixMilli(bt.firstTS + rr.tsDelta)
		}
		rec.SetPartition(part)
		if rr.nheaders > 0 {
			// A header takes two bytes on the wire and HeaderOverhead
			// here: reserved before its structs are made.
			if !record.ReserveHeaders(&d.hdrRoom, int64(rr.nheaders)*int64(record.HeaderOverhead), func(n int64) bool { return d.cn.r.body.Reserve(&d.hdr, n) }) {
				return consumer.ErrFull
			}
			rec.Headers = make([]record.Header, 0, rr.nheaders)
			d.headers += rr.nheaders // the slots made, dropped headers' too
			h := rr.headers
			for j := 0; j < rr.nheaders; j++ {
				var k, v []byte
				if k, v, h, err = nextHeader(h); err != nil {
					return err
				}
				if strings.HasPrefix(string(k), routing.ReservedHeaderPrefix) {
					d.cn.r.m.Error("reserved_header_dropped")
					continue
				}
				rec.Headers = append(rec.Headers, record.Header{Key: string(k), Value: v})
				d.headerBytes += len(k) + len(v)
			}
			if len(h) != 0 {
				return errCorrupt
			}
		}
		if c := d.cn.claims; c != nil {
			rec.Headers, _ = routing.TenantHeaders(rec.Headers, c, token.Messages)
		}
		d.b.Records = append(d.b.Records, rec)
		d.payload += len(rec.Key) + len(rec.Value)
	}
	if len(data) != 0 {
		return errCorrupt
	}
	return nil
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, errCorrupt):
		return "corrupt_message"
	case errors.Is(err, errOldFormat):
		return "unsupported_message_format"
	case errors.Is(err, errUnknownTopic):
		return "unknown_topic"
	case errors.Is(err, errUnreachable):
		return "kafka_unavailable"
	}
	return consumer.Reason(err)
}
