package hostile

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/protocol"
)

// TestUnreadAnswers: answers a client does not read are bounded per
// connection and per receiver. Each attack pipelines requests whose
// answers are many times their size and never reads them.
func TestUnreadAnswers(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "answers", 1)
	// ferry's exporter holds every batch for its whole linger (fixed, 8 s):
	// the first produce request stays owed, its answer waiting for Kafka's
	// acknowledgement, while the attack runs.
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"exporter.kafka.linger=8s", "exporter.kafka.linger_mode=fixed")
	held := func(receiver string) float64 {
		return a.Metric(fmt.Sprintf(`ferry_receiver_unread_answer_bytes{receiver="%s"}`, receiver))
	}

	for _, owed := range []bool{false, true} {
		name := "Kafka front: one produce request owed (Kafka has not acknowledged it), then 200 pipelined requests naming 10,000 partitions each (answered at once), answers never read"
		if owed {
			name = "Kafka front: 200 pipelined requests, each one record (owed until Kafka acknowledges it) and 9,999 partitions the topic does not have, answers never read"
		}
		attack(t, a, name, func() (string, bool, string) { return unreadKafkaAnswers(t, a, brokers, topic, owed) }, nil)
	}

	attack(t, a, "Local: 100 connections pipelining frames whose answers are 13 times their size, never read", func() (string, bool, string) {
		// Every record refused on its own (an invalid topic, named in the
		// reason), alternating so that no two refusals merge.
		body := binary.AppendUvarint(nil, 1000)
		for i := range 1000 {
			body = protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(fmt.Sprintf("!%d", i%2)), Value: nil})
		}
		// One answer's size, from a client that reads it.
		probe, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		_, _ = probe.Write(produceFrame(0, 1, body))
		fh, _, err := readFrame(probe)
		probe.Close()
		if err != nil {
			return err.Error(), false, ""
		}
		answer := float64(fh.Length)
		var frames []byte
		for id := range uint32(500) {
			frames = append(frames, produceFrame(0, id+1, body)...)
		}
		var conns []net.Conn
		var wg sync.WaitGroup
		for range 100 {
			c, err := localConn(t, a, 0)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.SetWriteDeadline(time.Now().Add(4 * time.Second))
				_, _ = c.Write(frames)
			}()
		}
		peak := 0.0
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			peak = max(peak, held("local"))
		}
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
		// The room (an eighth of memory_limit: 8 MiB), plus 16 KiB and
		// one answer a connection.
		bound := float64(memLimit/8) + 100*(16<<10+answer)
		return fmt.Sprintf("%d KiB of frames (%.0f KiB of answers) sent on each; at most %.1f MiB of answers held (bound %.1f)", len(frames)>>10, 500*answer/1024, peak/(1<<20), bound/(1<<20)),
			peak > 0 && peak <= bound,
			"past 1 MiB held on a connection, or 16 KiB while the receiver's connections hold an eighth of memory_limit, the agent stops reading it"
	}, nil)
}

// unreadKafkaAnswers: one produce request left owed (the agent's linger),
// then 200 pipelined requests naming 10,000 partitions, never read. With
// owed, each of them also carries a record (so its answer is owed too,
// not made at once and parked).
func unreadKafkaAnswers(t *testing.T, a *agenttest.Agent, brokers, topic string, owed bool) (string, bool, string) {
	held := func() float64 { return a.Metric(`ferry_receiver_unread_answer_bytes{receiver="kafka"}`) }
	sent := countValues(t, brokers, topic, prefix("ok"))
	before := a.Metric(`ferry_receiver_requests_total{code="Produce",receiver="kafka"}`)
	c, err := net.Dial("tcp", a.KafkaFront)
	if err != nil {
		return err.Error(), false, ""
	}
	defer c.Close()
	first := kmsg.NewPtrProduceRequest()
	first.Version, first.Acks, first.TimeoutMillis = 9, -1, 30000
	ft := kmsg.NewProduceRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewProduceRequestTopicPartition()
	fp.Records = idemBatch(-1, 0, 0, "ok")
	ft.Partitions = append(ft.Partitions, fp)
	first.Topics = append(first.Topics, ft)
	if _, err := c.Write(kafkaRequest(0, 9, 1, true, first.AppendTo(nil))); err != nil {
		return err.Error(), false, ""
	}
	// Partitions the topic does not have: each answered at once,
	// UNKNOWN_TOPIC_OR_PARTITION, and waiting behind the first answer.
	// With owed, partition 0 carries a record.
	big := kmsg.NewPtrProduceRequest()
	big.Version, big.Acks, big.TimeoutMillis = 9, -1, 30000
	bt := kmsg.NewProduceRequestTopic()
	bt.Topic = topic
	parts := int32(10000)
	if owed {
		parts-- // and partition 0 (max_partitions_per_request)
	}
	for p := range parts {
		bp := kmsg.NewProduceRequestTopicPartition()
		bp.Partition = 1 + p
		bt.Partitions = append(bt.Partitions, bp)
	}
	if owed {
		bp := kmsg.NewProduceRequestTopicPartition()
		bt.Partitions = append(bt.Partitions, bp)
	}
	big.Topics = append(big.Topics, bt)
	var all []byte
	for i := range 200 {
		if owed {
			bt.Partitions[len(bt.Partitions)-1].Records = idemBatch(-1, 0, 0, fmt.Sprintf("ok-%d", i))
		}
		all = append(all, kafkaRequest(0, 9, 2, true, big.AppendTo(nil))...)
	}
	// Written for 4 s at most: the write stops when the agent stops
	// reading (unless the kernel's buffers take it all).
	_ = c.SetWriteDeadline(time.Now().Add(4 * time.Second))
	_, _ = c.Write(all)
	read := a.Metric(`ferry_receiver_requests_total{code="Produce",receiver="kafka"}`) - before - 1 // and the first
	h := held()
	// Kafka takes the first record after the linger: every answer
	// goes out, in order.
	code, answered := int16(-1), 0
	for ; answered <= int(read); answered++ {
		raw, err := kafkaAnswer(c)
		if err != nil {
			break
		}
		if answered == 0 {
			resp := kmsg.NewPtrProduceResponse()
			resp.Version = 9
			if resp.ReadFrom(raw[1:]) == nil && len(resp.Topics) == 1 && len(resp.Topics[0].Partitions) == 1 {
				code = resp.Topics[0].Partitions[0].ErrorCode
			}
		}
	}
	want := int64(1)
	if owed {
		want += int64(read)
	}
	c.Close() // what the agent reads after the answers is not counted
	// Every record acknowledged is in Kafka (more may be: requests read
	// once the answers were).
	inKafka := countValues(t, brokers, topic, prefix("ok")) - sent
	ok := read < 20 && h <= 3<<20 && code == 0 && answered == int(read)+1 && inKafka >= want
	note := "answers waiting for an earlier one count toward the connection's 1 MiB (the reader used to stop at 1,000 owed answers only, ~1 GB here)"
	if owed {
		note = "an owed answer counts as what it will be from when its request is read (it used to count when made: 200 read, 200 answers of 330 KB)"
	}
	return fmt.Sprintf("%.0f of 200 read (%d KiB of answers held); after Kafka took the first (code %d, %d of %d records in Kafka), %d answers read", read, int(h)>>10, code, inKafka, want, answered), ok, note
}
