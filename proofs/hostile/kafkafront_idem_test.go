package hostile

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// forgedBatches is one produce request to topic's partitions 0..2 in turn,
// n batches of one record each, each under its own producer id from pid0
// on (ids no front issued: only the durable keys know them).
func forgedBatches(topic string, pid0 int64, n int, value func(i int) string) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 7, -1, 30000
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = topic
	for i := range n {
		pt := kmsg.NewProduceRequestTopicPartition()
		pt.Partition = int32(i % 3)
		pt.Records = idemBatch(pid0+int64(i), 0, 0, value(i))
		tp.Partitions = append(tp.Partitions, pt)
	}
	req.Topics = append(req.Topics, tp)
	return req
}

// codeCounts counts a produce answer's partition error codes.
func codeCounts(resp *kmsg.ProduceResponse) map[int16]int {
	out := map[int16]int{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			out[p.ErrorCode]++
		}
	}
	return out
}

// TestKafkaFrontIdempotencyBounds: in delivery mode spool the Kafka front
// keys every idempotent producer's batch in the idempotency store, so a
// client sending batches under ever new producer ids makes keys. On the
// real binary, with delivery.idempotency.max_bytes at its 64 KiB minimum,
// while a well-behaved client sends: 20,000 batches under 20,000 producer
// ids (memory and the key log bounded, the oldest evicted and counted, the
// newest still recognised), 2,000 batches in flight at once in one request
// (past the bytes, refused retriable and counted, nothing of them stored;
// sent again, stored), and one producer's sequences reused with other
// bytes (refused, nothing stored, the original still recognised).
func TestKafkaFrontIdempotencyBounds(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good-kfidem", 3)
	topic := kafkatest.NewTopic(t, brokers, "hostile-kfidem", 3)
	dir := t.TempDir()
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "delivery.mode=spool", "delivery.spool.dir="+dir,
		"delivery.spool.linger=5ms", "delivery.idempotency.max_bytes=64KiB", "receivers.kafka.enabled=true")
	good := runGood("http://"+a.HTTP, goodTopic)
	// acked: the values answered OK, by topic. The spool delivers them
	// after the answer, so lost waits for as many records as were acked
	// (a minute at most), then counts the acked values missing; a value
	// in Kafka twice is reported too (each attack's topic is its own).
	acked := map[string][]string{}
	lost := func(topic string) int64 {
		seen := map[string]int{}
		for _, r := range kafkatest.Consume(t, brokers, topic, len(acked[topic]), time.Minute) {
			seen[string(r.Value)]++
		}
		var n int64
		for _, v := range acked[topic] {
			switch seen[v] {
			case 0:
				t.Logf("%s: %q was answered as accepted and is not in Kafka", topic, v)
				n++
			case 1:
			default:
				t.Errorf("%s: %q is in Kafka %d times", topic, v, seen[v])
			}
		}
		return n
	}
	errs := func(reason string) float64 {
		return a.Metric(`ferry_receiver_errors_total{reason="` + reason + `",receiver="kafka"}`)
	}
	s, err := dialKafka(a.KafkaFront)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	pid := int64(1) << 50
	attackCounted(t, a, "Kafka front, spool mode: 20,000 idempotent batches under 20,000 producer ids against delivery.idempotency.max_bytes 64KiB", func() (string, bool, string) {
		// 400 a request, one request at a time: each request's keys fit.
		var last *kmsg.ProduceRequest
		for r := range 50 {
			req := forgedBatches(topic, pid+int64(r*400), 400, func(i int) string { return fmt.Sprintf("flood-%d-%d", r, i) })
			last = req
			resp := kmsg.NewPtrProduceResponse()
			if err := s.roundTrip(req, resp); err != nil {
				return err.Error(), false, ""
			}
			if c := codeCounts(resp); c[0] != 400 {
				return fmt.Sprintf("request %d: partition errors %v", r, c), false, ""
			}
			for i := range 400 {
				acked[topic] = append(acked[topic], fmt.Sprintf("flood-%d-%d", r, i))
			}
		}
		keys, evicted := a.Metric("ferry_idempotency_keys"), a.Metric(`ferry_idempotency_evicted_total{reason="bytes"}`)
		// ~141 bytes a key: at most 464 fit in 64 KiB.
		ok := keys > 0 && keys <= 64<<10/141 && evicted >= 20000-keys
		// The newest batch is still known (answered, not stored again);
		// the oldest is not (stored again: a duplicate, counted evicted).
		dups := errs("duplicate_batch")
		// The same bytes: a retry repeats them (timestamp included).
		newest := kmsg.NewPtrProduceRequest()
		newest.Version, newest.Acks, newest.TimeoutMillis = 7, -1, 30000
		newest.Topics = []kmsg.ProduceRequestTopic{{Topic: topic, Partitions: last.Topics[0].Partitions[399:]}}
		resp := kmsg.NewPtrProduceResponse()
		if err := s.roundTrip(newest, resp); err != nil {
			return err.Error(), false, ""
		}
		replayed := codeCounts(resp)[0] == 1 && errs("duplicate_batch") == dups+1
		ok = ok && replayed
		var disk int64
		logs, _ := filepath.Glob(filepath.Join(dir, "dedup-*.log"))
		for _, f := range logs {
			if fi, err := os.Stat(f); err == nil {
				disk += fi.Size()
			}
		}
		ok = ok && disk > 0 && disk <= 64<<10+16<<10+64<<10
		return fmt.Sprintf("0 ×20,000; %v keys kept, %v evicted (bytes); the newest resent: replayed %v; key log %d bytes in %d files", keys, evicted, replayed, disk, len(logs)), ok,
			"memory and the key log bounded by max_bytes; the oldest go first, counted; a retry of an evicted batch is stored again"
	}, nil, func() int64 { return lost(topic) })

	pid += 1 << 20
	wide := kafkatest.NewTopic(t, brokers, "hostile-kfidem-wide", 3)
	attackCounted(t, a, "Kafka front, spool mode: one produce request of 2,000 idempotent batches (2,000 producer ids) against a 64 KiB store", func() (string, bool, string) {
		full := errs("idempotency_full")
		value := func(i int) string { return fmt.Sprintf("wide-%d", i) }
		req := forgedBatches(wide, pid, 2000, value)
		resp := kmsg.NewPtrProduceResponse()
		if err := s.roundTrip(req, resp); err != nil {
			return err.Error(), false, ""
		}
		c := codeCounts(resp)
		var again *kmsg.ProduceRequest
		for i, p := range resp.Topics[0].Partitions {
			if p.ErrorCode == 0 {
				acked[wide] = append(acked[wide], value(i))
				continue
			}
			if again == nil {
				again = kmsg.NewPtrProduceRequest()
				again.Version, again.Acks, again.TimeoutMillis = 7, -1, 30000
				again.Topics = []kmsg.ProduceRequestTopic{{Topic: wide}}
			}
			again.Topics[0].Partitions = append(again.Topics[0].Partitions, req.Topics[0].Partitions[i])
		}
		refused := c[kerr.NotEnoughReplicas.Code]
		ok := c[0] > 0 && c[0] <= 64<<10/141 && c[0]+refused == 2000 && errs("idempotency_full") == full+float64(refused)
		// The refused ones, sent again, a few hundred at a time as a
		// producer's retries come: stored (the first are answered now,
		// their keys evictable).
		stored := 0
		for again != nil && len(again.Topics[0].Partitions) > 0 {
			part := again.Topics[0].Partitions
			n := min(400, len(part))
			chunk := kmsg.NewPtrProduceRequest()
			chunk.Version, chunk.Acks, chunk.TimeoutMillis = 7, -1, 30000
			chunk.Topics = []kmsg.ProduceRequestTopic{{Topic: wide, Partitions: part[:n]}}
			resp := kmsg.NewPtrProduceResponse()
			if err := s.roundTrip(chunk, resp); err != nil {
				return err.Error(), false, ""
			}
			if cc := codeCounts(resp); cc[0] != n {
				return fmt.Sprintf("the refused batches sent again: %v", cc), false, ""
			}
			stored += n
			again.Topics[0].Partitions = part[n:]
		}
		for i, p := range resp.Topics[0].Partitions {
			if p.ErrorCode != 0 {
				acked[wide] = append(acked[wide], value(i))
			}
		}
		ok = ok && stored == refused
		return fmt.Sprintf("%d stored, %d NOT_ENOUGH_REPLICAS idempotency_full (counted); sent again: %d stored", c[0], refused, stored), ok,
			"keys of batches in flight are bounded by max_bytes; past it a batch is refused retriable, nothing of it stored, and its retry is stored"
	}, nil, func() int64 { return lost(wide) })

	reuse := kafkatest.NewTopic(t, brokers, "hostile-kfidem-reuse", 1)
	attackCounted(t, a, "Kafka front, spool mode: one producer's sequences reused with other bytes", func() (string, bool, string) {
		p, pid, err := dialProducer(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer p.Close()
		original := idemBatch(pid, 0, 0, "original")
		code, _, err := p.produce(reuse, original)
		if err != nil || code != 0 {
			return fmt.Sprintf("the original: %d %v", code, err), false, ""
		}
		acked[reuse] = append(acked[reuse], "original")
		reused := errs("producer_sequence_reused")
		var last int16
		for i := range 50 {
			if last, _, err = p.produce(reuse, idemBatch(pid, 0, 0, fmt.Sprintf("other-%d", i))); err != nil {
				return err.Error(), false, ""
			}
			if last != kerr.OutOfOrderSequenceNumber.Code {
				return fmt.Sprintf("other bytes %d: partition error %d", i, last), false, ""
			}
		}
		dups := errs("duplicate_batch")
		same, _, err := p.produce(reuse, original)
		if err != nil {
			return err.Error(), false, ""
		}
		ok := errs("producer_sequence_reused") == reused+50 && same == 0 && errs("duplicate_batch") == dups+1
		// Once the original is in Kafka, anything stored after it would
		// follow within the spool's order: a short extra poll sees it.
		recs := kafkatest.Consume(t, brokers, reuse, 1, time.Minute)
		n := len(recs)
		ok = ok && n == 1 && string(recs[0].Value) == "original"
		return fmt.Sprintf("50 × OUT_OF_ORDER_SEQUENCE_NUMBER (counted); the original resent: %d (a replay); %d record in Kafka", same, n), ok,
			"a retry repeats the batch's bytes: other bytes under stored sequences are refused, nothing stored, never answered OK (Kafka would drop them as a duplicate)"
	}, nil, func() int64 { return lost(reuse) })

	good.stop()
	if good.n.Load() == 0 {
		t.Fatalf("the well-behaved client had nothing accepted (%d refused)", good.refused.Load())
	}
}
