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

	attack(t, a, "Kafka front: one produce request owed (Kafka has not acknowledged it), then 200 pipelined requests naming 10,000 partitions each, answers never read", func() (string, bool, string) {
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
		big := kmsg.NewPtrProduceRequest()
		big.Version, big.Acks, big.TimeoutMillis = 9, -1, 30000
		bt := kmsg.NewProduceRequestTopic()
		bt.Topic = topic
		for p := range int32(10000) {
			bp := kmsg.NewProduceRequestTopicPartition()
			bp.Partition = 1 + p
			bt.Partitions = append(bt.Partitions, bp)
		}
		big.Topics = append(big.Topics, bt)
		req := kafkaRequest(0, 9, 2, true, big.AppendTo(nil))
		before := a.Metric(`ferry_receiver_requests_total{code="Produce",receiver="kafka"}`)
		var all []byte
		for range 200 {
			all = append(all, req...)
		}
		wrote := make(chan error, 1)
		go func() {
			_ = c.SetWriteDeadline(time.Now().Add(4 * time.Second))
			_, err := c.Write(all)
			wrote <- err
		}()
		werr := <-wrote
		read := a.Metric(`ferry_receiver_requests_total{code="Produce",receiver="kafka"}`) - before
		h := held("kafka")
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
		inKafka := countValues(t, brokers, topic, prefix("ok"))
		ok := werr != nil && read < 20 && h <= 2<<20 && code == 0 && answered == int(read)+1 && inKafka == 1
		return fmt.Sprintf("%.0f of 200 read (%d KiB of answers held); after Kafka took the first (code %d, %d in Kafka), %d answers read", read, int(h)>>10, code, inKafka, answered), ok,
			"answers waiting for an earlier one count toward the connection's 1 MiB (the reader used to stop at 1,000 owed answers only, ~1 GB here)"
	}, nil)

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
