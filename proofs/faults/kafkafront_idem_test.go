package faults

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// kafkaConn is a raw connection to the agent's Kafka front: kmsg requests
// sent and answered one at a time, so a test can resend a produce request
// byte for byte, as an idempotent producer's retry does.
type kafkaConn struct {
	c    net.Conn
	corr int32
}

func dialKafkaFront(addr string) (*kafkaConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &kafkaConn{c: c}, nil
}

// roundTrip sends req and reads its answer into resp.
func (k *kafkaConn) roundTrip(req kmsg.Request, resp kmsg.Response) error {
	k.corr++
	b := make([]byte, 4, 64)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(k.corr))
	b = append(b, 0, 6, 'f', 'a', 'u', 'l', 't', 's')
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	_ = k.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := k.c.Write(b); err != nil {
		return err
	}
	var hdr [8]byte
	if _, err := io.ReadFull(k.c, hdr[:]); err != nil {
		return err
	}
	if got := int32(binary.BigEndian.Uint32(hdr[4:])); got != k.corr {
		return fmt.Errorf("answer to request %d, want %d", got, k.corr)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	if _, err := io.ReadFull(k.c, body); err != nil {
		return err
	}
	if req.IsFlexible() && len(body) > 0 {
		body = body[1:] // the response header's empty tag section
	}
	resp.SetVersion(req.GetVersion())
	return resp.ReadFrom(body)
}

// produce sends req and returns its partitions' error codes, in order.
func (k *kafkaConn) produce(req *kmsg.ProduceRequest) ([]int16, error) {
	resp := kmsg.NewPtrProduceResponse()
	if err := k.roundTrip(req, resp); err != nil {
		return nil, err
	}
	var codes []int16
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			codes = append(codes, p.ErrorCode)
		}
	}
	return codes, nil
}

// kafkaReq is one produce request of an idempotent producer and what the
// producer learnt of it before the agent died.
type kafkaReq struct {
	req      *kmsg.ProduceRequest
	answered bool // every partition answered OK before the kill
	unknown  bool // sent, no answer
}

// 14. Exactly once with an idempotent Kafka producer's retries: producers
// on the Kafka front (each its own producer id from InitProducerId) send
// batches, three partitions a request, each partition's batch under its
// sequence numbers, and the agent is SIGKILLed while they do. Restarted on
// the same spool (a new process that has never seen those producer ids),
// every request is resent byte for byte, as the producers' retries are,
// until answered: those answered before the kill are answered OK and not
// stored again (duplicate_batch), those the kill cut are either answered
// so or stored now; a read_committed consumer sees every record exactly
// once. (Was: every retry stored again, each record of the answered
// requests twice in Kafka.)
func TestKafkaFrontRetryAcrossAgentKill(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-kfidem", 3)
	dir := t.TempDir()
	sets := append(spoolSets(t, "spool", dir), "delivery.spool.fsync=always", "delivery.guarantee=exactly_once",
		"receivers.kafka.enabled=true")
	a := startAgent(t, brokers, sets...)
	const producers, perProducer, batch = 4, 60, 5
	reqs := make([][]*kafkaReq, producers)
	conns := make([]*kafkaConn, producers)
	for p := range producers {
		k, err := dialKafkaFront(a.KafkaFront)
		if err != nil {
			t.Fatal(err)
		}
		conns[p] = k
		init := kmsg.NewPtrInitProducerIDRequest()
		init.Version = 4
		resp := kmsg.NewPtrInitProducerIDResponse()
		if err := k.roundTrip(init, resp); err != nil || resp.ErrorCode != 0 {
			t.Fatalf("InitProducerId: %v %d", err, resp.ErrorCode)
		}
		for i := range perProducer {
			req := kmsg.NewPtrProduceRequest()
			req.Version, req.Acks, req.TimeoutMillis = 9, -1, 30000
			tp := kmsg.NewProduceRequestTopic()
			tp.Topic = topic
			for part := range int32(3) {
				var values []string
				for j := range batch {
					values = append(values, fmt.Sprintf("p%d-r%d-part%d-%d", p, i, part, j))
				}
				pt := kmsg.NewProduceRequestTopicPartition()
				pt.Partition = part
				// Built once: the retry repeats the bytes (timestamp
				// included), as a producer's does.
				pt.Records = kafkatest.Batch{ProducerID: resp.ProducerID, Epoch: resp.ProducerEpoch,
					Seq: int32(i * batch), Values: values}.Bytes()
				tp.Partitions = append(tp.Partitions, pt)
			}
			req.Topics = append(req.Topics, tp)
			reqs[p] = append(reqs[p], &kafkaReq{req: req})
		}
	}
	var answered atomic.Int64
	var dead atomic.Bool
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conns[p].c.Close()
			for _, r := range reqs[p] {
				codes, err := conns[p].produce(r.req)
				switch {
				case err != nil:
					r.unknown = true
					return
				case fmt.Sprint(codes) == "[0 0 0]":
					r.answered = true
					answered.Add(1)
				default:
					// Refused as it dies: the producer will retry.
					r.unknown = true
					if !dead.Load() {
						t.Errorf("producer %d: partition errors %v before the kill", p, codes)
					}
					return
				}
			}
		}()
	}
	for answered.Load() < producers*perProducer/3 {
		time.Sleep(time.Millisecond)
	}
	a.Kill()
	dead.Store(true)
	wg.Wait()
	a2 := startAgent(t, brokers, sets...)

	var replayedAnswered, cut, fresh int
	for p := range producers {
		k, err := dialKafkaFront(a2.KafkaFront)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range reqs[p] {
			for try := 0; ; try++ {
				codes, err := k.produce(r.req)
				if err == nil && fmt.Sprint(codes) == "[0 0 0]" {
					break
				}
				if try > 100 {
					t.Fatalf("producer %d request %d: %v %v after 100 retries", p, i, codes, err)
				}
				if err != nil {
					k.c.Close()
					if k, err = dialKafkaFront(a2.KafkaFront); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(100 * time.Millisecond) // in flight, or starting
			}
			switch {
			case r.answered:
				replayedAnswered++
			case r.unknown:
				cut++
			default:
				fresh++
			}
		}
		k.c.Close()
	}
	t.Logf("requests answered before the kill: %d; cut by the kill: %d; never sent before it: %d", replayedAnswered, cut, fresh)
	if replayedAnswered == 0 {
		t.Fatal("no request was answered before the kill")
	}
	want := producers * perProducer * 3 * batch
	seen := waitCommitted(t, brokers, topic, want)
	dups, missing := 0, 0
	for p := range producers {
		for i := range perProducer {
			for part := range 3 {
				for j := range batch {
					switch n := seen[fmt.Sprintf("p%d-r%d-part%d-%d", p, i, part, j)]; {
					case n == 0:
						missing++
					case n > 1:
						dups += n - 1
					}
				}
			}
		}
	}
	if missing > 0 || dups > 0 || len(seen) != want {
		t.Fatalf("read_committed: %d missing, %d duplicated, %d distinct of %d", missing, dups, len(seen), want)
	}
	// Every batch answered before the kill was recognised, not stored again.
	dupBatches := a2.Metric(`ferry_receiver_errors_total{reason="duplicate_batch",receiver="kafka"}`)
	record(t, outcome{Test: "6c. Kafka's producer protocol through the Kafka front, agent SIGKILL, every request resent byte for byte",
		Mode: "spool, fsync always, exactly_once (read_committed)", Duration: fmt.Sprintf("%d producers × %d requests of 3 × %d records, kill after a third", producers, perProducer, batch),
		Offered: int64(want), Acked: int64(want), Delivered: int64(len(seen)), Lost: int64(missing), Duplicates: int64(dups), PeakRSSMiB: mib(max(a.peakRSS.Load(), a2.peakRSS.Load())),
		Recovery: "every resent request answered OK by the restarted agent",
		Note: fmt.Sprintf("%d requests answered before the kill (%v batches recognised as duplicates, none stored again), %d cut by it, %d first sent after it",
			replayedAnswered, dupBatches, cut, fresh)})
	if dupBatches < float64(3*replayedAnswered) {
		t.Fatalf("%v batches answered as duplicates after the restart, want at least %d", dupBatches, 3*replayedAnswered)
	}
	a2.Stop()
}
